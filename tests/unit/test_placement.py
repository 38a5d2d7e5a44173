"""Placement: ``place()`` checked against an independent brute force, plus annotation parsing.

The brute force below is written from the documented semantics (docs/reference.md#placement,
the ``placement`` module docstring and the ``PlacementPolicy`` fields), not from the module's
private helpers, so a filter or ranking bug in ``place()`` shows up as a disagreement.

Prices and budget rooms are exact binary fractions, so "price <= room" is decided exactly
and ties in the ranking really occur. Offer keys are unique within one input, as a key
identifies an offer (``blocked`` and the launcher's ``prefer`` speak keys).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.workloads import workload
from vk_provider.domain.budget import BudgetView
from vk_provider.domain.models import Capabilities, Offer, WorkloadSpec
from vk_provider.domain.placement import (
    FILTERS,
    CapacityType,
    Placement,
    PlacementPolicy,
    PlacementRequest,
    PodShape,
    ProviderHealth,
    gpu_matches,
    penalties,
    place,
    score,
    shape_refused,
)
from vk_provider.domain.podspec import InvalidPodSpec
from vk_provider.domain.podview import ANN_CAPACITY_TYPE, ANN_MAX_PRICE, ANN_PROVIDERS, ANN_REGIONS
from vk_provider.domain.workload import placement_request

T = TypeVar("T")

PROVIDER_NAMES = ("alpha", "beta", "gamma", "delta")
OFFERED_GPUS: tuple[str | None, ...] = (
    "H100-SXM",
    "H100-PCIE",
    "H100",
    "h100-sxm",
    "A100",
    "A100-80GB",
    "L40S",
    None,
)
WANTED_GPUS = ("H100", "H100-SXM", "H100-PCIE", "h100", "A100", "A100-80GB", "L40S", "B200")
REGION_NAMES = ("us-east-1", "us-west", "eu-ro-1", "ap-south")
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# Prices cluster near $1/hour, so the penalties (a few to fifty percent) decide the order
# often; repeated values make exact ties. All are exact binary fractions, so "price <= room"
# and the tie-breaks are decided exactly.
PRICES = (0.0, 0.5, 1.0, 1.0, 1.0625, 1.125, 1.25, 1.5, 2.0, 2.0, 3.0, 6.0)
ROOMS = (-1.0, 0.0, 0.5, 1.0, 1.0625, 1.25, 2.0, 3.0, 8.0)


# --- strategies ------------------------------------------------------------------------------


def offers() -> st.SearchStrategy[Offer]:
    return st.builds(
        Offer,
        provider=st.sampled_from(PROVIDER_NAMES),
        sku=st.just("sku"),  # made unique by offer_lists
        region=st.sampled_from(REGION_NAMES),
        gpu_model=st.sampled_from(OFFERED_GPUS),
        gpu_count=st.sampled_from((0, 0, 1, 1, 2, 4, 8)),
        gpu_memory_gib=st.sampled_from((0.0, 24.0, 40.0, 48.0, 80.0)),
        vcpus=st.sampled_from((1.0, 2.0, 8.0, 16.0, 32.0)),
        memory_gib=st.sampled_from((2.0, 16.0, 64.0, 256.0)),
        price_per_hour=st.sampled_from(PRICES),
        spot=st.booleans(),
        available=st.integers(0, 5),
        startup_seconds=st.sampled_from((0.0, 30.0, 60.0, 300.0, 3600.0)),
    )


def offer_lists(max_size: int = 30) -> st.SearchStrategy[list[Offer]]:
    """Offers with unique keys; long lists as often as short ones."""
    lists = st.lists(offers(), max_size=max_size) | st.lists(
        offers(), min_size=10, max_size=max_size
    )
    return lists.map(lambda drawn: [replace(o, sku=f"sku-{i}") for i, o in enumerate(drawn)])


def mostly(default: T, other: st.SearchStrategy[T]) -> st.SearchStrategy[T]:
    """``default`` three times in four, so that enough offers survive the filters."""
    return st.integers(0, 3).flatmap(lambda n: other if n == 0 else st.just(default))


def requests() -> st.SearchStrategy[PlacementRequest]:
    def some(values: Sequence[str]) -> st.SearchStrategy[tuple[str, ...]]:
        return st.lists(st.sampled_from(values), min_size=1, max_size=3).map(tuple)

    return st.builds(
        PlacementRequest,
        gpu_count=st.sampled_from((0, 1, 1, 1, 1, 2, 4, 8)),
        gpu_models=st.just(()) | some(WANTED_GPUS),  # half the time: model matching matters
        min_gpu_memory_gib=mostly(0.0, st.sampled_from((24.0, 40.0, 80.0))),
        cpu=mostly(0.0, st.sampled_from((1.0, 4.0, 16.0))),
        memory_gib=mostly(0.0, st.sampled_from((8.0, 64.0))),
        regions=mostly((), some(REGION_NAMES)),
        max_price_per_hour=mostly(None, st.sampled_from(PRICES)),
        capacity_type=st.sampled_from(
            (CapacityType.ANY, CapacityType.ANY, CapacityType.ON_DEMAND, CapacityType.SPOT)
        ),
        providers=mostly((), some(PROVIDER_NAMES)),
        shape=mostly(PodShape(), SHAPES),
    )


SHAPES = st.builds(
    PodShape,
    app_containers=st.integers(1, 3),
    init_containers=st.integers(0, 2),
    sidecars=st.integers(0, 2),
)


def capability_maps() -> st.SearchStrategy[dict[str, Capabilities]]:
    return st.dictionaries(
        st.sampled_from(PROVIDER_NAMES),
        st.builds(
            Capabilities,
            multi_container=st.booleans(),
            init_containers=st.booleans(),
            sidecars=st.booleans(),
        ),
    )


def health_maps() -> st.SearchStrategy[dict[str, ProviderHealth]]:
    return st.dictionaries(
        st.sampled_from(PROVIDER_NAMES),
        st.builds(
            ProviderHealth,
            callable=st.sampled_from((True, True, True, False)),
            recent_failures=st.sampled_from((0, 1, 2, 3, 7)),
        ),
    )


def budget_views() -> st.SearchStrategy[BudgetView | None]:
    room = st.none() | st.sampled_from(ROOMS)
    return st.none() | st.builds(BudgetView, global_room=room, namespace_room=room)


def policies() -> st.SearchStrategy[PlacementPolicy]:
    return st.builds(
        PlacementPolicy,
        low_availability_penalty=st.sampled_from((0.0, 0.05, 0.5)),
        startup_penalty_per_minute=st.sampled_from((0.0, 0.01, 0.1)),
        startup_penalty_cap=st.sampled_from((0.2, 1.0)),
        failure_penalty=st.sampled_from((0.1, 0.5)),
        failure_penalty_cap=st.sampled_from((0.5, 2.0)),
    )


@dataclass(frozen=True)
class Scenario:
    request: PlacementRequest
    offers: list[Offer]
    blocked: frozenset[str]
    health: dict[str, ProviderHealth]
    budget: BudgetView | None
    priorities: dict[str, int]
    policy: PlacementPolicy
    capabilities: dict[str, Capabilities] = field(default_factory=dict)
    taken: dict[str, int] = field(default_factory=dict)

    def run(self, offers: Sequence[Offer] | None = None) -> Placement:
        return place(
            self.request,
            self.offers if offers is None else offers,
            blocked=self.blocked,
            health=self.health,
            budget=self.budget,
            priorities=self.priorities,
            policy=self.policy,
            capabilities=self.capabilities,
            taken=self.taken,
        )


# Built once: constructing strategies inside ``scenarios`` would dominate the run time.
OFFER_LISTS = offer_lists()
# Half of the requests are permissive, so that long candidate lists test the ranking.
REQUESTS = st.just(PlacementRequest(gpu_count=1, capacity_type=CapacityType.ANY)) | requests()
HEALTH_MAPS = health_maps()
BUDGET_VIEWS = budget_views()
POLICIES = policies()
CAPABILITY_MAPS = capability_maps()
PRIORITIES = st.dictionaries(st.sampled_from(PROVIDER_NAMES), st.integers(-2, 2))
PICKS = st.lists(st.integers(0, 63), max_size=4)
TAKEN = st.lists(st.tuples(st.integers(0, 63), st.integers(1, 3)), max_size=3)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    offers = draw(OFFER_LISTS)
    # Blocked entries are provider names, keys of drawn offers, or something unknown.
    blockable = [*PROVIDER_NAMES, *(o.key for o in offers), "nobody/none/none"]
    blocked = frozenset(blockable[i % len(blockable)] for i in draw(PICKS))
    return Scenario(
        request=draw(REQUESTS),
        offers=offers,
        blocked=blocked,
        health=draw(HEALTH_MAPS),
        budget=draw(BUDGET_VIEWS),
        priorities=draw(PRIORITIES),
        policy=draw(POLICIES),
        capabilities=draw(CAPABILITY_MAPS),
        # Creates under way on some offers (the room of domain.room): up to 3 each.
        taken={offers[i % len(offers)].key: n for i, n in draw(TAKEN)} if offers else {},
    )


# --- the brute force -------------------------------------------------------------------------


def family_match(wanted: str, offered: str | None) -> bool:
    """A wanted name matches an offered model whose dash-separated parts it is a prefix of."""
    if offered is None:
        return False
    want = wanted.lower().split("-")
    have = offered.lower().split("-")
    return have[: len(want)] == want


def checks(s: Scenario) -> dict[str, Callable[[Offer], bool]]:
    """Every hard constraint, named as in ``FILTERS``."""
    r = s.request

    def room_ok(o: Offer) -> bool:
        b = s.budget
        if b is None:
            return True
        rooms = [room for room in (b.global_room, b.namespace_room) if room is not None]
        return all(o.price_per_hour <= room for room in rooms)

    def capacity_ok(o: Offer) -> bool:
        if r.capacity_type is CapacityType.SPOT:
            return o.spot
        if r.capacity_type is CapacityType.ON_DEMAND:
            return not o.spot
        return True

    def shape_ok(o: Offer) -> bool:
        # One app container and nothing else runs anywhere; anything more needs a provider
        # that declares each kind it has (several apps, init containers, sidecars).
        shape = r.shape
        if shape.app_containers == 1 and shape.init_containers == 0 and shape.sidecars == 0:
            return True
        caps = s.capabilities.get(o.provider)
        if caps is None:
            return False
        needs = [
            (shape.app_containers > 1, caps.multi_container),
            (shape.init_containers > 0, caps.init_containers),
            (shape.sidecars > 0, caps.sidecars),
        ]
        return all(has for needed, has in needs if needed)

    return {
        "provider": lambda o: r.providers == () or o.provider in r.providers,
        "shape": shape_ok,
        "gpu-count": lambda o: o.gpu_count == 0 if r.gpu_count == 0 else o.gpu_count >= r.gpu_count,
        "gpu-model": lambda o: (
            r.gpu_models == () or any(family_match(m, o.gpu_model) for m in r.gpu_models)
        ),
        "gpu-memory": lambda o: o.gpu_memory_gib >= r.min_gpu_memory_gib,
        "cpu": lambda o: o.vcpus >= r.cpu,
        "memory": lambda o: o.memory_gib >= r.memory_gib,
        "region": lambda o: r.regions == () or o.region in r.regions,
        "capacity-type": capacity_ok,
        "price": lambda o: r.max_price_per_hour is None or o.price_per_hour <= r.max_price_per_hour,
        "sold-out": lambda o: o.available >= 1,
        "taken": lambda o: o.available - s.taken.get(o.key, 0) >= 1,
        "provider-health": lambda o: s.health.get(o.provider, ProviderHealth()).callable,
        "blocked": lambda o: o.key not in s.blocked and o.provider not in s.blocked,
        "budget": room_ok,
    }


def feasible(s: Scenario, offer: Offer, *, skip: frozenset[str] = frozenset()) -> bool:
    return all(check(offer) for name, check in checks(s).items() if name not in skip)


def first_failing(s: Scenario, offer: Offer) -> str | None:
    for name, check in checks(s).items():
        if not check(offer):
            return name
    return None


def order_key(s: Scenario, offer: Offer) -> tuple[float, float, int, str]:
    """(price after penalties, price, -priority, key), from the ``PlacementPolicy`` fields."""
    p = s.policy
    # Its last instance: the room left once the creates under way on it are counted.
    low = p.low_availability_penalty if offer.available - s.taken.get(offer.key, 0) == 1 else 0.0
    slow = min(offer.startup_seconds / 60.0 * p.startup_penalty_per_minute, p.startup_penalty_cap)
    failures = s.health.get(offer.provider, ProviderHealth()).recent_failures
    sick = min(failures * p.failure_penalty, p.failure_penalty_cap)
    scored = offer.price_per_hour * (1.0 + (low + slow + sick))
    return (scored, offer.price_per_hour, -s.priorities.get(offer.provider, 0), offer.key)


# --- properties ------------------------------------------------------------------------------


def test_brute_force_checks_the_documented_filters_in_order() -> None:
    empty = Scenario(PlacementRequest(), [], frozenset(), {}, None, {}, PlacementPolicy())
    assert list(checks(empty)) == list(FILTERS)


@SETTINGS
@given(scenarios())
def test_every_candidate_satisfies_every_hard_constraint(s: Scenario) -> None:
    for candidate in s.run().candidates:
        assert first_failing(s, candidate) is None, candidate


@SETTINGS
@given(scenarios())
def test_candidates_are_exactly_the_brute_force_feasible_set(s: Scenario) -> None:
    result = s.run()
    expected = sorted(o.key for o in s.offers if feasible(s, o))
    assert sorted(c.key for c in result.candidates) == expected
    assert len(result.candidates) == len(expected)


@SETTINGS
@given(scenarios())
def test_first_candidate_is_the_brute_force_minimum(s: Scenario) -> None:
    result = s.run()
    fitting = [o for o in s.offers if feasible(s, o)]
    if not fitting:
        assert not result.fits
        return
    best = min(fitting, key=lambda o: order_key(s, o))
    assert result.candidates[0] == best
    # And the whole list is in that order, not only its head.
    keys = [order_key(s, c) for c in result.candidates]
    assert keys == sorted(keys)


@SETTINGS
@given(scenarios(), st.randoms(use_true_random=False))
def test_ranking_is_deterministic_under_shuffling(s: Scenario, rnd: random.Random) -> None:
    shuffled = list(s.offers)
    rnd.shuffle(shuffled)
    first, second = s.run(), s.run(shuffled)
    assert first.candidates == second.candidates
    assert first.removed == second.removed


@SETTINGS
@given(scenarios())
def test_no_candidate_costs_more_than_the_budget_room(s: Scenario) -> None:
    result = s.run()
    if s.budget is None:
        return
    for candidate in result.candidates:
        for room in (s.budget.global_room, s.budget.namespace_room):
            assert room is None or candidate.price_per_hour <= room


@SETTINGS
@given(scenarios())
def test_removed_counts_account_for_every_offer(s: Scenario) -> None:
    result = s.run()
    assert [name for name, _ in result.removed] == list(FILTERS)
    assert sum(count for _, count in result.removed) == len(s.offers) - len(result.candidates)
    # Each offer is counted by the first filter (in FILTERS order) that rejects it.
    expected = dict.fromkeys(FILTERS, 0)
    for offer in s.offers:
        name = first_failing(s, offer)
        if name is not None:
            expected[name] += 1
    assert dict(result.removed) == expected


@SETTINGS
@given(scenarios())
def test_refused_names_each_removed_offer_with_its_first_failing_filter(s: Scenario) -> None:
    result = s.run()
    refused = sorted((offer.key, name) for offer, name in result.refused)
    expected = sorted(
        (offer.key, name) for offer in s.offers if (name := first_failing(s, offer)) is not None
    )
    assert refused == expected
    assert {o.key for o, _ in result.refused}.isdisjoint(c.key for c in result.candidates)


@SETTINGS
@given(scenarios())
def test_penalties_add_up_to_the_score(s: Scenario) -> None:
    for offer in s.offers:
        health = s.health.get(offer.provider, ProviderHealth())
        parts = penalties(offer, health, s.policy)
        if offer.available >= 1 and not s.taken.get(offer.key):  # ranked by its own room
            assert score(offer, health, s.policy) == order_key(s, offer)[0]
        assert score(offer, health, s.policy) == offer.price_per_hour * (1.0 + parts.total)


@SETTINGS
@given(REQUESTS, CAPABILITY_MAPS)
def test_shape_refused_exactly_when_no_allowed_provider_runs_the_shape(
    request: PlacementRequest, capabilities: dict[str, Capabilities]
) -> None:
    allowed = [n for n in capabilities if not request.providers or n in request.providers]
    refused = shape_refused(request, capabilities)
    nobody = bool(allowed) and not any(request.shape.runs_on(capabilities[n]) for n in allowed)
    assert refused == (tuple(allowed) if nobody and not request.shape.single else ())


@SETTINGS
@given(scenarios())
def test_unable_names_the_providers_whose_offers_the_shape_filter_removed(s: Scenario) -> None:
    result = s.run()
    expected = {o.provider for o in s.offers if first_failing(s, o) == "shape"}
    assert set(result.unable) == expected
    assert list(result.unable) == sorted(result.unable)


@SETTINGS
@given(scenarios())
def test_budget_limited_exactly_when_the_budget_removed_the_last_ones(s: Scenario) -> None:
    result = s.run()
    nothing_fits = not any(feasible(s, o) for o in s.offers)
    fits_but_for_budget = any(feasible(s, o, skip=frozenset({"budget"})) for o in s.offers)
    assert result.budget_limited == (nothing_fits and fits_but_for_budget)
    assert result.fits == (not nothing_fits)


# --- examples --------------------------------------------------------------------------------


def offer(**fields: object) -> Offer:
    base: dict[str, object] = {
        "provider": "alpha",
        "sku": "h100",
        "region": "us-east-1",
        "gpu_model": "H100-SXM",
        "gpu_count": 1,
        "gpu_memory_gib": 80.0,
        "vcpus": 16.0,
        "memory_gib": 128.0,
        "price_per_hour": 2.0,
        "available": 3,
    }
    base.update(fields)
    return Offer(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("wanted", "offered", "matches"),
    [
        ("H100", "H100-SXM", True),
        ("H100", "H100-PCIE", True),
        ("H100", "H100", True),
        ("H100-SXM", "H100-SXM", True),
        ("H100-SXM", "H100-PCIE", False),
        ("H100-SXM", "H100", False),
        ("h100", "H100-SXM", True),
        ("H100-sxm", "h100-SXM", True),
        ("A100", "A100-80GB", True),
        ("A100-80GB", "A100", False),
        ("H10", "H100", False),
        ("H100", "H100NVL", False),
        ("L40", "L40S", False),
        ("H100", None, False),
    ],
)
def test_gpu_matches(wanted: str, offered: str | None, matches: bool) -> None:
    assert gpu_matches(wanted, offered) is matches


def test_budget_filter_removes_offers_above_the_room() -> None:
    offers = [offer(sku="cheap", price_per_hour=1.0), offer(sku="dear", price_per_hour=3.0)]
    result = place(
        PlacementRequest(gpu_count=1),
        offers,
        budget=BudgetView(global_room=2.0, namespace_room=None),
    )
    assert [c.sku for c in result.candidates] == ["cheap"]
    assert dict(result.removed)["budget"] == 1
    squeezed = place(
        PlacementRequest(gpu_count=1),
        offers,
        budget=BudgetView(global_room=None, namespace_room=0.5),
    )
    assert squeezed.budget_limited
    assert not squeezed.fits


def test_penalties_can_outrank_a_cheaper_offer() -> None:
    risky = offer(provider="alpha", sku="risky", price_per_hour=1.0, available=1)
    steady = offer(provider="beta", sku="steady", price_per_hour=1.04, available=5)
    result = place(PlacementRequest(gpu_count=1), [risky, steady])
    # 1.0 * 1.05 (last instance) > 1.04.
    assert [c.sku for c in result.candidates] == ["steady", "risky"]
    flaky = place(
        PlacementRequest(gpu_count=1),
        [offer(provider="alpha", sku="a", price_per_hour=1.0), steady],
        health={"alpha": ProviderHealth(recent_failures=1)},
    )
    assert [c.sku for c in flaky.candidates] == ["steady", "a"]


def test_priority_breaks_ties_then_the_key() -> None:
    a = offer(provider="alpha", sku="x")
    b = offer(provider="beta", sku="x")
    assert place(PlacementRequest(gpu_count=1), [b, a]).candidates == (a, b)
    ranked = place(PlacementRequest(gpu_count=1), [a, b], priorities={"beta": 1})
    assert ranked.candidates == (b, a)


def spec(**fields: object) -> WorkloadSpec:
    base: dict[str, object] = {
        "pod_uid": "uid-1",
        "namespace": "team",
        "pod_name": "train",
        "container_name": "main",
        "image": "busybox",
    }
    base.update(fields)
    return workload(**base)  # type: ignore[arg-type]


def test_from_workload_defaults_and_resources() -> None:
    request = placement_request(
        spec(
            gpu_count=2,
            gpu_models=("H100", "A100-80GB"),
            min_gpu_memory_gib=40.0,
            cpu=8.0,
            memory_bytes=3 * 2**30,
        ),
        {},
    )
    assert request == PlacementRequest(
        gpu_count=2,
        gpu_models=("H100", "A100-80GB"),
        min_gpu_memory_gib=40.0,
        cpu=8.0,
        memory_gib=3.0,
        regions=(),
        max_price_per_hour=None,
        capacity_type=CapacityType.ON_DEMAND,
        providers=(),
    )


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({ANN_MAX_PRICE: "2.5"}, {"max_price_per_hour": 2.5}),
        ({ANN_MAX_PRICE: " 3 "}, {"max_price_per_hour": 3.0}),
        ({ANN_MAX_PRICE: "0"}, {"max_price_per_hour": 0.0}),
        ({ANN_REGIONS: "us-east-1, eu-ro-1,,"}, {"regions": ("us-east-1", "eu-ro-1")}),
        ({ANN_REGIONS: ""}, {"regions": ()}),
        ({ANN_PROVIDERS: "runpod,lambda"}, {"providers": ("runpod", "lambda")}),
        ({ANN_PROVIDERS: " , local "}, {"providers": ("local",)}),
        ({ANN_CAPACITY_TYPE: "spot"}, {"capacity_type": CapacityType.SPOT}),
        ({ANN_CAPACITY_TYPE: " any "}, {"capacity_type": CapacityType.ANY}),
        ({ANN_CAPACITY_TYPE: "on-demand"}, {"capacity_type": CapacityType.ON_DEMAND}),
        ({"vk-provider.io/unrelated": "x"}, {}),
    ],
)
def test_from_workload_reads_annotations(
    annotations: Mapping[str, str], expected: dict[str, object]
) -> None:
    request = placement_request(spec(), annotations)
    defaults = PlacementRequest()
    for name in ("max_price_per_hour", "regions", "providers", "capacity_type"):
        assert getattr(request, name) == expected.get(name, getattr(defaults, name)), name


@pytest.mark.parametrize(
    ("annotation", "value"),
    [
        (ANN_MAX_PRICE, "cheap"),
        (ANN_MAX_PRICE, "$2"),
        (ANN_MAX_PRICE, "-0.5"),
        (ANN_MAX_PRICE, "nan"),
        (ANN_MAX_PRICE, ""),
        (ANN_CAPACITY_TYPE, "reserved"),
        (ANN_CAPACITY_TYPE, ""),
        (ANN_CAPACITY_TYPE, "ondemand"),
        (ANN_MAX_PRICE, "inf"),
        (ANN_REGIONS, "us east"),
        (ANN_PROVIDERS, "run;pod"),
    ],
)
def test_from_workload_rejects_malformed_annotations(annotation: str, value: str) -> None:
    with pytest.raises(InvalidPodSpec) as caught:
        placement_request(spec(), {annotation: value})
    assert caught.value.field == f"metadata.annotations['{annotation}']"
    assert str(caught.value).startswith(caught.value.field + ": ")


def test_explain_names_each_filter_that_removed_offers() -> None:
    offers = [
        offer(sku="cpu", gpu_count=0, gpu_model=None),
        offer(sku="pcie", gpu_model="H100-PCIE"),
        offer(sku="dear", price_per_hour=9.0),
        offer(sku="dear2", price_per_hour=8.0),
        offer(sku="ok"),
    ]
    request = PlacementRequest(gpu_count=1, gpu_models=("H100-SXM",), max_price_per_hour=4.0)
    result = place(request, offers)
    assert [c.sku for c in result.candidates] == ["ok"]
    assert result.explain() == "1 by gpu-count, 1 by gpu-model, 2 by price"
    none_fit = place(request, offers[:3])
    assert not none_fit.fits
    assert none_fit.explain() == "1 by gpu-count, 1 by gpu-model, 1 by price"


def test_explain_without_removals() -> None:
    assert place(PlacementRequest(), []).explain() == "no offers known"
    # Offers known and all of them fit: nothing was removed, and the text must not say
    # that no offers were known (it ends up in the ProviderSelected Event).
    fits_all = place(PlacementRequest(gpu_count=1), [offer()])
    assert fits_all.fits
    assert fits_all.explain() == "none"
