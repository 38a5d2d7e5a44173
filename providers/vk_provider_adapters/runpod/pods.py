"""RunPod pods: who a pod belongs to, the v1 create body, and what state a pod payload says.

Identity. RunPod pod names need not be unique and there is no idempotency key, so every pod we
make is named ``vk-<pod uid>.<attempt>`` (the request id; RunPod allows 191 characters) and
carries ``VK_POD_UID`` / ``VK_REQUEST_ID`` / ``VK_OFFER_KEY`` in its environment. A pod is ours
when its name parses so and its ``env`` (when the payload has one) agrees and names this
provider in its offer key.

States (``instance_state``). v1 ``desiredStatus`` RUNNING is PENDING until the container is up
and RUNNING after. v1 payloads carry no field that says so (``publicIp``/``portMappings`` are
empty for a running pod with only HTTP ports or no public IP), so, as SkyPilot and the RunPod
SDK do, the adapter asks GraphQL for ``myself { pods { id runtime { uptimeInSeconds } } }``
(``RUNTIMES_QUERY``): a non-null ``runtime`` means the container runs. EXITED
means the pod stopped — RunPod reclaiming an interruptible pod, a person stopping it, or the
container ending; the v1 payload does not tell these apart and carries no exit code, and this
adapter never stops pods. So an interruptible pod that EXITED counts as preempted (LOST, and the
agent avoids the offer for a while); an on-demand one is EXITED with no exit code (the agent
counts that as a failure and the pod's restart policy decides). TERMINATED is TERMINATED
after our delete, else LOST. A v2 ``status`` (PROVISIONING, STARTING, RUNNING, EXITED, ERROR,
TERMINATED) takes precedence when a payload carries one; ERROR is LOST. A pod we asked to
delete that still reports running is TERMINATING. ``costPerHr`` is the instance's price.

Invariants: pure; ``parse_instance`` returns None for a pod that is not provably ours and
raises ``MalformedResponse`` for one of ours it cannot read.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from vk_provider.sdk import Instance, InstanceState, InvalidSpec, PortEndpoint, WorkloadSpec
from vk_provider_adapters.payload import MalformedResponse, as_number, string, timestamp
from vk_provider_adapters.runpod.offers import (
    DEFAULT_RAM_GB_PER_GPU,
    DEFAULT_VCPU_PER_GPU,
    REGION_ANY,
    Sku,
)

NAME_PREFIX = "vk-"
ENV_POD_UID = "VK_POD_UID"
ENV_REQUEST_ID = "VK_REQUEST_ID"
ENV_OFFER_KEY = "VK_OFFER_KEY"
NAME_MAX_LENGTH = 191  # PodCreateInput.name maxLength in the v1 document

_NAME = re.compile(r"vk-(?P<uid>[A-Za-z0-9][A-Za-z0-9_-]*)\.(?P<attempt>\d{1,9})")
_POD_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_CONTAINER = "spec.containers[0]"


def instance_name(spec: WorkloadSpec) -> str:
    """``vk-<pod uid>.<attempt>``: the request id, findable again with ``GET /pods?name=``."""
    return f"{NAME_PREFIX}{spec.request_id}"


@dataclass(frozen=True, slots=True)
class Owner:
    pod_uid: str
    attempt: int

    @property
    def request_id(self) -> str:
        return f"{self.pod_uid}.{self.attempt}"


def owner_of(pod: Mapping[str, object], *, provider: str | None = None) -> Owner | None:
    """Whose pod this is, if this agent made it: the name parses as ours and the environment,
    when the payload carries one, agrees with the name and (given ``provider``) names this
    provider in its offer key, so two agents with different provider names can share one
    RunPod account without taking each other's pods for orphans."""
    name = pod.get("name")
    if not isinstance(name, str):
        return None
    match = _NAME.fullmatch(name)
    if match is None:
        return None
    owner = Owner(match["uid"], int(match["attempt"]))
    env = pod.get("env")
    if isinstance(env, dict):
        if env.get(ENV_REQUEST_ID) != owner.request_id or env.get(ENV_POD_UID) != owner.pod_uid:
            return None
        offer_key = env.get(ENV_OFFER_KEY)
        foreign = isinstance(offer_key, str) and not offer_key.startswith(f"{provider}/")
        if provider is not None and foreign:
            return None
    return owner


def build_create_body(
    spec: WorkloadSpec,
    sku: Sku,
    *,
    region: str,
    container_disk_gb: int,
    offer_key: str,
    expose: str = "tcp",
) -> dict[str, object]:
    """The v1 ``PodCreateInput`` for ``spec`` on ``sku``; raises ``InvalidSpec``.

    Kubernetes ``command`` replaces the image's ENTRYPOINT and ``args`` its CMD, as
    ``dockerEntrypoint``/``dockerStartCmd`` do (an empty list keeps the image's value).
    """
    if not _POD_UID.fullmatch(spec.pod_uid):
        raise InvalidSpec(
            f"pod uid {spec.pod_uid!r} cannot name a RunPod pod", field="metadata.uid"
        )
    if not spec.main.image.strip():
        raise InvalidSpec("a RunPod pod needs an image", field=f"{_CONTAINER}.image")
    name = instance_name(spec)
    if len(name) > NAME_MAX_LENGTH:
        raise InvalidSpec("pod uid is too long for a RunPod name", field="metadata.uid")
    env = {var.name: var.value for var in spec.main.env}
    # Ours last, so a pod's own variables cannot disguise whose pod it is.
    env.update({ENV_POD_UID: spec.pod_uid, ENV_REQUEST_ID: spec.request_id})
    env[ENV_OFFER_KEY] = offer_key
    count = sku.gpu_count
    body: dict[str, object] = {
        "name": name,
        "imageName": spec.main.image,
        "computeType": "GPU",
        "cloudType": sku.cloud.value,
        "gpuTypeIds": [sku.gpu_type_id],
        "gpuCount": count,
        "interruptible": sku.spot,
        "dockerEntrypoint": list(spec.main.command),
        "dockerStartCmd": list(spec.main.args),
        "env": env,
        "ports": exposed_ports(spec, expose),
        "containerDiskInGb": container_disk_gb,
        "volumeInGb": 0,  # no persistent pod volume: a pod's state lives in its container
        "minVCPUPerGPU": max(DEFAULT_VCPU_PER_GPU, math.ceil(spec.cpu / count)),
        "minRAMPerGPU": max(DEFAULT_RAM_GB_PER_GPU, math.ceil(spec.memory_bytes / 2**30 / count)),
    }
    if region != REGION_ANY:
        body["dataCenterIds"] = [region]
    if expose == "tcp" and body["ports"]:
        body["supportPublicIp"] = True  # community cloud: TCP ports need the public IP
    return body


def exposed_ports(spec: WorkloadSpec, expose: str = "tcp") -> list[str]:
    """``<port>/tcp`` (or ``/http``, through the proxy) for each TCP container port; UDP
    cannot be exposed on RunPod."""
    ports: list[str] = []
    for port in spec.main.ports:
        entry = f"{port.container_port}/{expose}"
        if port.protocol.upper() == "TCP" and entry not in ports:
            ports.append(entry)
    return ports


PROXY_DOMAIN = "proxy.runpod.net"  # https://<pod id>-<port>.proxy.runpod.net (RunPod's docs)


def reached_at(pod: Mapping[str, object], pod_id: str) -> tuple[PortEndpoint, ...]:
    """Where the cluster reaches each of the pod's ports: a ``/tcp`` port on ``publicIp`` at
    the port ``portMappings`` maps it to (nothing until RunPod has mapped it), an ``/http``
    port through the HTTPS proxy on 443."""
    ip = pod.get("publicIp")
    mappings = pod.get("portMappings")
    found: list[PortEndpoint] = []
    ports = pod.get("ports")
    for entry in ports if isinstance(ports, list) else []:
        number, _, kind = str(entry).partition("/")
        if not number.isdigit() or not 1 <= int(number) <= 65535:
            continue
        port = int(number)
        if kind == "http":
            found.append(PortEndpoint(port, "TCP", f"{pod_id}-{port}.{PROXY_DOMAIN}", 443))
            continue
        mapped = mappings.get(number) if isinstance(mappings, dict) else None
        if (
            kind == "tcp"
            and isinstance(ip, str)
            and ip
            and isinstance(mapped, int)
            and 1 <= mapped <= 65535
        ):
            found.append(PortEndpoint(port, "TCP", ip, mapped))
    return tuple(found)


class Lifecycle(enum.Enum):
    """A pod's lifecycle, in v2 ``PodStatus`` terms; v1 payloads are read into it."""

    PROVISIONING = "PROVISIONING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    EXITED = "EXITED"
    ERROR = "ERROR"
    TERMINATED = "TERMINATED"


_V1_DESIRED = frozenset({"RUNNING", "EXITED", "TERMINATED"})


