"""The churn test's deletion budget (tests/integration/deletions.py): outages excuse only the
time they cover, once, and "API back -> pod gone" counts from the return."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.integration.deletions import Deletion, Outage, after_return, excused, overdue

T0 = datetime(2026, 12, 2, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_only_the_part_of_an_outage_inside_the_span_is_excused() -> None:
    outages = [Outage(at(5), at(15), "API server restart")]
    assert excused(outages, at(0), at(10)) == 5.0
    assert excused(outages, at(10), at(30)) == 5.0
    assert excused(outages, at(20), at(30)) == 0.0


def test_overlapping_outages_are_excused_once() -> None:
    outages = [Outage(at(0), at(10), "agent SIGKILL"), Outage(at(5), at(12), "restart")]
    assert excused(outages, at(0), at(20)) == 12.0


def test_a_deletion_is_charged_its_time_past_grace_outside_outages() -> None:
    deletion = Deletion("p", due=at(0), seen=at(0), gone=at(20))
    found = overdue(deletion, [Outage(at(2), at(14), "restart")], now=at(99))
    assert (found.used, found.excused, found.charged) == (20.0, 12.0, 8.0)


def test_a_pod_not_gone_yet_is_charged_until_now() -> None:
    assert overdue(Deletion("p", due=at(0), seen=at(0)), [], now=at(30)).charged == 30.0


def test_api_back_to_gone_counts_from_the_return_for_deletions_due_before_it() -> None:
    outage = Outage(at(10), at(20), "restart")
    deletions = [
        Deletion("due-during", due=at(12), seen=at(12), gone=at(23)),
        Deletion("due-before-still-there", due=at(8), seen=at(8), gone=at(21)),
        Deletion("due-after-return", due=at(22), seen=at(22), gone=at(30)),
        Deletion("gone-before-outage", due=at(1), seen=at(1), gone=at(5)),
        Deletion("never-gone", due=at(15), seen=at(15)),
    ]
    assert after_return(deletions, outage) == {"due-during": 3.0, "due-before-still-there": 1.0}
