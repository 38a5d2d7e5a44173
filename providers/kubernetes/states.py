"""What a remote pod says about its instance (``observe``, ``parse_instance``).

States, first match wins:

| remote pod                                                    | instance state      |
|---------------------------------------------------------------|---------------------|
| ``metadata.deletionTimestamp`` set                            | TERMINATING         |
| ``status.reason`` Evicted, Preempting, NodeLost, Shutdown,    | LOST                |
| NodeShutdown, Terminated, UnexpectedAdmissionError, OutOf*;   |                     |
| or condition DisruptionTarget=True                            |                     |
| phase Pending (unscheduled, ContainerCreating, pulling, ...)  | PENDING             |
| phase Running, container running                              | RUNNING (podIP)     |
| phase Running/Succeeded/Failed, container terminated          | EXITED (exit code)  |
| phase Succeeded without a container status                    | EXITED (0)          |
| phase Failed without a terminated container                   | LOST                |
| phase Unknown                                                 | LOST                |

A deleted pod is gone from the API: ``get`` raises ``NotFound`` (never TERMINATED).

Invariants: pure; a pod that is not provably ours (label and annotations) is None, one of ours
that cannot be read is ``MalformedResponse``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from providers.kubernetes.names import (
    ANN_ATTEMPT,
    ANN_OFFER,
    ANN_POD_UID,
    ANN_PRICE,
    LABEL_MANAGED_BY,
    label_value,
)
from providers.payload import MalformedResponse, mapping, text, timestamp
from vk_provider.domain.models import Instance, InstanceState, WorkloadSpec

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


def _container_state(status: Mapping[str, object]) -> Mapping[str, object]:
    statuses = status.get("containerStatuses")
    if not isinstance(statuses, list) or not statuses or not isinstance(statuses[0], dict):
        return {}
    state = statuses[0].get("state")
    return state if isinstance(state, dict) else {}


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


def observe(pod: Mapping[str, object]) -> Observation:
    """The state table of the module docstring; raises ``MalformedResponse`` for a phase it
    does not know."""
    metadata = mapping(pod.get("metadata"), "pod metadata")
    status = mapping(pod.get("status"), "pod status")
    state = _container_state(status)
    running = mapping(state.get("running"), "container state running")
    terminated = mapping(state.get("terminated"), "container state terminated")
    waiting = mapping(state.get("waiting"), "container state waiting")
    started = timestamp(running.get("startedAt")) or timestamp(terminated.get("startedAt"))
    finished = timestamp(terminated.get("finishedAt"))
    exit_code = terminated.get("exitCode") if terminated else None
    code = exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None
    if metadata.get("deletionTimestamp"):
        return Observation(InstanceState.TERMINATING, "deletion requested", code, started, finished)
    message = text(status, "message")
    disruption = _disrupted(status)
    if disruption is not None:
        why = f"{disruption}: {message}" if message else disruption
        return Observation(InstanceState.LOST, f"pod taken away by the cluster ({why})")
    phase = text(status, "phase")
    if phase == "Pending":
        why = text(waiting, "reason") or _pending_reason(status)
        detail = text(waiting, "message")
        return Observation(InstanceState.PENDING, f"{why}: {detail}" if detail else why)
    if phase in ("Running", "Succeeded", "Failed") and terminated:
        reason = text(terminated, "reason")
        return Observation(
            InstanceState.EXITED, reason, code if code is not None else 1, started, finished
        )
    if phase == "Running":
        return Observation(
            InstanceState.RUNNING, "", None, started or timestamp(status.get("startTime"))
        )
    if phase == "Succeeded":
        return Observation(InstanceState.EXITED, "Completed", 0, started, finished)
    if phase == "Failed":
        why = text(status, "reason") or "Failed"
        return Observation(InstanceState.LOST, f"pod failed before its container ran ({why})")
    if phase == "Unknown":
        return Observation(InstanceState.LOST, "the cluster lost contact with the pod's node")
    raise MalformedResponse(f"pod phase {phase!r} is not a Kubernetes pod phase")


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
    )


def made_for(instance: Instance, spec: WorkloadSpec) -> bool:
    return instance.pod_uid == spec.pod_uid and instance.attempt == spec.attempt
