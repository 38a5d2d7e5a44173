"""The hand-over's money check: held when the displaced pods' replacements break a cap."""

from __future__ import annotations

from vk_provider.domain.budget import BudgetView
from vk_provider.domain.handoverbudget import Outcome, ReplacementCost, shortfall


def _placed(name: str, price: float, namespace: str = "prod") -> ReplacementCost:
    return ReplacementCost(f"{namespace}/{name}", namespace, Outcome.PLACED, price)


def test_replacements_within_every_cap_leave_no_shortfall() -> None:
    costs = [_placed("a", 1.2), _placed("b", 1.2)]
    assert shortfall(costs, {"prod": BudgetView(global_room=2.4, namespace_room=3.0)}) == ""


def test_no_caps_leave_no_shortfall() -> None:
    costs = [_placed("a", 100.0)]
    assert shortfall(costs, {"prod": BudgetView(None, None)}) == ""
    assert shortfall([], {}) == ""


def test_the_sum_over_the_global_cap_is_a_shortfall_with_both_numbers() -> None:
    costs = [_placed(str(i), 1.2) for i in range(6)]
    why = shortfall(costs, {"prod": BudgetView(global_room=5.0, namespace_room=None)})
    assert "6 displaced pod(s) cost at least $7.20/h" in why
    assert "global budget cap leaves $5.00/h" in why


def test_a_namespace_cap_is_held_per_namespace() -> None:
    costs = [_placed("a", 2.0, "prod"), _placed("b", 2.0, "prod"), _placed("c", 3.0, "lab")]
    rooms = {
        "prod": BudgetView(global_room=None, namespace_room=3.0),
        "lab": BudgetView(global_room=None, namespace_room=10.0),
    }
    why = shortfall(costs, rooms)
    assert "namespace prod cost at least $4.00/h" in why
    assert "its budget cap leaves $3.00/h" in why
    rooms["prod"] = BudgetView(global_room=None, namespace_room=4.0)
    assert shortfall(costs, rooms) == ""


def test_a_pod_that_no_offer_takes_is_a_shortfall_naming_it_and_why() -> None:
    for outcome, words in (
        (Outcome.BUDGET, "could not be placed within the budget"),
        (Outcome.CAPACITY, "no provider has room"),
        (Outcome.INVALID, "no provider can run"),
    ):
        costs = [_placed("a", 1.0), ReplacementCost("prod/b", "prod", outcome, why="because")]
        why = shortfall(costs, {"prod": BudgetView(None, None)})
        assert words in why and "prod/b" in why and "because" in why
