"""The pod controller and reconciliation on a fake API, in-memory providers and simulated time.

Every test runs the production controllers (``controller_harness.Core``) on looptime: a
minute of agent time passes in a millisecond, delays are exact, nothing sleeps for real. A
test fails if it leaves a task running (``no_leftover_tasks``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.unit.controller_harness import Core, gpu_offer, memory_provider, pod_manifest
from vk_provider.controllers.offers import RECHECK_SECONDS
from vk_provider.domain.budget import BudgetCaps
from vk_provider.domain.containers import ContainerSpec
from vk_provider.domain.errors import CapacityUnavailable, Transient
from vk_provider.domain.models import InstanceState, Offer, WorkloadSpec
from vk_provider.domain.podview import (
    ANN_DELETION_COST,
    ANN_INSTANCE,
    ANN_OFFER,
    ANN_PROVIDER,
    deletion_cost,
)

pytestmark = [pytest.mark.looptime, pytest.mark.usefixtures("no_leftover_tasks")]


@pytest.fixture
async def no_leftover_tasks() -> AsyncIterator[None]:
    yield
    current = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    assert not left, f"tasks left running: {[t.get_name() for t in left]}"


def spec(uid: str, attempt: int = 0) -> WorkloadSpec:
    return WorkloadSpec(
        pod_uid=uid,
        namespace="ns",
        pod_name="p",
        containers=(ContainerSpec(name="main", image="img"),),
        attempt=attempt,
    )


async def test_a_pod_is_placed_and_runs() -> None:
    cheap = memory_provider("cheap", gpu_offer(price=1.0))
    dear = memory_provider("dear", gpu_offer(price=3.0))
    core = Core(cheap, dear)
    async with core.running():
        await core.kube.create_pod(pod_manifest("infer"))
        await core.until(lambda: core.phase("infer") == "Running", what="Running")
    assert core.annotation("infer", ANN_PROVIDER) == "cheap"
    assert core.annotation("infer", ANN_OFFER) == "cheap/a100/local"
    status = core.container_status("infer")
    assert status["ready"] is True
    assert status["containerID"] == f"vk-provider://{core.annotation('infer', ANN_INSTANCE)}"
    assert core.kube.reasons("infer") == ["ProviderSelected", "Started"]
    assert len(cheap.instances()) == 1
    assert dear.instances() == []


async def test_a_crash_looping_container_restarts_with_back_off_through_the_launcher() -> None:
    provider = memory_provider("mem", gpu_offer())
    core = Core(provider)
    async with core.running():
        await core.kube.create_pod(pod_manifest("crashy"))
        await core.until(lambda: core.phase("crashy") == "Running", what="Running")
        first = core.annotation("crashy", ANN_INSTANCE)
        assert first is not None
        exited_at = asyncio.get_running_loop().time()
        provider.exit(first, 2)
        await core.until(
            lambda: (
                core.container_status("crashy")["state"].get("waiting", {}).get("reason")
                == "CrashLoopBackOff"
            ),
            what="CrashLoopBackOff",
        )
        await core.until(
            lambda: core.annotation("crashy", ANN_INSTANCE) not in (None, first),
            what="a relaunched instance",
        )
        # The first restart waits the configured 10 s back-off, not less.
        assert asyncio.get_running_loop().time() - exited_at >= 10.0
        await core.until(lambda: core.container_status("crashy").get("ready"), what="Ready")
    status = core.container_status("crashy")
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 2
    assert core.kube.reasons("crashy").count("BackOff") == 1
    # Released only once the next attempt existed: one instance left, the new one.
    assert [i.instance_id for i in provider.instances()] == [
        core.annotation("crashy", ANN_INSTANCE)
    ]
    assert provider.instances()[0].attempt == 1


async def test_a_relaunch_that_needs_the_exited_instances_room_releases_it_first() -> None:
    """The exited instance is billed until its provider lists it gone, so a relaunch at a
    cap that holds one instance cannot be made beside it: the exited one is deleted first,
    and the relaunch follows once it is gone. The provider never runs more than the cap."""
    provider = memory_provider("mem", gpu_offer(price=1.5))
    core = Core(provider, budget=BudgetCaps(global_per_hour=2.0))
    billed: list[float] = []

    def alive_per_hour() -> float:
        alive = [i for i in provider.instances() if i.state is not InstanceState.TERMINATED]
        billed.append(sum(i.price_per_hour for i in alive))
        return billed[-1]

    async with core.running():
        await core.kube.create_pod(pod_manifest("crashy"))
        await core.until(lambda: core.phase("crashy") == "Running", what="Running")
        first = core.annotation("crashy", ANN_INSTANCE)
        assert first is not None
        provider.exit(first, 1)
        await core.until(lambda: "BudgetExceeded" in core.kube.reasons("crashy"), what="refusal")
        await core.until(
            lambda: (
                alive_per_hour() <= 2.0
                and core.annotation("crashy", ANN_INSTANCE) not in (None, first)
            ),
            what="the relaunch, after the exited instance went",
        )
    assert max(billed) <= 2.0
    assert core.ledger.total_per_hour() == 1.5


async def test_a_relaunch_on_a_full_offer_fails_over() -> None:
    home = memory_provider("home", gpu_offer(price=1.0))
    spare = memory_provider("spare", gpu_offer(price=2.0))
    core = Core(home, spare)
    async with core.running():
        await core.kube.create_pod(pod_manifest("crashy"))
        await core.until(lambda: core.phase("crashy") == "Running", what="Running")
        first = core.annotation("crashy", ANN_INSTANCE)
        assert first is not None and core.annotation("crashy", ANN_PROVIDER) == "home"
        home.fail_next("create", CapacityUnavailable("sold out", provider="home"))
        home.exit(first, 1)
        await core.until(
            lambda: core.annotation("crashy", ANN_PROVIDER) == "spare", what="failover"
        )
        await core.until(lambda: core.container_status("crashy").get("ready"), what="Ready")
    assert core.container_status("crashy")["restartCount"] == 1
    assert "ProviderCreateFailed" in core.kube.reasons("crashy")
    assert home.instances() == []  # the exited attempt was released after the failover
    assert len(spare.instances()) == 1


async def test_adoption_keeps_the_instance_reconciliation_chose() -> None:
    """A crash left two instances of an unannotated pod: attempt 0 running, attempt 1 still
    pending. Placement used to adopt the highest attempt while reconciliation kept the most
    alive one and terminated the other as a duplicate: both went and the pod failed."""
    provider = memory_provider("mem", gpu_offer(startup_seconds=600))
    core = Core(provider, intervals={"orphan_grace_seconds": 5})
    manifest = pod_manifest("survivor")
    created = await core.kube.create_pod(manifest)
    uid = created["metadata"]["uid"]
    offer = (await provider.offers())[0]
    running = await provider.create(spec(uid, 0), offer)
    provider._records[running.instance_id].startup = 0
    pending = await provider.create(spec(uid, 1), offer)
    async with core.running():
        await core.until(lambda: core.phase("survivor") == "Running", what="Running")
        await core.until(lambda: len(provider.instances()) == 1, what="the duplicate gone")
        await asyncio.sleep(60)  # several more reconcile cycles: nothing else goes
    assert core.annotation("survivor", ANN_INSTANCE) == running.instance_id
    assert [i.instance_id for i in provider.instances()] == [running.instance_id]
    assert pending.instance_id not in {i.instance_id for i in provider.instances()}
    assert "InstanceLost" not in core.kube.reasons("survivor")


async def test_a_deleted_pod_stops_its_instance_and_goes() -> None:
    provider = memory_provider("mem", gpu_offer())
    provider.terminate_seconds = 3.0
    core = Core(provider)
    async with core.running():
        await core.kube.create_pod(pod_manifest("gone"))
        await core.until(lambda: core.phase("gone") == "Running", what="Running")
        await core.kube.request_deletion("ns", "gone", grace=10)
        await core.until(lambda: core.kube.pod("ns", "gone") is None, what="pod deleted")
        elapsed_ok = provider.instances() == []
    assert elapsed_ok
    assert "Killing" in core.kube.reasons("gone")
    assert core.ledger.total_per_hour() == 0.0


async def test_a_lost_instance_fails_the_pod_and_avoids_the_offer() -> None:
    first = memory_provider("first", gpu_offer(price=1.0))
    second = memory_provider("second", gpu_offer(price=2.0))
    core = Core(first, second)
    async with core.running():
        await core.kube.create_pod(pod_manifest("victim"))
        await core.until(lambda: core.phase("victim") == "Running", what="Running")
        instance_id = core.annotation("victim", ANN_INSTANCE)
        assert instance_id is not None
        first.lose(instance_id, "preempted")
        await core.until(lambda: core.phase("victim") == "Failed", what="Failed")
        # Its controller's replacement avoids the offer that lost it.
        await core.kube.create_pod(pod_manifest("replacement"))
        await core.until(lambda: core.phase("replacement") == "Running", what="Running")
    assert core.annotation("replacement", ANN_PROVIDER) == "second"
    assert "InstanceLost" in core.kube.reasons("victim")
    assert first.instances() == []  # the lost instance was released too


async def test_unplaceable_pods_retry_on_the_queues_back_off_only() -> None:
    provider = memory_provider("mem", gpu_offer(capacity=0))
    core = Core(provider)
    async with core.running():
        await core.kube.create_pod(pod_manifest("waiting"))
        await core.until(lambda: "NoCapacity" in core.kube.reasons("waiting"), what="NoCapacity")
        start = asyncio.get_running_loop().time()
        offers_before = provider.calls["offers"]
        await asyncio.sleep(75)
    # Back-off doubling from 5 s: retries at +5, +10, +20, +40 (= 75 s): four more placements,
    # whatever our own status writes and events did to the watch meanwhile. While a pod
    # waits, the offers are kept at most RECHECK_SECONDS old (so free capacity is seen within
    # seconds), and asked for no more often than that.
    events = [e for e in core.kube.events if e["reason"] == "NoCapacity"]
    assert sum(e["count"] for e in events) == 5, events
    assert provider.calls["offers"] - offers_before <= 75 / RECHECK_SECONDS + 1
    assert asyncio.get_running_loop().time() - start == pytest.approx(75, abs=1)
    assert core.phase("waiting") == "Pending"


async def test_room_appearing_kicks_a_waiting_pod_at_once() -> None:
    provider = memory_provider("mem", gpu_offer(capacity=1))
    core = Core(provider)
    async with core.running():
        await core.kube.create_pod(pod_manifest("first"))
        await core.until(lambda: core.phase("first") == "Running", what="first Running")
        await core.kube.create_pod(pod_manifest("second"))
        await core.until(lambda: "NoCapacity" in core.kube.reasons("second"), what="NoCapacity")
        await asyncio.sleep(30)  # deep in back-off now
        await core.kube.request_deletion("ns", "first", grace=0)
        freed = asyncio.get_running_loop().time()
        await core.until(lambda: core.phase("second") == "Running", what="second Running")
    # Neither the offer cache (30 s TTL) nor the back-off hides a slot our own deletion freed.
    assert asyncio.get_running_loop().time() - freed <= 3


async def test_capacity_freed_behind_our_back_is_seen_within_seconds() -> None:
    """A slot the provider frees by itself (not by a termination of ours) is noticed by the
    offers refreshed while pods wait, not after the offer TTL times the back-off."""
    provider = memory_provider("mem", gpu_offer(capacity=1))
    core = Core(provider, intervals={"orphan_grace_seconds": 3600})
    async with core.running():
        offer = (await provider.offers())[0]
        spec = WorkloadSpec(
            pod_uid="squatter",
            namespace="ns",
            pod_name="other",
            containers=(ContainerSpec(name="c", image="i"),),
        )
        squatter = await provider.create(spec, offer)
        await core.kube.create_pod(pod_manifest("waiting"))
        await core.until(lambda: "NoCapacity" in core.kube.reasons("waiting"), what="NoCapacity")
        await asyncio.sleep(40)  # deep in back-off now, and past the offer TTL once
        await provider.delete(squatter.instance_id, grace_seconds=0)
        freed = asyncio.get_running_loop().time()
        await core.until(lambda: core.phase("waiting") == "Running", what="waiting Running")
    assert asyncio.get_running_loop().time() - freed <= RECHECK_SECONDS + 3


async def test_a_stalled_termination_is_asked_again_until_the_provider_confirms() -> None:
    """A delete the provider accepted and never carried out (RunPod, Modal) used to leave the
    instance TERMINATING, and billing, for good: reconciliation skipped TERMINATING ones."""
    provider = memory_provider("mem", gpu_offer())
    core = Core(provider, intervals={"termination_deadline_seconds": 60})
    async with core.running():
        await core.kube.create_pod(pod_manifest("leaky"))
        await core.until(lambda: core.phase("leaky") == "Running", what="Running")
        provider.lost_deletes = 2  # the stop request, and the one sent when the pod goes
        await core.kube.request_deletion("ns", "leaky", grace=2)
        await core.until(lambda: core.kube.pod("ns", "leaky") is None, what="pod deleted")
        assert [i.state for i in provider.instances()] == [InstanceState.TERMINATING]
        await core.until(lambda: core.reconciler.overdue, what="counted overdue")
        await core.until(lambda: provider.instances() == [], what="terminated for real")
        await core.until(lambda: core.reconciler.overdue == (), what="no longer overdue")
    assert provider.calls["delete"] == 3  # the stop, the stop when the pod went, the retry


async def test_a_force_deleted_pod_still_has_its_instance_stopped() -> None:
    provider = memory_provider("mem", gpu_offer())
    core = Core(provider)
    async with core.running():
        await core.kube.create_pod(pod_manifest("forced"))
        await core.until(lambda: core.phase("forced") == "Running", what="Running")
        provider.fail_next("delete", Transient("503", provider="mem"))
        await core.kube.force_delete("ns", "forced")
        await core.until(lambda: provider.instances() == [], what="instance stopped")
    assert provider.calls["delete"] >= 2  # the failed delete was retried


async def test_no_capacity_instance_is_not_created_twice_for_one_attempt() -> None:
    """A create whose answer was lost (Transient after it went through) is retried on the
    same offer with the same request id: the provider returns the first instance."""
    provider = memory_provider("mem", gpu_offer())
    core = Core(provider)
    original = provider.create

    async def lost_answer(spec: WorkloadSpec, offer: Offer):  # type: ignore[no-untyped-def]
        made = await original(spec, offer)
        if provider.calls["create"] == 1:
            raise Transient("timeout after the create went through", provider="mem")
        return made

    provider.create = lost_answer  # type: ignore[method-assign]
    async with core.running():
        await core.kube.create_pod(pod_manifest("once"))
        await core.until(lambda: core.phase("once") == "Running", what="Running")
        await asyncio.sleep(60)
    assert len(provider.instances()) == 1


async def test_a_controlled_pod_nothing_can_run_is_failed_after_the_limit() -> None:
    core = Core(
        memory_provider("full", gpu_offer(capacity=0)), intervals={"unplaceable_fail_seconds": 120}
    )
    owned = pod_manifest("owned")
    owned["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": "rs",
            "uid": "rs-1",
            "controller": True,
        }
    ]
    async with core.running():
        await core.kube.create_pod(owned)
        await core.kube.create_pod(pod_manifest("bare"))
        started = asyncio.get_running_loop().time()
        await core.until(lambda: core.phase("owned") == "Failed", within=600, what="owned Failed")
        elapsed = asyncio.get_running_loop().time() - started
        await asyncio.sleep(300)
    assert 120 <= elapsed <= 120 + 320  # the first retry past the limit (back-off at most 300 s)
    status = core.kube.pod("ns", "owned")["status"]  # type: ignore[index]
    assert status["reason"] == "NoCapacity"
    assert "no provider could run this pod for 120s" in status["message"]
    assert "recreates it" in status["message"]
    # A bare pod has nobody to recreate it: it keeps waiting.
    assert core.phase("bare") == "Pending"


async def test_an_instant_pod_costs_one_pod_write_two_events_and_no_reads() -> None:
    core = Core(memory_provider("instant", gpu_offer()))
    async with core.running():
        await core.until(lambda: core.kube.calls.get("watch_pods", 0) >= 1, what="watching")
        before = dict(core.kube.calls)
        await core.kube.create_pod(pod_manifest("quick"))
        await core.until(lambda: core.phase("quick") == "Running", what="Running")
        await asyncio.sleep(30)  # the status polls that follow write nothing new
    spent = {k: v - before.get(k, 0) for k, v in core.kube.calls.items()}
    assert spent.get("patch_status") == 1  # placement annotations, label and Running at once
    assert spent.get("get_pod", 0) == 0  # re-reads come from the watch's store
    assert spent.get("create_event") == 2  # ProviderSelected, Started
    assert core.annotation("quick", ANN_PROVIDER) == "instant"


async def test_deletions_due_in_an_api_outage_finish_soon_after_it_though_the_api_is_busy() -> None:
    """Deletions that fell due while the API server was down go within seconds of its return,
    even when its first answer to each is a 429: the back-off the outage ran up (to its 10 s
    cap) starts afresh once the pod watch lists again. The instances take ten minutes to stop,
    so they stay listed and nothing but the pods' own retries brings their deletion back."""
    provider = memory_provider("mem", gpu_offer(capacity=8))
    provider.terminate_seconds = 600.0
    core = Core(provider, intervals={"retry_backoff_seconds": 1})
    names = [f"p{i}" for i in range(6)]
    loop = asyncio.get_running_loop()
    async with core.running():
        for name in names:
            await core.kube.create_pod(pod_manifest(name))
        await core.until(lambda: all(core.phase(n) == "Running" for n in names), what="Running")
        for name in names:
            await core.kube.request_deletion("ns", name, grace=2)

        def seen() -> bool:
            views = [core.store.view(("ns", n)) for n in names]
            return all(v is not None and v.deletion_deadline is not None for v in views)

        await core.until(seen, step=0.01, what="the agent to see the deletions")
        core.kube.set_unreachable(True)
        await asyncio.sleep(120)  # two minutes down: every pod's back-off reaches its cap
        assert all(core.kube.pod("ns", n) is not None for n in names)
        core.kube.busy["delete_pod"] = len(names)  # its first answer to each: 429
        back = loop.time()
        core.kube.set_unreachable(False)
        await core.until(
            lambda: all(core.kube.pod("ns", n) is None for n in names), step=0.1, what="gone"
        )
    # The watch re-lists within 1 s; each delete is refused once, then retried after a fresh
    # back-off of 1 s (retry_backoff_seconds), not after the 10 s the outage ran up.
    assert loop.time() - back <= 3.0


def test_rented_replicas_cost_less_to_delete_than_home_ones_the_dearest_least() -> None:
    costs = [deletion_cost(p) for p in (0.0, 0.2, 1.5, 2.99, 40.0, 1e9)]
    assert all(c < -999_999 for c in costs)  # below a home replica's 0, and hand-set costs
    assert costs == sorted(costs, reverse=True)  # dearer: lower
    assert len(set(costs)) == len(costs)
    assert min(costs) >= -(2**31)  # the annotation is an int32


async def test_a_placed_pod_carries_its_deletion_cost() -> None:
    cheap = memory_provider("cheap", gpu_offer(price=1.0, capacity=1))
    dear = memory_provider("dear", gpu_offer(price=3.0))
    core = Core(cheap, dear)
    async with core.running():
        for name in ("first", "second"):
            await core.kube.create_pod(pod_manifest(name))
            await core.until(lambda n=name: core.phase(n) == "Running", what=f"{name} Running")
    first = int(core.annotation("first", ANN_DELETION_COST) or 0)
    second = int(core.annotation("second", ANN_DELETION_COST) or 0)
    assert first == deletion_cost(1.0) and second == deletion_cost(3.0) and second < first
