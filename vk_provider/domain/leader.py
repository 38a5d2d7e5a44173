"""Leader election on a ``coordination.k8s.io/v1`` Lease, as a pure state machine.

Two replicas of the agent share one virtual node; exactly one of them (the leader) may write
the node, the pods or the providers. This module decides, from what the Lease says, who this
replica is and what it should do next; ``controllers.leader`` reads and writes the Lease and
sleeps. It follows client-go's ``leaderelection`` package:

- A Lease record names its ``holderIdentity``, ``leaseDurationSeconds``, ``acquireTime``,
  ``renewTime`` and ``leaseTransitions``; writes go through ``resourceVersion`` (optimistic
  concurrency), so of two replicas racing for an expired lease one wins and one gets a 409.
- Expiry is judged on the *follower's own clock*: a record is expired when it has not changed
  for ``leaseDurationSeconds`` since this replica first saw it (``Observation.at``, monotonic
  time), never by comparing ``renewTime`` with the local wall clock — replicas' clocks may
  disagree; their rates do not (much).
- The leader stops leading on its own deadline: ``renew_deadline`` after the *start* of its
  last successful renewal (``still_leading``). That deadline is shorter than the lease
  duration, and a follower's clock for the same renewal starts no earlier than the write, so
  the old leader has stopped before a follower may take over — even when the old leader was
  frozen (SIGSTOP) and wakes up late: then ``still_leading`` is already false when it wakes.

Invariants: no clock is read here (``now`` is passed in: monotonic seconds for decisions, a
wall-clock ``datetime`` only for the times written into the record); every edge of ``decide``
is one comment and one unit test (``tests/unit/test_leader.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from enum import Enum
from typing import Any

from vk_provider.domain.podview import micro_time, parse_time


class Step(Enum):
    """What a replica does after reading the Lease."""

    CREATE = "create"  # no Lease exists: create it, holding it
    RENEW = "renew"  # we hold it: write a new renewTime
    TAKE_OVER = "take-over"  # free (released) or expired: write ourselves as holder
    WAIT = "wait"  # another replica holds a live lease: follow, read again later


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The election fields of a Lease's spec (``holder`` empty when nobody holds it)."""

    holder: str
    duration_seconds: int
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    transitions: int = 0


@dataclass(frozen=True, slots=True)
class Observation:
    """A record as this replica last saw it change: its resourceVersion and local time."""

    record: LeaseRecord
    resource_version: str
    at: float  # monotonic seconds when this replica first saw this version


@dataclass(frozen=True, slots=True)
class Timing:
    """client-go's three durations (kube-controller-manager: 15 s, 10 s, 2 s)."""

    lease_duration: float
    renew_deadline: float
    retry_period: float

    def __post_init__(self) -> None:
        # Checked by the settings with field names; repeated here because the safety of the
        # hand-over rests on it: the leader must give up before a follower may take over.
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("need 0 < retry_period < renew_deadline < lease_duration")


def observe(
    previous: Observation | None, record: LeaseRecord, resource_version: str, *, now: float
) -> Observation:
    """The observation after reading ``record``: the clock restarts only when it changed."""
    if previous is not None and previous.resource_version == resource_version:
        return previous
    return Observation(record=record, resource_version=resource_version, at=now)


def decide(observation: Observation | None, *, identity: str, now: float) -> Step:
    """The next step of replica ``identity`` given the Lease it just read (None: no Lease)."""
    if observation is None:
        # No Lease at all: the first replica to create it leads; a racing one gets a 409.
        return Step.CREATE
    record = observation.record
    if record.holder == identity:
        # Ours (also after a container restart with the same identity): keep renewing.
        return Step.RENEW
    if not record.holder:
        # Released (a leader that stopped cleanly cleared the holder): take it at once.
        return Step.TAKE_OVER
    if now >= observation.at + record.duration_seconds:
        # Unchanged for a whole lease duration on our clock: its holder is gone.
        return Step.TAKE_OVER
    # Another replica holds a live lease: follow.
    return Step.WAIT


def follow_for(observation: Observation | None, *, now: float, timing: Timing) -> float:
    """How long a follower sleeps before reading again: a retry period, or less when the
    lease it follows expires sooner (so a dead leader is replaced as soon as allowed)."""
    if observation is None or not observation.record.holder:
        return timing.retry_period
    expires_in = observation.at + observation.record.duration_seconds - now
    return min(timing.retry_period, max(expires_in, 0.0))


def next_record(
    current: LeaseRecord | None,
    step: Step,
    *,
    identity: str,
    duration_seconds: int,
    wall_now: datetime,
) -> LeaseRecord:
    """The record to write for ``step`` (CREATE, RENEW or TAKE_OVER)."""
    if step is Step.WAIT:
        raise ValueError("WAIT writes nothing")
    if step is Step.RENEW and current is not None:
        # Same holder: acquireTime and the transition count stay.
        return replace(current, duration_seconds=duration_seconds, renew_time=wall_now)
    transitions = 0 if current is None else current.transitions + 1
    return LeaseRecord(
        holder=identity,
        duration_seconds=duration_seconds,
        acquire_time=wall_now,
        renew_time=wall_now,
        transitions=transitions,
    )


def released(current: LeaseRecord, *, wall_now: datetime) -> LeaseRecord:
    """What a leader that stops cleanly writes (client-go's ``ReleaseOnCancel``): no holder,
    so a follower takes over on its next read instead of after a whole lease duration."""
    return replace(
        current, holder="", duration_seconds=1, acquire_time=wall_now, renew_time=wall_now
    )


def still_leading(last_renewal_start: float | None, *, now: float, timing: Timing) -> bool:
    """Whether a leader whose last successful renewal *started* at ``last_renewal_start``
    may still act: strictly before its renew deadline."""
    return last_renewal_start is not None and now < last_renewal_start + timing.renew_deadline


def lease_name(node_name: str) -> str:
    """The election Lease's name for a node: one election per virtual node."""
    return f"vk-provider-leader-{node_name}"


def record_of(spec: Mapping[str, Any]) -> LeaseRecord:
    """A Lease's ``spec`` as a record (absent fields as the API defaults them)."""
    duration = spec.get("leaseDurationSeconds")
    transitions = spec.get("leaseTransitions")
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration_seconds=duration if isinstance(duration, int) and duration > 0 else 1,
        acquire_time=parse_time(spec.get("acquireTime")),
        renew_time=parse_time(spec.get("renewTime")),
        transitions=transitions if isinstance(transitions, int) else 0,
    )


def spec_of(record: LeaseRecord) -> dict[str, Any]:
    """The Lease ``spec`` that says ``record`` (MicroTime with six fractional digits)."""
    spec: dict[str, Any] = {
        "holderIdentity": record.holder,
        "leaseDurationSeconds": record.duration_seconds,
        "leaseTransitions": record.transitions,
    }
    if record.acquire_time is not None:
        spec["acquireTime"] = micro_time(record.acquire_time)
    if record.renew_time is not None:
        spec["renewTime"] = micro_time(record.renew_time)
    return spec
