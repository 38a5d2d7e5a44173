"""A keyed work queue with per-key back-off, as client-go's rate-limited work queue.

Keys are added by watch events and timers; workers ``get()`` a key, sync it, and call
``done()``. A key added while it is being processed is marked dirty and handed out again
after ``done()``, so the latest state is always synced and never by two workers at once.

Back-off is the queue's, per key, and the only back-off of the controllers:

- ``add_after(key, delay)`` schedules a key later (a poll); an earlier ``add`` supersedes it.
- ``add_rate_limited(key)`` schedules it after the key's next exponential back-off (``base``
  doubled per failure since the last ``forget``, at most ``cap``; at least ``at_least``, e.g.
  a server's ``Retry-After``) and *holds* the key until then: ``held_for(key)`` says how long,
  so a sync that runs early (a watch event, our own status write) can decline to retry the
  launch before its time. Deletion and status work never look at the hold.
- ``forget(key)`` ends the hold and resets the key's failure count (a success, or room that
  appeared for pods waiting on capacity).

Keys the ``urgent`` predicate picks (the pod controller's: pods being deleted, whose grace
period runs) are handed out before all others, in the order they were queued; a key that
becomes urgent while it waits moves ahead. Without it, a burst of routine work (a re-list
after an API-server outage queues every pod) delays a deletion past its grace period.

What happens in the queue is reported to a ``QueueObserver`` (the metrics implement it, as
client-go's workqueue metrics: depth, adds, time waiting, time processing, retries); the
queue itself knows nothing of Prometheus.

Invariants: a key is in at most one of {queued, processing}; ``get`` never returns a key that
is being processed; an urgent key waits behind urgent keys only; time is the event loop's
(``loop.time()``), so tests run the queue on simulated time (looptime) with exact delays.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

K = TypeVar("K", bound=Hashable)


class QueueObserver(Protocol):
    """What a work queue reports, as client-go's ``MetricsProvider`` of a named queue."""

    def added(self) -> None:
        """A key was added: it was neither waiting nor already marked to run again."""
        ...

    def depth(self, keys: int) -> None:
        """Keys now waiting for a worker."""
        ...

    def waited(self, seconds: float) -> None:
        """A worker took a key that had waited ``seconds`` since it was added."""
        ...

    def worked(self, seconds: float) -> None:
        """A worker finished a key after ``seconds``."""
        ...

    def retried(self) -> None:
        """A key was requeued after its back-off (``add_rate_limited``)."""
        ...


class _Unobserved:
    def added(self) -> None:
        return None

    def depth(self, keys: int) -> None:
        return None

    def waited(self, seconds: float) -> None:
        return None

    def worked(self, seconds: float) -> None:
        return None

    def retried(self) -> None:
        return None


UNOBSERVED: QueueObserver = _Unobserved()


