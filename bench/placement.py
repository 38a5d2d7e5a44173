"""Placement throughput: ``place()`` against a naive brute force and a pure sort, in one run.

Generates 500 offers and 1,000 placement requests (seeded, so every run decides the same
things), then times, on this machine and in this process:

- ``place()`` for every request (each with its own blocked set, provider health and budget);
- a naive baseline written here: every filter evaluated for every offer (no early exit, no
  ordering of filters), then a full sort of the feasible offers by the same ranking key;
- the physical reference: sorting 500 floats once per decision, which any ranking of 500
  offers has to beat or match.

Only ratios measured in the same run are printed next to the raw rates; the absolute numbers
depend on the machine and are not claims. The baseline is first checked to decide exactly as
``place()`` does, so the ratio compares the same work.

Run: ``.venv/bin/python -m bench.placement`` (add ``--repeats N`` for more timing rounds).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from vk_provider.domain.budget import BudgetView
from vk_provider.domain.models import Offer
from vk_provider.domain.offerindex import OfferIndex
from vk_provider.domain.placement import (
    CapacityType,
    PlacementPolicy,
    PlacementRequest,
    ProviderHealth,
    gpu_matches,
    place,
)

SEED = 20240607
OFFERS = 500
DECISIONS = 1000

PROVIDERS = ("runpod", "lambda", "modal", "k8s-east", "local")
GPUS: tuple[tuple[str | None, float], ...] = (
    ("H100-SXM", 80.0),
    ("H100-PCIE", 80.0),
    ("A100-80GB", 80.0),
    ("A100-40GB", 40.0),
    ("L40S", 48.0),
    ("RTX-4090", 24.0),
    (None, 0.0),
)
WANTED = ("H100", "H100-SXM", "A100", "A100-80GB", "L40S", "RTX-4090")
REGIONS = ("us-east-1", "us-west-2", "eu-ro-1", "eu-se-1", "ap-south-1", "ca-mtl-1")


@dataclass(frozen=True, slots=True)
class Decision:
    request: PlacementRequest
    blocked: frozenset[str]
    health: Mapping[str, ProviderHealth]
    budget: BudgetView | None


def make_offers(rng: random.Random, count: int) -> list[Offer]:
    offers = []
    for index in range(count):
        model, memory = rng.choice(GPUS)
        gpus = 0 if model is None else rng.choice((1, 1, 2, 4, 8))
        offers.append(
            Offer(
                provider=rng.choice(PROVIDERS),
                sku=f"sku-{index}",
                region=rng.choice(REGIONS),
                gpu_model=model,
                gpu_count=gpus,
                gpu_memory_gib=memory,
                vcpus=float(rng.choice((2, 4, 8, 16, 32, 64))),
                memory_gib=float(rng.choice((8, 16, 64, 128, 256, 512))),
                price_per_hour=round(rng.uniform(0.05, 4.0) * max(gpus, 1), 4),
                spot=rng.random() < 0.3,
                available=rng.choice((0, 1, 1, 2, 3, 5, 10)),
                startup_seconds=rng.choice((5.0, 30.0, 60.0, 180.0, 600.0)),
            )
        )
    return offers


def make_decisions(rng: random.Random, offers: Sequence[Offer], count: int) -> list[Decision]:
    def some(values: Sequence[str], chance: float) -> tuple[str, ...]:
        if rng.random() >= chance:
            return ()
        return tuple(rng.sample(list(values), rng.randint(1, 3)))

    decisions = []
    for _ in range(count):
        request = PlacementRequest(
            gpu_count=rng.choice((0, 1, 1, 1, 2, 4, 8)),
            gpu_models=some(WANTED, 0.5),
            min_gpu_memory_gib=rng.choice((0.0, 0.0, 24.0, 40.0, 80.0)),
            cpu=float(rng.choice((0, 1, 4, 8, 16))),
            memory_gib=float(rng.choice((0, 4, 32, 128))),
            regions=some(REGIONS, 0.3),
            max_price_per_hour=None if rng.random() < 0.5 else round(rng.uniform(0.5, 20.0), 2),
            capacity_type=rng.choice(list(CapacityType)),
            providers=some(PROVIDERS, 0.2),
        )
        blocked = frozenset(
            rng.sample([o.key for o in offers], rng.randint(0, 10))
            + ([rng.choice(PROVIDERS)] if rng.random() < 0.1 else [])
        )
        health = {
            name: ProviderHealth(callable=rng.random() > 0.05, recent_failures=rng.randint(0, 3))
            for name in PROVIDERS
        }
        budget = (
            None
            if rng.random() < 0.3
            else BudgetView(global_room=rng.uniform(0.0, 40.0), namespace_room=rng.uniform(0, 20))
        )
        decisions.append(Decision(request, blocked, health, budget))
    return decisions


# --- the naive baseline --------------------------------------------------------------------


def naive_place(
    decision: Decision,
    offers: Sequence[Offer],
    priorities: Mapping[str, int],
    policy: PlacementPolicy,
) -> tuple[Offer, ...]:
    """Every check for every offer, then a full sort: the straightforward way to do it."""
    r = decision.request
    healthy = ProviderHealth()
    feasible = []
    for offer in offers:
        health = decision.health.get(offer.provider, healthy)
        checks = [
            not r.providers or offer.provider in r.providers,
            offer.gpu_count == 0 if r.gpu_count == 0 else offer.gpu_count >= r.gpu_count,
            not r.gpu_models or any(gpu_matches(m, offer.gpu_model) for m in r.gpu_models),
            offer.gpu_memory_gib >= r.min_gpu_memory_gib,
            offer.vcpus >= r.cpu,
            offer.memory_gib >= r.memory_gib,
            not r.regions or offer.region in r.regions,
            r.capacity_type is CapacityType.ANY
            or offer.spot == (r.capacity_type is CapacityType.SPOT),
            r.max_price_per_hour is None or offer.price_per_hour <= r.max_price_per_hour,
            offer.available > 0,
            health.callable,
            offer.key not in decision.blocked and offer.provider not in decision.blocked,
            decision.budget is None or decision.budget.allows(offer.price_per_hour),
        ]
        if all(checks):
            feasible.append(offer)

    def rank(offer: Offer) -> tuple[float, float, int, str]:
        failures = decision.health.get(offer.provider, healthy).recent_failures
        penalty = policy.low_availability_penalty if offer.available <= 1 else 0.0
        penalty += min(
            offer.startup_seconds / 60.0 * policy.startup_penalty_per_minute,
            policy.startup_penalty_cap,
        )
        penalty += min(failures * policy.failure_penalty, policy.failure_penalty_cap)
        return (
            offer.price_per_hour * (1.0 + penalty),
            offer.price_per_hour,
            -priorities.get(offer.provider, 0),
            offer.key,
        )

    return tuple(sorted(feasible, key=rank))


def single_pass(
    decision: Decision,
    offers: Sequence[Offer],
    priorities: Mapping[str, int],
    policy: PlacementPolicy,
) -> Offer | None:
    """The honest baseline: one pass, cheap checks first with early exit, keep the minimum.

    What a careful engineer writes when only the best offer is wanted: no lists, no sort, no
    explanation; the request's sets are built once per decision, not per offer.
    """
    r = decision.request
    healthy = ProviderHealth()
    health = decision.health
    blocked = decision.blocked
    budget = decision.budget
    providers = frozenset(r.providers)
    regions = frozenset(r.regions)
    models = r.gpu_models
    want_spot = r.capacity_type is CapacityType.SPOT
    any_type = r.capacity_type is CapacityType.ANY
    limit = r.max_price_per_hour
    best: Offer | None = None
    best_rank: tuple[float, float, int, str] | None = None
    for offer in offers:
        if offer.available <= 0:
            continue
        if r.gpu_count == 0:
            if offer.gpu_count != 0:
                continue
        elif offer.gpu_count < r.gpu_count:
            continue
        if not any_type and offer.spot != want_spot:
            continue
        if limit is not None and offer.price_per_hour > limit:
            continue
        if (
            offer.gpu_memory_gib < r.min_gpu_memory_gib
            or offer.vcpus < r.cpu
            or offer.memory_gib < r.memory_gib
        ):
            continue
        if providers and offer.provider not in providers:
            continue
        if regions and offer.region not in regions:
            continue
        if models and not any(gpu_matches(m, offer.gpu_model) for m in models):
            continue
        state = health.get(offer.provider, healthy)
        if not state.callable:
            continue
        if offer.key in blocked or offer.provider in blocked:
            continue
        if budget is not None and not budget.allows(offer.price_per_hour):
            continue
        penalty = policy.low_availability_penalty if offer.available <= 1 else 0.0
        penalty += min(
            offer.startup_seconds / 60.0 * policy.startup_penalty_per_minute,
            policy.startup_penalty_cap,
        )
        penalty += min(state.recent_failures * policy.failure_penalty, policy.failure_penalty_cap)
        rank = (
            offer.price_per_hour * (1.0 + penalty),
            offer.price_per_hour,
            -priorities.get(offer.provider, 0),
            offer.key,
        )
        if best_rank is None or rank < best_rank:
            best, best_rank = offer, rank
    return best


# --- timing --------------------------------------------------------------------------------


def best_of(repeats: int, run: Callable[[], object]) -> float:
    """The fastest of ``repeats`` runs, in seconds: the least disturbed by the machine."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def speedup(*, repeats: int = 3) -> float:
    """``place()``'s decisions/s over the single-pass baseline's (for ``python -m bench``)."""
    return measure(repeats, quiet=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.placement", description=__doc__)
    parser.add_argument("--repeats", type=int, default=3, help="timing rounds; the best counts")
    args = parser.parse_args(argv)
    measure(args.repeats, quiet=False)


def measure(repeats: int, *, quiet: bool) -> float:
    rng = random.Random(SEED)  # noqa: S311 - reproducible test data, not secrets
    offers = make_offers(rng, OFFERS)
    decisions = make_decisions(rng, offers, DECISIONS)
    priorities = {name: rank for rank, name in enumerate(reversed(PROVIDERS))}
    policy = PlacementPolicy()
    floats = [[rng.random() for _ in range(OFFERS)] for _ in range(DECISIONS)]

    index = OfferIndex(offers)  # built once per offer refresh, as the offer book does

    def run_place() -> list[tuple[Offer, ...]]:
        return [
            place(
                d.request,
                index,
                blocked=d.blocked,
                health=d.health,
                budget=d.budget,
                priorities=priorities,
                policy=policy,
            ).candidates
            for d in decisions
        ]

    def run_naive() -> list[tuple[Offer, ...]]:
        return [naive_place(d, offers, priorities, policy) for d in decisions]

    def run_single() -> list[Offer | None]:
        return [single_pass(d, offers, priorities, policy) for d in decisions]

    def run_sort() -> None:
        for values in floats:
            sorted(values)

    placed = run_place()
    if placed != run_naive():
        raise SystemExit("the naive baseline decides differently from place(): fix it first")
    if [c[0] if c else None for c in placed] != run_single():
        raise SystemExit("the single-pass baseline chooses differently from place(): fix it first")
    fitting = sum(1 for candidates in placed if candidates)
    mean_candidates = sum(len(c) for c in placed) / len(placed)

    t_place = best_of(repeats, run_place)
    t_naive = best_of(repeats, run_naive)
    t_single = best_of(repeats, run_single)
    t_sort = best_of(repeats, run_sort)

    def rate(seconds: float) -> str:
        return (
            f"{DECISIONS / seconds:>12,.0f} decisions/s  ({seconds / DECISIONS * 1e6:8.1f} µs each)"
        )

    if quiet:
        return t_single / t_place
    print(f"{OFFERS} offers, {DECISIONS} requests (seed {SEED}), best of {repeats} rounds")
    print(f"requests with a fit: {fitting}/{DECISIONS}; mean candidates {mean_candidates:.1f}")
    for label, seconds in (
        ("place()", t_place),
        ("single-pass min", t_single),
        ("naive baseline", t_naive),
        (f"sort of {OFFERS} floats", t_sort),
    ):
        print(f"{label:<20}{rate(seconds)}")
    print(f"place() vs single-pass: {t_single / t_place:6.2f}x the decisions/s (target >= 1.5x)")
    print(f"time place()/naive baseline:  {t_place / t_naive:6.2f}x")
    print(f"time place()/sort reference:  {t_place / t_sort:6.2f}x")
    return t_single / t_place


if __name__ == "__main__":
    main()
