"""The circuit breaker: every edge of the transition table in ``domain.breaker``, one row each.

The clock is a fake, advanced by hand; nothing sleeps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from vk_provider.domain.breaker import BreakerState, CircuitBreaker, counts_as_failure
from vk_provider.domain.errors import (
    AuthFailed,
    CapacityUnavailable,
    InvalidSpec,
    NotFound,
    ProviderError,
    RateLimited,
    Transient,
)

THRESHOLD = 3
COOLDOWN = 30.0
WINDOW = 300.0


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_breaker(clock: FakeClock) -> CircuitBreaker:
    return CircuitBreaker(
        threshold=THRESHOLD, cooldown_seconds=COOLDOWN, window_seconds=WINDOW, clock=clock
    )


def unwell() -> Transient:
    return Transient("502 from the provider")


# --- ways to reach each starting state ---------------------------------------------------------


def closed_with(failures: int) -> Callable[[CircuitBreaker, FakeClock], None]:
    def setup(breaker: CircuitBreaker, _clock: FakeClock) -> None:
        for _ in range(failures):
            breaker.record_failure(unwell())

    return setup


def opened(breaker: CircuitBreaker, clock: FakeClock) -> None:
    closed_with(THRESHOLD)(breaker, clock)
    assert breaker.state is BreakerState.OPEN


def half_opened(breaker: CircuitBreaker, clock: FakeClock) -> None:
    opened(breaker, clock)
    clock.advance(COOLDOWN)
    assert breaker.allow_probe()
    assert breaker.state is BreakerState.HALF_OPEN


# --- the events --------------------------------------------------------------------------------


def success(breaker: CircuitBreaker, _clock: FakeClock) -> object:
    breaker.record_success()
    return None


def failure(breaker: CircuitBreaker, _clock: FakeClock) -> object:
    breaker.record_failure(unwell())
    return None


def probe_before_cooldown(breaker: CircuitBreaker, clock: FakeClock) -> object:
    clock.advance(COOLDOWN - 0.5)
    return breaker.allow_probe()


def probe_after_cooldown(breaker: CircuitBreaker, clock: FakeClock) -> object:
    clock.advance(COOLDOWN)
    return breaker.allow_probe()


def probe_again_at_once(breaker: CircuitBreaker, _clock: FakeClock) -> object:
    return breaker.allow_probe()


def probe_lost_then_cooldown(breaker: CircuitBreaker, clock: FakeClock) -> object:
    # The probe never reports back (its caller was cancelled, e.g. by a timeout): after
    # another cool-down a new probe is allowed, or the breaker would stay half-open forever.
    clock.advance(COOLDOWN)
    return breaker.allow_probe()


@dataclass(frozen=True)
class Edge:
    name: str
    start: Callable[[CircuitBreaker, FakeClock], None]
    event: Callable[[CircuitBreaker, FakeClock], object]
    end: BreakerState
    consecutive: int
    returns: object = None


EDGES = [
    Edge("closed --success--> closed", closed_with(0), success, BreakerState.CLOSED, 0),
    Edge(
        "closed --success after failures--> closed, count reset",
        closed_with(THRESHOLD - 1),
        success,
        BreakerState.CLOSED,
        0,
    ),
    Edge("closed --failure--> closed", closed_with(0), failure, BreakerState.CLOSED, 1),
    Edge(
        "closed --failure under threshold--> closed",
        closed_with(THRESHOLD - 2),
        failure,
        BreakerState.CLOSED,
        THRESHOLD - 1,
    ),
    Edge(
        "closed --threshold-th failure--> open",
        closed_with(THRESHOLD - 1),
        failure,
        BreakerState.OPEN,
        THRESHOLD,
    ),
    Edge(
        "open --before cool-down--> open, no probe",
        opened,
        probe_before_cooldown,
        BreakerState.OPEN,
        THRESHOLD,
        returns=False,
    ),
    Edge(
        "open --cool-down elapsed--> half-open, probe",
        opened,
        probe_after_cooldown,
        BreakerState.HALF_OPEN,
        THRESHOLD,
        returns=True,
    ),
    Edge(
        "half-open --second probe at once--> half-open, no probe",
        half_opened,
        probe_again_at_once,
        BreakerState.HALF_OPEN,
        THRESHOLD,
        returns=False,
    ),
    Edge(
        "half-open --probe lost for a cool-down--> half-open, probe again",
        half_opened,
        probe_lost_then_cooldown,
        BreakerState.HALF_OPEN,
        THRESHOLD,
        returns=True,
    ),
    Edge("half-open --success--> closed", half_opened, success, BreakerState.CLOSED, 0),
    Edge(
        "half-open --failure--> open",
        half_opened,
        failure,
        BreakerState.OPEN,
        THRESHOLD + 1,
    ),
]


@pytest.mark.parametrize("edge", EDGES, ids=[e.name for e in EDGES])
def test_transition(edge: Edge) -> None:
    clock = FakeClock()
    breaker = make_breaker(clock)
    edge.start(breaker, clock)
    returned = edge.event(breaker, clock)
    assert returned == edge.returns
    snapshot = breaker.snapshot()
    assert snapshot.state is edge.end
    assert snapshot.consecutive_failures == edge.consecutive
    assert breaker.allows_calls() is (edge.end is BreakerState.CLOSED)
    assert (snapshot.opened_at is None) is (edge.end is BreakerState.CLOSED)


def test_half_open_failure_restarts_the_cooldown() -> None:
    clock = FakeClock()
    breaker = make_breaker(clock)
    half_opened(breaker, clock)
    clock.advance(5.0)
    breaker.record_failure(unwell())
    assert breaker.snapshot().opened_at == clock.now
    clock.advance(COOLDOWN - 1.0)
    assert not breaker.allow_probe()
    assert breaker.state is BreakerState.OPEN
    clock.advance(1.0)
    assert breaker.allow_probe()


def test_closed_breaker_never_offers_a_probe() -> None:
    clock = FakeClock()
    breaker = make_breaker(clock)
    clock.advance(COOLDOWN * 10)
    assert not breaker.allow_probe()
    assert breaker.state is BreakerState.CLOSED


@pytest.mark.parametrize(
    ("error", "is_failure"),
    [
        (CapacityUnavailable("sold out"), False),
        (InvalidSpec("no such image", field="spec.containers[0].image"), False),
        (NotFound("gone"), False),
        (Transient("503"), True),
        (RateLimited("429", retry_after=7), True),
        (AuthFailed("bad key"), True),
        (TimeoutError(), True),
        (RuntimeError("adapter bug"), True),
        (KeyError("id"), True),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_counts_as_failure(error: BaseException, is_failure: bool) -> None:
    assert counts_as_failure(error) is is_failure


@pytest.mark.parametrize(
    "error",
    [CapacityUnavailable("sold out"), InvalidSpec("bad"), NotFound("gone")],
    ids=lambda e: type(e).__name__,
)
def test_normal_refusals_count_as_success(error: ProviderError) -> None:
    clock = FakeClock()
    breaker = make_breaker(clock)
    closed_with(THRESHOLD - 1)(breaker, clock)
    for _ in range(THRESHOLD * 2):
        breaker.record_failure(error)
    snapshot = breaker.snapshot()
    assert snapshot.state is BreakerState.CLOSED
    assert snapshot.consecutive_failures == 0
    assert snapshot.recent_failures == THRESHOLD - 1  # the refusals are not remembered


def test_recent_failures_expire_after_the_window() -> None:
    clock = FakeClock()
    breaker = make_breaker(clock)
    breaker.record_failure(unwell())
    clock.advance(100.0)
    breaker.record_failure(RateLimited("429"))
    breaker.record_success()  # a success resets the streak, not the memory
    assert breaker.recent_failures() == 2
    clock.advance(WINDOW - 100.0)  # the first failure is exactly WINDOW old: still counted
    assert breaker.recent_failures() == 2
    clock.advance(0.001)
    assert breaker.recent_failures() == 1
    clock.advance(100.0)
    assert breaker.recent_failures() == 0
    assert breaker.snapshot().recent_failures == 0


def test_snapshot_keeps_the_last_error() -> None:
    clock = FakeClock()
    breaker = make_breaker(clock)
    breaker.record_failure(AuthFailed("card declined"))
    assert breaker.snapshot().last_error == "AuthFailed: card declined"
    breaker.record_failure(RuntimeError("x" * 1000))
    last = breaker.snapshot().last_error
    assert last is not None
    assert last.startswith("RuntimeError: xxx")
    assert len(last) == 300


def test_failures_while_open_do_not_postpone_the_probe() -> None:
    clock = FakeClock()
    breaker = make_breaker(clock)
    opened(breaker, clock)
    opened_at = clock.now
    # e.g. deletes, which are always attempted, failing every second of the cool-down
    while clock.now < opened_at + COOLDOWN - 1:
        clock.advance(1)
        breaker.record_failure(unwell())
        assert breaker.state is BreakerState.OPEN
    clock.now = opened_at + COOLDOWN
    assert breaker.allow_probe()
    assert breaker.state is BreakerState.HALF_OPEN
