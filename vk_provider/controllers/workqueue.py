"""A keyed work queue, as client-go's: one worker per key at a time, duplicates collapsed.

Keys are added by watch events and timers; workers ``get()`` a key, sync it, and call
``done()``. A key added while it is being processed is marked dirty and handed out again
after ``done()``, so the latest state is always synced and never by two workers at once.
``add_after`` schedules a key later (backoff); an earlier ``add`` supersedes it.

Invariants: a key is in at most one of {queued, processing}; ``get`` never returns a key
that is being processed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._queue: deque[K] = deque()
        self._queued: set[K] = set()
        self._processing: set[K] = set()
        self._dirty: set[K] = set()
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    def __len__(self) -> int:
        return len(self._queue)

    def _enqueue(self, key: K) -> None:
        if key in self._processing:
            self._dirty.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._queue.append(key)

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def add(self, key: K) -> None:
        """Queue ``key`` now (cancelling a pending ``add_after``)."""
        if self._closed:
            return
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._enqueue(key)
        if self._queue:
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
            return  # an earlier retry is already scheduled
        if existing is not None:
            existing.cancel()
        self._timers[key] = loop.call_at(due, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> K:
        while not self._queue:
            if self._closed:
                raise QueueClosed
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                # If we were woken and cancelled at once, pass the wake-up on.
                if waiter.done() and not waiter.cancelled() and self._queue:
                    self._wake_one()
                raise
        key = self._queue.popleft()
        self._queued.discard(key)
        self._processing.add(key)
        if self._queue:
            self._wake_one()
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

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
