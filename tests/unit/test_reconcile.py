"""plan_reconcile, rule by rule: orphans, ended pods, adoption, duplicates, vanished instances."""

from __future__ import annotations

from vk_provider.domain.models import Instance, InstanceState
from vk_provider.domain.reconcile import (
    Adopt,
    PodSnapshot,
    ProviderSnapshot,
    Resync,
    Terminate,
    plan_reconcile,
)


def _instance(
    iid: str, uid: str, state: InstanceState = InstanceState.RUNNING, attempt: int = 0
) -> Instance:
    return Instance(provider="p", instance_id=iid, pod_uid=uid, attempt=attempt, state=state)


def _pod(
    uid: str, instance_id: str | None = None, *, terminal: bool = False, deleting: bool = False
) -> PodSnapshot:
    return PodSnapshot(
        key=("ns", f"pod-{uid}"),
        uid=uid,
        provider="p" if instance_id else None,
        instance_id=instance_id,
        terminal=terminal,
        deleting=deleting,
    )


def _plan(pods, instances, *, fresh=True, first_seen=None, now=100.0, grace=10.0):  # type: ignore[no-untyped-def]
    return plan_reconcile(
        pods,
        [ProviderSnapshot("p", tuple(instances), fresh)],
        first_seen=first_seen or {},
        now=now,
        grace=grace,
    )


def test_a_matching_pod_and_instance_need_nothing() -> None:
    assert _plan([_pod("a", "i1")], [_instance("i1", "a")]).actions == ()


def test_an_orphan_is_terminated_only_after_the_grace() -> None:
    young = _plan([], [_instance("i1", "gone")])
    assert young.actions == ()
    assert young.first_seen == {("p", "i1"): 100.0}
    old = _plan([], [_instance("i1", "gone")], first_seen=young.first_seen, now=111.0)
    assert old.actions == (Terminate("p", "i1", "gone", "orphan"),)


def test_first_seen_forgets_instances_that_left() -> None:
    plan = _plan([], [], first_seen={("p", "old"): 1.0})
    assert plan.first_seen == {}


def test_a_running_instance_of_an_ended_pod_is_terminated_at_once() -> None:
    plan = _plan([_pod("a", "i1", terminal=True)], [_instance("i1", "a")])
    assert plan.actions == (Terminate("p", "i1", "a", "its pod has ended"),)
    exited = _plan([_pod("a", "i1", terminal=True)], [_instance("i1", "a", InstanceState.EXITED)])
    assert exited.actions == ()  # already released or about to be; its logs stay readable


def test_an_unnamed_instance_of_a_live_pod_is_adopted_and_duplicates_go() -> None:
    keep = _instance("new", "a", attempt=1)
    older = _instance("old", "a", attempt=0)
    young = _plan([_pod("a")], [older, keep])
    # Adopted at once; the duplicate only after the grace (it may be a create in flight).
    assert young.actions == (Adopt(("ns", "pod-a"), keep),)
    plan = _plan([_pod("a")], [older, keep], first_seen=young.first_seen, now=200.0)
    assert Adopt(("ns", "pod-a"), keep) in plan.actions
    assert Terminate("p", "old", "a", "duplicate") in plan.actions
    assert len(plan.actions) == 2


def test_a_running_instance_wins_over_a_later_lost_one() -> None:
    running = _instance("r", "a", InstanceState.RUNNING, attempt=0)
    lost = _instance("l", "a", InstanceState.LOST, attempt=3)
    plan = _plan([_pod("a")], [lost, running])
    assert Adopt(("ns", "pod-a"), running) in plan.actions


def test_a_deleting_pod_adopts_nothing() -> None:
    assert _plan([_pod("a", deleting=True)], [_instance("i1", "a")]).actions == ()


def test_a_second_instance_of_an_annotated_pod_goes_after_the_grace() -> None:
    pods = [_pod("a", "i1")]
    instances = [_instance("i1", "a"), _instance("i2", "a", attempt=1)]
    young = _plan(pods, instances)
    assert young.actions == ()
    old = _plan(pods, instances, first_seen=young.first_seen, now=200.0)
    assert old.actions == (Terminate("p", "i2", "a", "duplicate"),)


def test_a_vanished_instance_resyncs_its_pod() -> None:
    plan = _plan([_pod("a", "i1")], [])
    assert plan.actions == (Resync(("ns", "pod-a"), "its instance is no longer listed"),)


def test_a_stale_list_is_not_evidence() -> None:
    plan = _plan([_pod("a", "i1")], [_instance("zzz", "gone")], fresh=False, now=1000.0)
    assert plan.actions == ()


def test_terminated_instances_are_ignored() -> None:
    plan = _plan(
        [], [_instance("i1", "gone", InstanceState.TERMINATED)], first_seen={("p", "i1"): 0.0}
    )
    assert plan.actions == ()


def test_a_failed_poll_does_not_restart_the_grace_period() -> None:
    """With a flaky list call, every fresh poll after a failed one used to see the orphan as
    new again, so it outlived its grace period by minutes."""
    first = _plan([], [_instance("i1", "gone")], now=100.0)
    failed = _plan(
        [], [_instance("i1", "gone")], fresh=False, first_seen=first.first_seen, now=105.0
    )
    assert failed.actions == ()
    assert failed.first_seen == {("p", "i1"): 100.0}
    later = _plan([], [_instance("i1", "gone")], first_seen=failed.first_seen, now=111.0)
    assert later.actions == (Terminate("p", "i1", "gone", "orphan"),)
