"""The bench driver's wait: done when its event is set, a crashed watch reported as itself."""

from __future__ import annotations

import asyncio

import pytest

from bench.runs import wait_watching


async def _forever() -> None:
    await asyncio.Event().wait()


async def test_the_wait_ends_when_the_event_is_set() -> None:
    event, watch = asyncio.Event(), asyncio.create_task(_forever())
    asyncio.get_running_loop().call_soon(event.set)
    await wait_watching(event, watch, 5.0)
    assert not watch.done()
    watch.cancel()


async def test_a_watch_that_crashes_is_reported_as_its_own_error() -> None:
    async def crash() -> None:
        raise RuntimeError("GET /api/v1/pods: HTTP 403")

    with pytest.raises(RuntimeError, match="HTTP 403"):
        await wait_watching(asyncio.Event(), asyncio.create_task(crash()), 5.0)


async def test_nothing_happening_is_a_timeout() -> None:
    watch = asyncio.create_task(_forever())
    with pytest.raises(TimeoutError):
        await wait_watching(asyncio.Event(), watch, 0.05)
    watch.cancel()
