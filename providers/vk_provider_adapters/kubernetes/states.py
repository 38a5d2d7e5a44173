"""What a remote pod says about its instance (``observe``, ``parse_instance``).

The remote pod is the whole pod and B's kubelet restarts its containers per its restart
policy, so the instance is the pod: it runs while the pod's phase is Running, and once the
phase is Succeeded or Failed the pod has ended for good (the agent never relaunches it). Every
container is reported (``statuses``), init containers included.

States, first match wins:

| remote pod                                                    | instance state         |
|---------------------------------------------------------------|------------------------|
| ``metadata.deletionTimestamp`` set                            | TERMINATING            |
| ``status.reason`` Evicted, Preempting, NodeLost, Shutdown,    | LOST                   |
| NodeShutdown, Terminated, UnexpectedAdmissionError, OutOf*;   |                        |
| or condition DisruptionTarget=True                            |                        |
| phase Pending (unscheduled, init containers running, pulling) | PENDING (why it waits) |
| phase Running (even while a container crash-loops or ended)   | RUNNING (podIP)        |
| phase Succeeded                                               | EXITED (0)             |
| phase Failed, an app or init container failed (exit code > 0) | EXITED (exit code)     |
| phase Failed, no container failed (it failed before any ran)  | LOST                   |
| phase Unknown                                                 | LOST                   |

The exit code of a Failed pod is the first failed app container's (in spec order), else the
failed init container's. An ended pod reports every app container, so the agent sees a whole
pod even when B never reported one: one B has no status for is terminated with 0 in a
Succeeded pod, waiting (PodInitializing) in a Failed one. A deleted pod is gone from the API:
``get`` raises ``NotFound`` (never TERMINATED).

Invariants: pure; a pod that is not provably ours (label and annotations) is None, one of ours
that cannot be read is ``MalformedResponse``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Final

from vk_provider.sdk import ContainerState, ContainerStatus, Instance, InstanceState, WorkloadSpec
from vk_provider_adapters.kubernetes.names import (
    ANN_ATTEMPT,
    ANN_OFFER,
    ANN_POD_UID,
    ANN_PRICE,
    LABEL_MANAGED_BY,
    label_value,
)
from vk_provider_adapters.kubernetes.statuses import PodContainers, pod_containers
from vk_provider_adapters.payload import MalformedResponse, mapping, text, timestamp

LOST_REASONS: Final = frozenset(
    {
        "Evicted",
        "Preempting",
        "NodeLost",
        "Shutdown",
        "NodeShutdown",
        "Terminated",
        "UnexpectedAdmissionError",
    }
)


@dataclass(frozen=True, slots=True)
class Observation:
    """What a remote pod says about its instance."""

    state: InstanceState
    message: str = ""
    exit_code: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    containers: tuple[ContainerStatus, ...] = ()
    init_containers: tuple[ContainerStatus, ...] = ()


def _disrupted(status: Mapping[str, object]) -> str | None:
    """Why B took the pod away (eviction, preemption, node loss), if it did."""
    reason = status.get("reason")
    if isinstance(reason, str) and (reason in LOST_REASONS or reason.startswith("OutOf")):
        return reason
    conditions = status.get("conditions")
    for condition in conditions if isinstance(conditions, list) else []:
        if (
            isinstance(condition, dict)
            and condition.get("type") == "DisruptionTarget"
            and condition.get("status") == "True"
        ):
            return str(condition.get("reason") or "DisruptionTarget")
    return None


def _failed(status: ContainerStatus) -> bool:
    return status.state is ContainerState.TERMINATED and (status.exit_code or 0) != 0


def _ended(seen: PodContainers, *, succeeded: bool) -> tuple[ContainerStatus, ...]:
    """Every app container of an ended pod, in spec order (see the module docstring)."""
    reported = {c.name: c for c in seen.apps}
    missing = [
        ContainerStatus(name, ContainerState.TERMINATED, reason="Completed", exit_code=0)
        if succeeded
        else ContainerStatus(name, ContainerState.WAITING, reason="PodInitializing")
        for name in seen.app_names
        if name not in reported
    ]
    return seen.apps + tuple(missing)


def _waiting(seen: PodContainers) -> str:
    """Why a Pending pod's containers wait: the first init container not done, else the first
    app container that waits with a reason."""
    for init in seen.inits:
        if init.state is ContainerState.RUNNING:
            return f"PodInitializing: init container {init.name} is running"
        if _failed(init):  # about to be restarted (or, with Never, to fail the pod)
            return (
                f"{init.reason or 'Error'}: init container {init.name} exited with {init.exit_code}"
            )
        if init.state is ContainerState.WAITING and init.reason:
            return f"{init.reason}: {init.message}" if init.message else init.reason
    for app in seen.apps:
        if app.state is ContainerState.WAITING and app.reason and app.reason != "PodInitializing":
            return f"{app.reason}: {app.message}" if app.message else app.reason
    return ""


def observe(pod: Mapping[str, object]) -> Observation:
    """The state table of the module docstring; raises ``MalformedResponse`` for a phase it
    does not know."""
    metadata = mapping(pod.get("metadata"), "pod metadata")
    status = mapping(pod.get("status"), "pod status")
    seen = pod_containers(pod)
    started = next((c.started_at for c in seen.apps if c.started_at), None)
    base = Observation(
        InstanceState.PENDING,
        started_at=started or timestamp(status.get("startTime")),
        containers=seen.apps,
        init_containers=seen.inits,
    )
    if metadata.get("deletionTimestamp"):
        return replace(base, state=InstanceState.TERMINATING, message="deletion requested")
    message = text(status, "message")
    disruption = _disrupted(status)
    if disruption is not None:
        why = f"{disruption}: {message}" if message else disruption
        return replace(
            base, state=InstanceState.LOST, message=f"pod taken away by the cluster ({why})"
        )
    phase = text(status, "phase")
    if phase == "Pending":
        return replace(base, message=_waiting(seen) or _pending_reason(status))
    if phase == "Running":
        return replace(base, state=InstanceState.RUNNING)
    if phase == "Succeeded" or phase == "Failed":
        return _ended_pod(base, seen, status, succeeded=phase == "Succeeded")
    if phase == "Unknown":
        return replace(
            base, state=InstanceState.LOST, message="the cluster lost contact with the pod's node"
        )
    raise MalformedResponse(f"pod phase {phase!r} is not a Kubernetes pod phase")


def _ended_pod(
    base: Observation, seen: PodContainers, status: Mapping[str, object], *, succeeded: bool
) -> Observation:
    """The rows of a Succeeded or Failed pod."""
    failed = next((c for c in (*seen.apps, *seen.inits) if _failed(c)), None)
    if not succeeded and failed is None:
        why = text(status, "reason") or "Failed"
        ran = any(c.state is ContainerState.TERMINATED for c in (*seen.apps, *seen.inits))
        message = (
            f"pod failed, but none of its containers did ({why})"
            if ran
            else f"pod failed before any container ran ({why})"
        )
        return replace(base, state=InstanceState.LOST, message=message)
    finished = max((c.finished_at for c in seen.apps if c.finished_at), default=None)
    ended = replace(
        base,
        state=InstanceState.EXITED,
        exit_code=0,
        message="Completed",
        finished_at=finished,
        containers=_ended(seen, succeeded=succeeded),
    )
    if failed is None:
        return ended
    return replace(
        ended,
        exit_code=failed.exit_code,
        message=f"container {failed.name}: {failed.reason or 'Error'} (exit code "
        f"{failed.exit_code})",
        finished_at=finished or failed.finished_at,
    )


def _pending_reason(status: Mapping[str, object]) -> str:
    conditions = status.get("conditions")
    for condition in conditions if isinstance(conditions, list) else []:
        if (
            isinstance(condition, dict)
            and condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
        ):
            reason = text(condition, "reason") or "Unschedulable"
            detail = text(condition, "message")
            return f"{reason}: {detail}" if detail else reason
    return "Pending"


def parse_instance(pod: object, *, provider: str) -> Instance | None:
    """The ``Instance`` of a remote pod; None when it is not ours (label and annotations);
    raises ``MalformedResponse`` for a pod of ours that cannot be read."""
    if not isinstance(pod, dict):
        raise MalformedResponse("pod is not a JSON object")
    metadata = mapping(pod.get("metadata"), "pod metadata")
    labels = mapping(metadata.get("labels"), "pod labels")
    if labels.get(LABEL_MANAGED_BY) != label_value(provider):
        return None
    annotations = mapping(metadata.get("annotations"), "pod annotations")
    pod_uid = annotations.get(ANN_POD_UID)
    attempt = annotations.get(ANN_ATTEMPT)
    if not isinstance(pod_uid, str) or not isinstance(attempt, str) or not attempt.isdigit():
        return None  # labelled ours but not made by this adapter: not provably ours
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise MalformedResponse("pod has no name")
    seen = observe(pod)
    status = mapping(pod.get("status"), "pod status")
    ip = status.get("podIP")
    price = annotations.get(ANN_PRICE)
    try:
        price_per_hour = float(price) if isinstance(price, str) else 0.0
    except ValueError:
        price_per_hour = 0.0
    offer_key = annotations.get(ANN_OFFER)
    return Instance(
        provider=provider,
        instance_id=name,
        pod_uid=pod_uid,
        attempt=int(attempt),
        state=seen.state,
        offer_key=offer_key if isinstance(offer_key, str) else "",
        exit_code=seen.exit_code,
        message=seen.message,
        started_at=seen.started_at,
        finished_at=seen.finished_at,
        ip=ip if isinstance(ip, str) and ip else None,
        price_per_hour=price_per_hour,
        containers=seen.containers,
        init_containers=seen.init_containers,
    )


def made_for(instance: Instance, spec: WorkloadSpec) -> bool:
    return instance.pod_uid == spec.pod_uid and instance.attempt == spec.attempt
