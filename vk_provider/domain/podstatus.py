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

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from vk_provider.domain import podview

JSON = dict[str, Any]


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


@dataclass(frozen=True, slots=True)
class ContainerView:
    name: str
    image: str
    state: ContainerState
    container_id: str = ""
    last_state: Terminated | None = None
    restart_count: int = 0


def terminated_from_json(body: Mapping[str, Any]) -> Terminated:
    return Terminated(
        exit_code=int(body.get("exitCode", 0)),
        reason=str(body.get("reason", "")),
        started_at=podview.parse_time(body.get("startedAt")),
        finished_at=podview.parse_time(body.get("finishedAt")),
        message=str(body.get("message", "")),
    )


def last_termination(pod: Mapping[str, Any]) -> Terminated | None:
    """The container's last termination, as the pod's status records it."""
    last = (podview.container_status(pod).get("lastState") or {}).get("terminated")
    return terminated_from_json(last) if last else None


def waiting_view(pod: Mapping[str, Any], reason: str, message: str = "") -> ContainerView:
    """The container waiting for ``reason``, keeping its restart count and last termination."""
    container = podview.container_spec(pod)
    return ContainerView(
        name=str(container.get("name", "")),
        image=str(container.get("image", "")),
        state=Waiting(reason=reason, message=message),
        restart_count=podview.restart_count(pod),
        last_state=last_termination(pod),
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
    pod: JSON,
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
    current: JSON = pod.get("status") or {}
    restart_policy = str((pod.get("spec") or {}).get("restartPolicy") or "Always")
    phase = phase or pod_phase(view, restart_policy)
    previous = {c.get("type"): c for c in current.get("conditions") or []}
    running = isinstance(view.state, Running)
    terminal = phase in ("Succeeded", "Failed")
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
