"""Budget caps in $/hour, global and per namespace, that concurrent placements cannot break.

The ledger holds the hourly price of every pod that runs (or is being launched) on the
virtual node. A placement first *reserves* its offer's price; the reservation succeeds only
if every cap still holds with it counted, and because reserving is synchronous (no await
between check and record) two concurrent placements cannot both squeeze under a cap. A
reservation becomes a commitment when the instance exists, and is released when the launch
fails or the pod ends.

Invariants:
- ``spent(ns) + reserved(ns) <= cap(ns)`` and the same globally, at every moment, for every
  successful ``reserve``; entries are keyed by pod UID, so recording the same pod twice
  (e.g. re-observed after a restart) never double-counts.
- Accumulated spend integrates price over time per provider and namespace.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass


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
            if room is not None and price_per_hour > room + 1e-9:
                return False
        return True


@dataclass(slots=True)
class _Entry:
    namespace: str
    provider: str
    price: float
    committed: bool
    since: float


class BudgetLedger:
    def __init__(self, caps: BudgetCaps, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._caps = caps
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._accumulated: dict[tuple[str, str], float] = {}

    @property
    def caps(self) -> BudgetCaps:
        return self._caps

    def _total(self, namespace: str | None = None) -> float:
        return sum(
            e.price for e in self._entries.values() if namespace is None or e.namespace == namespace
        )

    def view(self, namespace: str, *, excluding: str | None = None) -> BudgetView:
        """Room left for ``namespace`` (not counting pod ``excluding``'s own entry)."""
        own = self._entries.get(excluding or "")
        own_price = own.price if own else 0.0
        own_ns = own.price if own and own.namespace == namespace else 0.0
        global_cap = self._caps.global_per_hour
        ns_cap = self._caps.namespace_cap(namespace)
        return BudgetView(
            global_room=None if global_cap is None else global_cap - self._total() + own_price,
            namespace_room=None if ns_cap is None else ns_cap - self._total(namespace) + own_ns,
        )

    def reserve(self, uid: str, *, namespace: str, provider: str, price: float) -> bool:
        """Hold ``price`` for pod ``uid`` if every cap allows it; replaces its previous entry."""
        if not self.view(namespace, excluding=uid).allows(price):
            return False
        self._settle(uid)
        self._entries[uid] = _Entry(namespace, provider, price, False, self._clock())
        return True

    def commit(self, uid: str, *, namespace: str, provider: str, price: float) -> None:
        """Record a running instance (after launch, or re-observed after a restart)."""
        entry = self._entries.get(uid)
        if entry and entry.committed and (entry.provider, entry.price) == (provider, price):
            return
        self._settle(uid)
        self._entries[uid] = _Entry(namespace, provider, price, True, self._clock())

    def release(self, uid: str) -> bool:
        """Drop ``uid``'s entry; return whether it had one (room appeared)."""
        self._settle(uid)
        return self._entries.pop(uid, None) is not None

    def _settle(self, uid: str) -> None:
        """Add what ``uid`` has cost since it was recorded to the accumulated spend."""
        entry = self._entries.get(uid)
        if entry is None or not entry.committed:
            return
        now = self._clock()
        key = (entry.provider, entry.namespace)
        self._accumulated[key] = self._accumulated.get(key, 0.0) + entry.price * (
            (now - entry.since) / 3600.0
        )
        entry.since = now

    def current_per_hour(self) -> dict[tuple[str, str], float]:
        """$/hour now, by (provider, namespace), counting running instances only."""
        totals: dict[tuple[str, str], float] = {}
        for entry in self._entries.values():
            if entry.committed:
                key = (entry.provider, entry.namespace)
                totals[key] = totals.get(key, 0.0) + entry.price
        return totals

    def accumulated(self) -> dict[tuple[str, str], float]:
        """Dollars spent so far, by (provider, namespace), including the running part."""
        now = self._clock()
        totals = dict(self._accumulated)
        for entry in self._entries.values():
            if entry.committed:
                key = (entry.provider, entry.namespace)
                totals[key] = totals.get(key, 0.0) + entry.price * ((now - entry.since) / 3600.0)
        return totals

    def total_per_hour(self, namespace: str | None = None) -> float:
        """$/hour held now (running and launching), in ``namespace`` or in all."""
        return self._total(namespace)
