"""The remote pod's containers as B's kubelet reports them, as ``ContainerStatus`` values.

``containerStatuses`` and ``initContainerStatuses`` become ``Instance.containers`` and
``Instance.init_containers``, in the order of the remote pod's spec (kubelet sorts app
container statuses by name); a status whose container the spec does not name comes last.
State, reason, message, exit code and times, the restart count and the last termination are
B's; so are ``ready`` and ``started``: B's kubelet runs the probes (``Capabilities.probes ==
"provider"``), and the agent shows its verdicts.

Invariants: pure; a status of ours that cannot be read is ``MalformedResponse``; a missing
``ready``/``started`` is None (never guessed); a status without a state is waiting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from vk_provider.sdk import ContainerState, ContainerStatus, Termination
from vk_provider_adapters.payload import MalformedResponse, mapping, text, timestamp


@dataclass(frozen=True, slots=True)
class PodContainers:
    """The remote pod's containers: the names in its spec and what B reports of each."""

    app_names: tuple[str, ...]
    init_names: tuple[str, ...]
    apps: tuple[ContainerStatus, ...]
    inits: tuple[ContainerStatus, ...]

    def app(self, name: str) -> ContainerStatus | None:
        return next((c for c in self.apps if c.name == name), None)


def _names(spec: Mapping[str, object], key: str) -> tuple[str, ...]:
    raw = spec.get(key)
    found: list[str] = []
    for index, container in enumerate(raw if isinstance(raw, list) else []):
        name = text(mapping(container, f"spec.{key}[{index}]"), "name")
        if name:
            found.append(name)
    return tuple(found)


def _code(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _flag(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def termination(raw: Mapping[str, object]) -> Termination:
    """A ``state.terminated`` (or ``lastState.terminated``) object."""
    code = _code(raw.get("exitCode"))
    return Termination(
        exit_code=code if code is not None else 1,
        reason=text(raw, "reason"),
        message=text(raw, "message"),
        started_at=timestamp(raw.get("startedAt")),
        finished_at=timestamp(raw.get("finishedAt")),
    )


def container_status(raw: object, where: str) -> ContainerStatus:
    """One entry of ``containerStatuses`` / ``initContainerStatuses``."""
    body = mapping(raw, where)
    name = text(body, "name")
    if not name:
        raise MalformedResponse(f"{where} has no name")
    state = mapping(body.get("state"), f"{where}.state")
    running = mapping(state.get("running"), f"{where}.state.running")
    terminated = mapping(state.get("terminated"), f"{where}.state.terminated")
    waiting = mapping(state.get("waiting"), f"{where}.state.waiting")
    last_state = mapping(body.get("lastState"), f"{where}.lastState")
    last = mapping(last_state.get("terminated"), f"{where}.lastState.terminated")
    if running:
        status = ContainerStatus(
            name, ContainerState.RUNNING, started_at=timestamp(running.get("startedAt"))
        )
    elif terminated:
        ended = termination(terminated)
        status = ContainerStatus(
            name,
            ContainerState.TERMINATED,
            reason=ended.reason,
            message=ended.message,
            exit_code=ended.exit_code,
            started_at=ended.started_at,
            finished_at=ended.finished_at,
        )
    else:
        status = ContainerStatus(
            name,
            ContainerState.WAITING,
            reason=text(waiting, "reason"),
            message=text(waiting, "message"),
        )
    return replace(
        status,
        restart_count=max(0, _code(body.get("restartCount")) or 0),
        last_termination=termination(last) if last else None,
        ready=_flag(body.get("ready")),
        started=_flag(body.get("started")),
    )


def _ordered(raw: object, key: str, names: Sequence[str]) -> tuple[ContainerStatus, ...]:
    statuses = [
        container_status(entry, f"status.{key}[{index}]")
        for index, entry in enumerate(raw if isinstance(raw, list) else [])
    ]
    position = {name: index for index, name in enumerate(names)}
    statuses.sort(key=lambda s: position.get(s.name, len(position)))
    return tuple(statuses)


def pod_containers(pod: Mapping[str, object]) -> PodContainers:
    """What the remote pod's spec names and what its status says of each container."""
    spec = mapping(pod.get("spec"), "pod spec")
    status = mapping(pod.get("status"), "pod status")
    apps, inits = _names(spec, "containers"), _names(spec, "initContainers")
    return PodContainers(
        app_names=apps,
        init_names=inits,
        apps=_ordered(status.get("containerStatuses"), "containerStatuses", apps),
        inits=_ordered(status.get("initContainerStatuses"), "initContainerStatuses", inits),
    )
