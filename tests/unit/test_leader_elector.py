"""The leader elector's loop (``controllers.leader``) on simulated time, against a fake Lease
store that keeps resourceVersions as the API server does (409 on a stale write)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any, cast

import pytest

from vk_provider.controllers.leader import LeaderElector, LeadershipLost, NotLeading
from vk_provider.domain.leader import Timing
from vk_provider.kube.client import JSON, ApiError, ConflictError, KubeClient

pytestmark = pytest.mark.looptime
TIMING = Timing(lease_duration=15, renew_deadline=10, retry_period=2)


class FakeLeases:
    """Leases by name, with resourceVersion checks; ``down()`` makes every call hang."""

    def __init__(self) -> None:
        self.leases: dict[str, JSON] = {}
        self.version = 0
        self.up = asyncio.Event()
        self.up.set()

    def down(self) -> None:
        self.up.clear()

    async def _answer(self) -> None:
        await self.up.wait()

    def _stamp(self, lease: Mapping[str, Any]) -> JSON:
        self.version += 1
        stored = copy.deepcopy(dict(lease))
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.leases[stored["metadata"]["name"]] = stored
        return copy.deepcopy(stored)

    async def get_lease(self, name: str, *, namespace: str, request_timeout: float) -> JSON | None:
        await self._answer()
        found = self.leases.get(name)
        return copy.deepcopy(found) if found else None

    async def create_lease(
        self,
        lease: Mapping[str, Any],
        *,
        namespace: str,
        request_timeout: float,
        fenced: bool = True,
    ) -> JSON:
        assert not fenced  # the election's own writes are never fenced by the election
        await self._answer()
        if lease["metadata"]["name"] in self.leases:
            raise ConflictError(409, "exists")
        return self._stamp(lease)

    async def replace_lease(
        self,
        name: str,
        lease: Mapping[str, Any],
        *,
        namespace: str,
        request_timeout: float,
        fenced: bool = True,
    ) -> JSON:
        assert not fenced
        await self._answer()
        current = self.leases[name]
        if lease["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ConflictError(409, "stale")
        return self._stamp(lease)

    def holder(self, name: str = "lease") -> str:
        return str(self.leases[name]["spec"]["holderIdentity"])


def elector(store: FakeLeases, identity: str, changes: list[bool] | None = None) -> LeaderElector:
    loop = asyncio.get_running_loop()
    return LeaderElector(
        cast(KubeClient, store),
        name="lease",
        namespace="ns",
        identity=identity,
        timing=TIMING,
        clock=loop.time,
        on_change=(changes.append if changes is not None else lambda leading: None),
    )


async def test_the_first_replica_creates_the_lease_and_leads() -> None:
    store = FakeLeases()
    changes: list[bool] = []
    a = elector(store, "a", changes)
    await asyncio.wait_for(a.acquire(), 1)
    assert a.is_leader() and store.holder() == "a" and changes == [True]
    assert store.leases["lease"]["spec"]["leaseTransitions"] == 0


async def test_a_follower_waits_while_the_leader_renews_and_takes_over_after_it_dies() -> None:
    store = FakeLeases()
    a, b = elector(store, "a"), elector(store, "b")
    await a.acquire()
    keeper = asyncio.create_task(a.keep())
    follower = asyncio.create_task(b.acquire())
    await asyncio.sleep(60)  # a renews every 2 s: b never leads
    assert not follower.done() and b.holder == "a" and not b.is_leader()
    keeper.cancel()  # a dies without releasing
    died = asyncio.get_running_loop().time()
    await asyncio.wait_for(follower, 30)
    took = asyncio.get_running_loop().time() - died
    assert 13 <= took <= 17 and store.holder() == "b"
    assert store.leases["lease"]["spec"]["leaseTransitions"] == 1
    with pytest.raises(NotLeading):
        a.fence("create")  # the dead leader's fence closed at its deadline


async def test_a_leader_that_cannot_renew_stops_at_its_deadline_before_anyone_takes_over() -> None:
    store = FakeLeases()
    changes: list[bool] = []
    a = elector(store, "a", changes)
    await a.acquire()
    renewed_at = asyncio.get_running_loop().time()
    store.down()  # the API stops answering: every call hangs
    with pytest.raises(LeadershipLost, match="no renewal for 10s"):
        await asyncio.wait_for(a.keep(), 30)
    lost_at = asyncio.get_running_loop().time()
    assert lost_at - renewed_at <= TIMING.renew_deadline + 0.01
    assert lost_at - renewed_at < TIMING.lease_duration
    assert not a.is_leader() and changes == [True, False]
    with pytest.raises(NotLeading, match="not the leader"):
        a.fence("create an instance")


async def test_a_leader_that_finds_another_holder_stops_at_once() -> None:
    store = FakeLeases()
    a = elector(store, "a")
    await a.acquire()
    store.leases["lease"]["spec"]["holderIdentity"] = "b"  # taken while a was frozen
    store.leases["lease"]["metadata"]["resourceVersion"] = "99"
    with pytest.raises(LeadershipLost, match="b holds the Lease now"):
        await asyncio.wait_for(a.keep(), 5)


async def test_a_frozen_leader_wakes_up_no_longer_leading() -> None:
    store = FakeLeases()
    a = elector(store, "a")
    await a.acquire()
    await asyncio.sleep(10)  # no renewal ran: as if the process had been stopped
    assert not a.is_leader()
    with pytest.raises(LeadershipLost):
        await asyncio.wait_for(a.keep(), 1)


async def test_releasing_hands_over_on_the_followers_next_read() -> None:
    store = FakeLeases()
    a, b = elector(store, "a"), elector(store, "b")
    await a.acquire()
    follower = asyncio.create_task(b.acquire())
    await asyncio.sleep(5)
    await a.release()
    assert not a.is_leader() and store.holder() == ""
    released = asyncio.get_running_loop().time()
    await asyncio.wait_for(follower, 5)
    assert asyncio.get_running_loop().time() - released <= TIMING.retry_period + 0.01


async def test_two_followers_racing_for_an_expired_lease_elect_one() -> None:
    store = FakeLeases()
    dead = elector(store, "dead")
    await dead.acquire()
    b, c = elector(store, "b"), elector(store, "c")
    tasks = [asyncio.create_task(b.acquire()), asyncio.create_task(c.acquire())]
    done, pending = await asyncio.wait(tasks, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1
    winner = b if b.is_leader() else c
    keeper = asyncio.create_task(winner.keep())
    await asyncio.sleep(60)  # the loser keeps following while the winner renews
    assert all(not t.done() for t in pending)
    assert store.holder() == winner.identity and b.is_leader() != c.is_leader()
    for task in [*pending, keeper]:
        task.cancel()
    await asyncio.gather(*pending, keeper, return_exceptions=True)


async def test_an_api_error_while_following_is_retried() -> None:
    store = FakeLeases()
    calls = 0
    real = store.get_lease

    async def flaky(name: str, *, namespace: str, request_timeout: float) -> JSON | None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ApiError(0, "connection refused")
        return await real(name, namespace=namespace, request_timeout=request_timeout)

    store.get_lease = flaky  # type: ignore[method-assign]
    a = elector(store, "a")
    await asyncio.wait_for(a.acquire(), 10)
    assert a.is_leader() and calls == 3


async def test_the_kube_client_refuses_node_pod_and_event_writes_while_not_leading() -> None:
    from kubernetes_asyncio.client.api_client import ApiClient

    api = ApiClient()
    try:
        kube = KubeClient(api)
        kube.may_write = lambda: False
        writes = [
            kube.create_node({}),
            kube.patch_node("n", {}),
            kube.patch_node_status("n", {}),
            kube.patch_pod_status("ns", "p", {}),
            kube.delete_pod_now("ns", "p", uid="u"),
            kube.create_event("ns", {}),
            kube.patch_event("ns", "e", {}),
            kube.create_lease({"metadata": {"name": "n"}}),
            kube.replace_lease("n", {}),
        ]
        for write in writes:
            with pytest.raises(ApiError, match="not the leader: refusing to"):
                await write
    finally:
        await api.close()
