"""A read-only view of the running agent, for the REST API, the metrics and the CLI.

The view is built from the live parts (guarded providers, offer book, budget ledger, pod
controller, node controller) but exposes only frozen snapshots, so readers cannot change
the agent and never see a credential: nothing here holds configuration secrets. The one
computation it offers, ``place`` (the placement dry run), has no effects either.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vk_provider.controllers.guarded import GuardedProvider
from vk_provider.controllers.offers import OfferBook
from vk_provider.controllers.overflow import OverflowView
from vk_provider.controllers.preview import Preview
from vk_provider.domain.budget import BudgetLedger
from vk_provider.domain.models import Instance, Offer, PortEndpoint
from vk_provider.domain.podview import PodPlacement


@dataclass(frozen=True, slots=True)
class ProviderStatus:
    name: str
    type: str
    healthy: bool
    breaker_state: str
    consecutive_failures: int
    recent_failures: int
    last_error: str | None
    last_answer_age_seconds: float | None
    offers: tuple[Offer, ...]
    gpus_available: int
    running_pods: int
    spend_per_hour: float
    terminations_overdue: int = 0


@dataclass(frozen=True, slots=True)
class SpendRow:
    provider: str
    namespace: str
    per_hour: float
    accumulated: float


@dataclass(frozen=True, slots=True)
class CapStatus:
    """One budget cap: what it allows, what is held against it now, what is left."""

    scope: str  # "global", or a namespace
    cap_per_hour: float | None  # None: no cap
    used_per_hour: float  # running and launching pods
    room_per_hour: float | None


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    global_cap: CapStatus
    default_namespace_per_hour: float | None
    namespaces: tuple[CapStatus, ...]  # capped namespaces and those that spend, by name


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    reasons: tuple[str, ...]


class AgentView:
    def __init__(
        self,
        *,
        providers: Mapping[str, GuardedProvider],
        provider_types: Mapping[str, str],
        offers: OfferBook,
        ledger: BudgetLedger,
        placements: Callable[[], list[PodPlacement]],
        readiness: Callable[[], Readiness],
        not_leading: Callable[[], str | None] = lambda: None,
        overdue: Callable[[], Sequence[tuple[str, str]]] = tuple,
        overflow: Callable[[], OverflowView | None] | None = None,
        instances: Callable[[], Sequence[Instance]] = tuple,
        preview: Callable[[Mapping[str, Any]], Awaitable[Preview]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._overflow = overflow  # None: the flip is not enabled in this agent
        self._instances = instances  # what the providers listed at the last poll
        self._preview = preview  # None: this agent offers no dry run (tests)
        self._providers = dict(providers)
        self._types = dict(provider_types)
        self._offers = offers
        self._ledger = ledger
        self._placements = placements
        self._readiness = readiness
        self._not_leading = not_leading  # why this replica does not serve /v1, or None
        self._overdue = overdue  # (provider, instance id) of terminations not yet confirmed
        self._clock = clock

    def provider_names(self) -> list[str]:
        return sorted(self._providers)

    def provider(self, name: str) -> ProviderStatus | None:
        guarded = self._providers.get(name)
        if guarded is None:
            return None
        snapshot = guarded.breaker.snapshot()
        answer = self._offers.answer(name)
        pods = [p for p in self._placements() if p.provider == name]
        offers = answer.offers
        return ProviderStatus(
            name=name,
            type=self._types.get(name, "unknown"),
            healthy=snapshot.state.value == "closed" and answer.error is None,
            breaker_state=snapshot.state.value,
            consecutive_failures=snapshot.consecutive_failures,
            recent_failures=snapshot.recent_failures,
            last_error=snapshot.last_error or answer.error,
            last_answer_age_seconds=(
                None if answer.answered_at is None else self._clock() - answer.answered_at
            ),
            offers=offers,
            gpus_available=sum(o.gpu_count * max(o.available, 0) for o in offers),
            running_pods=len(pods),
            spend_per_hour=sum(
                v for (prov, _ns), v in self._ledger.current_per_hour().items() if prov == name
            ),
            terminations_overdue=sum(1 for prov, _ in self._overdue() if prov == name),
        )

    def providers(self) -> list[ProviderStatus]:
        return [status for n in self.provider_names() if (status := self.provider(n))]

    def offers(self) -> list[Offer]:
        return sorted(self._offers.cached(), key=lambda o: (o.price_per_hour, o.key))

    def pods(self) -> list[PodPlacement]:
        return sorted(self._placements(), key=lambda p: (p.namespace, p.name))

    def spend(self) -> list[SpendRow]:
        current = self._ledger.current_per_hour()
        accumulated = self._ledger.accumulated()
        keys = sorted(set(current) | set(accumulated))
        return [
            SpendRow(
                provider=provider,
                namespace=namespace,
                per_hour=current.get((provider, namespace), 0.0),
                accumulated=accumulated.get((provider, namespace), 0.0),
            )
            for provider, namespace in keys
        ]

    def readiness(self) -> Readiness:
        return self._readiness()

    def not_leading(self) -> str | None:
        """None on the leader (or without election); else why /v1 is not served here."""
        return self._not_leading()

    @property
    def overflow_enabled(self) -> bool:
        return self._overflow is not None

    def overflow(self) -> OverflowView | None:
        return self._overflow() if self._overflow is not None else None

    def endpoints(self) -> dict[tuple[str, str], tuple[PortEndpoint, ...]]:
        """(provider, instance id) -> where its declared ports are reached, as last listed."""
        return {(i.provider, i.instance_id): i.endpoints for i in self._instances() if i.endpoints}

    def instances(self) -> list[Instance]:
        """The instances the providers listed at the last poll (and launches since)."""
        return sorted(self._instances(), key=lambda i: (i.provider, i.instance_id))

    def budget(self) -> BudgetStatus:
        caps = self._ledger.caps
        spending = {row.namespace for row in self.spend()}
        names = sorted(spending | set(caps.per_namespace or {}))

        def status(scope: str, cap: float | None, used: float) -> CapStatus:
            return CapStatus(scope, cap, used, None if cap is None else cap - used)

        return BudgetStatus(
            global_cap=status("global", caps.global_per_hour, self._ledger.total_per_hour()),
            default_namespace_per_hour=caps.default_namespace_per_hour,
            namespaces=tuple(
                status(ns, caps.namespace_cap(ns), self._ledger.total_per_hour(ns)) for ns in names
            ),
        )

    @property
    def can_place(self) -> bool:
        return self._preview is not None

    async def place(self, pod: Mapping[str, Any]) -> Preview:
        """The placement dry run of ``pod`` (see ``controllers.preview``)."""
        if self._preview is None:
            raise RuntimeError("this agent has no placement dry run")
        return await self._preview(pod)
