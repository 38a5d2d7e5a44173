"""What a pod's status should say, written as a kubelet writes it. Pure: no I/O, no clock.

The pod controller describes the pod's containers — a ``ContainerView`` each (waiting,
running or terminated, the last termination, restart count and readiness), gathered in a
``PodContainers`` (app containers, init containers) — and ``pod_status`` turns them into the
``status`` object: phase, conditions, containerStatuses, initContainerStatuses, startTime,
hostIP(s), podIP(s). A single-container pod is a ``PodContainers`` of one app container.

The phase follows kubelet's ``getPhase``: an init container that failed with restartPolicy
Never fails the pod; init containers still to complete, or app containers that never started,
keep it Pending; a running container makes it Running; when all have stopped, Always keeps it
Running (it restarts), all exit 0 is Succeeded, Never is Failed, OnFailure restarts (Running).
Ready is ContainersReady: every app container and sidecar ready (running, and its readiness
probe passed where it has one); an ended pod is never Ready.

Invariants:
- ``startTime`` and each condition's ``lastTransitionTime`` are kept from the current status
  when unchanged, so rewriting the same state is a no-op (``status_changed`` is False).
- Exactly one of waiting/running/terminated is set in ``state``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from types import EllipsisType
from typing import Any

from vk_provider.domain.models import Instance
from vk_provider.domain.podview import (
    TERMINAL_PHASES,
    ContainerState,
    PodView,
    Running,
    Terminated,
    Waiting,
    rfc3339,
)

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ContainerView:
    name: str
    image: str
    state: ContainerState
    container_id: str = ""
    last_state: Terminated | None = None
    restart_count: int = 0
    # None: ready (started) exactly while running; else the probe's verdict while running.
    ready: bool | None = None
    started: bool | None = None
    sidecar: bool = False  # an init container with restartPolicy Always

    @property
    def is_ready(self) -> bool:
        return isinstance(self.state, Running) and self.ready is not False

    @property
    def is_started(self) -> bool:
        return isinstance(self.state, Running) and self.started is not False


@dataclass(frozen=True, slots=True)
class PodContainers:
    """Every container of a pod as its status will show them."""

    apps: tuple[ContainerView, ...]
    inits: tuple[ContainerView, ...] = ()

    @classmethod
    def of(cls, view: ContainerView | PodContainers) -> PodContainers:
        return view if isinstance(view, PodContainers) else cls((view,))

    @property
    def initialized(self) -> bool:
        """Every plain init container completed and every sidecar started."""
        for init in self.inits:
            if init.sidecar:
                if not init.is_started:
                    return False
            elif not (isinstance(init.state, Terminated) and init.state.exit_code == 0):
                return False
        return True

    @property
    def ready(self) -> bool:
        return all(c.is_ready for c in self.apps) and all(
            c.is_ready for c in self.inits if c.sidecar
        )


def container_id(instance_id: str) -> str:
    return f"vk-provider://{instance_id}"


def container_view(
    pod: PodView,
    state: ContainerState,
    *,
    instance_id: str | None = None,
    last: Terminated | EllipsisType | None = ...,
    restarts: int | None = None,
) -> ContainerView:
    """The pod's container in ``state``; the last termination (``...``: the recorded one) and
    restart count are the pod's own unless given, the container id that of ``instance_id``
    (else the recorded one)."""
    return ContainerView(
        name=pod.container_name,
        image=pod.container_image,
        state=state,
        container_id=container_id(instance_id) if instance_id else pod.status.container_id,
        last_state=pod.status.last_termination if last is ... else last,
        restart_count=pod.status.restart_count if restarts is None else restarts,
    )


def terminated_of(instance: Instance, *, now: datetime) -> Terminated:
    """How an exited instance's container ended (no exit code counts as a failure)."""
    code = instance.exit_code if instance.exit_code is not None else 1
    return Terminated(
        exit_code=code,
        reason="Completed" if code == 0 else "Error",
        started_at=instance.started_at,
        finished_at=instance.finished_at or now,
        message=instance.message if code else "",
    )


