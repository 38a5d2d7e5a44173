"""The budget ledger: reservations, commitments, caps and accumulated spend (fake clock).

Prices are exact binary fractions so sums compare exactly.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vk_provider.domain.budget import BudgetCaps, BudgetLedger, BudgetView


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def ledger(caps: BudgetCaps | None = None, clock: FakeClock | None = None) -> BudgetLedger:
    return BudgetLedger(caps or BudgetCaps(), clock=clock or FakeClock())


# --- caps ------------------------------------------------------------------------------------


def test_namespace_cap_prefers_the_explicit_entry_over_the_default() -> None:
    caps = BudgetCaps(per_namespace={"ml": 10.0, "free": 0.0}, default_namespace_per_hour=2.0)
    assert caps.namespace_cap("ml") == 10.0
    assert caps.namespace_cap("free") == 0.0
    assert caps.namespace_cap("other") == 2.0
    assert BudgetCaps().namespace_cap("ml") is None


@pytest.mark.parametrize(
    ("view", "price", "allowed"),
    [
        (BudgetView(None, None), 1e6, True),
        (BudgetView(2.0, None), 2.0, True),
        (BudgetView(2.0, None), 2.25, False),
        (BudgetView(None, 1.0), 1.5, False),
        (BudgetView(5.0, 1.0), 1.0, True),
        (BudgetView(0.5, 5.0), 1.0, False),
        (BudgetView(-1.0, None), 0.0, False),
    ],
)
def test_view_allows_only_what_fits_every_room(
    view: BudgetView, price: float, allowed: bool
) -> None:
    assert view.allows(price) is allowed


# --- reserve / commit / release --------------------------------------------------------------


def test_reserve_succeeds_only_within_the_global_cap() -> None:
    book = ledger(BudgetCaps(global_per_hour=4.0))
    assert book.reserve("a", namespace="ns", provider="p", price=2.5)
    assert not book.reserve("b", namespace="ns", provider="p", price=2.0)
    assert book.reserve("b", namespace="ns", provider="p", price=1.5)  # exactly at the cap
    assert book.total_per_hour() == 4.0
    assert not book.reserve("c", namespace="other", provider="q", price=0.25)
    assert book.view("other") == BudgetView(global_room=0.0, namespace_room=None)


def test_namespace_caps_are_separate_and_the_default_applies_to_the_rest() -> None:
    caps = BudgetCaps(per_namespace={"ml": 3.0}, default_namespace_per_hour=1.0)
    book = ledger(caps)
    assert book.reserve("a", namespace="ml", provider="p", price=2.0)
    assert not book.reserve("b", namespace="ml", provider="p", price=1.5)
    assert book.reserve("c", namespace="web", provider="p", price=1.0)
    assert not book.reserve("d", namespace="web", provider="p", price=0.5)
    assert book.reserve("e", namespace="batch", provider="p", price=1.0)  # its own default room
    assert book.view("ml").namespace_room == 1.0
    assert book.view("web").namespace_room == 0.0
    assert book.view("new").namespace_room == 1.0


def test_rereserving_the_same_pod_replaces_its_entry() -> None:
    book = ledger(BudgetCaps(global_per_hour=3.0))
    assert book.reserve("a", namespace="ns", provider="p", price=2.0)
    # The pod's own entry does not count against it: 3.0 fits after dropping its 2.0.
    assert book.view("ns", excluding="a").global_room == 3.0
    assert book.reserve("a", namespace="ns", provider="q", price=3.0)
    assert book.total_per_hour() == 3.0
    assert not book.reserve("b", namespace="ns", provider="p", price=0.25)


def test_a_failed_reserve_leaves_the_previous_entry() -> None:
    book = ledger(BudgetCaps(global_per_hour=3.0))
    assert book.reserve("a", namespace="ns", provider="p", price=2.0)
    assert not book.reserve("a", namespace="ns", provider="p", price=4.0)
    assert book.total_per_hour() == 2.0


def test_release_frees_the_room_and_says_whether_there_was_an_entry() -> None:
    book = ledger(BudgetCaps(global_per_hour=2.0))
    assert book.reserve("a", namespace="ns", provider="p", price=2.0)
    assert not book.reserve("b", namespace="ns", provider="p", price=1.0)
    assert book.release("a") is True
    assert book.release("a") is False
    assert book.total_per_hour() == 0.0
    assert book.reserve("b", namespace="ns", provider="p", price=1.0)


def test_reservations_count_against_caps_but_not_as_current_spend() -> None:
    book = ledger(BudgetCaps(global_per_hour=5.0))
    assert book.reserve("a", namespace="ns", provider="p", price=2.0)
    assert book.current_per_hour() == {}
    assert book.view("ns").global_room == 3.0
    book.commit("a", namespace="ns", provider="p", price=2.0)
    assert book.current_per_hour() == {("p", "ns"): 2.0}
    assert book.view("ns").global_room == 3.0  # committing does not count it twice


def test_commit_of_the_same_pod_is_idempotent() -> None:
    clock = FakeClock()
    book = ledger(BudgetCaps(global_per_hour=10.0), clock)
    book.commit("a", namespace="ns", provider="p", price=2.0)
    clock.advance(1800.0)
    book.commit("a", namespace="ns", provider="p", price=2.0)  # re-observed after a restart
    book.commit("a", namespace="ns", provider="p", price=2.0)
    assert book.total_per_hour() == 2.0
    assert book.current_per_hour() == {("p", "ns"): 2.0}
    clock.advance(1800.0)
    assert book.accumulated() == {("p", "ns"): 2.0}  # one hour at $2, not more


def test_commit_records_even_beyond_the_cap() -> None:
    """A running instance is a fact; the cap only stops new reservations."""
    book = ledger(BudgetCaps(global_per_hour=1.0))
    book.commit("a", namespace="ns", provider="p", price=3.0)
    assert book.total_per_hour() == 3.0
    assert book.view("ns").global_room == -2.0
    assert not book.reserve("b", namespace="ns", provider="p", price=0.0)


# --- spend -----------------------------------------------------------------------------------


def test_accumulated_spend_is_price_times_hours() -> None:
    clock = FakeClock()
    book = ledger(clock=clock)
    book.commit("a", namespace="ml", provider="p", price=2.0)
    book.commit("b", namespace="ml", provider="q", price=1.0)
    book.reserve("c", namespace="ml", provider="p", price=8.0)  # never ran: costs nothing
    clock.advance(1800.0)
    assert book.accumulated() == {("p", "ml"): 1.0, ("q", "ml"): 0.5}
    assert book.release("a")
    clock.advance(3600.0)
    assert book.accumulated() == {("p", "ml"): 1.0, ("q", "ml"): 1.5}
    assert book.current_per_hour() == {("q", "ml"): 1.0}


def test_a_price_change_settles_the_time_at_the_old_price() -> None:
    clock = FakeClock()
    book = ledger(clock=clock)
    book.commit("a", namespace="ns", provider="p", price=2.0)
    clock.advance(3600.0)
    book.commit("a", namespace="ns", provider="p", price=4.0)
    clock.advance(900.0)
    assert book.accumulated() == {("p", "ns"): 3.0}  # 1 h at $2 + 1/4 h at $4


def test_current_per_hour_groups_by_provider_and_namespace() -> None:
    book = ledger()
    book.commit("a", namespace="ml", provider="p", price=1.0)
    book.commit("b", namespace="ml", provider="p", price=2.0)
    book.commit("c", namespace="web", provider="p", price=0.5)
    book.commit("d", namespace="ml", provider="q", price=4.0)
    book.reserve("e", namespace="ml", provider="q", price=8.0)
    assert book.current_per_hour() == {
        ("p", "ml"): 3.0,
        ("p", "web"): 0.5,
        ("q", "ml"): 4.0,
    }
    assert book.total_per_hour() == 15.5


# --- the invariant, for any sequence of operations -------------------------------------------

OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(("reserve", "commit", "release")),
        st.sampled_from(("u1", "u2", "u3", "u4", "u5")),
        st.sampled_from(("ml", "web")),
        st.sampled_from((0.25, 0.5, 1.0, 2.0, 3.0)),
    ),
    max_size=30,
)


@settings(max_examples=100, deadline=None)
@given(OPERATIONS)
def test_the_ledger_never_holds_more_than_a_cap(
    operations: list[tuple[str, str, str, float]],
) -> None:
    caps = BudgetCaps(
        global_per_hour=5.0, per_namespace={"ml": 3.0}, default_namespace_per_hour=2.0
    )
    book = ledger(caps)
    held: dict[str, tuple[str, float]] = {}  # an independent model: uid -> (namespace, price)
    for op, uid, namespace, price in operations:
        if op == "release":
            assert book.release(uid) == (uid in held)
            held.pop(uid, None)
            continue
        others = {u: entry for u, entry in held.items() if u != uid}
        fits = sum(p for _, p in others.values()) + price <= 5.0 and sum(
            p for ns, p in others.values() if ns == namespace
        ) + price <= (3.0 if namespace == "ml" else 2.0)
        assert book.reserve(uid, namespace=namespace, provider="p", price=price) == fits
        if fits:
            held[uid] = (namespace, price)
            if op == "commit":  # as the launcher does: commit what was reserved
                book.commit(uid, namespace=namespace, provider="p", price=price)
        assert book.total_per_hour() == sum(p for _, p in held.values()) <= 5.0
        for ns, cap in (("ml", 3.0), ("web", 2.0)):
            assert sum(p for n, p in held.values() if n == ns) <= cap
            assert book.view(ns).namespace_room == cap - sum(p for n, p in held.values() if n == ns)
