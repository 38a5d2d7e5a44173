"""Lambda's client-side rate limits: requests about 1 s apart, launches 12 s apart.

Lambda allows about one request a second and five launches a minute per account; the adapter
spaces its calls itself instead of learning the limit from 429s, and a 429 pushes every later
request back (``hold_off``).

Invariants: callers leave in arrival order, each at least ``interval`` after the one before;
time passes only through the injected ``clock`` and ``sleep`` (tests simulate both).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from vk_provider_adapters.transport import Sleep

Clock = Callable[[], float]


class RateLimiter:
    """Spaces calls at least ``interval`` seconds apart, first come first served.

    ``clock`` and ``sleep`` are injectable so tests run on simulated time.
    """

    def __init__(self, interval: float, *, clock: Clock, sleep: Sleep) -> None:
        self._interval = interval
        self._clock = clock
        self._sleep = sleep
        self._next = -math.inf
        # Held while waiting, so callers leave in arrival order, each one interval apart.
        self._lock = asyncio.Lock()

    @property
    def interval(self) -> float:
        return self._interval

    async def acquire(self) -> None:
        async with self._lock:
            wait = self._next - self._clock()
            if wait > 0:
                await self._sleep(wait)
            self._next = max(self._clock(), self._next) + self._interval

    def hold_off(self, seconds: float) -> None:
        """Let nobody through for ``seconds`` from now (the server said slow down)."""
        self._next = max(self._next, self._clock() + seconds)
