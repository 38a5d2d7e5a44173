"""Choosing where a pod runs: a pure function from a request and offers to ranked candidates.

``place()`` applies hard filters in a fixed order (``FILTERS``) and ranks what is left by
price per hour after penalties — low availability, slow start-up, recent provider failures
(``PlacementPolicy``) — cheapest first; ties are broken by raw price, provider priority and
the offer key, so the same input always gives the same answer. When nothing fits, the
result says which filter removed how many offers, so the pod's Event can say why, and
which filter removed each offer (``Placement.refused``), so a dry run can say it per offer.

Invariants: no I/O, no clock. Provider health, blocked offers and the budget are passed in
as data; every candidate satisfies every hard constraint, including the budget.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from vk_provider.domain.budget import BudgetView
from vk_provider.domain.models import Capabilities, Offer, WorkloadSpec
from vk_provider.domain.offerindex import OfferIndex, bits


class CapacityType(enum.Enum):
    ON_DEMAND = "on-demand"
    SPOT = "spot"
    ANY = "any"


@dataclass(frozen=True, slots=True)
class PodShape:
    """How many containers a pod has, of which kind: what a provider must be able to run."""

    app_containers: int = 1
    init_containers: int = 0  # plain init containers (run to completion, in order)
    sidecars: int = 0  # init containers with restartPolicy Always
    field: str = ""  # the pod field that makes it more than one container

    @classmethod
    def of(cls, spec: WorkloadSpec) -> PodShape:
        apps = max(len(spec.containers), 1)
        sidecars = [i for i, c in enumerate(spec.init_containers) if c.sidecar]
        plain = [i for i, c in enumerate(spec.init_containers) if not c.sidecar]
        if apps > 1:
            field = "spec.containers[1]"
        elif sidecars:
            field = f"spec.initContainers[{sidecars[0]}]"
        elif plain:
            field = f"spec.initContainers[{plain[0]}]"
        else:
            field = ""
        return cls(apps, len(plain), len(sidecars), field)

    @property
    def single(self) -> bool:
        return self.app_containers == 1 and not self.init_containers and not self.sidecars

    def describe(self) -> str:
        parts = [f"{self.app_containers} app container(s)"]
        if self.sidecars:
            parts.append(f"{self.sidecars} sidecar(s)")
        if self.init_containers:
            parts.append(f"{self.init_containers} init container(s)")
        return ", ".join(parts)

    def runs_on(self, capabilities: Capabilities | None) -> bool:
        """Whether a provider with ``capabilities`` can run a pod of this shape."""
        if self.single:
            return True
        if capabilities is None:
            return False
        return (
            (self.app_containers == 1 or capabilities.multi_container)
            and (not self.init_containers or capabilities.init_containers)
            and (not self.sidecars or capabilities.sidecars)
        )


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    gpu_count: int = 0
    gpu_models: tuple[str, ...] = ()
    min_gpu_memory_gib: float = 0.0
    cpu: float = 0.0
    memory_gib: float = 0.0
    regions: tuple[str, ...] = ()
    max_price_per_hour: float | None = None
    capacity_type: CapacityType = CapacityType.ON_DEMAND
    providers: tuple[str, ...] = ()
    shape: PodShape = PodShape()


def shape_refused(
    request: PlacementRequest, capabilities: Mapping[str, Capabilities]
) -> tuple[str, ...]:
    """The providers the pod may use, when none of them can run its shape (an InvalidSpec:
    no offer will ever do); empty when one can, or when the pod is one container."""
    if request.shape.single:
        return ()
    allowed = [name for name in capabilities if not request.providers or name in request.providers]
    if allowed and not any(request.shape.runs_on(capabilities[name]) for name in allowed):
        return tuple(allowed)
    return ()


def gpu_matches(wanted: str, offered: str | None) -> bool:
    """``H100`` matches any H100 variant (``H100-SXM``); ``H100-SXM`` matches only itself."""
    if offered is None:
        return False
    wanted_u, offered_u = wanted.upper(), offered.upper()
    return offered_u == wanted_u or offered_u.startswith(wanted_u + "-")


# Filters in the order they are applied; each removes offers for one reason.
FILTERS: tuple[str, ...] = (
    "provider",
    "shape",
    "gpu-count",
    "gpu-model",
    "gpu-memory",
    "cpu",
    "memory",
    "region",
    "capacity-type",
    "price",
    "sold-out",
    "taken",
    "provider-health",
    "blocked",
    "budget",
)


@dataclass(frozen=True, slots=True)
class ProviderHealth:
    """What placement knows of a provider: may it be called, and how often it failed lately."""

    callable: bool = True
    recent_failures: int = 0


@dataclass(frozen=True, slots=True)
class PlacementPolicy:
    """Penalties, as fractions of the price, that make a cheap but risky offer rank lower."""

    low_availability_penalty: float = 0.05  # the offer's last instance
    startup_penalty_per_minute: float = 0.01
    startup_penalty_cap: float = 0.20
    failure_penalty: float = 0.10  # per recent provider failure
    failure_penalty_cap: float = 0.50


@dataclass(frozen=True, slots=True)
class Penalties:
    """The penalties of one offer, as fractions of its price (``0.05`` is +5 %)."""

    low_availability: float = 0.0  # the offer's last instance
    startup: float = 0.0  # slow start-up, per minute, capped
    recent_failures: float = 0.0  # the provider failed lately, per failure, capped

    @property
    def total(self) -> float:
        return self.low_availability + self.startup + self.recent_failures


def penalties(offer: Offer, health: ProviderHealth, policy: PlacementPolicy) -> Penalties:
    """What ``score`` adds to an offer's price, one reason at a time."""
    return Penalties(
        low_availability=policy.low_availability_penalty if offer.available <= 1 else 0.0,
        startup=min(
            offer.startup_seconds / 60.0 * policy.startup_penalty_per_minute,
            policy.startup_penalty_cap,
        ),
        recent_failures=min(
            health.recent_failures * policy.failure_penalty, policy.failure_penalty_cap
        ),
    )


