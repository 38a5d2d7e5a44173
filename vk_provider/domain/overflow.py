"""The overflow flip, decided: when the virtual node takes the cluster's overflow. Pure.

The signal is how many GPUs the cluster's own nodes have (allocatable) and how many pods
bound to them request (``Reading``, from Prometheus). The flip is **closed** while the own
GPUs have room (the virtual node carries the overflow taint with effect NoSchedule: nothing
lands there unless it tolerates the taint) and **open** while they are full (the taint's
effect is PreferNoSchedule: pods that find no room at home land on the virtual node, and the
scheduler still prefers own nodes that have room). Never NoExecute: that would evict every
pod on the virtual node at once, bypassing PodDisruptionBudgets.

The own GPUs count as **full** when every GPU of the usable own nodes is requested, or when a
pending pod fits no single own node (``unfit``: fragmentation, or every own node cordoned).

``step`` is level-triggered with hysteresis: it opens once the own GPUs have been full for
``open_after`` seconds without a break, and closes once at least ``needed_free`` own GPUs
have been free for ``close_after`` seconds without a break. The seconds are those of the
samples (``Reading.sampled_at``, the Prometheus timestamp of the rule's evaluation), not of
the agent's ticks: the same sample read twice is not fresh and moves nothing, so a run needs
samples that span ``open_after``, however slowly Prometheus evaluates. A reading that is
missing (the signal could not be read, or its newest sample is older than
``max_sample_age``: ``stale``) keeps the state and restarts both timers, so the flip never
moves on missing data. ``overflow_taints`` is the node's taint list for a state (other
taints kept).

Invariants: at most one transition per step; a transition needs an unbroken run of fresh
readings that call for it, spanning the delay by their own timestamps; no function here
returns a NoExecute overflow taint.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

JSON = dict[str, Any]


class OverflowState(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class OverflowQueries:
    allocatable: str
    requested: str
    unscheduled: str
    unfit: str = ""  # "": no fragmentation signal


@dataclass(frozen=True, slots=True)
class OverflowPolicy:
    open_after: float = 10.0
    close_after: float = 60.0
    close_min_free_gpus: int | None = None  # None: the smallest GPU request on the node
    max_sample_age: float = 180.0  # seconds; an older newest sample is a lost signal


@dataclass(frozen=True, slots=True)
class Reading:
    """Usable own GPUs: allocatable, requested by Pending/Running pods bound there;
    unscheduled demand, and the part of it no single own node can take (``unfit``);
    ``sampled_at`` the Unix time of the samples (None: when read)."""

    allocatable: float
    requested: float
    unscheduled: float = 0.0
    unfit: float = 0.0
    sampled_at: float | None = None

    @property
    def full(self) -> bool:
        return (self.allocatable > 0 and self.requested >= self.allocatable) or self.unfit > 0

    @property
    def free(self) -> float:
        return max(self.allocatable - self.requested, 0.0)

    def describe(self) -> str:
        unfit = f" ({self.unfit:g} of them fit no own node)" if self.unfit > 0 else ""
        return (
            f"own GPUs {self.requested:g} of {self.allocatable:g} requested, "
            f"{self.free:g} free, {self.unscheduled:g} wanted by unscheduled pods{unfit}"
        )


@dataclass(frozen=True, slots=True)
class Flip:
    """What the flip remembers between steps (Unix seconds of samples)."""

    state: OverflowState
    full_since: float | None = None
    free_since: float | None = None
    signal_ok: bool = True
    last_sample: float | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    to: OverflowState
    reason: str
    message: str


def needed_free(policy: OverflowPolicy, gpu_requests: Iterable[float]) -> int:
    """Free own GPUs that are enough to close: configured, else the smallest GPU request of
    the virtual node's pods (so at least one of them fits at home), at least 1."""
    if policy.close_min_free_gpus is not None:
        return policy.close_min_free_gpus
    wanted = [r for r in gpu_requests if r > 0]
    return max(1, math.ceil(min(wanted))) if wanted else 1


def stale(reading: Reading, *, now: float, policy: OverflowPolicy) -> str | None:
    """Why ``reading`` is too old to decide on (its newest sample), or None."""
    if reading.sampled_at is None:
        return None
    age = now - reading.sampled_at
    if age <= policy.max_sample_age:
        return None
    return (
        f"the newest sample is {age:.0f}s old (more than max_sample_age_seconds "
        f"{policy.max_sample_age:g}): is the rule group evaluated?"
    )


