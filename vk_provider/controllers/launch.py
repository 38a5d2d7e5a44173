"""Launching a pod's workload: placement, budget reservation and failover across offers.

``Launcher.launch`` is the only create path of the agent: a pod's first launch and every
relaunch of a crash-looping container go through it. It ranks the offers with ``place()``
(pure) and walks the candidates, at most ``max_candidates`` of them (a relaunch, or a retry
after a 429, tries its previous offer first), reserving each one's price in the budget
ledger before calling the provider. The outcome is data (``LaunchResult``) that the pod
controller turns into annotations, status and Events; every failed attempt is listed in it.

Failover rules (docs/reference.md#failover), one per error class:

| error | effect |
|---|---|
| ``CapacityUnavailable`` | block the (provider, sku, region) a while; next candidate |
| ``AuthFailed`` | block the provider for ``auth_block_seconds``; next candidate |
| ``InvalidSpec`` | stop: the request can never succeed as is |
| ``RateLimited`` / ``Transient`` | stop and retry later on the same candidate (``retry_after``) |

Invariants: every create is reserved in the ledger first (``domain.budget``: keyed by
provider and request id, every cap checked); an answered refusal releases the hold, any other
failure leaves it "uncertain" until the provider's next listing says whether the instance
exists, so a lost answer can never let a cap be passed; blocked entries expire by the
injected clock; an offer or provider blocked during the walk is not called again in the same
walk; an offer's room that creates under way (or made since the providers answered) use is
not offered again (``domain.room``: each create is claimed before it goes out and settled
when it answers); ``plan`` (the ranking and the walk's order) has no effects, and the
placement dry run (``controllers.preview``) uses it as ``launch`` does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from vk_provider.domain.budget import BudgetLedger, BudgetView
from vk_provider.domain.contract import Provider
from vk_provider.domain.errors import (
    AuthFailed,
    CapacityUnavailable,
    InvalidSpec,
    NotSent,
    ProviderError,
    RateLimited,
)
from vk_provider.domain.models import Instance, Offer, WorkloadSpec
from vk_provider.domain.offerindex import OfferIndex, bits
from vk_provider.domain.placement import (
    Placement,
    PlacementPolicy,
    PlacementRequest,
    ProviderHealth,
    place,
)
from vk_provider.domain.room import Room
from vk_provider.settings.agent import PlacementConfig


@dataclass(frozen=True, slots=True)
class Attempt:
    offer: Offer
    error: ProviderError


@dataclass(frozen=True, slots=True)
class LaunchResult:
    """Exactly one of: launched, no fit, invalid, or retry later; plus the failed attempts."""

    placement: Placement
    attempts: tuple[Attempt, ...] = ()
    instance: Instance | None = None
    offer: Offer | None = None
    invalid: InvalidSpec | None = None
    retry_after: float | None = None  # set for RateLimited / Transient: same candidate later
    budget_skipped: int = 0  # candidates a concurrent placement priced out meanwhile

    @property
    def launched(self) -> bool:
        return self.instance is not None

    @property
    def budget_limited(self) -> bool:
        """Nothing launched because a budget cap would be exceeded."""
        if self.launched or self.invalid or self.retry_after is not None:
            return False
        return self.placement.budget_limited or (self.budget_skipped > 0 and not self.attempts)


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """What a launch would do now: the ranking, and the candidates in the order it tries
    them (a preferred offer first), with the provider health and budget room it saw."""

    placement: Placement
    order: tuple[Offer, ...]
    health: Mapping[str, ProviderHealth]
    budget: BudgetView


# Errors that prove the create made nothing (the provider answered no, or nothing was sent).
ANSWERED_REFUSALS = (CapacityUnavailable, AuthFailed, InvalidSpec, RateLimited, NotSent)


class Launcher:
    def __init__(
        self,
        providers: Mapping[str, Provider],
        ledger: BudgetLedger,
        *,
        settings: PlacementConfig,
        health: Callable[[], Mapping[str, ProviderHealth]],
        priorities: Mapping[str, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._providers = dict(providers)
        # Read once: which providers can run pods of more than one container.
        self.capabilities = {name: p.capabilities for name, p in self._providers.items()}
        self.ledger = ledger
        self._settings = settings
        self._health = health
        self._priorities = dict(priorities or {})
        self._clock = clock
        self._blocked: dict[str, float] = {}  # offer key or provider name -> until
        self._capacity_blocked_at: dict[str, float] = {}  # offer key -> when it said "full"
        self._avoided: dict[str, float] = {}  # offer key -> until (an instance was lost there)
        # Creates under way or made since the providers last answered (the offer book tells
        # it when it asks and when they answer): their room is not offered twice.
        self.room = Room()

    def block(self, key: str, seconds: float) -> None:
        """Skip an offer (or a whole provider) for a while: it said no capacity / no auth."""
        self._blocked[key] = max(self._blocked.get(key, 0.0), self._clock() + seconds)

    def capacity_freed(self, offer_key: str) -> None:
        """An instance of ``offer_key`` ended: its "no capacity" block no longer holds."""
        self._blocked.pop(offer_key, None)
        self._capacity_blocked_at.pop(offer_key, None)

    def capacity_seen(self, offers: OfferIndex, asked_at: float) -> list[str]:
        """The providers, asked at ``asked_at``, offer these again: a "no capacity" block set
        before they were asked no longer holds for an offer they say is available (so a
        block never hides capacity longer than the offer cache does). The keys unblocked."""
        lifted = []
        for key, since in list(self._capacity_blocked_at.items()):
            if key not in self._blocked:
                del self._capacity_blocked_at[key]  # expired meanwhile
                continue
            if since > asked_at:
                continue  # the refusal is newer than the answer
            mask = offers.keys.get(key, 0)
            if any(offers.offers[i].available > 0 for i in bits(mask)):
                self._blocked.pop(key, None)
                del self._capacity_blocked_at[key]
                lifted.append(key)
        return lifted

    def avoid(self, key: str, seconds: float) -> None:
        """Prefer other offers for a while: an instance was lost there.

        Softer than ``block``: a pod's first attempt skips avoided offers (so the replacement
        of a lost pod goes elsewhere if it can), its retries may use them (so a single-offer
        setup recovers after one back-off instead of waiting out the cool-down).
        """
        self._avoided[key] = max(self._avoided.get(key, 0.0), self._clock() + seconds)

    @staticmethod
    def _current(entries: dict[str, float], now: float) -> frozenset[str]:
        for key in [k for k, until in entries.items() if until <= now]:
            del entries[key]
        return frozenset(entries)

    def blocked(self, *, include_avoided: bool = False) -> frozenset[str]:
        now = self._clock()
        hard = self._current(self._blocked, now)
        return hard | self._current(self._avoided, now) if include_avoided else hard

    @property
    def max_candidates(self) -> int:
        """How many candidates one launch walks at most."""
        return self._settings.max_candidates

    @property
    def policy(self) -> PlacementPolicy:
        return self._settings.policy

    def plan(
        self,
        request: PlacementRequest,
        offers: Sequence[Offer] | OfferIndex,
        *,
        namespace: str,
        request_id: str = "",
        prefer: str | None = None,
        allow_avoided: bool = True,
    ) -> LaunchPlan:
        """The ranking, and the order ``launch`` walks the candidates in, from the state of
        now (blocks, breakers, budget). Calls no provider and reserves nothing: a dry run
        (``controllers.preview``) shares it with ``launch``, so both choose alike."""
        health = dict(self._health())
        budget = self.ledger.view(namespace, excluding=request_id or None)
        placement = place(
            request,
            offers,
            blocked=self.blocked(include_avoided=not allow_avoided),
            health=health,
            budget=budget,
            priorities=self._priorities,
            policy=self._settings.policy,
            capabilities=self.capabilities,
            taken=self.room.taken(),
        )
        candidates = list(placement.candidates)
        if prefer:
            # Retrying after a 429/5xx: the same candidate first, if it still qualifies.
            candidates.sort(key=lambda o: o.key != prefer)
        return LaunchPlan(placement, tuple(candidates), health, budget)

    def _settle_failed(self, offer: Offer, request: str, error: ProviderError) -> None:
        """A create failed: an answered refusal made nothing, so its hold goes; any other
        failure (no answer, a 5xx, a timeout) may have made the instance, which stays
        counted until its provider's listing says whether it exists."""
        answered = isinstance(error, ANSWERED_REFUSALS)
        if answered:
            self.ledger.refused(offer.provider, request)
        else:
            self.ledger.unanswered(offer.provider, request)
        self.room.settled(request, made=not answered)

    async def launch(
        self,
        spec: WorkloadSpec,
        request: PlacementRequest,
        offers: Sequence[Offer] | OfferIndex,
        *,
        prefer: str | None = None,
        allow_avoided: bool = True,
    ) -> LaunchResult:
        plan = self.plan(
            request,
            offers,
            namespace=spec.namespace,
            request_id=spec.request_id,
            prefer=prefer,
            allow_avoided=allow_avoided,
        )
        placement, candidates = plan.placement, plan.order
        attempts: list[Attempt] = []
        budget_skipped = 0
        walked = 0
        for offer in candidates:
            if walked >= self._settings.max_candidates:
                break
            blocked = self.blocked()
            if offer.key in blocked or offer.provider in blocked:
                # Blocked during this walk (an AuthFailed blocks the provider's other offers
                # too): not a candidate any more, and it does not use up a place in the walk.
                continue
            if offer.available <= self.room.taken().get(offer.key, 0):
                continue  # a concurrent placement took its last room during this walk
            walked += 1
            if not self.ledger.reserve(
                spec.request_id,
                pod_uid=spec.pod_uid,
                namespace=spec.namespace,
                provider=offer.provider,
                offer_key=offer.key,
                price=offer.price_per_hour,
            ):
                budget_skipped += 1  # a concurrent placement took the room meanwhile
                continue
            self.room.claim(spec.request_id, uid=spec.pod_uid, offer_key=offer.key)
            try:
                instance = await self._providers[offer.provider].create(spec, offer)
            except ProviderError as exc:
                self._settle_failed(offer, spec.request_id, exc)
                attempts.append(Attempt(offer, exc))
                if isinstance(exc, CapacityUnavailable):
                    self.block(offer.key, self._settings.capacity_block_seconds)
                    self._capacity_blocked_at[offer.key] = self._clock()
                    continue
                if isinstance(exc, AuthFailed):
                    self.block(offer.provider, self._settings.auth_block_seconds)
                    continue
                if isinstance(exc, InvalidSpec):
                    return LaunchResult(placement, tuple(attempts), invalid=exc)
                wait = exc.retry_after if isinstance(exc, RateLimited) else None
                return LaunchResult(placement, tuple(attempts), retry_after=wait or 0.0)
            except BaseException:
                # Cancelled or crashed while the create was out: it may have been made.
                self.ledger.unanswered(offer.provider, spec.request_id)
                self.room.settled(spec.request_id, made=True)
                raise
            self.ledger.created(offer.provider, spec.request_id)
            self.room.settled(spec.request_id, made=True)
            return LaunchResult(placement, tuple(attempts), instance=instance, offer=offer)
        return LaunchResult(placement, tuple(attempts), budget_skipped=budget_skipped)
