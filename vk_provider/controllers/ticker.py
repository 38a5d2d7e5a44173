"""A level-triggered loop: run one tick every ``interval`` seconds, forever, on the leader.

Invariant: a failed tick never ends the loop — an API error is logged as a warning, anything
else with its traceback — and the next tick runs after the same interval.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from vk_provider.kube.client import ApiError


async def once(tick: Callable[[], Awaitable[None]], *, log: logging.Logger, what: str) -> None:
    """One tick; a failure is logged (an API error as a warning), never raised."""
    try:
        await tick()
    except ApiError as exc:
        log.warning("%s: %s; retrying next tick", what, exc)
    except Exception:
        log.exception("%s: evaluation failed; retrying next tick", what)


async def every(
    interval: Callable[[], float],
    tick: Callable[[], Awaitable[None]],
    *,
    log: logging.Logger,
    what: str,
) -> None:
    while True:
        await once(tick, log=log, what=what)
        await asyncio.sleep(interval())
