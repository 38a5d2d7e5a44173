"""What our own creates did to the providers' room since the providers last answered.

Offers are the providers' answers: their free room as of when they were asked. Between two
answers the agent creates instances the answers do not know of yet. ``Room`` keeps each
create from its claim until an answer asked after it was settled, and what the pods held
when the providers were last asked, so that

- placement sees an offer's room as the answer minus the creates under way on it or made
  since (``taken``): pods placed in the same second spread over offers at once instead of
  all trying the cheapest and failing over;
- the node's capacity is the answer's free room plus what our pods held when the providers
  were asked (``reflected``): a new instance is counted once (as its pod's request, which
  the scheduler subtracts), never also as room the stale answer still shows; a pod that
  ended since the answer still counts (its room is free, which the answer does not know);
  an adopted pod counts from the moment it is seen placed.

So between two answers the node's capacity does not move with our own placements or
terminations: only the providers' next answer moves it, by what changed outside the agent.

Invariants: pure, no I/O, no clock: "before" and "after" are the order of the calls (asks
are numbered; one ask is answered before the next begins, as the offer book refreshes one
at a time). A claim counts against its offer until an ask begun after it settled is
answered (an unanswered create may have made its instance: it counts until an answer can
say); ``reflected`` never counts a pod twice nor a pod whose create the providers had not
seen when asked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from vk_provider.domain.workload import Held


@dataclass(slots=True)
class _Claim:
    uid: str
    offer_key: str
    settled_after: int | None = None  # asks begun before it settled; None: still out


@dataclass(slots=True)
class Room:
    _claims: dict[str, _Claim] = field(default_factory=dict)  # request id -> claim
    _by_uid: dict[str, set[str]] = field(default_factory=dict)  # pod uid -> its request ids
    _taken: dict[str, int] = field(default_factory=dict)  # offer key -> claims on it
    _reflected: dict[str, Held] = field(default_factory=dict)  # pod uid -> what it held
    _asks: int = 0  # asks begun
    _asking: dict[str, Held] | None = None  # what the ask under way will count as ours

    # ------------------------------------------------------------------ creates

    def claim(self, request_id: str, *, uid: str, offer_key: str) -> None:
        """A create of ``request_id`` on ``offer_key`` is about to go out."""
        if request_id in self._claims:
            self._drop(request_id)  # a second try of the same request: one claim
        self._claims[request_id] = _Claim(uid, offer_key)
        self._by_uid.setdefault(uid, set()).add(request_id)
        self._taken[offer_key] = self._taken.get(offer_key, 0) + 1

    def _drop(self, request_id: str) -> None:
        claim = self._claims.pop(request_id)
        requests = self._by_uid[claim.uid]
        requests.discard(request_id)
        if not requests:
            del self._by_uid[claim.uid]
        left = self._taken[claim.offer_key] - 1
        if left:
            self._taken[claim.offer_key] = left
        else:
            del self._taken[claim.offer_key]

    def settled(self, request_id: str, *, made: bool) -> None:
        """The create answered (``made``: it made the instance, or may have: no answer); an
        answered refusal made nothing and gives its room back at once."""
        claim = self._claims.get(request_id)
        if claim is None:
            return
        if made:
            claim.settled_after = self._asks
        else:
            self._drop(request_id)

    def taken(self) -> Mapping[str, int]:
        """Per offer key, the creates under way on it or made since the providers were
        last asked: room the cached answer still shows but placement must not count (a
        read-only view, kept current)."""
        return MappingProxyType(self._taken)

    def _unseen(self, uid: str, ask: int | None) -> bool:
        """Is a create of ``uid`` out, or settled after ask number ``ask`` began (None: a
        claim of it still counts)?"""
        for request_id in self._by_uid.get(uid, ()):
            settled = self._claims[request_id].settled_after
            if settled is None or ask is None or settled >= ask:
                return True
        return False

    # ------------------------------------------------------------------ answers

    def asking(self, placed: Mapping[str, Held]) -> None:
        """The providers are being asked now; ``placed`` is what each live placed pod holds
        (by uid). Their answer will count as ours every pod whose create settled before."""
        self._asks += 1
        ask = self._asks
        self._asking = {uid: h for uid, h in placed.items() if not self._unseen(uid, ask)}

    def answered(self) -> None:
        """The providers asked last answered: creates settled before they were asked are in
        their answers (no longer taken); what the pods held then is what the answers count
        as ours."""
        if self._asking is None:
            return  # an answer without an ask: nothing is known to have changed
        ask = self._asks
        for request_id in [
            r
            for r, c in self._claims.items()
            if c.settled_after is not None and c.settled_after < ask
        ]:
            self._drop(request_id)
        self._reflected = self._asking
        self._asking = None

    def reflected(self, placed: Mapping[str, Held]) -> Held:
        """What the providers' last answer counts as ours: the pods placed when they were
        asked (whether or not they still run), and pods seen placed since without a create
        of ours the answer could not know (adopted after a restart)."""
        total = Held()
        counted = dict(self._reflected)
        for uid, held in placed.items():
            if uid not in counted and not self._unseen(uid, None):
                counted[uid] = held
        for held in counted.values():
            total = Held(
                total.gpus + held.gpus, total.cpu + held.cpu, total.memory_gib + held.memory_gib
            )
        return total
