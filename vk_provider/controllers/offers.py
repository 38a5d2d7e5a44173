"""Gathering offers from every provider at once, cached for a while.

Each provider is asked concurrently with its own timeout; a provider that fails or times out
contributes no offers and does not fail the others. The time of each provider's last answer
is kept, because "providers answer" is what keeps the node's Lease renewed.

The book also keeps the offers as an ``OfferIndex`` (``index()``), built once per refresh,
so the many placements between two refreshes never rebuild it. ``invalidate()`` (capacity
changed: one of our instances ended, a create said "no capacity") makes the next caller ask
the providers again instead of waiting for the TTL.

Invariants: at most one refresh runs at a time (concurrent callers share it); the cache is
replaced whole, never half-updated; the index always describes the cached answers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from vk_provider.domain.contract import Provider
from vk_provider.domain.models import Offer
from vk_provider.domain.offerindex import OfferIndex

log = logging.getLogger(__name__)

# While pods wait for capacity, the offers they are retried against are at most this old
# (and reconciliation refreshes them this often): free capacity the providers report is
# seen within a few seconds, whatever a waiting pod's back-off is.
RECHECK_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class ProviderAnswer:
    offers: tuple[Offer, ...]
    answered_at: float | None
    error: str | None


class OfferBook:
    def __init__(
        self,
        providers: Mapping[str, Provider],
        *,
        ttl_seconds: float,
        timeout_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._providers = dict(providers)
        self._ttl = ttl_seconds
        self._timeout = timeout_seconds
        self._clock = clock
        self._answers: dict[str, ProviderAnswer] = {
            name: ProviderAnswer((), None, None) for name in providers
        }
        self._fetched_at: float | None = None
        self._generation = 0  # completed refreshes, so waiting callers can share one
        self._index = OfferIndex(())
        self._listeners: list[Callable[[OfferIndex, float], None]] = []
        self._asking: list[Callable[[], None]] = []
        self._lock = asyncio.Lock()

    async def _ask(self, name: str, provider: Provider) -> ProviderAnswer:
        previous = self._answers[name]
        try:
            offers = await asyncio.wait_for(provider.offers(), self._timeout)
        except TimeoutError:
            return ProviderAnswer((), previous.answered_at, f"no answer in {self._timeout:.0f}s")
        except Exception as exc:  # an adapter's failure must not stop the others
            log.warning("provider %s: offers failed: %s", name, exc)
            return ProviderAnswer((), previous.answered_at, f"{type(exc).__name__}: {exc}")
        return ProviderAnswer(tuple(offers), self._clock(), None)

    async def refresh(self) -> None:
        async with self._lock:
            await self._refresh_locked()

    def on_refresh(self, listener: Callable[[OfferIndex, float], None]) -> None:
        """Call ``listener(index, asked_at)`` after every refresh: the new offers, and when
        the providers were asked (what they said is no older than that)."""
        self._listeners.append(listener)

    def on_asking(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` just before every refresh asks the providers (one refresh at
        a time, so each ask is answered, through ``on_refresh``, before the next)."""
        self._asking.append(listener)

    async def _refresh_locked(self) -> None:
        for asking in self._asking:
            asking()
        asked_at = self._clock()
        names = list(self._providers)
        answers = await asyncio.gather(*(self._ask(n, self._providers[n]) for n in names))
        self._answers = dict(zip(names, answers, strict=True))
        self._index = OfferIndex(offer for answer in answers for offer in answer.offers)
        self._fetched_at = self._clock()
        self._generation += 1
        for listener in self._listeners:
            listener(self._index, asked_at)

    async def offers(self, *, max_age: float | None = None) -> list[Offer]:
        """All providers' offers, refreshed when older than ``max_age`` (default the TTL)."""
        return list((await self.index(max_age=max_age)).offers)

    async def index(self, *, max_age: float | None = None) -> OfferIndex:
        """All providers' offers, indexed for ``place()``; refreshed as ``offers`` is."""
        age_limit = self._ttl if max_age is None else max_age
        if self._fetched_at is None or self._clock() - self._fetched_at >= age_limit:
            seen = self._generation
            async with self._lock:
                # A refresh that completed while this caller waited for the lock answered
                # after it asked: share it instead of asking every provider again.
                if self._generation == seen:
                    await self._refresh_locked()
        return self._index

    def invalidate(self) -> None:
        """Capacity changed (an instance of ours ended, a create found no capacity): the next
        ``offers()`` asks the providers instead of waiting for the TTL."""
        self._fetched_at = None

    def cached(self) -> list[Offer]:
        return [offer for answer in self._answers.values() for offer in answer.offers]

    def answer(self, name: str) -> ProviderAnswer:
        return self._answers[name]

    def responsive(self, within_seconds: float) -> set[str]:
        """Providers whose last successful answer is younger than ``within_seconds``."""
        now = self._clock()
        return {
            name
            for name, answer in self._answers.items()
            if answer.answered_at is not None and now - answer.answered_at <= within_seconds
        }
