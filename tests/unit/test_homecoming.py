"""The way home (domain.homecoming.choose): dearest first, only where a pod fits at home,
paced by budgets."""

from __future__ import annotations

from vk_provider.domain.homecoming import Rented, choose


def rented(
    name: str,
    price: float,
    *,
    gpus: int = 1,
    budgeted: bool = True,
    leaving: bool = False,
    movable: bool = True,
) -> Rented:
    return Rented("ml", name, gpus, price, budgeted, leaving, movable)


def test_the_dearest_is_offered_first() -> None:
    pods = [rented("cheap", 1.0), rented("dear", 2.99), rented("mid", 1.5)]
    assert [p.name for p in choose(pods, [8], limit=1)] == ["dear", "mid", "cheap"]


def test_only_pods_that_fit_one_home_node_are_chosen() -> None:
    pods = [rented("big", 5.0, gpus=8), rented("small", 1.0, gpus=2)]
    assert [p.name for p in choose(pods, [4, 4], limit=1)] == ["small"]
    assert [p.name for p in choose(pods, [8, 2], limit=1)] == ["big", "small"]


def test_room_the_leaving_pods_replacements_need_is_not_offered_twice() -> None:
    pods = [rented("gone", 3.0, gpus=4, leaving=True), rented("next", 2.0, gpus=4)]
    assert choose(pods, [4], limit=1) == []
    assert [p.name for p in choose(pods, [8], limit=1)] == ["next"]


def test_pods_without_a_budget_leave_limit_at_a_time() -> None:
    pods = [rented(n, p, budgeted=False) for n, p in (("a", 3.0), ("b", 2.0), ("c", 1.0))]
    assert [p.name for p in choose(pods, [8], limit=1)] == ["a"]
    assert [p.name for p in choose(pods, [8], limit=2)] == ["a", "b"]
    busy = [rented("x", 9.0, budgeted=False, leaving=True), *pods]
    assert choose(busy, [8], limit=1) == []


def test_bare_or_tolerating_pods_stay() -> None:
    assert choose([rented("bare", 9.0, movable=False)], [8], limit=1) == []
