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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from vk_provider.domain.budget import BudgetView
from vk_provider.domain.models import Capabilities, Offer, WorkloadSpec


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


@dataclass(frozen=True, slots=True)
class _Context:
    blocked: frozenset[str]
    health: Mapping[str, ProviderHealth]
    budget: BudgetView | None
    capabilities: Mapping[str, Capabilities]


_HEALTHY = ProviderHealth()


def _passes(name: str, request: PlacementRequest, offer: Offer, ctx: _Context) -> bool:
    if name == "provider":
        return not request.providers or offer.provider in request.providers
    if name == "shape":
        return request.shape.runs_on(ctx.capabilities.get(offer.provider))
    if name == "gpu-count":
        if request.gpu_count == 0:
            return offer.gpu_count == 0
        return offer.gpu_count >= request.gpu_count
    if name == "gpu-model":
        return not request.gpu_models or any(
            gpu_matches(m, offer.gpu_model) for m in request.gpu_models
        )
    if name == "gpu-memory":
        return offer.gpu_memory_gib >= request.min_gpu_memory_gib
    if name == "cpu":
        return offer.vcpus >= request.cpu
    if name == "memory":
        return offer.memory_gib >= request.memory_gib
    if name == "region":
        return not request.regions or offer.region in request.regions
    if name == "capacity-type":
        if request.capacity_type is CapacityType.ANY:
            return True
        return offer.spot == (request.capacity_type is CapacityType.SPOT)
    if name == "price":
        limit = request.max_price_per_hour
        return limit is None or offer.price_per_hour <= limit
    if name == "sold-out":
        return offer.available > 0
    if name == "provider-health":
        return ctx.health.get(offer.provider, _HEALTHY).callable
    if name == "blocked":
        return offer.key not in ctx.blocked and offer.provider not in ctx.blocked
    if name == "budget":
        return ctx.budget is None or ctx.budget.allows(offer.price_per_hour)
    raise AssertionError(name)


@dataclass(frozen=True, slots=True)
class Placement:
    """Ranked candidates (cheapest first), or why there are none."""

    candidates: tuple[Offer, ...]
    removed: tuple[tuple[str, int], ...] = field(default=())
    # Providers that cannot run the pod's shape (more than one container): named in Events.
    unable: tuple[str, ...] = ()
    # Every offer that did not pass, with the filter that removed it (the first it failed).
    refused: tuple[tuple[Offer, str], ...] = ()

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
    offers: Iterable[Offer],
    *,
    blocked: frozenset[str] = frozenset(),
    health: Mapping[str, ProviderHealth] | None = None,
    budget: BudgetView | None = None,
    priorities: Mapping[str, int] | None = None,
    policy: PlacementPolicy = PlacementPolicy(),  # frozen, so one shared default is safe
    capabilities: Mapping[str, Capabilities] | None = None,
) -> Placement:
    """Filter ``offers`` by ``request`` and rank them; see the module docstring.

    ``capabilities`` (per provider) decide which providers can run a pod of more than one
    container (the "shape" filter); a single-container pod runs anywhere.
    """
    ctx = _Context(
        blocked=blocked, health=health or {}, budget=budget, capabilities=capabilities or {}
    )
    remaining: Sequence[Offer] = list(offers)
    removed: list[tuple[str, int]] = []
    refused: list[tuple[Offer, str]] = []
    unable: set[str] = set()
    for name in FILTERS:
        kept: list[Offer] = []
        for offer in remaining:
            if _passes(name, request, offer, ctx):
                kept.append(offer)
            else:
                refused.append((offer, name))
        removed.append((name, len(remaining) - len(kept)))
        if name == "shape":
            unable = {o.provider for o in remaining} - {o.provider for o in kept}
        remaining = kept
    prio = priorities or {}
    states = ctx.health

    def rank(offer: Offer) -> tuple[float, float, int, str]:
        value = score(offer, states.get(offer.provider, _HEALTHY), policy)
        return (value, offer.price_per_hour, -prio.get(offer.provider, 0), offer.key)

    return Placement(
        candidates=tuple(sorted(remaining, key=rank)),
        removed=tuple(removed),
        unable=tuple(sorted(unable)),
        refused=tuple(refused),
    )
