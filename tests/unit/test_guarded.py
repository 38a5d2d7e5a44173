"""GuardedProvider: the breaker in front of every provider call (fake clock, fake adapter)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import cast

import pytest

from vk_provider.controllers.guarded import GuardedProvider
from vk_provider.controllers.offers import OfferBook
from vk_provider.domain.breaker import BreakerState, CircuitBreaker
from vk_provider.domain.containers import ContainerSpec, ContainerUsage
from vk_provider.domain.contract import ExecSession, PortStream
from vk_provider.domain.errors import (
    CapacityUnavailable,
    InvalidSpec,
    NotFound,
    ProviderError,
    RateLimited,
    Transient,
)
from vk_provider.domain.models import (
    Capabilities,
    Instance,
    InstanceState,
    LogOptions,
    Offer,
    WorkloadSpec,
)

THRESHOLD = 2
COOLDOWN = 30.0

OFFER = Offer(
    provider="flaky",
    sku="h100",
    region="r1",
    gpu_model="H100",
    gpu_count=1,
    gpu_memory_gib=80.0,
    vcpus=8.0,
    memory_gib=64.0,
    price_per_hour=2.0,
)
SPEC = WorkloadSpec(
    pod_uid="uid", namespace="ns", pod_name="p", containers=(ContainerSpec(name="c", image="img"),)
)
INSTANCE = Instance(
    provider="flaky", instance_id="i-1", pod_uid="uid", attempt=0, state=InstanceState.RUNNING
)


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeAdapter:
    """Counts calls per operation; ``fail`` is raised by every call while it is set."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.fail: BaseException | None = None
        self.hang: asyncio.Event | None = None  # offers() waits on it when set

    def _enter(self, operation: str) -> None:
        self.calls[operation] = self.calls.get(operation, 0) + 1
        if self.fail is not None:
            raise self.fail

    @property
    def name(self) -> str:
        return "flaky"

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(follow_logs=True)

    async def offers(self) -> list[Offer]:
        self._enter("offers")
        if self.hang is not None:
            await self.hang.wait()
        return [OFFER]

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        self._enter("create")
        return INSTANCE

    async def get(self, instance_id: str) -> Instance:
        self._enter("get")
        return INSTANCE

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        self._enter("delete")

    async def list_ours(self) -> list[Instance]:
        self._enter("list")
        return [INSTANCE]

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        self._enter("logs")
        yield b"line\n"

    async def close(self) -> None:
        self.calls["close"] = self.calls.get("close", 0) + 1


Observed = list[tuple[str, str, BaseException | None]]


def guarded() -> tuple[GuardedProvider, FakeAdapter, FakeClock, Observed]:
    clock = FakeClock()
    adapter = FakeAdapter()
    observed: Observed = []
    breaker = CircuitBreaker(threshold=THRESHOLD, cooldown_seconds=COOLDOWN, clock=clock)
    provider = GuardedProvider(
        adapter, breaker, observe=lambda p, o, _s, e: observed.append((p, o, e))
    )
    return provider, adapter, clock, observed


def state(provider: GuardedProvider) -> BreakerState:
    """Read afresh each time (a plain attribute read would be narrowed by mypy)."""
    return provider.breaker.state


async def open_breaker(provider: GuardedProvider, adapter: FakeAdapter) -> None:
    adapter.fail = Transient("503")
    for _ in range(THRESHOLD):
        with pytest.raises(Transient):
            await provider.get("i-1")
    adapter.fail = None
    assert state(provider) is BreakerState.OPEN


async def test_calls_pass_through_while_closed() -> None:
    provider, adapter, _clock, observed = guarded()
    assert provider.name == "flaky"
    assert provider.capabilities.follow_logs
    assert await provider.offers() == [OFFER]
    assert await provider.create(SPEC, OFFER) is INSTANCE
    assert await provider.get("i-1") is INSTANCE
    assert await provider.list_ours() == [INSTANCE]
    await provider.delete("i-1", grace_seconds=5)
    assert [chunk async for chunk in provider.logs("i-1", LogOptions())] == [b"line\n"]
    await provider.close()
    assert adapter.calls == {
        "offers": 1,
        "create": 1,
        "get": 1,
        "list": 1,
        "delete": 1,
        "logs": 1,
        "close": 1,
    }
    assert [(p, o, e) for p, o, e in observed] == [
        ("flaky", op, None) for op in ("offers", "create", "get", "list", "delete")
    ]


