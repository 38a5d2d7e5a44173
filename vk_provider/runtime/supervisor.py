"""One supervisor for every long-lived task of the agent.

``supervise`` runs named root tasks until a stop is asked for; if one of them ends first —
returns or raises — it says which and why (``AgentFailed``) after cancelling and awaiting all
the others, so nothing is left running behind the caller's back. A half-working node agent
is worse than a restarted one: the process then exits non-zero and its Deployment restarts it.

Invariants: every task is cancelled and awaited (bounded by ``shutdown_seconds``) before
``supervise`` returns or raises; ``before_cancel`` runs first (e.g. to close the work queue so
workers return on their own).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

log = logging.getLogger(__name__)

SHUTDOWN_SECONDS = 10.0

Root = Callable[[], Coroutine[Any, Any, None]]


class AgentFailed(RuntimeError):
    """A root task of the agent died; the message says which and why."""


async def supervise(
    roots: Mapping[str, Root],
    stop: asyncio.Event,
    *,
    before_cancel: Callable[[], None] = lambda: None,
    shutdown_seconds: float = SHUTDOWN_SECONDS,
) -> None:
    """Run named root tasks until ``stop`` is set; if one ends first, raise ``AgentFailed``."""
    tasks = {asyncio.create_task(start(), name=name): name for name, start in roots.items()}
    stopper = asyncio.create_task(stop.wait(), name="stop-signal")
    try:
        waited: list[asyncio.Task[Any]] = [*tasks, stopper]
        done, _ = await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
        if stopper not in done:
            task = next(t for t in tasks if t in done)
            exc = task.exception()
            raise AgentFailed(
                f"root task {tasks[task]!r} "
                + (f"died: {type(exc).__name__}: {exc}" if exc else "ended unexpectedly")
            ) from exc
    finally:
        stopper.cancel()
        before_cancel()
        for task in tasks:
            task.cancel()
        _, pending = await asyncio.wait([*tasks, stopper], timeout=shutdown_seconds)
        for stuck in pending:
            log.error("task %s did not stop within %.0fs", stuck.get_name(), shutdown_seconds)
