"""Launching: failover per error class, blocking with a fake clock, and the budget under load.

``ScriptedProvider`` is a fake adapter whose ``create`` fails per a script (offer key -> the
outcomes of successive calls) and can yield to the event loop a few times, so concurrent
launches really interleave.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

import pytest

from tests.unit.ledgers import bill, instance, listed
from vk_provider.controllers.launch import Launcher, LaunchResult
from vk_provider.domain.budget import BudgetCaps, BudgetLedger
from vk_provider.domain.containers import ContainerSpec
from vk_provider.domain.contract import Provider
from vk_provider.domain.errors import (
    AuthFailed,
    CapacityUnavailable,
    InvalidSpec,
    NotSent,
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
from vk_provider.domain.placement import PlacementRequest, ProviderHealth
from vk_provider.settings.agent import PlacementConfig


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ScriptedProvider:
    def __init__(
        self,
        name: str,
        script: Mapping[str, list[ProviderError | None]] | None = None,
        *,
        yields: int = 0,
        fail_pods: Callable[[WorkloadSpec], ProviderError | None] | None = None,
        during_create: Callable[[], None] | None = None,
    ) -> None:
        self._name = name
        self._script = {key: list(outcomes) for key, outcomes in (script or {}).items()}
        self._yields = yields
        self._fail_pods = fail_pods
        self._during_create = during_create
        self.calls: list[str] = []

    @property
    def name(self) -> str:
        return self._name

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities()

    async def offers(self) -> list[Offer]:
        return []

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        self.calls.append(offer.key)
        for _ in range(self._yields):
            await asyncio.sleep(0)
            if self._during_create:
                self._during_create()
        if self._during_create:
            self._during_create()
        outcomes = self._script.get(offer.key)
        error = outcomes.pop(0) if outcomes else None
        if error is None and self._fail_pods:
            error = self._fail_pods(spec)
        if error is not None:
            raise error
        return Instance(
            provider=self._name,
            instance_id=f"{spec.pod_uid}-{len(self.calls)}",
            pod_uid=spec.pod_uid,
            attempt=spec.attempt,
            state=InstanceState.PENDING,
            offer_key=offer.key,
            price_per_hour=offer.price_per_hour,
        )

    async def get(self, instance_id: str) -> Instance:
        raise NotImplementedError

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        raise NotImplementedError

    async def list_ours(self) -> list[Instance]:
        return []

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        raise NotImplementedError
        yield b""  # pragma: no cover - makes this an async generator

    async def close(self) -> None:
        return None


def offer(provider: str, sku: str, price: float, **fields: object) -> Offer:
    base: dict[str, object] = {
        "provider": provider,
        "sku": sku,
        "region": "r1",
        "gpu_model": "H100-SXM",
        "gpu_count": 1,
        "gpu_memory_gib": 80.0,
        "vcpus": 16.0,
        "memory_gib": 128.0,
        "price_per_hour": price,
        "available": 5,
    }
    base.update(fields)
    return Offer(**base)  # type: ignore[arg-type]


A1 = offer("alpha", "a1", 1.0)
A2 = offer("alpha", "a2", 1.5)
B1 = offer("beta", "b1", 2.0)
OFFERS = [B1, A2, A1]  # deliberately not in price order
REQUEST = PlacementRequest(gpu_count=1)


def spec(uid: str = "pod-1", namespace: str = "ml") -> WorkloadSpec:
    return WorkloadSpec(
        pod_uid=uid,
        namespace=namespace,
        pod_name=uid,
        containers=(ContainerSpec(name="main", image="img"),),
    )


@dataclass
class Rig:
    providers: dict[str, ScriptedProvider]
    ledger: BudgetLedger
    clock: FakeClock
    launcher: Launcher
    health: dict[str, ProviderHealth] = field(default_factory=dict)

    def calls(self) -> list[str]:
        return [key for p in self.providers.values() for key in p.calls]


def rig(
    *providers: ScriptedProvider,
    caps: BudgetCaps | None = None,
    settings: PlacementConfig | None = None,
) -> Rig:
    clock = FakeClock()
    ledger = BudgetLedger(caps or BudgetCaps(), clock=clock)
    named = {p.name: p for p in providers}
    health: dict[str, ProviderHealth] = {}
    as_providers: dict[str, Provider] = dict(named)
    launcher = Launcher(
        as_providers,
        ledger,
        settings=settings or PlacementConfig(),
        health=lambda: health,
        clock=clock,
    )
    return Rig(named, ledger, clock, launcher, health)


def two_providers(
    alpha: Mapping[str, list[ProviderError | None]] | None = None,
    beta: Mapping[str, list[ProviderError | None]] | None = None,
    *,
    caps: BudgetCaps | None = None,
    settings: PlacementConfig | None = None,
) -> Rig:
    return rig(
        ScriptedProvider("alpha", alpha),
        ScriptedProvider("beta", beta),
        caps=caps,
        settings=settings,
    )


# --- failover, one error class per row --------------------------------------------------------


@dataclass(frozen=True)
class Row:
    error: ProviderError
    calls: list[str]
    launched_on: str | None = None
    blocked: frozenset[str] = frozenset()
    invalid: bool = False
    retry_after: float | None = None


ROWS = {
    "CapacityUnavailable blocks the offer, next candidate": Row(
        CapacityUnavailable("sold out"),
        calls=[A1.key, A2.key],
        launched_on=A2.key,
        blocked=frozenset({A1.key}),
    ),
    "AuthFailed blocks the provider, next provider": Row(
        AuthFailed("card declined"),
        calls=[A1.key, B1.key],  # alpha's other offer is not tried
        launched_on=B1.key,
        blocked=frozenset({"alpha"}),
    ),
    "InvalidSpec stops": Row(
        InvalidSpec("no such image", field="spec.containers[0].image"),
        calls=[A1.key],
        invalid=True,
    ),
    "RateLimited stops with its Retry-After": Row(
        RateLimited("429", retry_after=7), calls=[A1.key], retry_after=7.0
    ),
    "RateLimited without Retry-After stops with 0": Row(
        RateLimited("429"), calls=[A1.key], retry_after=0.0
    ),
    "Transient stops with 0": Row(Transient("503"), calls=[A1.key], retry_after=0.0),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
async def test_failover_by_error_class(row: Row) -> None:
    r = two_providers(alpha={A1.key: [row.error]})
    result = await r.launcher.launch(spec(), REQUEST, OFFERS)
    assert r.calls() == row.calls
    assert [(a.offer.key, a.error) for a in result.attempts] == [(A1.key, row.error)]
    assert (result.offer.key if result.offer else None) == row.launched_on
    assert result.launched is (row.launched_on is not None)
    assert r.launcher.blocked() == row.blocked
    assert (result.invalid is row.error) if row.invalid else result.invalid is None
    assert result.retry_after == row.retry_after
    assert not result.budget_limited
    expected_spend: dict[tuple[str, str], float] = {}
    if result.offer is not None:
        expected_spend[(result.offer.provider, "ml")] = result.offer.price_per_hour
    assert r.ledger.current_per_hour() == expected_spend
    # An answered refusal releases its hold; a Transient may have made the instance, whose
    # price stays held until a listing of alpha says whether it exists.
    uncertain = A1.price_per_hour if isinstance(row.error, Transient) else 0.0
    assert r.ledger.total_per_hour() == sum(expected_spend.values()) + uncertain


async def test_every_failed_attempt_is_listed_in_order() -> None:
    r = two_providers(
        alpha={A1.key: [CapacityUnavailable("a1")], A2.key: [CapacityUnavailable("a2")]}
    )
    result = await r.launcher.launch(spec(), REQUEST, OFFERS)
    assert [a.offer.key for a in result.attempts] == [A1.key, A2.key]
    assert [str(a.error) for a in result.attempts] == ["a1", "a2"]
    assert result.offer == B1
    assert r.launcher.blocked() == {A1.key, A2.key}


async def test_nothing_launches_when_every_candidate_is_out_of_capacity() -> None:
    full: list[ProviderError | None] = [CapacityUnavailable("full")]
    r = two_providers(alpha={A1.key: full, A2.key: list(full)}, beta={B1.key: list(full)})
    result = await r.launcher.launch(spec(), REQUEST, OFFERS)
    assert not result.launched
    assert [a.offer.key for a in result.attempts] == [A1.key, A2.key, B1.key]
    assert result.retry_after is None
    assert result.invalid is None
    assert not result.budget_limited
    assert r.ledger.total_per_hour() == 0.0


async def test_at_most_max_candidates_are_tried() -> None:
    full: list[ProviderError | None] = [CapacityUnavailable("full")]
    r = two_providers(
        alpha={A1.key: full, A2.key: list(full)}, settings=PlacementConfig(max_candidates=2)
    )
    result = await r.launcher.launch(spec(), REQUEST, OFFERS)
    assert r.calls() == [A1.key, A2.key]
    assert not result.launched


async def test_prefer_puts_that_candidate_first() -> None:
    r = two_providers()
    result = await r.launcher.launch(spec(), REQUEST, OFFERS, prefer=B1.key)
    assert r.calls() == [B1.key]
    assert result.offer == B1
    # The ranking itself is unchanged: the preference only reorders the walk.
    assert result.placement.candidates == (A1, A2, B1)


async def test_prefer_of_an_unknown_key_keeps_the_ranking() -> None:
    r = two_providers()
    result = await r.launcher.launch(spec(), REQUEST, OFFERS, prefer="gone/x/y")
    assert result.offer == A1


async def test_prefer_of_a_blocked_offer_is_ignored() -> None:
    r = two_providers()
    r.launcher.block(B1.key, 60.0)
    result = await r.launcher.launch(spec(), REQUEST, OFFERS, prefer=B1.key)
    assert result.offer == A1
    assert B1.key not in r.calls()


async def test_capacity_block_expires_with_the_clock() -> None:
    settings = PlacementConfig(capacity_block_seconds=120.0)
    r = two_providers(alpha={A1.key: [CapacityUnavailable("full")]}, settings=settings)
    await r.launcher.launch(spec("p1"), REQUEST, OFFERS)
    r.clock.advance(119.0)
    second = await r.launcher.launch(spec("p2"), REQUEST, OFFERS)
    assert second.offer == A2
    assert dict(second.placement.removed)["blocked"] == 1
    r.clock.advance(1.0)
    assert r.launcher.blocked() == frozenset()
    third = await r.launcher.launch(spec("p3"), REQUEST, OFFERS)
    assert third.offer == A1


async def test_auth_block_covers_every_offer_of_the_provider_until_it_expires() -> None:
    settings = PlacementConfig(auth_block_seconds=600.0)
    r = two_providers(alpha={A1.key: [AuthFailed("key revoked")]}, settings=settings)
    first = await r.launcher.launch(spec("p1"), REQUEST, OFFERS)
    assert first.offer == B1
    r.clock.advance(599.0)
    second = await r.launcher.launch(spec("p2"), REQUEST, OFFERS)
    assert second.offer == B1
    assert dict(second.placement.removed)["blocked"] == 2
    r.clock.advance(1.0)
    third = await r.launcher.launch(spec("p3"), REQUEST, OFFERS)
    assert third.offer == A1


async def test_a_longer_block_is_not_shortened() -> None:
    r = two_providers()
    r.launcher.block("alpha", 600.0)
    r.launcher.block("alpha", 10.0)
    r.clock.advance(300.0)
    assert r.launcher.blocked() == {"alpha"}


async def test_unhealthy_providers_are_not_called() -> None:
    r = two_providers()
    r.health["alpha"] = ProviderHealth(callable=False)
    result = await r.launcher.launch(spec(), REQUEST, OFFERS)
    assert result.offer == B1
    assert dict(result.placement.removed)["provider-health"] == 2


# --- the budget --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "held_after"),
    [
        (CapacityUnavailable("full"), 0.0),
        (NotSent("circuit open"), 0.0),
        (Transient("503"), 1.0),  # may exist: held until a listing of alpha says
    ],
    ids=["refused", "not-sent", "answer-lost"],
)
async def test_a_failed_create_releases_its_hold_only_when_nothing_can_exist(
    error: ProviderError, held_after: float
) -> None:
    seen: list[float] = []
    ledger_ref: list[BudgetLedger] = []

    def watch() -> None:
        seen.append(ledger_ref[0].total_per_hour())

    alpha = ScriptedProvider("alpha", {A1.key: [error]}, during_create=watch)
    r = rig(alpha, caps=BudgetCaps(global_per_hour=10.0))
    ledger_ref.append(r.ledger)
    await r.launcher.launch(spec(), REQUEST, [A1])
    assert seen == [1.0]  # the price was held while the provider was called
    assert r.ledger.total_per_hour() == held_after
    listed(r.ledger, "alpha", [])  # alpha lists nothing: the lost answer made nothing
    assert r.ledger.total_per_hour() == 0.0


async def test_budget_limited_when_the_cap_leaves_no_room() -> None:
    r = two_providers(caps=BudgetCaps(per_namespace={"ml": 0.5}))
    result = await r.launcher.launch(spec(), REQUEST, OFFERS)
    assert not result.launched
    assert result.budget_limited
    assert r.calls() == []
    other = await r.launcher.launch(spec("p2", namespace="web"), REQUEST, OFFERS)
    assert other.offer == A1


async def test_a_retry_of_a_create_whose_answer_was_lost_replaces_its_own_hold() -> None:
    """The same request on the same provider makes one instance: its uncertain hold is not
    counted twice, so the retry fits a cap that holds one."""
    r = two_providers(caps=BudgetCaps(global_per_hour=1.0))
    assert r.ledger.reserve(
        "pod-1.0", pod_uid="pod-1", namespace="ml", provider="alpha", offer_key=A1.key, price=1.0
    )
    r.ledger.unanswered("alpha", "pod-1.0")
    result = await r.launcher.launch(spec("pod-1"), REQUEST, OFFERS)
    assert result.offer == A1
    assert r.ledger.total_per_hour() == 1.0


async def test_candidates_priced_out_during_the_launch_are_skipped() -> None:
    ledger_ref: list[BudgetLedger] = []

    def someone_else_spends() -> None:
        bill(ledger_ref[0], provider="beta", pod_uid="other", namespace="ml", price=9.0)

    alpha = ScriptedProvider(
        "alpha", {A1.key: [CapacityUnavailable("full")]}, during_create=someone_else_spends
    )
    r = rig(alpha, ScriptedProvider("beta"), caps=BudgetCaps(global_per_hour=10.0))
    ledger_ref.append(r.ledger)
    result = await r.launcher.launch(spec(), REQUEST, OFFERS)
    # While a1 was being created another pod took 9 of the 10; a1 then failed, and
    # neither a2 (1.5) nor b1 (2.0) fits the 1.0 left: both are skipped, not called.
    assert r.calls() == [A1.key]
    assert not result.launched
    assert result.budget_skipped == 2
    assert [a.offer for a in result.attempts] == [A1]
    assert r.ledger.total_per_hour() == 9.0


async def test_concurrent_launches_never_exceed_a_cap() -> None:
    """50 launches at once; every create yields to the loop, so they interleave."""
    caps = BudgetCaps(
        global_per_hour=10.0, per_namespace={"ml": 6.0}, default_namespace_per_hour=5.0
    )
    offers = [
        offer("alpha", "small", 0.75),
        offer("beta", "medium", 1.25),
        offer("alpha", "large", 2.0),
        offer("beta", "huge", 4.0),
    ]
    ledger_ref: list[BudgetLedger] = []
    peaks: list[float] = []

    def check_caps() -> None:
        book = ledger_ref[0]
        peaks.append(book.total_per_hour())
        assert book.total_per_hour() <= 10.0
        assert book.view("ml").namespace_room >= 0.0  # type: ignore[operator]
        assert book.view("web").namespace_room >= 0.0  # type: ignore[operator]

    def transient_for_every_seventh(s: WorkloadSpec) -> ProviderError | None:
        return Transient("503") if int(s.pod_uid.split("-")[1]) % 7 == 0 else None

    providers = [
        ScriptedProvider(
            name, yields=3, fail_pods=transient_for_every_seventh, during_create=check_caps
        )
        for name in ("alpha", "beta")
    ]
    r = rig(*providers, caps=caps)
    ledger_ref.append(r.ledger)
    specs = [spec(f"pod-{i}", namespace="ml" if i % 2 else "web") for i in range(50)]
    results: list[LaunchResult] = await asyncio.gather(
        *(r.launcher.launch(s, REQUEST, offers) for s in specs)
    )

    launched = [(s, res) for s, res in zip(specs, results, strict=True) if res.launched]
    spent = sum(res.offer.price_per_hour for _, res in launched if res.offer)
    assert spent <= 10.0
    for namespace, cap in (("ml", 6.0), ("web", 5.0)):
        assert (
            sum(
                res.offer.price_per_hour
                for s, res in launched
                if res.offer and s.namespace == namespace
            )
            <= cap
        )
    # The ledger bills exactly the launched pods, and holds too what the 503s may have
    # made; the providers' listings (which show none of those) then release them.
    assert sum(r.ledger.current_per_hour().values()) == spent
    for name in ("alpha", "beta"):
        listed(
            r.ledger,
            name,
            [
                instance(name, s.pod_uid, res.offer.price_per_hour)
                for s, res in launched
                if res.offer and res.offer.provider == name
            ],
        )
    assert r.ledger.total_per_hour() == spent
    # The cap was what stopped the rest: at its peak the ledger had no room for one more.
    assert 10.0 - 0.75 < max(peaks) <= 10.0
    assert len(launched) >= 8
    for s, res in zip(specs, results, strict=True):
        if res.launched:
            continue
        if int(s.pod_uid.split("-")[1]) % 7 == 0 and res.attempts:
            assert res.retry_after == 0.0
        else:
            assert res.budget_limited, (s.pod_uid, res)


async def test_a_fresh_answer_with_room_lifts_an_older_capacity_block_only() -> None:
    """Issue 14: a "no capacity" block hid a slot for its whole 120 s even after the provider
    said, in a later answer, that the offer had room again."""
    from dataclasses import replace as with_

    from vk_provider.domain.offerindex import OfferIndex

    r = two_providers(alpha={A1.key: [CapacityUnavailable("a1")]})
    asked_before = r.clock()
    r.clock.advance(1.0)
    await r.launcher.launch(spec(), REQUEST, OFFERS)
    assert A1.key in r.launcher.blocked()
    room = OfferIndex([with_(A1, available=1), A2, B1])
    full = OfferIndex([with_(A1, available=0), A2, B1])
    # An answer older than the refusal, or one that says it is still full, changes nothing.
    assert r.launcher.capacity_seen(room, asked_before) == []
    assert r.launcher.capacity_seen(full, r.clock()) == []
    assert A1.key in r.launcher.blocked()
    # An answer asked for after the refusal that shows room lifts the block.
    assert r.launcher.capacity_seen(room, r.clock()) == [A1.key]
    assert A1.key not in r.launcher.blocked()


class RoomedProvider(ScriptedProvider):
    """Refuses a create (``CapacityUnavailable``) once an offer's slots are used up."""

    def __init__(self, name: str, slots: Mapping[str, int]) -> None:
        super().__init__(name, yields=3)
        self.slots = dict(slots)
        self.refused = 0

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        made = await super().create(spec, offer)
        if self.slots[offer.key] <= 0:
            self.refused += 1
            raise CapacityUnavailable(f"{offer.key} is full")
        self.slots[offer.key] -= 1
        return made


