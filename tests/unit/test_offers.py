"""OfferBook: concurrent gathering, per-provider timeouts and failures, the TTL cache.

Concurrency is shown with events (every provider must be inside ``offers()`` before any may
answer), not with wall-clock sleeps; the cache age uses a fake clock. Only the timeout test
waits for real, for its (short) timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from vk_provider.controllers.offers import OfferBook
from vk_provider.domain.models import Capabilities, Instance, LogOptions, Offer, WorkloadSpec


class FakeClock:
    def __init__(self, now: float = 50.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def offer(provider: str, sku: str = "gpu") -> Offer:
    return Offer(
        provider=provider,
        sku=sku,
        region="r1",
        gpu_model="A100",
        gpu_count=1,
        gpu_memory_gib=80.0,
        vcpus=8.0,
        memory_gib=64.0,
        price_per_hour=1.0,
    )


class FakeProvider:
    """Answers ``offers()`` with its offers, after ``gate`` (if any) is set; or raises."""

    def __init__(
        self,
        name: str,
        *,
        gate: asyncio.Event | None = None,
        error: BaseException | None = None,
        entered: list[str] | None = None,
    ) -> None:
        self._name = name
        self.gate = gate
        self.error = error
        self.entered = entered if entered is not None else []
        self.calls = 0
        self.answer = [offer(name)]

    @property
    def name(self) -> str:
        return self._name

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities()

    async def offers(self) -> list[Offer]:
        self.calls += 1
        self.entered.append(self._name)
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        return list(self.answer)

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        raise NotImplementedError

    async def get(self, instance_id: str) -> Instance:
        raise NotImplementedError

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        raise NotImplementedError

    async def list_ours(self) -> list[Instance]:
        raise NotImplementedError

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        raise NotImplementedError
        yield b""  # pragma: no cover - makes this an async generator

    async def close(self) -> None:
        return None


class Barrier:
    """Opens once ``parties`` providers are inside ``offers()`` at the same time."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.entered: list[str] = []
        self.gate = asyncio.Event()

    def provider(self, name: str) -> FakeProvider:
        barrier = self

        class Arriving(FakeProvider):
            async def offers(self) -> list[Offer]:
                barrier.entered.append(name)
                if len(barrier.entered) == barrier.parties:
                    barrier.gate.set()
                return await super().offers()

        return Arriving(name, gate=self.gate)


async def test_all_providers_are_asked_at_the_same_time() -> None:
    barrier = Barrier(parties=3)
    providers = {name: barrier.provider(name) for name in ("a", "b", "c")}
    # Asked one after the other, "a" would wait for the barrier until its timeout and the
    # book would come back without a's offers; asked together, all three answer.
    book = OfferBook(providers, ttl_seconds=60.0, timeout_seconds=1.0, clock=FakeClock())
    offers = await asyncio.wait_for(book.offers(), 5.0)
    assert sorted(o.provider for o in offers) == ["a", "b", "c"]
    assert sorted(barrier.entered) == ["a", "b", "c"]


async def test_a_slow_provider_times_out_without_holding_up_the_others() -> None:
    clock = FakeClock()
    slow = FakeProvider("slow", gate=asyncio.Event())  # never answers
    providers = {"slow": slow, "fast": FakeProvider("fast"), "also": FakeProvider("also")}
    book = OfferBook(providers, ttl_seconds=60.0, timeout_seconds=0.05, clock=clock)
    offers = await book.offers()
    assert sorted(o.provider for o in offers) == ["also", "fast"]
    answer = book.answer("slow")
    assert answer.offers == ()
    assert answer.answered_at is None
    assert answer.error is not None
    assert "no answer" in answer.error
    assert book.answer("fast").error is None
    assert book.answer("fast").answered_at == clock.now


async def test_a_failing_provider_contributes_nothing_and_the_others_still_answer() -> None:
    providers = {
        "broken": FakeProvider("broken", error=RuntimeError("schema changed")),
        "ok": FakeProvider("ok"),
    }
    book = OfferBook(providers, ttl_seconds=60.0, clock=FakeClock())
    offers = await book.offers()
    assert [o.provider for o in offers] == ["ok"]
    assert book.answer("broken").error == "RuntimeError: schema changed"
    assert book.cached() == offers


async def test_results_are_cached_for_the_ttl_and_refreshed_after() -> None:
    clock = FakeClock()
    a = FakeProvider("a")
    book = OfferBook({"a": a}, ttl_seconds=30.0, clock=clock)
    first = await book.offers()
    a.answer = [offer("a", "new")]
    clock.advance(29.0)
    assert await book.offers() == first
    assert a.calls == 1
    clock.advance(1.0)
    refreshed = await book.offers()
    assert a.calls == 2
    assert [o.sku for o in refreshed] == ["new"]
    assert book.cached() == refreshed


async def test_max_age_overrides_the_ttl() -> None:
    clock = FakeClock()
    a = FakeProvider("a")
    book = OfferBook({"a": a}, ttl_seconds=300.0, clock=clock)
    await book.offers()
    clock.advance(5.0)
    await book.offers(max_age=10.0)
    assert a.calls == 1
    await book.offers(max_age=5.0)
    assert a.calls == 2
    await book.offers(max_age=0.0)
    assert a.calls == 3


async def test_a_provider_that_fails_on_refresh_loses_its_old_offers() -> None:
    clock = FakeClock()
    a, b = FakeProvider("a"), FakeProvider("b")
    book = OfferBook({"a": a, "b": b}, ttl_seconds=10.0, clock=clock)
    assert len(await book.offers()) == 2
    first_answer = book.answer("a").answered_at
    a.error = ConnectionError("reset")
    clock.advance(10.0)
    assert [o.provider for o in await book.offers()] == ["b"]
    # Its last successful answer is remembered, for the Lease.
    assert book.answer("a").answered_at == first_answer


async def test_concurrent_callers_share_one_refresh() -> None:
    gate = asyncio.Event()
    a = FakeProvider("a", gate=gate)
    book = OfferBook({"a": a}, ttl_seconds=60.0, clock=FakeClock())
    callers = [asyncio.create_task(book.offers()) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*callers)
    assert all(r == [offer("a")] for r in results)
    assert a.calls == 1


async def test_explicit_refresh_always_asks() -> None:
    a = FakeProvider("a")
    book = OfferBook({"a": a}, ttl_seconds=60.0, clock=FakeClock())
    await book.refresh()
    await book.refresh()
    assert a.calls == 2


async def test_responsive_lists_providers_that_answered_lately() -> None:
    clock = FakeClock()
    a, b = FakeProvider("a"), FakeProvider("b", error=RuntimeError("down"))
    book = OfferBook({"a": a, "b": b}, ttl_seconds=10.0, clock=clock)
    assert book.responsive(60.0) == set()  # nobody asked yet
    await book.offers()
    assert book.responsive(60.0) == {"a"}
    clock.advance(60.0)
    assert book.responsive(60.0) == {"a"}  # exactly at the limit
    clock.advance(0.5)
    assert book.responsive(60.0) == set()
    b.error = None
    await book.offers()
    assert book.responsive(1.0) == {"a", "b"}
