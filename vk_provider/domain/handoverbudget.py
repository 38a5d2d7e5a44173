"""Whether the displaced pods' replacements can be bought: the hand-over's money check.

Before the hand-over claims own nodes, each displaced pod is rehearsed as a first launch
(``controllers.preview``: the same ranking, offer book and budget room as the placer). The
outcome per pod is a ``ReplacementCost``; ``shortfall`` adds the prices of the offers each
would take first and compares the sums with what the caps leave (``BudgetView``: globally and
per namespace), so a hand-over that would strand inference behind a budget cap is held, with
the numbers, instead of evicting pods whose replacements then wait for money.

Invariants:
- Pure: no I/O, no clock.
- ``shortfall`` returns "" only when every pod has an offer and every cap holds the sum of
  the first-choice prices; the prices are the cheapest each pod can take, so a non-empty
  answer is certain, an empty one the best case (offer slots shared between pods are counted
  by the node's room, not here).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vk_provider.domain.budget import BudgetView

_EPSILON = 1e-9


class Outcome(enum.Enum):
    PLACED = "placed"
    BUDGET = "budget"  # alone it exceeds a cap
    CAPACITY = "capacity"  # no provider has room now
    INVALID = "invalid"  # no provider can run it


@dataclass(frozen=True, slots=True)
class ReplacementCost:
    pod: str  # namespace/name of the displaced pod
    namespace: str
    outcome: Outcome
    price_per_hour: float = 0.0  # the first-choice offer's, when PLACED
    why: str = ""  # the placer's own words when not PLACED


def _sum(costs: Sequence[ReplacementCost]) -> float:
    return sum(c.price_per_hour for c in costs)


def shortfall(costs: Sequence[ReplacementCost], rooms: Mapping[str, BudgetView]) -> str:
    """Why the replacements of ``costs`` cannot all be placed within the caps, or "".
    ``rooms``: the budget view of each namespace in ``costs``."""
    for cost in costs:
        if cost.outcome is Outcome.BUDGET:
            return f"displaced pod {cost.pod} could not be placed within the budget: {cost.why}"
        if cost.outcome is Outcome.INVALID:
            return f"no provider can run displaced pod {cost.pod}: {cost.why}"
        if cost.outcome is Outcome.CAPACITY:
            return f"no provider has room for displaced pod {cost.pod} now: {cost.why}"
    if not costs:
        return ""
    total = _sum(costs)
    global_room = next(iter(rooms.values())).global_room if rooms else None
    if global_room is not None and total > global_room + _EPSILON:
        return (
            f"the {len(costs)} displaced pod(s) cost at least ${total:.2f}/h elsewhere; the "
            f"global budget cap leaves ${max(global_room, 0):.2f}/h"
        )
    for namespace in sorted({c.namespace for c in costs}):
        room = rooms[namespace].namespace_room if namespace in rooms else None
        spent = _sum([c for c in costs if c.namespace == namespace])
        if room is not None and spent > room + _EPSILON:
            return (
                f"the displaced pods of namespace {namespace} cost at least ${spent:.2f}/h "
                f"elsewhere; its budget cap leaves ${max(room, 0):.2f}/h"
            )
    return ""