def waiting_view(pod: PodView, reason: str, message: str = "") -> PodContainers:
    """Every container waiting for ``reason``, keeping restart counts and last terminations."""

    def waiting(name: str, image: str, recorded: Any, *, sidecar: bool = False) -> ContainerView:
        return ContainerView(
            name=name,
            image=image,
            state=Waiting(reason=reason, message=message),
            restart_count=recorded.restart_count if recorded else 0,
            last_state=recorded.last_termination if recorded else None,
            sidecar=sidecar,
        )

    if not pod.containers:  # a malformed pod: show the one container the view knows
        return PodContainers((waiting(pod.container_name, pod.container_image, pod.status),))
    return PodContainers(
        apps=tuple(waiting(c.name, c.image, pod.statuses.get(c.name)) for c in pod.containers),
        inits=tuple(
            waiting(c.name, c.image, pod.init_statuses.get(c.name), sidecar=c.sidecar)
            for c in pod.init_containers
        ),
    )


def _state_json(state: ContainerState | None) -> JSON:
    if state is None:
        return {}
    if isinstance(state, Waiting):
        body: JSON = {"reason": state.reason}
        if state.message:
            body["message"] = state.message
        return {"waiting": body}
    if isinstance(state, Running):
        return {"running": {"startedAt": rfc3339(state.started_at)}}
    terminated: JSON = {"exitCode": state.exit_code, "reason": state.reason}
    if state.message:
        terminated["message"] = state.message
    if state.started_at:
        terminated["startedAt"] = rfc3339(state.started_at)
    if state.finished_at:
        terminated["finishedAt"] = rfc3339(state.finished_at)
    return {"terminated": terminated}


def _completed(view: ContainerView) -> bool:
    return isinstance(view.state, Terminated) and view.state.exit_code == 0


def container_status(view: ContainerView, *, init: bool = False) -> JSON:
    """One entry of containerStatuses (or initContainerStatuses, ``init``)."""
    # A plain init container is ready once it completed; others while running and probed so.
    ready = _completed(view) if init and not view.sidecar else view.is_ready
    body: JSON = {
        "name": view.name,
        "image": view.image,
        "imageID": "",
        "ready": ready,
        "started": view.is_started,
        "restartCount": view.restart_count,
        "state": _state_json(view.state),
        "lastState": _state_json(view.last_state),
    }
    if view.container_id:
        body["containerID"] = view.container_id
    return body


def _condition(kind: str, ok: bool, now: datetime, previous: JSON, reason: str = "") -> JSON:
    status = "True" if ok else "False"
    old = previous.get(kind)
    transition = (
        old.get("lastTransitionTime")
        if old and old.get("status") == status and old.get("lastTransitionTime")
        else rfc3339(now)
    )
    body: JSON = {"type": kind, "status": status, "lastTransitionTime": transition}
    if reason and not ok:
        body["reason"] = reason
    if old and "lastProbeTime" in old:
        body["lastProbeTime"] = old["lastProbeTime"]
    return body


def _init_counts(inits: Sequence[ContainerView]) -> tuple[int, int]:
    """(pending, failed) plain init containers, as kubelet counts them."""
    pending = failed = 0
    for init in inits:
        if init.sidecar:
            continue
        state = init.state
        if isinstance(state, Terminated):
            failed += state.exit_code != 0
        elif isinstance(state, Waiting) and init.last_state is not None:
            failed += init.last_state.exit_code != 0  # in back-off after a failure
        else:
            pending += 1  # running, or not started yet
    return pending, failed


