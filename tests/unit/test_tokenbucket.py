"""The token bucket: a burst at once, then the rate; waits that add up to the rate."""

from __future__ import annotations

import pytest

from vk_provider.domain.tokenbucket import TokenBucket


def test_the_burst_is_there_at_once_then_tokens_come_at_the_rate() -> None:
    bucket = TokenBucket(rate=2.0, burst=3)
    assert [bucket.try_take(10.0) for _ in range(4)] == [True, True, True, False]
    assert not bucket.try_take(10.4)  # 0.8 of a token
    assert bucket.try_take(10.5)  # one token after half a second at 2/s
    assert not bucket.try_take(10.5)


def test_an_idle_bucket_refills_to_its_burst_not_beyond() -> None:
    bucket = TokenBucket(rate=100.0, burst=2)
    assert bucket.try_take(0.0) and bucket.try_take(0.0)
    assert [bucket.try_take(1000.0) for _ in range(3)] == [True, True, False]


def test_reservations_past_the_burst_wait_their_turn_at_the_rate() -> None:
    bucket = TokenBucket(rate=50.0, burst=100)
    waits = [bucket.reserve(0.0) for _ in range(110)]
    assert waits[:100] == [0.0] * 100
    assert waits[100:] == pytest.approx([(i + 1) / 50 for i in range(10)])
    # Time passing pays the debt off: 0.1 s later the 111th waits 0.1 s less.
    assert bucket.reserve(0.1) == pytest.approx(11 / 50 - 0.1)


def test_a_rate_of_zero_reserves_without_limit() -> None:
    bucket = TokenBucket(rate=0.0, burst=1)
    assert {bucket.reserve(0.0) for _ in range(1000)} == {0.0}


def test_a_clock_that_goes_back_does_not_mint_tokens() -> None:
    bucket = TokenBucket(rate=1.0, burst=1)
    assert bucket.try_take(5.0)
    assert not bucket.try_take(4.0)
    assert not bucket.try_take(5.5)
    assert bucket.try_take(6.0)


@pytest.mark.parametrize(("rate", "burst", "field"), [(-1.0, 1, "rate"), (1.0, 0, "burst")])
def test_a_bad_rate_or_burst_is_refused_by_name(rate: float, burst: int, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        TokenBucket(rate=rate, burst=burst)
