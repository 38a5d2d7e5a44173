"""What a pod's status should say, written as a kubelet writes it. Pure: no I/O, no clock.

The pod controller describes the container with a ``ContainerView`` (waiting, running or
terminated, plus the last termination and restart count) and ``pod_status`` turns it into
the ``status`` object: phase, conditions, containerStatuses, startTime, hostIP(s), podIP(s).

Invariants:
- ``startTime`` and each condition's ``lastTransitionTime`` are kept from the current status
  when unchanged, so rewriting the same state is a no-op (``status_changed`` is False).
- Exactly one of waiting/running/terminated is set in ``state``.
"""

from __future__ import annotations

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
    )


def waiting_view(pod: PodView, reason: str, message: str = "") -> ContainerView:
    """The container waiting for ``reason``, keeping its restart count and last termination."""
    return ContainerView(
        name=pod.container_name,
        image=pod.container_image,
        state=Waiting(reason=reason, message=message),
        restart_count=pod.status.restart_count,
        last_state=pod.status.last_termination,
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


def container_status(view: ContainerView) -> JSON:
    running = isinstance(view.state, Running)
    body: JSON = {
        "name": view.name,
        "image": view.image,
        "imageID": "",
        "ready": running,
        "started": running,
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


def pod_phase(view: ContainerView, restart_policy: str) -> str:
    state = view.state
    if isinstance(state, Running):
        return "Running"
    if isinstance(state, Terminated):
        if restart_policy == "Always" or (restart_policy == "OnFailure" and state.exit_code):
            return "Running"  # a kubelet keeps a restarting pod Running
        return "Succeeded" if state.exit_code == 0 else "Failed"
    if view.restart_count > 0 or view.last_state is not None:
        return "Running"  # waiting to restart (CrashLoopBackOff) after having run
    return "Pending"


def pod_status(
    pod: PodView,
    view: ContainerView,
    *,
    now: datetime,
    host_ip: str,
    pod_ip: str | None,
    phase: str | None = None,
    reason: str = "",
    message: str = "",
) -> JSON:
    """The full status to write (phase is derived from ``view`` unless given)."""
    current: JSON = pod.raw.get("status") or {}
    phase = phase or pod_phase(view, pod.restart_policy)
    previous = {c.get("type"): c for c in current.get("conditions") or []}
    running = isinstance(view.state, Running)
    terminal = phase in TERMINAL_PHASES
    ready = running and not terminal
    not_ready = "PodCompleted" if terminal else "ContainersNotReady"
    conditions = [
        _condition("PodReadyToStartContainers", bool(view.container_id), now, previous),
        _condition("Initialized", True, now, previous),
        _condition("Ready", ready, now, previous, not_ready),
        _condition("ContainersReady", ready, now, previous, not_ready),
        _condition("PodScheduled", True, now, previous),
    ]
    status: JSON = {
        "phase": phase,
        "conditions": conditions,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": current.get("startTime") or rfc3339(now),
        "containerStatuses": [container_status(view)],
        "qosClass": current.get("qosClass") or "BestEffort",
        "reason": reason or None,
        "message": message or None,
    }
    # An IP, once known, stays until the pod ends (a waiting view does not know it).
    pod_ip = pod_ip or current.get("podIP")
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    return status


_COMPARED = ("phase", "conditions", "hostIP", "podIP", "startTime", "containerStatuses", "reason")


def status_changed(current: JSON, wanted: JSON) -> bool:
    """Whether writing ``wanted`` would change anything we own in ``current``."""
    for key in _COMPARED:
        if (current.get(key) or None) != (wanted.get(key) or None):
            return True
    return (current.get("message") or None) != (wanted.get("message") or None)
