"""A token bucket, as client-go's ``flowcontrol`` and ``golang.org/x/time/rate`` have it, pure.

``burst`` tokens at most, refilled at ``rate`` per second. ``try_take`` takes a token if one
is there (the Event spam filter: over the rate, the excess is dropped); ``reserve`` always
takes one, in debt when none is left, and says how long the caller waits before using it
(the Event writer: over the rate, Events queue instead of competing with the pods' status
writes, as a kubelet's ``eventRecordQPS`` / ``eventBurst`` do).

Invariants: no I/O; time comes in as an argument (monotonic seconds); a ``rate`` of 0 means
no limit for ``reserve`` (kubelet's ``eventRecordQPS: 0``) and nothing after the burst for
``try_take``; waits handed out by ``reserve`` add up to at most ``rate`` uses per second after
the first ``burst``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class TokenBucket:
    rate: float  # tokens per second
    burst: int  # tokens at most (and at first)
    _tokens: float = field(default=-1.0, repr=False)
    _at: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.rate < 0:
            raise ValueError(f"rate: {self.rate} is negative")
        if self.burst < 1:
            raise ValueError(f"burst: {self.burst} is less than 1")
        self._tokens = float(self.burst)

    def _refill(self, now: float) -> None:
        if self._at is not None and now > self._at:
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        if self._at is None or now > self._at:
            self._at = now

    def try_take(self, now: float) -> bool:
        """Take a token if one is there now."""
        self._refill(now)
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def reserve(self, now: float) -> float:
        """Take a token, in debt if none is left: the seconds to wait before using it (0.0
        when it is there now, or when there is no limit)."""
        if self.rate == 0:
            return 0.0
        self._refill(now)
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate
