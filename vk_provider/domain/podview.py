"""A pod as the agent reads it: parsed once from the API's JSON into a typed, frozen view.

``PodView.parse(pod)`` reads everything the agent's decisions need — identity, phase,
deletion, restart policy, where the pod runs (the annotations the agent owns), its container
and what the status last said about it, the resources it holds — so that no other module
re-reads the raw dict for those. The raw object stays available (``raw``) for the places that
need the whole pod (translation into a workload, writing status back): it is kept as compact
JSON (``encoded``, about a third of the memory of the decoded dicts, which matters with
10,000 pods) and decoded on each access, so every caller gets a copy of its own.

Also here: the annotation names (docs/reference.md#annotations), the container state value
types (``Waiting``, ``Running``, ``Terminated``), and ``PodPlacement``, the read-only summary
of a placed pod for the REST API and the metrics.

Invariants:
- Pure; parsing never raises on a malformed pod: a missing or ill-typed field reads as empty
  (translation, which does raise, names the field).
- ``TERMINAL_PHASES`` is the one spelling of "the pod has ended".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

JSON = dict[str, Any]
PodKey = tuple[str, str]  # (namespace, name)

ANNOTATION_PREFIX = "vk-provider.io/"
# Annotations the agent writes (docs/reference.md#written-by-the-agent); they make a pod
# restart-safe together.
ANN_PROVIDER = ANNOTATION_PREFIX + "provider"
ANN_INSTANCE = ANNOTATION_PREFIX + "instance-id"
ANN_OFFER = ANNOTATION_PREFIX + "offer"
ANN_PRICE = ANNOTATION_PREFIX + "price-per-hour"
ANN_PLACEMENT = ANNOTATION_PREFIX + "placement"  # why it runs there (ProviderSelected, kept)
# The provider as a label too, so `kubectl get pods -l vk-provider.io/provider=x` works.
LABEL_PROVIDER = ANN_PROVIDER
# The ReplicaSet controller removes the pods of lowest cost first when scaling in: rented
# replicas are below every home replica's (absent: 0), the dearest lowest
# (``deletion_cost``).
ANN_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
DELETION_COST_BELOW = 1_000_000
"""How far below 0 a rented replica's cost starts: below any cost people set by hand."""
# Annotations the user writes (docs/reference.md#written-by-the-user).
ANN_GPU = ANNOTATION_PREFIX + "gpu"
ANN_MIN_GPU_MEMORY = ANNOTATION_PREFIX + "min-gpu-memory"
ANN_MAX_PRICE = ANNOTATION_PREFIX + "max-price"
ANN_REGIONS = ANNOTATION_PREFIX + "regions"
ANN_PROVIDERS = ANNOTATION_PREFIX + "providers"
ANN_CAPACITY_TYPE = ANNOTATION_PREFIX + "capacity-type"

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
RESTART_POLICIES = frozenset({"Always", "OnFailure", "Never"})


# --------------------------------------------------------------------------- container states


@dataclass(frozen=True, slots=True)
class Waiting:
    reason: str
    message: str = ""


@dataclass(frozen=True, slots=True)
class Running:
    started_at: datetime


@dataclass(frozen=True, slots=True)
class Terminated:
    exit_code: int
    reason: str
    started_at: datetime | None
    finished_at: datetime | None
    message: str = ""


ContainerState = Waiting | Running | Terminated


# --------------------------------------------------------------------------- loose readers


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def rfc3339(moment: datetime) -> str:
    """A Time as the API writes it: seconds precision, UTC, ``Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(moment: datetime) -> str:
    """A MicroTime: always six fractional digits (the API server rejects other forms)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: object) -> datetime | None:
    """An RFC 3339 time as the API writes it (``...Z``); None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def terminated_from_json(body: Mapping[str, Any]) -> Terminated:
    return Terminated(
        exit_code=_int(body.get("exitCode")),
        reason=_text(body.get("reason")),
        started_at=parse_time(body.get("startedAt")),
        finished_at=parse_time(body.get("finishedAt")),
        message=_text(body.get("message")),
    )


def _state(body: Mapping[str, Any]) -> ContainerState | None:
    if "running" in body:
        started = parse_time(_mapping(body["running"]).get("startedAt"))
        return Running(started) if started else None
    if "terminated" in body:
        return terminated_from_json(_mapping(body["terminated"]))
    if "waiting" in body:
        waiting = _mapping(body["waiting"])
        return Waiting(_text(waiting.get("reason")), _text(waiting.get("message")))
    return None


# --------------------------------------------------------------------------- the view


@dataclass(frozen=True, slots=True)
class ContainerStatus:
    """What the pod's status last said about one container."""

    name: str = ""
    state: ContainerState | None = None
    last_termination: Terminated | None = None
    restart_count: int = 0
    container_id: str = ""

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> ContainerStatus:
        last = _mapping(_mapping(body.get("lastState")).get("terminated"))
        return cls(
            name=_text(body.get("name")),
            state=_state(_mapping(body.get("state"))),
            last_termination=terminated_from_json(last) if last else None,
            restart_count=_int(body.get("restartCount")),
            container_id=_text(body.get("containerID")),
        )

    @property
    def running_since(self) -> datetime | None:
        return self.state.started_at if isinstance(self.state, Running) else None

    @property
    def waiting_reason(self) -> str:
        return self.state.reason if isinstance(self.state, Waiting) else ""