def pod_phase(view: ContainerView | PodContainers, restart_policy: str) -> str:
    """The pod's phase from its containers, as kubelet's ``getPhase`` decides it."""
    containers = PodContainers.of(view)
    pending_init, failed_init = _init_counts(containers.inits)
    if failed_init and restart_policy == "Never":
        return "Failed"
    waiting = running = stopped = succeeded = 0
    for sidecar in (c for c in containers.inits if c.sidecar):
        if isinstance(sidecar.state, Running):
            running += 1
            pending_init += not sidecar.is_started
        elif isinstance(sidecar.state, Waiting) and sidecar.last_state is None:
            pending_init += 1
            waiting += 1
    for app in containers.apps:
        state = app.state
        if isinstance(state, Running):
            running += 1
        elif isinstance(state, Terminated):
            stopped += 1
            succeeded += state.exit_code == 0
        elif app.last_state is not None or app.restart_count > 0:
            stopped += 1  # waiting to restart (CrashLoopBackOff) after having run
        else:
            waiting += 1
    if pending_init or waiting:
        return "Pending"
    if running:
        return "Running"
    if not stopped:
        return "Pending"
    if restart_policy == "Always":
        return "Running"  # every container is restarting
    if stopped == succeeded:
        return "Succeeded"
    return "Failed" if restart_policy == "Never" else "Running"


# The pod conditions the agent writes (as a kubelet owns them); every other is kept.
OWN_CONDITIONS = frozenset(
    {"PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"}
)


def pod_status(
    pod: PodView,
    view: ContainerView | PodContainers,
    *,
    now: datetime,
    host_ip: str,
    pod_ip: str | None,
    phase: str | None = None,
    reason: str = "",
    message: str = "",
    current: JSON | None = None,
) -> JSON:
    """The full status to write (phase is derived from the containers unless given);
    ``current`` is the pod's status as stored, when the caller has decoded it already."""
    containers = PodContainers.of(view)
    if current is None:
        current = pod.raw.get("status") or {}
    phase = phase or pod_phase(containers, pod.restart_policy)
    previous = {c.get("type"): c for c in current.get("conditions") or []}
    terminal = phase in TERMINAL_PHASES
    ready = containers.ready and not terminal
    not_ready = "PodCompleted" if terminal else "ContainersNotReady"
    initialized = containers.initialized
    everything = (*containers.apps, *containers.inits)
    conditions = [
        _condition(
            "PodReadyToStartContainers", any(c.container_id for c in everything), now, previous
        ),
        _condition("Initialized", initialized, now, previous, "ContainersNotInitialized"),
        _condition("Ready", ready, now, previous, not_ready),
        _condition("ContainersReady", ready, now, previous, not_ready),
        _condition("PodScheduled", True, now, previous),
    ]
    # Conditions others own stay, as a kubelet's status manager keeps them: the API server's
    # DisruptionTarget on an eviction (Jobs' pod failure policies and our log read it),
    # readiness gates' conditions. The merge patch replaces the list, so they are resent.
    conditions += [c for t, c in previous.items() if t not in OWN_CONDITIONS]
    status: JSON = {
        "phase": phase,
        "conditions": conditions,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": current.get("startTime") or rfc3339(now),
        "containerStatuses": [container_status(c) for c in containers.apps],
        "qosClass": current.get("qosClass") or "BestEffort",
        "reason": reason or None,
        "message": message or None,
    }
    if containers.inits:
        status["initContainerStatuses"] = [container_status(c, init=True) for c in containers.inits]
    # An IP, once known, stays until the pod ends (a waiting view does not know it).
    pod_ip = pod_ip or current.get("podIP")
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    return status


_COMPARED = (
    "phase",
    "conditions",
    "hostIP",
    "podIP",
    "startTime",
    "containerStatuses",
    "initContainerStatuses",
    "reason",
)


def status_changed(current: JSON, wanted: JSON) -> bool:
    """Whether writing ``wanted`` would change anything we own in ``current``."""
    for key in _COMPARED:
        if (current.get(key) or None) != (wanted.get(key) or None):
            return True
    return (current.get("message") or None) != (wanted.get("message") or None)