def _now() -> float:
    """The event loop's time (simulated in tests); the monotonic clock outside a loop."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


@dataclass(frozen=True, slots=True)
class Backoff:
    """Per-key exponential back-off: ``base * 2**(failures - 1)``, at most ``cap``."""

    base: float = 5.0
    cap: float = 300.0

    def delay(self, failures: int) -> float:
        return float(min(self.base * (2 ** max(failures - 1, 0)), self.cap))


class WorkQueue(Generic[K]):
    def __init__(
        self,
        backoff: Backoff | None = None,
        *,
        observer: QueueObserver = UNOBSERVED,
        urgent: Callable[[K], bool] = lambda _: False,
    ) -> None:
        self._backoff = backoff or Backoff()
        self._observer = observer
        self._urgent = urgent
        self._added_at: dict[K, float] = {}  # waiting or marked dirty: since when
        self._started_at: dict[K, float] = {}  # being processed: since when
        # Two lanes, urgent first. A key moved ahead stays behind in the routine lane too;
        # ``get`` skips such a stale entry (the key is no longer in ``_queued``, or is
        # ``_ahead``).
        self._queue: deque[K] = deque()
        self._first: deque[K] = deque()
        self._ahead: set[K] = set()
        self._queued: set[K] = set()
        self._processing: set[K] = set()
        self._dirty: set[K] = set()
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._failures: dict[K, int] = {}
        self._held: dict[K, float] = {}  # key -> loop time until which launches wait
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    def __len__(self) -> int:
        return len(self._queued)

    @property
    def depth(self) -> int:
        """Keys waiting for a worker (not counting scheduled ones)."""
        return len(self._queued)

    @property
    def scheduled(self) -> int:
        """Keys waiting for a timer (polls and back-offs)."""
        return len(self._timers)

    def _mark_added(self, key: K) -> None:
        # Counted once per wait: a key added again while it waits (or while it is marked to
        # run again after processing) is the same add, as in client-go.
        if key not in self._added_at:
            self._added_at[key] = _now()
            self._observer.added()

    def _enqueue(self, key: K) -> None:
        if key in self._processing:
            self._dirty.add(key)
            self._mark_added(key)
            return
        if key in self._queued:
            if key not in self._ahead and self._urgent(key):
                self._ahead.add(key)
                self._first.append(key)
            return
        self._mark_added(key)
        self._queued.add(key)
        if self._urgent(key):
            self._ahead.add(key)
            self._first.append(key)
        else:
            self._queue.append(key)
        self._observer.depth(len(self._queued))

    def _next(self) -> K | None:
        """The key to hand out now: the oldest urgent one, else the oldest routine one."""
        while self._first:
            key = self._first.popleft()
            if key in self._ahead:
                self._ahead.discard(key)
                return key
        while self._queue:
            key = self._queue.popleft()
            if key in self._queued and key not in self._ahead:
                return key
        return None

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def add(self, key: K) -> None:
        """Queue ``key`` now (cancelling a pending ``add_after``; a hold stays)."""
        if self._closed:
            return
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._enqueue(key)
        if self._queued:
            self._wake_one()

    def add_after(self, key: K, delay: float) -> None:
        """Queue ``key`` after ``delay`` seconds unless something queues it sooner."""
        if self._closed:
            return
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        existing = self._timers.get(key)
        due = loop.time() + delay
        if existing is not None and existing.when() <= due:
            return  # an earlier wake-up is already scheduled
        if existing is not None:
            existing.cancel()
        self._timers[key] = loop.call_at(due, self._fire, key)

    def add_rate_limited(self, key: K, *, at_least: float = 0.0, cap: float | None = None) -> float:
        """Queue ``key`` after its next back-off and hold it until then; returns the delay."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = self._backoff.delay(failures)
        if cap is not None:
            delay = min(delay, cap)
        delay = max(delay, at_least)
        if not self._closed:
            self._held[key] = asyncio.get_running_loop().time() + delay
            self._observer.retried()
        self.add_after(key, delay)
        return delay

    def held_for(self, key: K) -> float:
        """Seconds the key's back-off still holds it (0 when it is not held)."""
        until = self._held.get(key)
        if until is None:
            return 0.0
        remaining = until - asyncio.get_running_loop().time()
        if remaining <= 0:
            del self._held[key]
            return 0.0
        return remaining

    def failures(self, key: K) -> int:
        """Rate-limited requeues of ``key`` since it was last forgotten."""
        return self._failures.get(key, 0)

    def forget(self, key: K) -> None:
        """Reset the key's back-off and end its hold."""
        self._failures.pop(key, None)
        self._held.pop(key, None)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> K:
        while not self._queued:
            if self._closed:
                raise QueueClosed
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                # If we were woken and cancelled at once, pass the wake-up on.
                if waiter.done() and not waiter.cancelled() and self._queued:
                    self._wake_one()
                raise
        key = self._next()
        assert key is not None  # every queued key has an entry in a lane
        self._queued.discard(key)
        self._processing.add(key)
        now = _now()
        self._observer.depth(len(self._queued))
        self._observer.waited(now - self._added_at.pop(key, now))
        self._started_at[key] = now
        if self._queued:
            self._wake_one()
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        started = self._started_at.pop(key, None)
        if started is not None:
            self._observer.worked(_now() - started)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def drop(self, key: K) -> None:
        """Forget everything about ``key`` (its object is gone): timers, hold, failures."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self.forget(key)

    def close(self) -> None:
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)


class QueueClosed(Exception):
    """The queue is shutting down; workers return."""
