"""A whole pod as Docker containers on one VM: their names, their order, and each ``docker run``.

A pod runs on its VM (``vk_provider_adapters.cloud_init``, ``vk_provider_adapters.boot_script``) as:

- a **sandbox** container, ``vk-<request id>``, running the pause image: it owns the pod's
  network namespace (every other container joins it with ``--network container:<sandbox>``,
  so they reach each other on ``localhost`` as in a Kubernetes pod) and publishes every port
  the pod's containers declare (a joined container cannot publish);
- one container per init container (native sidecars among them) and per app container,
  ``vk-<request id>.<container name>``, labelled ``vk-provider.pod=<request id>``;
- the pod's ``emptyDir`` volumes as host directories ``<state dir>/volumes/<name>``,
  bind-mounted where each container mounts them (``readOnly``, ``subPath`` honoured).

Restarts are Docker's (``--restart``), per container, as the pod's restartPolicy says: app
containers ``always`` / ``on-failure`` / ``no`` for Always / OnFailure / Never; plain init
containers ``no`` under Never, else ``on-failure`` (retried until they succeed); sidecars
always ``always``. Docker's back-off (100 ms doubled per restart up to one minute, reset after
ten seconds of running) stands in for kubelet's (10 s doubled up to five minutes), and
``docker inspect`` counts the restarts (``RestartCount``).

Kubernetes' ``command`` replaces the image's ENTRYPOINT and ``args`` its CMD; Docker's
``--entrypoint`` takes one executable, so the rest of ``command`` goes after the image.
Setting ``--entrypoint`` also drops the image's CMD, as Kubernetes does. Containers log to
Docker's ``local`` driver, which ``docker logs`` reads and which rotates.

Invariants: pure; no environment value is on a command line (env files and ``--env NAME``
carry them: ``vk_provider_adapters.cloud_init``); a mount path that Docker's ``--mount`` syntax
cannot carry is refused with ``InvalidSpec`` naming the pod field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from vk_provider.sdk import ContainerSpec, InvalidSpec, Port, VolumeMount, WorkloadSpec

PAUSE_IMAGE: Final = "registry.k8s.io/pause:3.10"
POD_LABEL: Final = "vk-provider.pod"
VOLUMES_DIR: Final = "volumes"

Kind = Literal["init", "sidecar", "app"]

_DOCKER_NAME_CHARS: Final = re.compile(r"[^a-zA-Z0-9_.-]")
_PROTOCOLS: Final = {"TCP": "tcp", "UDP": "udp", "SCTP": "sctp"}
# Docker reads --mount as one CSV record: these would need quoting it does not promise.
_MOUNT_UNSAFE: Final = re.compile(r'[,"\n\r=]')
_APP_RESTART: Final = {"Always": "always", "OnFailure": "on-failure", "Never": "no"}


@dataclass(frozen=True, slots=True)
class PodContainer:
    """One container of the pod in run order: what it is, and the pod field it comes from."""

    kind: Kind
    spec: ContainerSpec
    field: str  # spec.initContainers[1], spec.containers[0]


def sandbox_name_for(request_id: str) -> str:
    """The pod's sandbox container on the VM: ``vk-<request id>`` in Docker's alphabet."""
    return "vk-" + _DOCKER_NAME_CHARS.sub("-", request_id)


def container_name_for(request_id: str, container: str) -> str:
    """A container of the pod on the VM: ``vk-<request id>.<container name>``."""
    return f"{sandbox_name_for(request_id)}.{_DOCKER_NAME_CHARS.sub('-', container)}"


def pod_containers(spec: WorkloadSpec) -> list[PodContainer]:
    """The pod's containers in the order they start: init containers (sidecars among them) in
    order, then the app containers."""
    ordered = [
        PodContainer("sidecar" if c.sidecar else "init", c, f"spec.initContainers[{i}]")
        for i, c in enumerate(spec.init_containers)
    ]
    ordered += [
        PodContainer("app", c, f"spec.containers[{i}]") for i, c in enumerate(spec.containers)
    ]
    return ordered


def restart_policy(container: PodContainer, pod_policy: str) -> str:
    """Docker's ``--restart`` for the container (see the module docstring)."""
    if container.kind == "sidecar":
        return "always"
    if container.kind == "init":
        return "no" if pod_policy == "Never" else "on-failure"
    return _APP_RESTART.get(pod_policy, "always")