async def test_pods_placed_together_spread_over_offers_with_one_create_each() -> None:
    """Five pods at once on offers with 2, 2 and 4 free: the creates under way count against
    their offer's room, so the two cheapest fill up and the fifth goes to the third; no
    create is refused, and each pod was offered its cheapest offer with room left."""
    cheap, mid, dear = (
        offer("alpha", "cheap", 1.0, available=2),
        offer("alpha", "mid", 1.5, available=2),
        offer("alpha", "dear", 2.0, available=4),
    )
    provider = RoomedProvider("alpha", {cheap.key: 2, mid.key: 2, dear.key: 4})
    r = rig(provider)
    results = await asyncio.gather(
        *(r.launcher.launch(spec(f"pod-{i}"), REQUEST, [cheap, mid, dear]) for i in range(5))
    )
    assert all(res.launched and not res.attempts for res in results), results
    assert len(provider.calls) == 5 and provider.refused == 0, provider.calls
    assert sorted(provider.calls) == sorted([cheap.key] * 2 + [mid.key] * 2 + [dear.key])
    # Until the providers are asked again, the room stays taken: a sixth pod sees only the
    # dear offer, and the explanation says why the others were refused.
    plan = r.launcher.plan(REQUEST, [cheap, mid, dear], namespace="ml")
    assert [o.key for o in plan.order] == [dear.key]
    assert dict(plan.placement.removed)["taken"] == 2


async def test_room_taken_by_creates_is_given_back_by_a_refusal_and_by_the_next_answer() -> None:
    only = offer("alpha", "only", 1.0, available=1)
    provider = RoomedProvider("alpha", {only.key: 0})  # the answer was stale: it is full
    r = rig(provider)
    refused = await r.launcher.launch(spec("pod-1"), REQUEST, [only])
    assert not refused.launched and r.launcher.room.taken() == {}
    provider.slots[only.key] = 1
    r.launcher.capacity_freed(only.key)  # the "no capacity" block of that refusal lifted
    made = await r.launcher.launch(spec("pod-2"), REQUEST, [only])
    assert made.launched and r.launcher.room.taken() == {only.key: 1}
    r.launcher.room.asking({})
    r.launcher.room.answered()  # asked after the create: the answer counts it
    assert r.launcher.room.taken() == {}