@dataclass(frozen=True, slots=True)
class SpecContainer:
    """One container of the pod's spec, as the status writer needs it."""

    name: str
    image: str
    sidecar: bool = False  # an init container with restartPolicy Always
    readiness_probe: bool = False
    startup_probe: bool = False
    liveness_probe: bool = False
    ports: tuple[tuple[int, str], ...] = ()  # (containerPort, protocol) as declared

    @classmethod
    def parse(cls, body: Mapping[str, Any], *, init: bool = False) -> SpecContainer:
        return cls(
            name=_text(body.get("name")),
            image=_text(body.get("image")),
            sidecar=init and body.get("restartPolicy") == "Always",
            readiness_probe=isinstance(body.get("readinessProbe"), Mapping),
            startup_probe=isinstance(body.get("startupProbe"), Mapping),
            liveness_probe=isinstance(body.get("livenessProbe"), Mapping),
            ports=tuple(
                (port["containerPort"], (_text(port.get("protocol")) or "TCP").upper())
                for port in (_mapping(p) for p in _list(body.get("ports")))
                if isinstance(port.get("containerPort"), int)
            ),
        )


@dataclass(frozen=True, slots=True)
class Placed:
    """Where the agent's annotations say the pod runs."""

    provider: str
    instance_id: str
    offer_key: str
    price_per_hour: float | None


EVICTED = "EvictionByEvictionAPI"  # the DisruptionTarget reason of an eviction


def _disruption(conditions: list[Any]) -> str:
    for condition in conditions:
        body = _mapping(condition)
        if body.get("type") == "DisruptionTarget" and body.get("status") == "True":
            return _text(body.get("reason"))
    return ""