async def test_open_breaker_fails_fast_without_calling_the_adapter() -> None:
    provider, adapter, _clock, _observed = guarded()
    await open_breaker(provider, adapter)
    before = dict(adapter.calls)
    with pytest.raises(Transient, match="circuit open") as created:
        await provider.create(SPEC, OFFER)
    assert created.value.provider == "flaky"
    with pytest.raises(Transient, match="circuit open"):
        await provider.get("i-1")
    with pytest.raises(Transient, match="circuit open"):
        await provider.list_ours()
    with pytest.raises(Transient, match="circuit open"):
        async for _ in provider.logs("i-1", LogOptions()):
            pass
    assert adapter.calls == before


async def test_offers_are_empty_until_the_cooldown_then_one_probe_closes_it() -> None:
    provider, adapter, clock, _observed = guarded()
    await open_breaker(provider, adapter)
    clock.advance(COOLDOWN - 1)
    assert await provider.offers() == []
    assert adapter.calls.get("offers", 0) == 0
    clock.advance(1)
    assert await provider.offers() == [OFFER]  # the probe
    assert adapter.calls["offers"] == 1
    assert state(provider) is BreakerState.CLOSED
    assert await provider.get("i-1") is INSTANCE  # closed again: calls go through


async def test_a_failed_probe_opens_the_breaker_for_another_cooldown() -> None:
    provider, adapter, clock, _observed = guarded()
    await open_breaker(provider, adapter)
    clock.advance(COOLDOWN)
    adapter.fail = Transient("still down")
    with pytest.raises(Transient, match="still down"):
        await provider.offers()
    assert state(provider) is BreakerState.OPEN
    adapter.fail = None
    clock.advance(COOLDOWN - 1)
    assert await provider.offers() == []
    assert adapter.calls["offers"] == 1
    clock.advance(1)
    assert await provider.offers() == [OFFER]
    assert state(provider) is BreakerState.CLOSED


async def test_only_one_probe_while_half_open() -> None:
    provider, adapter, clock, _observed = guarded()
    await open_breaker(provider, adapter)
    clock.advance(COOLDOWN)
    adapter.hang = asyncio.Event()
    probe = asyncio.create_task(provider.offers())
    await asyncio.sleep(0)
    assert state(provider) is BreakerState.HALF_OPEN
    assert await provider.offers() == []  # a second caller does not probe too
    with pytest.raises(Transient, match="circuit open"):
        await provider.create(SPEC, OFFER)
    adapter.hang.set()
    assert await probe == [OFFER]
    assert adapter.calls["offers"] == 1
    assert state(provider) is BreakerState.CLOSED


async def test_a_probe_cancelled_by_a_timeout_does_not_stop_probing_for_good() -> None:
    """OfferBook's timeout cancels a hanging probe; a later cool-down must allow another."""
    provider, adapter, clock, _observed = guarded()
    await open_breaker(provider, adapter)
    clock.advance(COOLDOWN)
    adapter.hang = asyncio.Event()  # never set: the probe hangs until cancelled
    book = OfferBook({"flaky": provider}, ttl_seconds=0.0, timeout_seconds=0.01, clock=clock)
    assert await book.offers() == []
    assert adapter.calls["offers"] == 1
    assert state(provider) is BreakerState.HALF_OPEN
    assert await book.offers() == []  # still within the cool-down: no second probe
    assert adapter.calls["offers"] == 1
    adapter.hang = None
    clock.advance(COOLDOWN)
    assert await book.offers() == [OFFER]
    assert adapter.calls["offers"] == 2
    assert state(provider) is BreakerState.CLOSED


async def test_delete_is_attempted_while_open() -> None:
    provider, adapter, _clock, _observed = guarded()
    await open_breaker(provider, adapter)
    await provider.delete("i-1", grace_seconds=0)
    assert adapter.calls["delete"] == 1
    adapter.fail = NotFound("already gone")
    with pytest.raises(NotFound):
        await provider.delete("i-2", grace_seconds=0)
    assert adapter.calls["delete"] == 2


@pytest.mark.parametrize(
    "raised",
    [RuntimeError("boom"), KeyError("id"), ValueError("bad json")],
    ids=lambda e: type(e).__name__,
)
async def test_non_taxonomy_exceptions_become_transient(raised: Exception) -> None:
    provider, adapter, _clock, observed = guarded()
    adapter.fail = raised
    with pytest.raises(Transient) as caught:
        await provider.get("i-1")
    assert caught.value.__cause__ is raised
    assert caught.value.provider == "flaky"
    assert "adapter flaky failed in get" in str(caught.value)
    assert type(raised).__name__ in str(caught.value)
    assert observed[-1] == ("flaky", "get", raised)
    assert provider.breaker.snapshot().consecutive_failures == 1


