"""The Event correlator (client-go's rules): spam filter, aggregation, deduplication."""

from __future__ import annotations

from vk_provider.domain.eventcorrelator import COMBINED, Action, EventCorrelator


def record(c: EventCorrelator, message: str, now: float, *, uid: str = "u", reason: str = "R"):
    verdict = c.correlate(uid, "Normal", reason, message, now)
    if verdict.action is not Action.DROP:
        c.created(verdict, verdict.name or f"ev-{message}", now)
    return verdict


def test_a_repeat_bumps_the_count_of_the_first_event() -> None:
    c = EventCorrelator()
    first = record(c, "m", 0.0)
    second = record(c, "m", 1.0)
    assert first.action is Action.CREATE
    assert (second.action, second.name, second.count) == (Action.BUMP, "ev-m", 2)
    assert record(c, "m", 2.0).count == 3


def test_a_repeat_after_the_window_is_a_new_event() -> None:
    c = EventCorrelator()
    record(c, "m", 0.0)
    assert record(c, "m", 601.0).action is Action.CREATE


def test_the_spam_filter_drops_past_the_burst_and_refills_slowly() -> None:
    c = EventCorrelator(burst=3, qps=1 / 300)
    verdicts = [record(c, f"m{i % 2}", float(i)) for i in range(5)]
    assert [v.action for v in verdicts][:3] != [Action.DROP] * 3
    assert [v.action for v in verdicts][3:] == [Action.DROP, Action.DROP]
    assert record(c, "m0", 4.0 + 300.0).action is not Action.DROP  # one token back
    # Another object has its own bucket.
    assert record(c, "m0", 5.0, uid="other").action is Action.CREATE


def test_similar_events_are_combined_from_the_tenth_message_on() -> None:
    c = EventCorrelator()
    verdicts = [record(c, f"message {i}", float(i)) for i in range(12)]
    assert all(v.action is Action.CREATE and not v.message.startswith(COMBINED)
               for v in verdicts[:9])  # fmt: skip
    assert verdicts[9].action is Action.CREATE and verdicts[9].message == COMBINED + "message 9"
    assert verdicts[10].action is Action.BUMP and verdicts[10].count == 2
    assert verdicts[11].message == COMBINED + "message 11"


def test_a_failed_write_is_created_afresh_and_forget_drops_an_object() -> None:
    c = EventCorrelator()
    first = record(c, "m", 0.0)
    c.failed(first)
    assert record(c, "m", 1.0).action is Action.CREATE
    c.forget("u")
    assert record(c, "m", 2.0).action is Action.CREATE


def test_memory_is_bounded() -> None:
    c = EventCorrelator(max_keys=100)
    for i in range(1000):
        record(c, "m", float(i), uid=f"pod-{i}")
    assert len(c._seen) <= 100 and len(c._buckets) <= 100 and len(c._similar) <= 100