@dataclass(frozen=True, slots=True)
class PodView:
    key: PodKey
    uid: str
    resource_version: str
    node_name: str
    phase: str
    deletion_deadline: datetime | None  # deletionTimestamp: gone by then, at the latest
    restart_policy: str
    annotations: Mapping[str, str]
    placed: Placed | None
    container_name: str
    container_image: str
    status: ContainerStatus  # of the first app container
    controlled: bool  # a controller (ReplicaSet, Job, ...) owns it and would replace it
    encoded: bytes = field(repr=False, compare=False)  # the pod object as compact JSON
    # Every app container and init container of the spec, in order, and what the status
    # last said about each (by name; init containers' from initContainerStatuses).
    containers: tuple[SpecContainer, ...] = ()
    init_containers: tuple[SpecContainer, ...] = ()
    statuses: Mapping[str, ContainerStatus] = field(default_factory=dict, compare=False)
    init_statuses: Mapping[str, ContainerStatus] = field(default_factory=dict, compare=False)
    # Why it is being disrupted: the reason of its DisruptionTarget condition, which the API
    # server sets on an eviction (EvictionByEvictionAPI), the scheduler on a preemption...
    disruption: str = ""

    @classmethod
    def parse(cls, pod: Mapping[str, Any]) -> PodView:
        metadata = _mapping(pod.get("metadata"))
        spec = _mapping(pod.get("spec"))
        status = _mapping(pod.get("status"))
        annotations = {
            str(k): v
            for k, v in _mapping(metadata.get("annotations")).items()
            if isinstance(v, str)
        }
        containers = _list(spec.get("containers"))
        container = _mapping(containers[0]) if containers else {}
        statuses = _list(status.get("containerStatuses"))
        parsed = [ContainerStatus.parse(_mapping(body)) for body in statuses]
        inits = [
            ContainerStatus.parse(_mapping(body))
            for body in _list(status.get("initContainerStatuses"))
        ]
        policy = _text(spec.get("restartPolicy")) or "Always"
        owners = _list(metadata.get("ownerReferences"))
        return cls(
            key=(_text(metadata.get("namespace")), _text(metadata.get("name"))),
            uid=_text(metadata.get("uid")),
            resource_version=_text(metadata.get("resourceVersion")),
            node_name=_text(spec.get("nodeName")),
            phase=_text(status.get("phase")) or "Pending",
            deletion_deadline=parse_time(metadata.get("deletionTimestamp")),
            restart_policy=policy if policy in RESTART_POLICIES else "Always",
            annotations=annotations,
            placed=_placed(annotations),
            container_name=_text(container.get("name")),
            container_image=_text(container.get("image")),
            status=parsed[0] if parsed else ContainerStatus(),
            controlled=any(_mapping(o).get("controller") is True for o in owners),
            encoded=encode(pod),
            containers=tuple(SpecContainer.parse(_mapping(c)) for c in containers),
            init_containers=tuple(
                SpecContainer.parse(_mapping(c), init=True)
                for c in _list(spec.get("initContainers"))
            ),
            statuses={s.name: s for s in parsed},
            init_statuses={s.name: s for s in inits},
            disruption=_disruption(_list(status.get("conditions"))),
        )

    @property
    def evicted(self) -> bool:
        """Deleted through the Eviction API (a hand-over, the way home, a drain)."""
        return self.disruption == EVICTED

    @property
    def raw(self) -> JSON:
        """The whole pod object, decoded afresh: the caller's own copy."""
        decoded: JSON = json.loads(self.encoded)
        return decoded

    @property
    def declared_ports(self) -> frozenset[tuple[int, str]]:
        """(containerPort, protocol) of every app container and native sidecar."""
        serving = (*self.containers, *(c for c in self.init_containers if c.sidecar))
        return frozenset(port for c in serving for port in c.ports)

    @property
    def namespace(self) -> str:
        return self.key[0]

    @property
    def name(self) -> str:
        return self.key[1]

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def deleting(self) -> bool:
        return self.deletion_deadline is not None

    @property
    def start_time(self) -> datetime | None:
        return parse_time(_mapping(self.raw.get("status")).get("startTime"))

    @property
    def bound_at(self) -> datetime | None:
        """When the pod was bound to the node: its ``PodScheduled=True`` condition's
        ``lastTransitionTime`` (the scheduler's binding); for a pod created with
        ``spec.nodeName`` (no scheduler), its ``creationTimestamp``."""
        status = _mapping(self.raw.get("status"))
        for condition in _list(status.get("conditions")):
            body = _mapping(condition)
            if body.get("type") == "PodScheduled" and body.get("status") == "True":
                moment = parse_time(body.get("lastTransitionTime"))
                if moment is not None:
                    return moment
        return parse_time(_mapping(self.raw.get("metadata")).get("creationTimestamp"))


def encode(pod: Mapping[str, Any]) -> bytes:
    """``pod`` as compact JSON (what ``PodView.encoded`` keeps)."""
    return json.dumps(pod, separators=(",", ":"), ensure_ascii=False).encode()


def _placed(annotations: Mapping[str, str]) -> Placed | None:
    provider = annotations.get(ANN_PROVIDER)
    instance_id = annotations.get(ANN_INSTANCE)
    if not provider or not instance_id:
        return None
    try:
        price: float | None = float(annotations.get(ANN_PRICE, ""))
    except ValueError:
        price = None
    return Placed(provider, instance_id, annotations.get(ANN_OFFER, ""), price)


def pod_key(pod: Mapping[str, Any]) -> PodKey:
    metadata = _mapping(pod.get("metadata"))
    return (_text(metadata.get("namespace")), _text(metadata.get("name")))


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """Where a placed, live pod runs and what it costs (REST ``/v1/pods``, metrics)."""

    namespace: str
    name: str
    uid: str
    provider: str
    instance_id: str
    offer: str
    price_per_hour: float
    phase: str
    since: datetime | None

    @classmethod
    def of(cls, pod: PodView) -> PodPlacement | None:
        """The placement of a live, placed pod; None for others."""
        if pod.placed is None or pod.terminal:
            return None
        return cls(
            namespace=pod.namespace,
            name=pod.name,
            uid=pod.uid,
            provider=pod.placed.provider,
            instance_id=pod.placed.instance_id,
            offer=pod.placed.offer_key,
            price_per_hour=pod.placed.price_per_hour or 0.0,
            phase=pod.phase,
            since=pod.start_time,
        )


def deletion_cost(price_per_hour: float) -> int:
    """The pod-deletion-cost of a replica rented at ``price_per_hour``: negative, below
    ``-DELETION_COST_BELOW``, one step per tenth of a cent an hour, so a dearer replica is
    removed first; within the annotation's int32 range."""
    steps = round(min(max(price_per_hour, 0.0), 1e6) * 1000)
    return -(DELETION_COST_BELOW + steps)
