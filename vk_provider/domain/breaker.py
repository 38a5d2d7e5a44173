"""A circuit breaker per provider: stop calling a provider that keeps failing, probe it later.

States and transitions (each edge is tested in ``tests/unit/test_breaker.py``):

| from | event | to |
|---|---|---|
| closed | success | closed (failure count reset) |
| closed | failure, fewer than ``threshold`` in a row | closed |
| closed | ``threshold``-th failure in a row | open |
| open | ``cooldown`` elapsed (checked by ``allow_probe``) | half-open |
| half-open | probe success | closed |
| half-open | probe failure | open (cool-down starts again) |
| half-open | probe unanswered for ``cooldown`` (``allow_probe``) | half-open, new probe |

Only failures that say the provider itself is unwell count (``Transient``, ``RateLimited``,
``AuthFailed``, timeouts); ``CapacityUnavailable``, ``InvalidSpec`` and ``NotFound`` are normal
answers from a healthy provider and count as success.

Invariants: pure state plus an injected clock; no I/O. Recent failures are remembered for a
window so placement can penalise a provider that failed lately even while closed. A probe whose
caller was cancelled (e.g. by a timeout around ``offers``) reports nothing; the breaker then
allows a new probe after another cool-down instead of staying half-open for good.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from vk_provider.domain.errors import AuthFailed, ProviderError, RateLimited, Transient


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


def counts_as_failure(error: BaseException) -> bool:
    """Whether ``error`` says the provider is unwell (as opposed to a normal refusal)."""
    if isinstance(error, Transient | RateLimited | AuthFailed | TimeoutError):
        return True
    # Anything that is not one of our classified answers is an adapter fault: unwell.
    return not isinstance(error, ProviderError)


@dataclass(frozen=True, slots=True)
class BreakerSnapshot:
    state: BreakerState
    consecutive_failures: int
    recent_failures: int
    opened_at: float | None
    last_error: str | None


class CircuitBreaker:
    def __init__(
        self,
        *,
        threshold: int = 5,
        cooldown_seconds: float = 30.0,
        window_seconds: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._threshold = threshold
        self._cooldown = cooldown_seconds
        self._window = window_seconds
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._consecutive = 0
        self._opened_at: float | None = None
        self._probe_at: float | None = None  # when the outstanding half-open probe began
        self._failures: deque[float] = deque()
        self._last_error: str | None = None

    @property
    def state(self) -> BreakerState:
        return self._state

    def allows_calls(self) -> bool:
        """Closed: yes. Open or half-open: only the probe may call (see ``allow_probe``)."""
        return self._state is BreakerState.CLOSED

    def allow_probe(self) -> bool:
        """True once the cool-down is over; moves open → half-open (one probe at a time)."""
        now = self._clock()
        if self._state is BreakerState.HALF_OPEN:
            # One probe at a time; but a probe that never reported back (its caller was
            # cancelled) must not block probing forever: after a cool-down it counts as lost.
            if self._probe_at is not None and now - self._probe_at >= self._cooldown:
                self._probe_at = now
                return True
            return False
        opened = self._opened_at
        due = opened is not None and now - opened >= self._cooldown
        if self._state is BreakerState.OPEN and due:
            self._state = BreakerState.HALF_OPEN
            self._probe_at = now
            return True
        return False

    def record_success(self) -> None:
        self._consecutive = 0
        self._state = BreakerState.CLOSED
        self._opened_at = None
        self._probe_at = None

    def record_failure(self, error: BaseException) -> None:
        if not counts_as_failure(error):
            self.record_success()
            return
        now = self._clock()
        self._failures.append(now)
        self._last_error = f"{type(error).__name__}: {error}"[:300]
        self._consecutive += 1
        if self._state is BreakerState.HALF_OPEN or (
            self._state is BreakerState.CLOSED and self._consecutive >= self._threshold
        ):
            # Only a transition (re)starts the cool-down: failures while already open (e.g.
            # deletes, which are always attempted) must not postpone the probe forever.
            self._state = BreakerState.OPEN
            self._opened_at = now
            self._probe_at = None

    def recent_failures(self) -> int:
        cutoff = self._clock() - self._window
        while self._failures and self._failures[0] < cutoff:
            self._failures.popleft()
        return len(self._failures)

    def snapshot(self) -> BreakerSnapshot:
        return BreakerSnapshot(
            state=self._state,
            consecutive_failures=self._consecutive,
            recent_failures=self.recent_failures(),
            opened_at=self._opened_at,
            last_error=self._last_error,
        )
