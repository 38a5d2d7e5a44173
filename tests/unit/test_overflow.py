"""The overflow flip's decision (``domain.overflow``): hysteresis, missing data, the taint.

Sequences of readings are replayed through ``step`` with explicit times; the expected
transitions are written out here from docs/overflow.md, not derived from the module.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vk_provider.domain.overflow import (
    Flip,
    OverflowPolicy,
    OverflowState,
    Reading,
    condition_fields,
    needed_free,
    overflow_taints,
    stale,
    state_from_taints,
    step,
)

OPEN, CLOSED = OverflowState.OPEN, OverflowState.CLOSED
POLICY = OverflowPolicy(open_after=10, close_after=30)
FULL = Reading(allocatable=32, requested=32, unscheduled=6)
ROOM = Reading(allocatable=32, requested=8)
ONE_FREE = Reading(allocatable=32, requested=31)
KEY, VALUE = "virtual-kubelet.io/provider", "vk-provider"


def replay(
    readings: Sequence[tuple[float, Reading | None]],
    *,
    start: OverflowState = CLOSED,
    policy: OverflowPolicy = POLICY,
    needed: int = 1,
) -> list[tuple[float, OverflowState]]:
    """The (time, state) of every transition."""
    flip = Flip(start)
    moves = []
    for now, reading in readings:
        flip, transition = step(flip, reading, now=now, policy=policy, needed=needed)
        if transition is not None:
            assert transition.to is flip.state
            moves.append((now, transition.to))
    return moves


def every(period: float, until: float, reading: Reading | None, *, start: float = 0.0):
    t = start
    out = []
    while t <= until:
        out.append((t, reading))
        t += period
    return out


def test_opens_once_the_own_gpus_were_full_for_open_after() -> None:
    assert replay(every(5, 20, FULL)) == [(10, OPEN)]


def test_a_break_in_fullness_restarts_the_open_timer() -> None:
    readings = [(0, FULL), (5, FULL), (8, ONE_FREE), (10, FULL), (15, FULL), (20, FULL)]
    assert replay(readings) == [(20, OPEN)]


def test_closes_once_enough_gpus_were_free_for_close_after() -> None:
    readings = every(5, 60, ROOM)
    assert replay(readings, start=OPEN) == [(30, CLOSED)]


def test_a_full_reading_restarts_the_close_timer() -> None:
    readings = [*every(5, 25, ROOM), (27, FULL), *every(5, 60, ROOM, start=30)]
    assert replay(readings, start=OPEN) == [(60, CLOSED)]


def test_too_few_free_gpus_do_not_close() -> None:
    # Two free GPUs are needed (the smallest pod on the node asks for two); one is not enough.
    assert replay(every(5, 120, ONE_FREE), start=OPEN, needed=2) == []
    assert replay(every(5, 120, Reading(32, 30)), start=OPEN, needed=2) == [(30, CLOSED)]


def test_missing_data_keeps_the_state_and_restarts_the_timers() -> None:
    readings = [(0, FULL), (5, FULL), (8, None), (10, FULL), (15, FULL), (20, FULL)]
    assert replay(readings) == [(20, OPEN)]
    # An outage never flips, however long.
    assert replay(every(5, 600, None)) == []
    assert replay(every(5, 600, None), start=OPEN) == []


def test_missing_data_is_remembered_until_a_reading_works() -> None:
    flip, _ = step(Flip(OPEN), None, now=0, policy=POLICY, needed=1)
    assert flip == Flip(OPEN, None, None, signal_ok=False)
    flip, _ = step(flip, FULL, now=5, policy=POLICY, needed=1)
    assert flip.signal_ok and flip.state is OPEN


def test_no_flapping_around_the_boundary() -> None:
    # Alternating full / one free every 5 s for ten minutes: never full (or free) for 10 s.
    readings = [(t, FULL if (t // 5) % 2 == 0 else ONE_FREE) for t in range(0, 600, 5)]
    assert replay(readings) == []
    assert replay(readings, start=OPEN) == []


def test_the_whole_story_changes_state_exactly_twice() -> None:
    readings = [
        *every(5, 60, ROOM),  # inference fits at home
        *every(5, 300, FULL, start=65),  # training takes every GPU
        *every(5, 600, ROOM, start=305),  # training ends
    ]
    assert replay(readings) == [(75, OPEN), (335, CLOSED)]


def test_zero_delays_flip_on_the_first_reading() -> None:
    policy = OverflowPolicy(open_after=0, close_after=0)
    assert replay([(0, FULL), (1, ROOM)], policy=policy) == [(0, OPEN), (1, CLOSED)]


@pytest.mark.parametrize(
    ("requests", "configured", "expected"),
    [
        ([], None, 1),
        ([0.0, 0.0], None, 1),
        ([4.0, 1.0, 8.0], None, 1),
        ([8.0, 2.0], None, 2),
        ([1.5], None, 2),
        ([1.0], 4, 4),
    ],
)
def test_needed_free(requests: list[float], configured: int | None, expected: int) -> None:
    policy = OverflowPolicy(close_min_free_gpus=configured)
    assert needed_free(policy, requests) == expected


def test_an_empty_cluster_is_never_full() -> None:
    assert not Reading(allocatable=0, requested=0).full
    assert Reading(allocatable=0, requested=0).free == 0


TAINTS = st.lists(
    st.fixed_dictionaries(
        {
            "key": st.sampled_from([KEY, "node.kubernetes.io/not-ready", "gpu", "other"]),
            "value": st.sampled_from(["", "vk-provider", "x"]),
            "effect": st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"]),
        }
    ),
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(TAINTS, st.sampled_from([OPEN, CLOSED]))
def test_overflow_taints_keep_others_and_never_say_no_execute(
    current: list[dict[str, str]], state: OverflowState
) -> None:
    result = overflow_taints(current, state, key=KEY, value=VALUE)
    ours = [t for t in result if t["key"] == KEY]
    assert ours == [
        {
            "key": KEY,
            "value": VALUE,
            "effect": "NoSchedule" if state is CLOSED else "PreferNoSchedule",
        }
    ]
    assert [t for t in result if t["key"] != KEY] == [t for t in current if t["key"] != KEY]
    assert state_from_taints(result, key=KEY) is state
    # Applying it again changes nothing (level-triggered writes are idempotent).
    assert overflow_taints(result, state, key=KEY, value=VALUE) == result


@pytest.mark.parametrize(
    ("effects", "state"),
    [
        ([], CLOSED),
        (["NoSchedule"], CLOSED),
        (["PreferNoSchedule"], OPEN),
        (["PreferNoSchedule", "NoSchedule"], CLOSED),
        (["NoExecute"], CLOSED),
    ],
)
def test_state_from_taints_reads_closed_unless_only_prefer_no_schedule(
    effects: list[str], state: OverflowState
) -> None:
    taints = [{"key": KEY, "value": VALUE, "effect": e} for e in effects]
    taints.append({"key": "other", "effect": "PreferNoSchedule"})
    assert state_from_taints(taints, key=KEY) is state


def test_the_condition_says_why() -> None:
    assert condition_fields(Flip(OPEN), FULL, "") == (
        "True",
        "OwnGPUsFull",
        "overflow open: own GPUs 32 of 32 requested, 0 free, 6 wanted by unscheduled pods",
    )
    assert condition_fields(Flip(CLOSED), ROOM, "")[:2] == ("False", "OwnGPUsFree")
    status, reason, message = condition_fields(
        Flip(OPEN, signal_ok=False), FULL, "connection refused"
    )
    assert (status, reason) == ("True", "SignalUnavailable")
    assert "keeping the overflow open" in message and "connection refused" in message


def _sampled(reading: Reading, at: float) -> Reading:
    return Reading(
        reading.allocatable, reading.requested, reading.unscheduled, reading.unfit, sampled_at=at
    )


def test_one_old_sample_read_again_and_again_never_opens() -> None:
    """Prometheus evaluating every 60 s: the agent reads the same full sample at every 5-s
    tick. Only a second sample 60 s later shows the own GPUs full for open_after."""
    ticks = [(t, _sampled(FULL, 1000.0)) for t in range(1000, 1060, 5)]
    assert replay(ticks) == []
    later = [*ticks, (1060, _sampled(FULL, 1060.0))]
    assert replay(later) == [(1060, OPEN)]


def test_the_run_is_measured_by_sample_time_not_by_the_agents_clock() -> None:
    """Samples 2 s apart read by a slow agent 20 s apart: the run is 2 s, not 20."""
    readings = [(0, _sampled(FULL, 0.0)), (20, _sampled(FULL, 2.0))]
    assert replay(readings) == []


def test_a_reading_older_than_max_sample_age_is_stale() -> None:
    policy = OverflowPolicy(max_sample_age=60)
    assert stale(_sampled(FULL, 1000.0), now=1060, policy=policy) is None
    why = stale(_sampled(FULL, 1000.0), now=1090, policy=policy)
    assert why is not None and "90s old" in why and "max_sample_age_seconds 60" in why
    assert stale(FULL, now=10**9, policy=policy) is None  # no timestamp: taken when read


def test_a_pending_pod_that_fits_no_own_node_opens_with_gpus_free() -> None:
    """Fragmentation: 8 GPUs free in all, but no node has the 8 a pending pod asks for."""
    fragmented = Reading(allocatable=16, requested=8, unscheduled=8, unfit=8)
    assert fragmented.full and fragmented.free == 8
    assert replay(every(5, 10, fragmented)) == [(10, OPEN)]
    assert "8 of them fit no own node" in fragmented.describe()


def test_free_gpus_do_not_close_while_a_pending_pod_fits_no_own_node() -> None:
    fragmented = Reading(allocatable=16, requested=8, unscheduled=8, unfit=8)
    assert replay(every(5, 300, fragmented), start=OPEN) == []


def test_every_own_node_cordoned_with_demand_is_full() -> None:
    assert Reading(allocatable=0, requested=0, unscheduled=1, unfit=1).full
    assert not Reading(allocatable=0, requested=0).full
