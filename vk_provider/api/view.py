"""A read-only view of the running agent, for the REST API, the metrics and the CLI.

The view is built from the live parts (guarded providers, offer book, budget ledger, pod
controller, node controller) but exposes only frozen snapshots, so readers cannot change
the agent and never see a credential: nothing here holds configuration secrets.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from vk_provider.controllers.guarded import GuardedProvider
from vk_provider.controllers.offers import OfferBook
from vk_provider.controllers.overflow import OverflowView
from vk_provider.domain.budget import BudgetLedger
from vk_provider.domain.models import Offer
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
        overdue: Callable[[], Sequence[tuple[str, str]]] = tuple,
        overflow: Callable[[], OverflowView | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._overflow = overflow  # None: the flip is not enabled in this agent
        self._providers = dict(providers)
        self._types = dict(provider_types)
        self._offers = offers
        self._ledger = ledger
        self._placements = placements
        self._readiness = readiness
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

    @property
    def overflow_enabled(self) -> bool:
        return self._overflow is not None

    def overflow(self) -> OverflowView | None:
        return self._overflow() if self._overflow is not None else None