def sandbox_argv(*, name: str, request_id: str, ports: Iterable[Port], image: str) -> list[str]:
    """``docker run`` of the sandbox: the pod's network namespace and published ports."""
    argv = ["docker", "run", "--name", name, "--restart", "always", "--detach"]
    argv += ["--label", f"{POD_LABEL}={request_id}"]
    for port in _unique_ports(ports):
        argv += ["--publish", f"{port.container_port}:{port.container_port}/{_protocol(port)}"]
    argv.append(image)
    return argv


def container_argv(
    container: PodContainer,
    *,
    request_id: str,
    pod_policy: str,
    gpus: bool,
    env_files: Sequence[str],
    exported: Sequence[str],
    state_dir: str,
    provider: str = "",
) -> list[str]:
    """``docker run`` of one container of the pod, as run.sh executes it (``docker`` first).
    ``env_files`` are its ``--env-file``\\s; ``exported`` the names Docker takes from its own
    environment (values an env-file cannot carry)."""
    spec = container.spec
    argv = ["docker", "run", "--name", container_name_for(request_id, spec.name)]
    argv += ["--restart", restart_policy(container, pod_policy)]
    argv += ["--detach", "--log-driver", "local"]
    argv += ["--network", f"container:{sandbox_name_for(request_id)}"]
    argv += ["--label", f"{POD_LABEL}={request_id}"]
    if gpus and spec.gpu_count > 0:
        argv += ["--gpus", "all"]  # the VM is the pod's: its GPU containers share them all
    for env_file in env_files:
        argv += ["--env-file", env_file]
    for name in exported:
        argv += ["--env", name]  # the name only: Docker takes the value from its environment
    for index, mount in enumerate(spec.volume_mounts):
        where = f"{container.field}.volumeMounts[{index}]"
        argv += ["--mount", _mount(mount, state_dir=state_dir, where=where, provider=provider)]
    if spec.working_dir:
        argv += ["--workdir", spec.working_dir]
    if spec.command:
        argv += ["--entrypoint", spec.command[0], spec.image, *spec.command[1:]]
    else:
        argv.append(spec.image)
    argv += spec.args
    return argv


def volume_dirs(containers: Iterable[PodContainer], *, state_dir: str) -> list[str]:
    """The host directories the pod's mounts need (each volume, and each subPath in it)."""
    dirs: list[str] = []
    for container in containers:
        for mount in container.spec.volume_mounts:
            for path in (_volume_dir(mount, state_dir), _source(mount, state_dir)):
                if path not in dirs:
                    dirs.append(path)
    return dirs


def all_ports(containers: Iterable[PodContainer]) -> list[Port]:
    return [port for container in containers for port in container.spec.ports]


def _volume_dir(mount: VolumeMount, state_dir: str) -> str:
    return f"{state_dir}/{VOLUMES_DIR}/{mount.volume}"


def _source(mount: VolumeMount, state_dir: str) -> str:
    base = _volume_dir(mount, state_dir)
    return f"{base}/{mount.sub_path.strip('/')}" if mount.sub_path.strip("/") else base


def _mount(mount: VolumeMount, *, state_dir: str, where: str, provider: str) -> str:
    for value, name in ((mount.mount_path, "mountPath"), (mount.sub_path, "subPath")):
        if _MOUNT_UNSAFE.search(value):
            raise InvalidSpec(
                f"{name} {value[:120]!r} has a character Docker's --mount cannot carry "
                "(',', '\"', '=' or a line break)",
                provider=provider,
                field=f"{where}.{name}",
            )
    if _MOUNT_UNSAFE.search(mount.volume):
        raise InvalidSpec(
            f"volume name {mount.volume[:60]!r} is not valid",
            provider=provider,
            field=f"{where}.name",
        )
    text = f"type=bind,source={_source(mount, state_dir)},target={mount.mount_path}"
    return text + ",readonly" if mount.read_only else text


def _unique_ports(ports: Iterable[Port]) -> list[Port]:
    seen: set[tuple[int, str]] = set()
    unique: list[Port] = []
    for port in ports:
        key = (port.container_port, _protocol(port))
        if key not in seen:
            seen.add(key)
            unique.append(port)
    return unique


def _protocol(port: Port) -> str:
    return _PROTOCOLS.get(port.protocol.upper(), "tcp")
