"""Small helpers shared by tests: polling with a deadline instead of fixed sleeps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


async def wait_for(
    predicate: Callable[[], Awaitable[T]],
    *,
    timeout: float = 30.0,
    interval: float = 0.2,
    what: str,
) -> T:
    """Await ``predicate`` until it returns something truthy, and return that; fail on timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = await predicate()
        if result:
            return result
        if loop.time() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


def wait_until(
    predicate: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.05, what: str
) -> T:
    """``wait_for`` for synchronous code (a subprocess, a file): poll until truthy."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
