"""The agent's supervisor: a dying root task ends everything with a clear error."""

from __future__ import annotations

import asyncio

import pytest

from vk_provider.runtime.supervisor import AgentFailed, supervise


async def test_a_dying_root_task_is_named_and_the_others_are_cancelled() -> None:
    cancelled: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.append(name)

    async def broken() -> None:
        await asyncio.sleep(0)
        raise ConnectionError("api server gone")

    with pytest.raises(AgentFailed, match=r"root task 'pod-watch' died: ConnectionError"):
        await supervise({"lease": lambda: forever("lease"), "pod-watch": broken}, asyncio.Event())
    assert cancelled == ["lease"]


async def test_a_root_task_that_returns_is_a_failure_too() -> None:
    async def done() -> None:
        return None

    with pytest.raises(AgentFailed, match="ended unexpectedly"):
        await supervise({"workers": done}, asyncio.Event())


async def test_stop_cancels_everything_and_returns() -> None:
    stop = asyncio.Event()
    closed: list[bool] = []
    running = asyncio.Event()

    async def loop() -> None:
        running.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(
        supervise({"loop": loop}, stop, before_cancel=lambda: closed.append(True))
    )
    await running.wait()
    stop.set()
    await asyncio.wait_for(task, timeout=5)
    assert closed == [True]
    leftover = [t for t in asyncio.all_tasks() if t.get_name() in ("loop", "stop-signal")]
    assert leftover == []
