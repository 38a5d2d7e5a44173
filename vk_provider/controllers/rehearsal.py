"""The hand-over's rehearsal: what the displaced pods' replacements would cost, placed now.

``Rehearsal.shortfall(pods)`` previews each displaced pod as a first launch
(``PlacementPreview``: no launch, no reservation, no Event) and asks
``domain.handoverbudget.shortfall`` whether the caps (``BudgetLedger.view``) hold them all.

Invariants: no effects beyond the preview's (the offer book may refresh its cache).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vk_provider.controllers.preview import Outcome as PreviewOutcome
from vk_provider.controllers.preview import PlacementPreview
from vk_provider.domain.budget import BudgetLedger
from vk_provider.domain.handoverbudget import Outcome, ReplacementCost, shortfall

_OUTCOMES = {
    PreviewOutcome.PLACED: Outcome.PLACED,
    PreviewOutcome.BUDGET_EXCEEDED: Outcome.BUDGET,
    PreviewOutcome.NO_CAPACITY: Outcome.CAPACITY,
    PreviewOutcome.INVALID: Outcome.INVALID,
}


class Rehearsal:
    def __init__(self, preview: PlacementPreview, ledger: BudgetLedger) -> None:
        self._preview = preview
        self._ledger = ledger

    async def costs(self, pods: Sequence[Mapping[str, Any]]) -> list[ReplacementCost]:
        costs = []
        for pod in pods:
            seen = await self._preview.preview(pod)
            chosen = seen.chosen
            costs.append(
                ReplacementCost(
                    pod=f"{seen.namespace}/{seen.name}",
                    namespace=seen.namespace,
                    outcome=_OUTCOMES[seen.outcome],
                    price_per_hour=chosen.price_per_hour if chosen is not None else 0.0,
                    why="" if chosen is not None else seen.message,
                )
            )
        return costs

    async def shortfall(self, pods: Sequence[Mapping[str, Any]]) -> str:
        costs = await self.costs(pods)
        rooms = {c.namespace: self._ledger.view(c.namespace) for c in costs}
        return shortfall(costs, rooms)