def score(offer: Offer, health: ProviderHealth, policy: PlacementPolicy) -> float:
    """The price per hour after penalties; lower is better."""
    return offer.price_per_hour * (1.0 + penalties(offer, health, policy).total)


_HEALTHY = ProviderHealth()


@dataclass(frozen=True, slots=True)
class Placement:
    """Ranked candidates (cheapest first), or why there are none."""

    candidates: tuple[Offer, ...]
    removed: tuple[tuple[str, int], ...] = field(default=())
    # Providers that cannot run the pod's shape (more than one container): named in Events.
    unable: tuple[str, ...] = ()
    # What each filter removed, as masks over ``_offers`` (``refused`` is built from them
    # only when asked: a launch never needs it, a dry run does).
    _removed_masks: tuple[tuple[str, int], ...] = ()
    _offers: tuple[Offer, ...] = ()

    @property
    def refused(self) -> tuple[tuple[Offer, str], ...]:
        """Every offer that did not pass, with the filter that removed it (the first it
        failed), filter by filter in ``FILTERS`` order, offers in their given order."""
        return tuple(
            (self._offers[i], name) for name, mask in self._removed_masks for i in bits(mask)
        )

    @property
    def fits(self) -> bool:
        return bool(self.candidates)

    @property
    def budget_limited(self) -> bool:
        """Nothing fits only because of a budget cap (BudgetExceeded, not NoCapacity)."""
        return not self.candidates and dict(self.removed).get("budget", 0) > 0

    def explain(self) -> str:
        parts = [f"{count} by {name}" for name, count in self.removed if count]
        if parts:
            return ", ".join(parts)
        # Nothing removed: either every known offer fits, or no offer was known at all.
        return "none" if self.candidates else "no offers known"


