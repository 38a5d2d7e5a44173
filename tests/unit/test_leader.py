"""Leader election's pure state machine (``domain.leader``), edge by edge on simulated time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from vk_provider.domain.leader import (
    LeaseRecord,
    Observation,
    Step,
    Timing,
    decide,
    follow_for,
    lease_name,
    next_record,
    observe,
    record_of,
    released,
    spec_of,
    still_leading,
)

TIMING = Timing(lease_duration=15, renew_deadline=10, retry_period=2)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def held_by(holder: str, *, transitions: int = 3) -> LeaseRecord:
    return LeaseRecord(
        holder=holder, duration_seconds=15, acquire_time=T0, renew_time=T0, transitions=transitions
    )


def seen(record: LeaseRecord, *, at: float, version: str = "7") -> Observation:
    return Observation(record=record, resource_version=version, at=at)


# ------------------------------------------------------------------ decide, one test per edge


def test_no_lease_is_created() -> None:
    assert decide(None, identity="a", now=0) is Step.CREATE


def test_our_own_lease_is_renewed_even_long_unchanged() -> None:
    # Also a restarted container with the same identity: it renews at once.
    assert decide(seen(held_by("a"), at=0), identity="a", now=1000) is Step.RENEW


def test_a_released_lease_is_taken_over_at_once() -> None:
    assert decide(seen(held_by(""), at=100), identity="a", now=100) is Step.TAKE_OVER


def test_another_holders_live_lease_is_followed() -> None:
    observation = seen(held_by("b"), at=100)
    assert decide(observation, identity="a", now=100) is Step.WAIT
    assert decide(observation, identity="a", now=114.999) is Step.WAIT


def test_another_holders_lease_unchanged_for_its_duration_is_taken_over() -> None:
    observation = seen(held_by("b"), at=100)
    assert decide(observation, identity="a", now=115) is Step.TAKE_OVER


def test_expiry_uses_the_observed_time_not_the_renew_time() -> None:
    # renewTime says 2026-01-01 (long ago by any wall clock); we saw it change only now, so
    # a skewed clock on the other replica cannot make us take a live lease.
    record = held_by("b")
    assert decide(seen(record, at=5000), identity="a", now=5001) is Step.WAIT


# ------------------------------------------------------------------ observe


def test_the_observed_clock_restarts_only_when_the_version_changes() -> None:
    first = observe(None, held_by("b"), "7", now=10)
    assert observe(first, held_by("b"), "7", now=20) is first
    renewed = observe(first, held_by("b"), "8", now=20)
    assert renewed.at == 20 and renewed.resource_version == "8"


def test_a_leader_renewing_keeps_a_follower_waiting_for_ever() -> None:
    observation = None
    for tick in range(0, 100, 2):  # the leader renews every 2 s: a new version each time
        observation = observe(observation, held_by("b"), str(tick), now=tick)
        assert decide(observation, identity="a", now=tick + 1) is Step.WAIT


def test_a_dead_leader_is_replaced_one_lease_duration_after_its_last_renewal() -> None:
    observation = observe(None, held_by("b"), "1", now=0)
    now = 0.0
    while decide(observation, identity="a", now=now) is Step.WAIT:
        now += 2  # the follower's retry period
        observation = observe(observation, held_by("b"), "1", now=now)
    assert 15 <= now <= 17


def test_a_follower_reads_every_retry_period_and_at_the_moment_of_expiry() -> None:
    assert follow_for(None, now=0, timing=TIMING) == 2
    observation = seen(held_by("b"), at=100)
    assert follow_for(observation, now=100, timing=TIMING) == 2
    assert follow_for(observation, now=114, timing=TIMING) == 1
    assert follow_for(observation, now=120, timing=TIMING) == 0
    assert follow_for(seen(held_by(""), at=100), now=100, timing=TIMING) == 2


def test_a_dead_leader_is_replaced_exactly_one_lease_duration_after_it_was_seen() -> None:
    observation = observe(None, held_by("b"), "1", now=0.5)
    now = 0.5
    while decide(observation, identity="a", now=now) is Step.WAIT:
        now += follow_for(observation, now=now, timing=TIMING)
    assert now == 15.5


# ------------------------------------------------------------------ records written


def test_creating_starts_at_zero_transitions() -> None:
    record = next_record(None, Step.CREATE, identity="a", duration_seconds=15, wall_now=T0)
    assert record == LeaseRecord("a", 15, T0, T0, 0)


def test_renewing_keeps_acquire_time_and_transitions() -> None:
    later = T0 + timedelta(seconds=2)
    record = next_record(
        held_by("a"), Step.RENEW, identity="a", duration_seconds=15, wall_now=later
    )
    assert record.acquire_time == T0 and record.renew_time == later and record.transitions == 3


def test_taking_over_counts_a_transition_and_restarts_acquire_time() -> None:
    later = T0 + timedelta(seconds=20)
    record = next_record(
        held_by("b"), Step.TAKE_OVER, identity="a", duration_seconds=15, wall_now=later
    )
    assert record == LeaseRecord("a", 15, later, later, 4)


def test_waiting_writes_nothing() -> None:
    with pytest.raises(ValueError, match="WAIT"):
        next_record(held_by("b"), Step.WAIT, identity="a", duration_seconds=15, wall_now=T0)


def test_releasing_clears_the_holder_and_keeps_the_count() -> None:
    record = released(held_by("a"), wall_now=T0)
    assert record.holder == "" and record.transitions == 3 and record.duration_seconds == 1
    assert decide(seen(record, at=0), identity="b", now=0) is Step.TAKE_OVER


def test_spec_round_trips_as_the_api_writes_it() -> None:
    record = held_by("a")
    spec = spec_of(record)
    assert spec["renewTime"] == "2026-01-01T00:00:00.000000Z"
    assert spec["holderIdentity"] == "a" and spec["leaseTransitions"] == 3
    assert record_of(spec) == record


def test_a_spec_without_fields_reads_as_free() -> None:
    assert record_of({}) == LeaseRecord(holder="", duration_seconds=1)


# ------------------------------------------------------------------ the leader's own deadline


def test_a_leader_leads_strictly_before_its_renew_deadline() -> None:
    assert still_leading(100, now=109.999, timing=TIMING)
    assert not still_leading(100, now=110, timing=TIMING)
    assert not still_leading(None, now=0, timing=TIMING)


def test_a_leader_stops_before_any_follower_may_take_over() -> None:
    # The follower's clock for the same renewal starts no earlier than the renewal began.
    renewal_started = 100.0
    follower = seen(held_by("b"), at=renewal_started)
    now = renewal_started
    while still_leading(renewal_started, now=now, timing=TIMING):
        assert decide(follower, identity="a", now=now) is Step.WAIT
        now += 0.25


@pytest.mark.parametrize(
    ("duration", "deadline", "retry"), [(10, 10, 2), (15, 10, 10), (15, 10, 0), (15, 20, 2)]
)
def test_timing_refuses_an_unsafe_order(duration: float, deadline: float, retry: float) -> None:
    with pytest.raises(ValueError, match="retry_period < renew_deadline < lease_duration"):
        Timing(lease_duration=duration, renew_deadline=deadline, retry_period=retry)


def test_the_lease_name_derives_from_the_node() -> None:
    assert lease_name("vk-gpu") == "vk-provider-leader-vk-gpu"
