"""The pod lifecycle table, edge by edge, and the classifiers that choose the edge.

Each (context, condition) pair of ``lifecycle.TABLE`` is built from a real pod and a real
instance here and driven through ``decide``; the expected step is written out again in this
file (not read from the table), so a changed edge fails its own row.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from vk_provider.domain.containers import ContainerState, ContainerStatus
from vk_provider.domain.lifecycle import (
    MISSING,
    NOT_PLACED,
    TABLE,
    UNREACHABLE,
    Condition,
    Context,
    Sighting,
    Step,
    crash_backoff,
    decide,
    next_attempt,
    start_poll_delay,
)
from vk_provider.domain.models import Instance, InstanceState
from vk_provider.domain.podview import ANN_INSTANCE, ANN_OFFER, ANN_PRICE, ANN_PROVIDER, PodView

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
RESTART_BACKOFF = 10.0
SLACK = 5.0


def pod(
    *,
    context: Context = Context.LIVE,
    placed: bool = True,
    policy: str = "Always",
    restart_count: int = 0,
) -> PodView:
    metadata: dict[str, Any] = {"namespace": "ns", "name": "p", "uid": "u1"}
    status: dict[str, Any] = {"phase": "Running"}
    if placed:
        metadata["annotations"] = {
            ANN_PROVIDER: "prov",
            ANN_INSTANCE: "i1",
            ANN_OFFER: "prov/sku/r",
            ANN_PRICE: "1.5000",
        }
    if context is Context.DELETING:
        metadata["deletionTimestamp"] = (NOW + timedelta(seconds=20)).strftime("%Y-%m-%dT%H:%M:%SZ")
    if context is Context.OVERDUE:
        metadata["deletionTimestamp"] = (NOW - timedelta(seconds=SLACK + 1)).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )
    if context is Context.ENDED:
        status["phase"] = "Failed"
    status["containerStatuses"] = [{"name": "main", "restartCount": restart_count, "state": {}}]
    raw = {
        "metadata": metadata,
        "spec": {"nodeName": "vk", "restartPolicy": policy, "containers": [{"name": "main"}]},
        "status": status,
    }
    return PodView.parse(raw)


def instance(
    state: InstanceState,
    *,
    exit_code: int | None = None,
    finished_ago: float = 0.0,
    attempt: int = 0,
) -> Instance:
    return Instance(
        provider="prov",
        instance_id="i1",
        pod_uid="u1",
        attempt=attempt,
        state=state,
        exit_code=exit_code,
        finished_at=NOW - timedelta(seconds=finished_ago),
    )


def sighting_for(condition: Condition) -> tuple[Sighting, str, bool]:
    """A sighting that makes ``condition``, the restart policy it needs, and placed-ness."""
    if condition is Condition.NOT_PLACED:
        return NOT_PLACED, "Always", False
    if condition is Condition.MISSING:
        return MISSING, "Always", True
    if condition is Condition.UNREACHABLE:
        return UNREACHABLE, "Always", True
    simple = {
        Condition.PENDING: InstanceState.PENDING,
        Condition.RUNNING: InstanceState.RUNNING,
        Condition.TERMINATING: InstanceState.TERMINATING,
        Condition.TERMINATED: InstanceState.TERMINATED,
        Condition.LOST: InstanceState.LOST,
    }
    if condition in simple:
        return Sighting.of(instance(simple[condition])), "Always", True
    if condition is Condition.EXITED_FINAL:
        return Sighting.of(instance(InstanceState.EXITED, exit_code=3)), "Never", True
    if condition is Condition.EXITED_WAIT:  # just exited: the 10 s back-off is not over
        return Sighting.of(instance(InstanceState.EXITED, exit_code=3)), "Always", True
    assert condition is Condition.EXITED_DUE
    done = instance(InstanceState.EXITED, exit_code=3, finished_ago=RESTART_BACKOFF + 1)
    return Sighting.of(done), "Always", True


C, K, S = Context, Condition, Step
EXPECTED: dict[tuple[Context, Condition], Step] = {
    (C.LIVE, K.NOT_PLACED): S.PLACE,
    (C.LIVE, K.MISSING): S.FAIL_LOST,
    (C.LIVE, K.UNREACHABLE): S.RETRY,
    (C.LIVE, K.PENDING): S.SHOW_PENDING,
    (C.LIVE, K.RUNNING): S.SHOW_RUNNING,
    (C.LIVE, K.EXITED_FINAL): S.COMPLETE,
    (C.LIVE, K.EXITED_WAIT): S.BACK_OFF,
    (C.LIVE, K.EXITED_DUE): S.RELAUNCH,
    (C.LIVE, K.TERMINATING): S.FAIL_LOST,
    (C.LIVE, K.TERMINATED): S.FAIL_LOST,
    (C.LIVE, K.LOST): S.FAIL_LOST,
    (C.DELETING, K.NOT_PLACED): S.FINISH_DELETION,
    (C.DELETING, K.MISSING): S.FINISH_DELETION,
    (C.DELETING, K.UNREACHABLE): S.TERMINATE,
    (C.DELETING, K.PENDING): S.TERMINATE,
    (C.DELETING, K.RUNNING): S.TERMINATE,
    (C.DELETING, K.EXITED_FINAL): S.FINISH_DELETION,
    (C.DELETING, K.EXITED_WAIT): S.FINISH_DELETION,
    (C.DELETING, K.EXITED_DUE): S.FINISH_DELETION,
    (C.DELETING, K.TERMINATING): S.AWAIT_TERMINATION,
    (C.DELETING, K.TERMINATED): S.FINISH_DELETION,
    (C.DELETING, K.LOST): S.FINISH_DELETION,
    **{(C.OVERDUE, k): S.FINISH_DELETION for k in Condition},
    (C.ENDED, K.NOT_PLACED): S.NOTHING,
    (C.ENDED, K.MISSING): S.NOTHING,
    (C.ENDED, K.UNREACHABLE): S.RELEASE,
    (C.ENDED, K.PENDING): S.RELEASE,
    (C.ENDED, K.RUNNING): S.RELEASE,
    (C.ENDED, K.EXITED_FINAL): S.RELEASE,
    (C.ENDED, K.EXITED_WAIT): S.RELEASE,
    (C.ENDED, K.EXITED_DUE): S.RELEASE,
    (C.ENDED, K.TERMINATING): S.NOTHING,
    (C.ENDED, K.TERMINATED): S.NOTHING,
    (C.ENDED, K.LOST): S.RELEASE,
}


def test_the_table_is_total() -> None:
    assert set(TABLE) == {(c, k) for c in Context for k in Condition}
    assert set(EXPECTED) == set(TABLE)


@pytest.mark.parametrize(
    ("context", "condition"), sorted(EXPECTED, key=lambda e: (e[0].value, e[1].value))
)
def test_each_edge(context: Context, condition: Condition) -> None:
    sighting, policy, placed = sighting_for(condition)
    decision = decide(
        pod(context=context, placed=placed, policy=policy),
        sighting,
        now=NOW,
        restart_backoff=RESTART_BACKOFF,
        deletion_slack=SLACK,
    )
    assert (decision.context, decision.condition) == (context, condition)
    assert decision.step is EXPECTED[(context, condition)]


@pytest.mark.parametrize(
    ("policy", "code", "expected"),
    [
        ("Never", 0, Condition.EXITED_FINAL),
        ("Never", 1, Condition.EXITED_FINAL),
        ("OnFailure", 0, Condition.EXITED_FINAL),
        ("OnFailure", 1, Condition.EXITED_DUE),
        ("Always", 0, Condition.EXITED_DUE),
        ("Always", 1, Condition.EXITED_DUE),
        ("Always", None, Condition.EXITED_DUE),  # no exit code counts as a failure
        ("OnFailure", None, Condition.EXITED_DUE),
    ],
)
def test_restart_policy_decides_what_an_exit_means(
    policy: str, code: int | None, expected: Condition
) -> None:
    exited = instance(InstanceState.EXITED, exit_code=code, finished_ago=3600)
    decision = decide(pod(policy=policy), Sighting.of(exited), now=NOW)
    assert decision.condition is expected


@pytest.mark.parametrize("policy", ["Always", "OnFailure", "Never"])
@pytest.mark.parametrize("code", [0, 1])
def test_a_whole_pod_that_exited_has_ended_whatever_the_policy(policy: str, code: int) -> None:
    # Its provider restarts containers itself: EXITED means the pod is done, never a relaunch.
    running = ContainerStatus("main", ContainerState.TERMINATED, exit_code=code)
    exited = replace(
        instance(InstanceState.EXITED, exit_code=code, finished_ago=3600), containers=(running,)
    )
    decision = decide(pod(policy=policy), Sighting.of(exited), now=NOW)
    assert (decision.condition, decision.step) == (Condition.EXITED_FINAL, Step.COMPLETE)


def test_crash_loop_back_off_doubles_per_restart_and_caps_at_five_minutes() -> None:
    assert [crash_backoff(10.0, n) for n in range(7)] == [10, 20, 40, 80, 160, 300, 300]


def test_back_off_waits_exactly_until_the_restart_is_due() -> None:
    # Third restart: 40 s after the exit; 15 s have passed.
    exited = instance(InstanceState.EXITED, exit_code=1, finished_ago=15)
    decision = decide(
        pod(restart_count=2), Sighting.of(exited), now=NOW, restart_backoff=RESTART_BACKOFF
    )
    assert decision.step is Step.BACK_OFF
    assert decision.wait_seconds == pytest.approx(25.0)
    later = decide(
        pod(restart_count=2),
        Sighting.of(exited),
        now=NOW + timedelta(seconds=25),
        restart_backoff=RESTART_BACKOFF,
    )
    assert later.step is Step.RELAUNCH


def test_a_relaunch_gets_a_new_attempt_even_when_a_status_write_was_lost() -> None:
    exited = instance(InstanceState.EXITED, exit_code=1, finished_ago=3600, attempt=4)
    # The pod's restartCount says 2 (two writes lost), the instance is attempt 4.
    assert decide(pod(restart_count=2), Sighting.of(exited), now=NOW).attempt == 5
    assert next_attempt(pod(restart_count=7), exited) == 8


def test_a_held_pod_waits_for_its_back_off_but_a_deleting_one_does_not() -> None:
    hold = NOW + timedelta(seconds=30)
    held = decide(pod(placed=False), NOT_PLACED, now=NOW, hold_until=hold)
    assert held.step is Step.WAIT
    assert held.wait_seconds == pytest.approx(30.0)
    # The hold is over: place.
    assert decide(pod(placed=False), NOT_PLACED, now=hold, hold_until=hold).step is Step.PLACE
    # A relaunch is held too ...
    due = Sighting.of(instance(InstanceState.EXITED, exit_code=1, finished_ago=3600))
    assert decide(pod(), due, now=NOW, hold_until=hold).step is Step.WAIT
    # ... but nothing else is: status and deletion go on.
    running = Sighting.of(instance(InstanceState.RUNNING))
    assert decide(pod(), running, now=NOW, hold_until=hold).step is Step.SHOW_RUNNING
    deleting = decide(pod(context=Context.DELETING), running, now=NOW, hold_until=hold)
    assert deleting.step is Step.TERMINATE


def test_terminate_gives_the_instance_what_is_left_of_the_grace_period() -> None:
    running = Sighting.of(instance(InstanceState.RUNNING))
    decision = decide(pod(context=Context.DELETING), running, now=NOW)
    assert decision.grace_seconds == pytest.approx(20.0)
    # Within the slack after the deadline: still DELETING, with no grace left.
    late = decide(pod(context=Context.DELETING), running, now=NOW + timedelta(seconds=23))
    assert (late.context, late.grace_seconds) == (Context.DELETING, 0.0)
    assert (
        decide(pod(context=Context.DELETING), running, now=NOW + timedelta(seconds=26)).context
        is Context.OVERDUE
    )


def test_a_pending_instance_is_looked_at_soon_after_its_launch_then_at_the_poll_interval() -> None:
    assert [start_poll_delay(0.25, 2.0, n) for n in range(6)] == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    # A first poll slower than the interval is not shortened to it.
    assert start_poll_delay(5.0, 2.0, 0) == 5.0


def test_the_pod_memory_counts_its_pending_polls() -> None:
    from vk_provider.controllers.placer import PodMemory
    from vk_provider.settings.agent import IntervalsConfig

    intervals = IntervalsConfig(pod_start_poll_seconds=0.5, pod_status_seconds=3)
    memory = PodMemory(uid="u")
    assert [memory.next_start_poll(intervals) for _ in range(4)] == [0.5, 1.0, 2.0, 3.0]
    assert memory.pending_polls == 4


def test_an_evicted_pod_is_told_from_one_merely_deleted_by_its_disruption_condition() -> None:
    """The API server marks an eviction with DisruptionTarget/EvictionByEvictionAPI: that is
    what lets the log say an eviction finished when the pod is gone."""
    body = {"metadata": {"namespace": "ns", "name": "p", "uid": "u"}, "spec": {}, "status": {}}
    assert not PodView.parse(body).evicted
    for reason, evicted in (("EvictionByEvictionAPI", True), ("PreemptionByScheduler", False)):
        condition = {"type": "DisruptionTarget", "status": "True", "reason": reason}
        view = PodView.parse({**body, "status": {"conditions": [condition]}})
        assert view.disruption == reason and view.evicted is evicted
    stale = {"type": "DisruptionTarget", "status": "False", "reason": "EvictionByEvictionAPI"}
    assert not PodView.parse({**body, "status": {"conditions": [stale]}}).evicted