def place(
    request: PlacementRequest,
    offers: Iterable[Offer] | OfferIndex,
    *,
    blocked: frozenset[str] = frozenset(),
    health: Mapping[str, ProviderHealth] | None = None,
    budget: BudgetView | None = None,
    priorities: Mapping[str, int] | None = None,
    policy: PlacementPolicy = PlacementPolicy(),  # frozen, so one shared default is safe
    capabilities: Mapping[str, Capabilities] | None = None,
    taken: Mapping[str, int] | None = None,
) -> Placement:
    """Filter ``offers`` by ``request`` and rank them; see the module docstring.

    ``taken`` (per offer key) is the room of each offer that creates under way, or made
    since the providers answered, already use (``domain.room``): an offer with none left is
    refused ("taken"), and one with one left ranks as its last instance.

    ``offers`` is best an ``OfferIndex`` built once for many decisions (the offer book keeps
    one); plain offers are indexed on the way. ``capabilities`` (per provider) decide which
    providers can run a pod of more than one container (the "shape" filter); a
    single-container pod runs anywhere.
    """
    index = offers if isinstance(offers, OfferIndex) else OfferIndex(offers)
    states = health or {}
    remaining = index.all
    removed: list[tuple[str, int]] = []
    removed_masks: list[tuple[str, int]] = []
    unable: tuple[str, ...] = ()
    for name in FILTERS:
        if not remaining:
            removed.append((name, 0))
            continue
        mask = _mask(name, request, index, blocked, states, budget, capabilities or {}, taken or {})
        kept = remaining if mask is None else remaining & mask
        gone = remaining ^ kept
        removed.append((name, gone.bit_count()))
        if gone:
            removed_masks.append((name, gone))
            if name == "shape":
                unable = tuple(
                    sorted(
                        p
                        for p, pmask in index.providers.items()
                        if pmask & remaining and not pmask & kept
                    )
                )
        remaining = kept
    prio = priorities or {}
    static = index.static_penalties(policy, lambda o: _static_penalty(o, policy))
    failures = {
        p: min(
            states.get(p, _HEALTHY).recent_failures * policy.failure_penalty,
            policy.failure_penalty_cap,
        )
        for p in index.providers
    }
    ranked = []
    for i in bits(remaining):
        offer = index.offers[i]
        price = offer.price_per_hour
        fixed = static[i]
        if taken and taken.get(offer.key):
            left = replace(offer, available=offer.available - taken[offer.key])
            fixed = _static_penalty(left, policy)
        value = price * (1.0 + (fixed + failures[offer.provider]))
        ranked.append((value, price, -prio.get(offer.provider, 0), offer.key, i))
    ranked.sort()
    return Placement(
        candidates=tuple(index.offers[r[4]] for r in ranked),
        removed=tuple(removed),
        unable=unable,
        _removed_masks=tuple(removed_masks),
        _offers=index.offers,
    )


def _static_penalty(offer: Offer, policy: PlacementPolicy) -> float:
    """The part of ``penalties(...).total`` that does not depend on provider health, summed
    in the same order (so the score is the same float)."""
    p = penalties(offer, _HEALTHY, policy)
    return p.low_availability + p.startup


def _mask(
    name: str,
    request: PlacementRequest,
    index: OfferIndex,
    blocked: frozenset[str],
    health: Mapping[str, ProviderHealth],
    budget: BudgetView | None,
    capabilities: Mapping[str, Capabilities],
    taken: Mapping[str, int],
) -> int | None:
    """The offers that pass filter ``name``; None when every offer does."""
    if name == "provider":
        return index.union(index.providers, request.providers) if request.providers else None
    if name == "shape":
        if request.shape.single:
            return None
        able = [p for p in index.providers if request.shape.runs_on(capabilities.get(p))]
        return index.union(index.providers, able)
    if name == "gpu-count":
        if request.gpu_count == 0:
            return index.no_gpu
        return index.gpu_count_at_least(request.gpu_count)
    if name == "gpu-model":
        return index.gpu_models(request.gpu_models, gpu_matches) if request.gpu_models else None
    if name == "gpu-memory":
        return index.gpu_memory_at_least(request.min_gpu_memory_gib)
    if name == "cpu":
        return index.vcpus_at_least(request.cpu)
    if name == "memory":
        return index.memory_at_least(request.memory_gib)
    if name == "region":
        return index.union(index.regions, request.regions) if request.regions else None
    if name == "capacity-type":
        if request.capacity_type is CapacityType.ANY:
            return None
        return index.spot if request.capacity_type is CapacityType.SPOT else index.on_demand
    if name == "price":
        limit = request.max_price_per_hour
        return None if limit is None else index.price_at_most(limit)
    if name == "sold-out":
        return index.in_stock
    if name == "taken":
        used = 0
        for key, count in taken.items():
            for i in bits(index.keys.get(key, 0)):
                if index.offers[i].available <= count:
                    used |= 1 << i
        return index.all ^ used if used else None
    if name == "provider-health":
        down = [p for p in index.providers if not health.get(p, _HEALTHY).callable]
        return index.all ^ index.union(index.providers, down) if down else None
    if name == "blocked":
        if not blocked:
            return None
        return index.all ^ (
            index.union(index.keys, blocked) | index.union(index.providers, blocked)
        )
    if name == "budget":
        if budget is None:
            return None
        rooms = [r + 1e-9 for r in (budget.global_room, budget.namespace_room) if r is not None]
        # BudgetView.allows: price <= room + 1e-9 for every room there is.
        return index.price_at_most(min(rooms)) if rooms else None
    raise AssertionError(name)
