"""Budget caps in $/hour, global and per namespace, held against what the providers may bill.

The ledger counts **instances**, not pods: one entry per create request (the provider and the
request id ``<pod UID>.<attempt>``, which every instance carries), from the moment its create
is sent until a listing of its provider proves it gone. An entry holds its price as one of:

- ``SENDING``: the create is on its way; no answer yet.
- ``UNCERTAIN``: the create's answer was lost (an error after the request may have been
  sent): the instance may exist, so it counts until a listing taken after the answer was
  lost says it does not (or shows it: then it is ``BILLED``).
- ``BILLED``: the provider has it (the create answered, or a listing shows it, whatever its
  state: starting, running, exited or terminating; a deleted instance the provider keeps
  counts until it is listed no more).
- An instance listed before its pod is seen (just after a restart) counts against every
  namespace's cap until ``name_pod`` says whose it is.
- ``ESTIMATE``: after a restart, a pod's annotations say it runs on a provider that has not
  been listed yet; dropped at that provider's first listing, which is the truth.

Creates are admitted atomically: ``reserve`` checks every cap with everything held counted
and records the entry with no await in between, so concurrent placements cannot squeeze past
a cap. Instances nobody reserved (a previous run's, adopted or orphaned) are counted as
their provider lists them, cap or no cap: they are billed; ``within_caps`` tells whether
adopting one keeps the caps.

Invariants:
- For every successful ``reserve``: held(ns) ≤ cap(ns) and held ≤ global cap, counting
  every entry of every kind; no entry leaves the ledger except by an answered refusal of its
  create (``refused``) or a listing of its provider, begun after the entry settled, that does
  not show it (or shows it terminated).
- Spend now (``current_per_hour``) and accumulated spend integrate ``BILLED`` entries only,
  by (provider, namespace); caps count everything.
- Pure: the clock is injected; no I/O.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from vk_provider.domain.models import Instance, InstanceState

_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class BudgetCaps:
    global_per_hour: float | None = None
    per_namespace: Mapping[str, float] | None = None
    default_namespace_per_hour: float | None = None

    def namespace_cap(self, namespace: str) -> float | None:
        if self.per_namespace and namespace in self.per_namespace:
            return self.per_namespace[namespace]
        return self.default_namespace_per_hour


@dataclass(frozen=True, slots=True)
class BudgetView:
    """What placement needs to know: how much more each scope may spend per hour."""

    global_room: float | None
    namespace_room: float | None

    def allows(self, price_per_hour: float) -> bool:
        for room in (self.global_room, self.namespace_room):
            if room is not None and price_per_hour > room + _EPSILON:
                return False
        return True


class Hold(enum.Enum):
    """Why an entry holds its price (see the module docstring)."""

    SENDING = "sending"
    UNCERTAIN = "uncertain"
    BILLED = "billed"
    ESTIMATE = "estimate"


# (provider, request id); an estimate is (provider, "pod:<uid>").
EntryKey = tuple[str, str]


@dataclass(slots=True)
class _Entry:
    pod_uid: str
    namespace: str  # "" while unknown (an instance whose pod is not seen): global cap only
    provider: str
    offer_key: str
    price: float
    hold: Hold
    since: float  # BILLED: accrued up to here
    settled: int  # the listing mark when its create answered (or was lost); -1: still sending


@dataclass(frozen=True, slots=True)
class Freed:
    """An entry a listing proved gone: its room is free again."""

    provider: str
    offer_key: str
    namespace: str


def request_id(pod_uid: str, attempt: int) -> str:
    """The idempotency key of a create, as ``WorkloadSpec.request_id`` spells it."""
    return f"{pod_uid}.{attempt}"


class BudgetLedger:
    def __init__(self, caps: BudgetCaps, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._caps = caps
        self._clock = clock
        self._entries: dict[EntryKey, _Entry] = {}
        self._accumulated: dict[tuple[str, str], float] = {}
        self._mark = 0  # counts listings begun and creates settled, in order
        self._listed: set[str] = set()  # providers listed at least once

    @property
    def caps(self) -> BudgetCaps:
        return self._caps

    # ---------------------------------------------------------------- room and admission

    def _held(self, namespace: str | None = None, excluding: EntryKey | str | None = None) -> float:
        return sum(
            e.price
            for key, e in self._entries.items()
            if excluding not in (key, key[1])
            # An instance whose pod is not known yet may be any namespace's: it counts in all.
            and (namespace is None or e.namespace in (namespace, ""))
        )

    def view(self, namespace: str, *, excluding: EntryKey | str | None = None) -> BudgetView:
        """Room left for ``namespace``, not counting the entry ``excluding``: a (provider,
        request) key, which a retry of that create there replaces (the provider makes one
        instance), or a request id, for every provider (what placement may try first;
        ``reserve`` then checks the exact room on the provider it chose)."""
        global_cap = self._caps.global_per_hour
        ns_cap = self._caps.namespace_cap(namespace)
        return BudgetView(
            global_room=None if global_cap is None else global_cap - self._held(None, excluding),
            namespace_room=None if ns_cap is None else ns_cap - self._held(namespace, excluding),
        )

    def reserve(
        self,
        request: str,
        *,
        pod_uid: str,
        namespace: str,
        provider: str,
        offer_key: str,
        price: float,
    ) -> bool:
        """Hold ``price`` for the create ``request`` on ``provider`` if every cap allows it
        (a non-finite or negative price never does)."""
        key = (provider, request)
        if not (math.isfinite(price) and price >= 0):
            return False
        if not self.view(namespace, excluding=key).allows(price):
            return False
        self._settle(key)
        self._entries[key] = _Entry(
            pod_uid, namespace, provider, offer_key, price, Hold.SENDING, self._clock(), -1
        )
        return True

    def within_caps(self, namespace: str) -> bool:
        """Whether everything held (an adopted instance included) keeps ``namespace``'s cap
        and the global cap."""
        return self.view(namespace).allows(0.0)

    # ---------------------------------------------------------------- what a create answered

    def created(self, provider: str, request: str) -> None:
        """The create answered with its instance: it is billed from now."""
        entry = self._entries.get((provider, request))
        if entry is None:
            return
        entry.hold, entry.since, entry.settled = Hold.BILLED, self._clock(), self._next_mark()

    def refused(self, provider: str, request: str) -> bool:
        """The provider answered that it made nothing: the hold goes. Whether one was held."""
        return self._entries.pop((provider, request), None) is not None

    def unanswered(self, provider: str, request: str) -> None:
        """The create's answer was lost: the instance may exist until a listing says no."""
        entry = self._entries.get((provider, request))
        if entry is not None and entry.hold is Hold.SENDING:
            entry.hold, entry.settled = Hold.UNCERTAIN, self._next_mark()

    # ---------------------------------------------------------------- what a provider lists

    def listing(self) -> int:
        """Mark the start of a listing; pass the mark to ``listed`` with its answer."""
        return self._next_mark()

    def listed(
        self,
        provider: str,
        instances: Iterable[Instance],
        mark: int,
        *,
        namespace_of: Callable[[str], str | None] = lambda _uid: None,
    ) -> list[Freed]:
        """Reconcile ``provider``'s entries with its listing begun at ``mark``: every instance
        it shows (not terminated) is billed; entries settled before ``mark`` that it does not
        show are gone, as are the provider's estimates. Returns what was freed."""
        self._listed.add(provider)
        now = self._clock()
        shown: set[EntryKey] = set()
        for instance in instances:
            if instance.state is InstanceState.TERMINATED:
                continue
            key = (provider, request_id(instance.pod_uid, instance.attempt))
            shown.add(key)
            entry = self._entries.get(key)
            price = instance.price_per_hour
            if entry is None:
                namespace = namespace_of(instance.pod_uid) or ""
                self._entries[key] = _Entry(
                    instance.pod_uid,
                    namespace,
                    provider,
                    instance.offer_key,
                    price,
                    Hold.BILLED,
                    now,
                    mark,
                )
                continue
            if entry.hold is not Hold.BILLED:
                entry.hold, entry.since = Hold.BILLED, now
                entry.settled = max(entry.settled, mark)
            if not entry.namespace:
                entry.namespace = namespace_of(instance.pod_uid) or ""
            if math.isfinite(price) and price >= 0 and price != entry.price:
                self._settle(key)
                entry.price = price
        freed: list[Freed] = []
        for key, entry in list(self._entries.items()):
            if entry.provider != provider or key in shown:
                continue
            if entry.hold is Hold.ESTIMATE or (0 <= entry.settled < mark):
                self._settle(key)
                del self._entries[key]
                if entry.hold is not Hold.ESTIMATE:
                    freed.append(Freed(provider, entry.offer_key, entry.namespace))
        return freed

    def name_pod(self, pod_uid: str, namespace: str) -> None:
        """The pod ``pod_uid`` is in ``namespace``: its instances listed before it was seen
        count in that namespace alone from now on."""
        for entry in self._entries.values():
            if entry.pod_uid == pod_uid and not entry.namespace:
                self._settle_entry(entry)
                entry.namespace = namespace

    def estimate(
        self, pod_uid: str, *, namespace: str, provider: str, offer_key: str, price: float
    ) -> None:
        """After a restart: the pod's annotations say it runs on ``provider`` at ``price``.
        Counted only until that provider is first listed (then the listing is the truth)."""
        if provider in self._listed or not (math.isfinite(price) and price >= 0):
            return
        self._entries[(provider, f"pod:{pod_uid}")] = _Entry(
            pod_uid, namespace, provider, offer_key, price, Hold.ESTIMATE, self._clock(), -1
        )

    def forget_estimate(self, pod_uid: str) -> bool:
        """The pod says it runs nothing any more: its estimate (if any) goes."""
        keys = [
            k for k, e in self._entries.items() if e.hold is Hold.ESTIMATE and e.pod_uid == pod_uid
        ]
        for key in keys:
            del self._entries[key]
        return bool(keys)

    # ---------------------------------------------------------------- spend

    def _next_mark(self) -> int:
        self._mark += 1
        return self._mark

    def _settle(self, key: EntryKey) -> None:
        entry = self._entries.get(key)
        if entry is not None:
            self._settle_entry(entry)

    def _settle_entry(self, entry: _Entry) -> None:
        """Add what a billed entry has cost since it was recorded to the accumulated spend."""
        if entry.hold is not Hold.BILLED:
            return
        now = self._clock()
        bucket = (entry.provider, entry.namespace)
        self._accumulated[bucket] = self._accumulated.get(bucket, 0.0) + entry.price * (
            (now - entry.since) / 3600.0
        )
        entry.since = now

    def holds(self) -> dict[Hold, float]:
        """$/hour held, by kind of hold."""
        totals = dict.fromkeys(Hold, 0.0)
        for entry in self._entries.values():
            totals[entry.hold] += entry.price
        return totals

    def current_per_hour(self) -> dict[tuple[str, str], float]:
        """$/hour billed now, by (provider, namespace)."""
        totals: dict[tuple[str, str], float] = {}
        for entry in self._entries.values():
            if entry.hold is Hold.BILLED:
                bucket = (entry.provider, entry.namespace)
                totals[bucket] = totals.get(bucket, 0.0) + entry.price
        return totals

    def accumulated(self) -> dict[tuple[str, str], float]:
        """Dollars spent so far, by (provider, namespace), including the billed part now."""
        now = self._clock()
        totals = dict(self._accumulated)
        for entry in self._entries.values():
            if entry.hold is Hold.BILLED:
                bucket = (entry.provider, entry.namespace)
                totals[bucket] = totals.get(bucket, 0.0) + entry.price * (
                    (now - entry.since) / 3600.0
                )
        return totals

    def total_per_hour(self, namespace: str | None = None) -> float:
        """$/hour held now (every kind of hold), in ``namespace`` or in all."""
        return self._held(namespace)
