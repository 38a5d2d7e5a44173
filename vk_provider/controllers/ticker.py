"""A level-triggered loop: run one tick every ``interval`` seconds, forever, on the leader.

Invariant: a failed tick never ends the loop — an API error is logged as a warning, anything
else with its traceback — and the next tick runs after the same interval.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from vk_provider.kube.client import ApiError


async def every(
    interval: Callable[[], float],
    tick: Callable[[], Awaitable[None]],
    *,
    log: logging.Logger,
    what: str,
) -> None:
    while True:
        try:
            await tick()
        except ApiError as exc:
            log.warning("%s: %s; retrying next tick", what, exc)
        except Exception:
            log.exception("%s: evaluation failed; retrying next tick", what)
        await asyncio.sleep(interval())