def step(
    flip: Flip, reading: Reading | None, *, now: float, policy: OverflowPolicy, needed: int
) -> tuple[Flip, Transition | None]:
    """The flip after one evaluation at ``now`` (Unix seconds), and the transition it made."""
    if reading is None:
        return replace(flip, full_since=None, free_since=None, signal_ok=False), None
    at = now if reading.sampled_at is None else reading.sampled_at
    if flip.signal_ok and flip.last_sample is not None and at <= flip.last_sample:
        return flip, None  # the sample already counted: nothing new happened
    full_since = (at if flip.full_since is None else flip.full_since) if reading.full else None
    enough = reading.free >= needed and not reading.full
    free_since = (at if flip.free_since is None else flip.free_since) if enough else None
    after = Flip(flip.state, full_since, free_since, signal_ok=True, last_sample=at)
    if (
        flip.state is OverflowState.CLOSED
        and full_since is not None
        and at - full_since >= policy.open_after
    ):
        message = (
            f"overflow opened: own GPUs full for {at - full_since:.0f}s "
            f"({reading.describe()}); pods that find no room at home now run here"
        )
        return Flip(OverflowState.OPEN, last_sample=at), Transition(
            OverflowState.OPEN, "OwnGPUsFull", message
        )
    if (
        flip.state is OverflowState.OPEN
        and free_since is not None
        and at - free_since >= policy.close_after
    ):
        message = (
            f"overflow closed: at least {needed} own GPU(s) free for {at - free_since:.0f}s "
            f"({reading.describe()}); no new pods land here, the descheduler moves the "
            "others home one by one"
        )
        return Flip(OverflowState.CLOSED, last_sample=at), Transition(
            OverflowState.CLOSED, "OwnGPUsFree", message
        )
    return after, None


def held_open(
    flip: Flip, transition: Transition | None, *, reason: str, now: float
) -> tuple[Flip, Transition | None]:
    """The flip after ``step`` while a hand-over needs the overflow open (``reason`` says
    whose; "" when none does): a closed flip opens at once, an open one does not close, and
    samples computed before ``now`` never count once the hold ends (they describe the own
    GPUs before the training that the hand-over released took them)."""
    if not reason:
        return flip, transition
    seen = now if flip.last_sample is None else max(flip.last_sample, now)
    held = replace(
        flip, state=OverflowState.OPEN, full_since=None, free_since=None, last_sample=seen
    )
    if flip.state is OverflowState.OPEN or (
        transition is not None and transition.to is OverflowState.CLOSED
    ):
        opened = transition if transition and transition.to is OverflowState.OPEN else None
        return held, opened
    return held, Transition(
        OverflowState.OPEN,
        "Handover",
        f"overflow opened for {reason}: the pods it displaces run here before the training "
        "takes their GPUs",
    )


def overflow_taint(state: OverflowState, *, key: str, value: str) -> JSON:
    effect = "NoSchedule" if state is OverflowState.CLOSED else "PreferNoSchedule"
    return {"key": key, "value": value, "effect": effect}


def overflow_taints(
    current: Sequence[Mapping[str, Any]], state: OverflowState, *, key: str, value: str
) -> list[JSON]:
    """The node's taints for ``state``: others' kept in order, the overflow taint last (any
    other taint with the overflow key — a NoExecute one above all — is replaced)."""
    others = [dict(t) for t in current if t.get("key") != key]
    return [*others, overflow_taint(state, key=key, value=value)]


def state_from_taints(current: Sequence[Mapping[str, Any]], *, key: str) -> OverflowState:
    """What the node's taints say the flip is: open only with the PreferNoSchedule taint
    alone (a fresh or hand-edited node reads as closed, the safe side)."""
    effects = {t.get("effect") for t in current if t.get("key") == key}
    return OverflowState.OPEN if effects == {"PreferNoSchedule"} else OverflowState.CLOSED


CONDITION = "Overflow"


def condition_fields(flip: Flip, reading: Reading | None, error: str) -> tuple[str, str, str]:
    """(status, reason, message) of the node's ``Overflow`` condition."""
    status = "True" if flip.state is OverflowState.OPEN else "False"
    if not flip.signal_ok:
        return (
            status,
            "SignalUnavailable",
            f"keeping the overflow {flip.state.value}: the GPU signal cannot be read ({error})",
        )
    detail = reading.describe() if reading else "no reading yet"
    if flip.state is OverflowState.OPEN:
        return status, "OwnGPUsFull", f"overflow open: {detail}"
    return status, "OwnGPUsFree", f"overflow closed: {detail}"
