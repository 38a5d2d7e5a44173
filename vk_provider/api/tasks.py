"""Ending the tasks of a stream: cancel them all, then wait for each to be done.

The kubelet API's streams (exec, attach, port-forward over SPDY and WebSocket) each run a few
pumps; when the stream ends they all stop here, in one way.

Invariants: every task is cancelled before any is awaited (so no pump waits on a peer that
is still running), and ``cancel_all`` returns only when every task is done; what a task
raised on its way out is its own and is not re-raised (the stream is already ending).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any


async def cancel_all(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel every one of ``tasks`` and wait until each is done."""
    pending = list(tasks)
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