def lifecycle_of(pod: Mapping[str, object]) -> Lifecycle:
    """The pod's lifecycle from a v2 ``status`` when present, else from v1 ``desiredStatus``
    and whether the container is up: GraphQL's ``runtime`` (merged into the payload by
    ``with_runtime``), non-null once it runs. Without a ``runtime`` the pod is STARTING: a
    running pod with only HTTP ports or no public IP looks like a starting one in v1, so
    nothing else is taken as proof that it runs."""
    status = pod.get("status")
    if isinstance(status, str) and status in Lifecycle.__members__:
        return Lifecycle[status]
    desired = pod.get("desiredStatus")
    if not isinstance(desired, str) or desired not in _V1_DESIRED:
        raise MalformedResponse(
            f"pod payload: 'desiredStatus' is {desired!r}, not one of RUNNING, EXITED, TERMINATED"
        )
    if desired != "RUNNING":
        return Lifecycle(desired)
    return Lifecycle.RUNNING if pod.get("runtime") is not None else Lifecycle.STARTING


def needs_runtime(pod: object) -> bool:
    """Whether the pod's state depends on a ``runtime`` the v1 payload does not carry."""
    if not isinstance(pod, dict) or "runtime" in pod:
        return False
    status = pod.get("status")
    if isinstance(status, str) and status in Lifecycle.__members__:
        return False
    return pod.get("desiredStatus") == "RUNNING"


RUNTIMES_QUERY = (
    "query VkProviderRuntimes { myself { pods { id desiredStatus runtime { uptimeInSeconds } } } }"
)


def parse_runtimes(data: object) -> dict[str, object]:
    """Each pod's ``runtime`` (None until its container is up) from the ``data`` of
    ``RUNTIMES_QUERY``, by pod id."""
    myself = data.get("myself") if isinstance(data, dict) else None
    pods = myself.get("pods") if isinstance(myself, dict) else None
    if not isinstance(pods, list):
        raise MalformedResponse("GraphQL myself.pods: missing or not a list")
    return {
        pod["id"]: pod.get("runtime")
        for pod in pods
        if isinstance(pod, dict) and isinstance(pod.get("id"), str)
    }


def with_runtime(pod: object, runtimes: Mapping[str, object]) -> object:
    """The v1 payload with GraphQL's ``runtime`` of that pod (None when it has none yet)."""
    if not needs_runtime(pod):
        return pod
    assert isinstance(pod, dict)  # needs_runtime checked it
    return {**pod, "runtime": runtimes.get(str(pod.get("id")))}


def instance_state(
    lifecycle: Lifecycle, *, deleting: bool, interruptible: bool
) -> tuple[InstanceState, str]:
    """The state table (see the module docstring): our state and a message for it."""
    if lifecycle is Lifecycle.TERMINATED:
        if deleting:
            return InstanceState.TERMINATED, "terminated on request"
        return InstanceState.LOST, "pod terminated by RunPod, not by this agent"
    if deleting:
        return InstanceState.TERMINATING, "termination requested"
    if lifecycle is Lifecycle.ERROR:
        return InstanceState.LOST, "RunPod reports the pod in an unrecoverable error state"
    if lifecycle is Lifecycle.EXITED:
        if interruptible:
            return InstanceState.LOST, "interruptible pod stopped by RunPod (preempted)"
        return InstanceState.EXITED, "pod stopped; RunPod reports no exit code"
    if lifecycle is Lifecycle.RUNNING:
        return InstanceState.RUNNING, ""
    return InstanceState.PENDING, f"pod {lifecycle.value.lower()}"


def parse_instance(
    pod: object, *, provider: str, deleting: Callable[[str], bool]
) -> Instance | None:
    """The ``Instance`` of a v1 Pod payload; None when the pod is not ours; raises
    ``MalformedResponse`` for a pod of ours whose payload cannot be read."""
    if not isinstance(pod, dict):
        raise MalformedResponse("pod payload is not a JSON object")
    owner = owner_of(pod, provider=provider)
    if owner is None:
        return None
    pod_id = string(pod, "id", "pod payload", nonempty=True)
    state, message = instance_state(
        lifecycle_of(pod),
        deleting=deleting(pod_id),
        interruptible=pod.get("interruptible") is True,
    )
    if state is InstanceState.PENDING and isinstance(pod.get("lastStatusChange"), str):
        message = f"{message}: {pod['lastStatusChange']}"
    env = pod.get("env")
    offer_key = env.get(ENV_OFFER_KEY) if isinstance(env, dict) else None
    ip = pod.get("publicIp")
    return Instance(
        provider=provider,
        instance_id=pod_id,
        pod_uid=owner.pod_uid,
        attempt=owner.attempt,
        state=state,
        offer_key=offer_key if isinstance(offer_key, str) else "",
        message=message,
        started_at=timestamp(pod.get("lastStartedAt")),
        ip=ip if isinstance(ip, str) and ip else None,
        price_per_hour=as_number(pod.get("costPerHr")) or 0.0,
        endpoints=reached_at(pod, pod_id),
    )
