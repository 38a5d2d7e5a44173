"""The budget ledger: holds keyed by instance (provider, request id), caps, what a listing
proves, and accumulated spend (fake clock).

Prices are exact binary fractions so sums compare exactly.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.ledgers import instance, listed
from vk_provider.domain.budget import BudgetCaps, BudgetLedger, BudgetView, Hold


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


def hold(book: BudgetLedger, uid: str, price: float, *, ns: str = "ns", p: str = "p") -> bool:
    """Reserve the first attempt of pod ``uid`` on provider ``p``."""
    return book.reserve(
        f"{uid}.0", pod_uid=uid, namespace=ns, provider=p, offer_key=f"{p}/s/r", price=price
    )


def billed(book: BudgetLedger, uid: str, price: float, *, ns: str = "ns", p: str = "p") -> None:
    assert hold(book, uid, price, ns=ns, p=p)
    book.created(p, f"{uid}.0")


def test_reserve_succeeds_only_within_the_global_cap() -> None:
    book = ledger(BudgetCaps(global_per_hour=4.0))
    assert hold(book, "a", 2.5)
    assert not hold(book, "b", 2.0)
    assert hold(book, "b", 1.5)  # exactly at the cap
    assert book.total_per_hour() == 4.0
    assert not hold(book, "c", 0.25, ns="other", p="q")
    assert book.view("other") == BudgetView(global_room=0.0, namespace_room=None)


@pytest.mark.parametrize("price", [float("nan"), float("inf"), -1.0])
def test_a_price_that_is_not_a_finite_non_negative_number_is_never_admitted(price: float) -> None:
    book = ledger(BudgetCaps(global_per_hour=4.0))
    assert not hold(book, "a", price)
    assert book.total_per_hour() == 0.0


def test_namespace_caps_are_separate_and_the_default_applies_to_the_rest() -> None:
    caps = BudgetCaps(per_namespace={"ml": 3.0}, default_namespace_per_hour=1.0)
    book = ledger(caps)
    assert hold(book, "a", 2.0, ns="ml")
    assert not hold(book, "b", 1.5, ns="ml")
    assert hold(book, "c", 1.0, ns="web")
    assert not hold(book, "d", 0.5, ns="web")
    assert hold(book, "e", 1.0, ns="batch")  # its own default room
    assert book.view("ml").namespace_room == 1.0
    assert book.view("web").namespace_room == 0.0
    assert book.view("new").namespace_room == 1.0


def test_the_same_request_on_the_same_provider_replaces_its_hold_on_another_it_does_not() -> None:
    book = ledger(BudgetCaps(global_per_hour=3.0))
    assert hold(book, "a", 2.0)
    assert book.view("ns", excluding=("p", "a.0")).global_room == 3.0
    assert hold(book, "a", 3.0)  # a retry of the same create: one instance at most
    assert book.total_per_hour() == 3.0
    assert not hold(book, "a", 0.25, p="q")  # elsewhere it may make a second one
    assert not hold(book, "b", 0.25)


def test_an_answered_refusal_frees_the_room_and_says_whether_it_held_any() -> None:
    book = ledger(BudgetCaps(global_per_hour=2.0))
    assert hold(book, "a", 2.0)
    assert not hold(book, "b", 1.0)
    assert book.refused("p", "a.0") is True
    assert book.refused("p", "a.0") is False
    assert book.total_per_hour() == 0.0
    assert hold(book, "b", 1.0)


def test_a_lost_answer_holds_until_a_later_listing_says_whether_it_exists() -> None:
    book = ledger(BudgetCaps(global_per_hour=2.0))
    early = book.listing()  # a listing already under way when the answer was lost
    assert hold(book, "a", 2.0)
    book.unanswered("p", "a.0")
    assert book.holds()[Hold.UNCERTAIN] == 2.0
    assert book.listed("p", [], early) == []  # began before: proves nothing
    assert not hold(book, "b", 1.0)
    freed = book.listed("p", [], book.listing())  # began after, and does not show it
    assert [f.offer_key for f in freed] == ["p/s/r"]
    assert book.total_per_hour() == 0.0


def test_a_lost_answer_whose_instance_is_listed_is_billed() -> None:
    book = ledger(BudgetCaps(global_per_hour=2.0))
    assert hold(book, "a", 2.0)
    book.unanswered("p", "a.0")
    listed(book, "p", [instance("p", "a", 2.0)])
    assert book.current_per_hour() == {("p", "ns"): 2.0}
    assert book.total_per_hour() == 2.0


def test_a_create_still_on_its_way_is_never_dropped_by_a_listing() -> None:
    book = ledger(BudgetCaps(global_per_hour=2.0))
    assert hold(book, "a", 2.0)
    assert book.listed("p", [], book.listing()) == []
    assert book.total_per_hour() == 2.0


def test_a_deleted_instance_counts_until_its_provider_lists_it_gone() -> None:
    book = ledger(BudgetCaps(global_per_hour=2.0))
    billed(book, "a", 2.0)
    terminating = instance("p", "a", 2.0)
    listed(book, "p", [terminating])  # the provider accepted the delete but keeps it
    assert book.total_per_hour() == 2.0 and not hold(book, "b", 1.0)
    listed(book, "p", [])
    assert book.total_per_hour() == 0.0 and hold(book, "b", 1.0)


def test_reservations_count_against_caps_but_not_as_current_spend() -> None:
    book = ledger(BudgetCaps(global_per_hour=5.0))
    assert hold(book, "a", 2.0)
    assert book.current_per_hour() == {}
    assert book.view("ns").global_room == 3.0
    book.created("p", "a.0")
    assert book.current_per_hour() == {("p", "ns"): 2.0}
    assert book.view("ns").global_room == 3.0  # answered: not counted twice


def test_an_instance_nobody_reserved_counts_as_listed_even_beyond_the_cap() -> None:
    """A billed instance is a fact (a previous run's); the cap only stops new creates, and
    ``within_caps`` says an adoption would not fit."""
    book = ledger(BudgetCaps(global_per_hour=1.0))
    listed(book, "p", [instance("p", "a", 3.0)], {"a": "ns"})
    assert book.total_per_hour() == 3.0
    assert book.view("ns").global_room == -2.0
    assert not book.within_caps("ns")
    assert not hold(book, "b", 0.0)


def test_a_pods_estimate_counts_only_until_its_provider_is_listed() -> None:
    book = ledger(BudgetCaps(global_per_hour=2.0))
    book.estimate("a", namespace="ns", provider="p", offer_key="p/s/r", price=2.0)
    assert not hold(book, "b", 1.0, p="q")
    listed(book, "p", [])
    assert book.total_per_hour() == 0.0
    book.estimate("c", namespace="ns", provider="p", offer_key="p/s/r", price=2.0)
    assert book.total_per_hour() == 0.0  # p is listed: its listings are the truth


# --- spend -----------------------------------------------------------------------------------


def test_accumulated_spend_is_price_times_hours() -> None:
    clock = FakeClock()
    book = ledger(clock=clock)
    billed(book, "a", 2.0, ns="ml")
    billed(book, "b", 1.0, ns="ml", p="q")
    hold(book, "c", 8.0, ns="ml")  # never answered: costs nothing yet
    clock.advance(1800.0)
    assert book.accumulated() == {("p", "ml"): 1.0, ("q", "ml"): 0.5}
    listed(book, "p", [])  # a and c are gone
    clock.advance(3600.0)
    assert book.accumulated() == {("p", "ml"): 1.0, ("q", "ml"): 1.5}
    assert book.current_per_hour() == {("q", "ml"): 1.0}


def test_a_price_change_settles_the_time_at_the_old_price() -> None:
    clock = FakeClock()
    book = ledger(clock=clock)
    billed(book, "a", 2.0)
    clock.advance(3600.0)
    listed(book, "p", [instance("p", "a", 4.0)])
    clock.advance(900.0)
    assert book.accumulated() == {("p", "ns"): 3.0}  # 1 h at $2 + 1/4 h at $4


def test_current_per_hour_groups_by_provider_and_namespace() -> None:
    book = ledger()
    billed(book, "a", 1.0, ns="ml")
    billed(book, "b", 2.0, ns="ml")
    billed(book, "c", 0.5, ns="web")
    billed(book, "d", 4.0, ns="ml", p="q")
    hold(book, "e", 8.0, ns="ml", p="q")
    assert book.current_per_hour() == {
        ("p", "ml"): 3.0,
        ("p", "web"): 0.5,
        ("q", "ml"): 4.0,
    }
    assert book.total_per_hour() == 15.5


# --- the invariant, for any sequence of operations -------------------------------------------

UIDS = ("u1", "u2", "u3", "u4", "u5")
OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(("create", "refuse", "lost-made", "lost-unmade", "list", "delete")),
        st.sampled_from(UIDS),
        st.sampled_from(("ml", "web")),
        st.sampled_from((0.25, 0.5, 1.0, 2.0, 3.0)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(OPERATIONS)
def test_the_ledger_never_lets_what_may_be_billed_pass_a_cap(
    operations: list[tuple[str, str, str, float]],
) -> None:
    """An independent model of one provider: which instances exist (billed), and which
    creates are unanswered. Whatever the order of creates, refusals, lost answers,
    deletions and listings, what may be billed never passes a cap, and after a listing the
    ledger holds exactly what the provider bills."""
    caps = BudgetCaps(
        global_per_hour=5.0, per_namespace={"ml": 3.0}, default_namespace_per_hour=2.0
    )
    book = ledger(caps)
    exists: dict[str, tuple[str, float]] = {}  # uid -> (namespace, price) at the provider
    maybe: dict[str, tuple[str, float]] = {}  # lost answers: exists or not, we do not know

    def cap(ns: str) -> float:
        return 3.0 if ns == "ml" else 2.0

    for op, uid, namespace, price in operations:
        if op == "create" and uid not in exists and uid not in maybe:
            if hold(book, uid, price, ns=namespace):
                exists[uid] = (namespace, price)
                book.created("p", f"{uid}.0")
        elif op == "refuse" and uid not in exists and uid not in maybe:
            if hold(book, uid, price, ns=namespace):
                book.refused("p", f"{uid}.0")
        elif op.startswith("lost") and uid not in exists and uid not in maybe:
            if hold(book, uid, price, ns=namespace):
                book.unanswered("p", f"{uid}.0")
                # Whether the provider made it, only the provider knows.
                (exists if op == "lost-made" else maybe)[uid] = (namespace, price)
        elif op == "delete":
            exists.pop(uid, None)  # the provider let it go; the ledger learns by listing
        elif op == "list":
            maybe.clear()  # a listing after the lost answers settles them
            listed(book, "p", [instance("p", u, pr) for u, (_ns, pr) in exists.items()])
            assert book.total_per_hour() == sum(pr for _ns, pr in exists.values())
        may_bill = {**maybe, **exists}
        assert sum(pr for _ns, pr in exists.values()) <= 5.0
        assert book.total_per_hour() >= sum(pr for _ns, pr in exists.values())
        assert book.total_per_hour() <= 5.0
        for ns in ("ml", "web"):
            assert sum(pr for n, pr in may_bill.values() if n == ns) <= cap(ns)