async def test_timeouts_become_transient_and_count() -> None:
    provider, adapter, _clock, _observed = guarded()
    adapter.fail = TimeoutError()
    for _ in range(THRESHOLD):
        with pytest.raises(Transient, match="create timed out"):
            await provider.create(SPEC, OFFER)
    assert state(provider) is BreakerState.OPEN


@pytest.mark.parametrize(
    "error",
    [NotFound("gone"), CapacityUnavailable("sold out"), InvalidSpec("bad", field="image")],
    ids=lambda e: type(e).__name__,
)
async def test_normal_refusals_pass_through_and_do_not_open_the_breaker(
    error: ProviderError,
) -> None:
    provider, adapter, _clock, _observed = guarded()
    adapter.fail = error
    for _ in range(THRESHOLD * 3):
        with pytest.raises(type(error)) as caught:
            await provider.get("i-1")
        assert caught.value is error  # re-raised as is, not wrapped
    assert caught.value.provider == "flaky"  # but named
    assert state(provider) is BreakerState.CLOSED
    adapter.fail = None
    assert await provider.get("i-1") is INSTANCE


async def test_a_provider_error_keeps_the_provider_it_names() -> None:
    provider, adapter, _clock, _observed = guarded()
    adapter.fail = RateLimited("429", provider="upstream", retry_after=3)
    with pytest.raises(RateLimited) as caught:
        await provider.list_ours()
    assert caught.value.provider == "upstream"
    assert caught.value.retry_after == 3


# --------------------------------------------------------------------------- optional operations


class FullAdapter(FakeAdapter):
    """An adapter with every optional operation."""

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(exec=True, port_forward=True, usage=True, multi_container=True)

    async def exec(
        self, instance_id: str, container: str, command: list[str], *, tty: bool
    ) -> ExecSession:
        self._enter("exec")
        return cast(ExecSession, ("session", instance_id, container, tuple(command), tty))

    async def open_port(self, instance_id: str, port: int) -> PortStream:
        self._enter("open_port")
        return cast(PortStream, ("port", instance_id, port))

    async def usage(self, instance_id: str) -> list[ContainerUsage]:
        self._enter("usage")
        return [ContainerUsage("main", 1, 2, datetime(2026, 1, 1, tzinfo=UTC))]

    async def restart_container(self, instance_id: str, container: str) -> None:
        self._enter("restart")


async def test_optional_operations_are_forwarded_through_the_breaker() -> None:
    clock = FakeClock()
    adapter = FullAdapter()
    observed: Observed = []
    breaker = CircuitBreaker(threshold=THRESHOLD, cooldown_seconds=COOLDOWN, clock=clock)
    provider = GuardedProvider(
        adapter, breaker, observe=lambda p, o, _s, e: observed.append((p, o, e))
    )
    assert provider.capabilities == adapter.capabilities
    assert await provider.exec("i-1", "main", ["ls"], tty=True) == cast(
        ExecSession, ("session", "i-1", "main", ("ls",), True)
    )
    assert await provider.open_port("i-1", 80) == cast(PortStream, ("port", "i-1", 80))
    [measured] = await provider.usage("i-1")
    assert measured.name == "main"
    await provider.restart_container("i-1", "main")
    assert [o for _, o, _ in observed] == ["exec", "port_forward", "usage", "restart_container"]

    adapter.fail = Transient("503")
    for _ in range(THRESHOLD):
        with pytest.raises(Transient):
            await provider.usage("i-1")
    assert state(provider) is BreakerState.OPEN
    adapter.fail = None
    with pytest.raises(Transient, match="circuit open"):
        await provider.exec("i-1", "main", ["ls"], tty=False)
    assert adapter.calls["exec"] == 1  # not called while open


async def test_an_adapter_without_the_operation_is_invalid_spec_naming_it() -> None:
    provider, _adapter, _clock, observed = guarded()
    for call in (
        provider.exec("i-1", "main", ["ls"], tty=False),
        provider.open_port("i-1", 80),
        provider.usage("i-1"),
        provider.restart_container("i-1", "main"),
    ):
        with pytest.raises(InvalidSpec, match="provider flaky does not support"):
            await call
    assert observed == [] and state(provider) is BreakerState.CLOSED


async def test_an_exec_the_adapter_refuses_does_not_count_against_it() -> None:
    clock = FakeClock()
    adapter = FullAdapter()
    provider = GuardedProvider(
        adapter, CircuitBreaker(threshold=THRESHOLD, cooldown_seconds=COOLDOWN, clock=clock)
    )
    adapter.fail = InvalidSpec('exec: "nope": executable file not found in $PATH')
    for _ in range(THRESHOLD + 1):
        with pytest.raises(InvalidSpec):
            await provider.exec("i-1", "main", ["nope"], tty=False)
    assert state(provider) is BreakerState.CLOSED
