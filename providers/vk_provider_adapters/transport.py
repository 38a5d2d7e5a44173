"""What every HTTP/SDK adapter's transport shares: the retry policy and Retry-After parsing
(redaction is ``vk_provider.domain.redact``, shared with the agent).

The adapters (``runpod``, ``kubernetes``, ``lambda_cloud``, ``modal``) each classify their own
failures and decide which calls are safe to repeat; what they have in common lives here, so a
fix to how retries wait or how secrets are scrubbed is made once. Provider-specific choices are
values, not copies: there is one ``RetryPolicy`` class, and an adapter whose limits differ
passes its own values (``kubernetes.adapter.DEFAULT_RETRY``, ``modal.adapter.DEFAULT_RETRY``).
The HTTP adapters reach it through ``vk_provider_adapters.http.JsonApi``.

- ``RetryPolicy`` holds the limits (attempts, backoff, jitter, the longest ``Retry-After``
  worth waiting for, the sleep). Its defaults are RunPod's.
- ``RetryPolicy.run`` retries ``domain.errors`` by default (``Transient``, and
  ``RateLimited`` whose ``Retry-After`` is short); an adapter that retries fewer calls (a
  create that may have reached the provider) passes its own ``retry`` predicate.

Invariants:

- A call is tried ``attempts`` times at the most and at least once (``attempts`` counts the
  first try; anything below 1 means 1). The last error is raised as it is — never a tenacity
  ``RetryError`` — so only the adapter's own errors leave the loop.
- Backoff doubles from ``backoff_seconds``, never exceeds ``max_backoff_seconds`` and adds at
  most ``jitter_seconds``. A server's ``Retry-After`` replaces the backoff, but is waited for
  only when it is at most ``max_retry_after_seconds``: a longer one makes ``should_retry`` (and
  ``waits_for``) refuse, so the ``RateLimited`` goes to the caller, whose queue schedules the
  pause, instead of a coroutine holding a worker. No wait for a ``Retry-After`` is longer
  than that cap.
- ``parse_retry_after`` never raises and never returns a negative or non-finite number.
- Nothing here does I/O of its own: time passes only through the policy's ``sleep``, and the
  only log line is the one ``log_retries`` writes (the error's message, already redacted by
  the adapter that built it).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from vk_provider.sdk import RateLimited, Transient

T = TypeVar("T")

Sleep = Callable[[float], Awaitable[None]]


# --- Retry-After --------------------------------------------------------------------------


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """``Retry-After`` as seconds from ``now`` (default: the current time): delta-seconds or an
    HTTP date; None if absent, unreadable or not finite. A date in the past is 0."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


# --- retries ------------------------------------------------------------------------------


async def _sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


def failure_of(state: RetryCallState) -> BaseException | None:
    """The error the attempt behind ``state`` failed with (None: it has no outcome)."""
    return state.outcome.exception() if state.outcome is not None else None


def rate_limit_retry_after(error: BaseException | None) -> float | None:
    """The ``Retry-After`` a ``RateLimited`` carries; None for any other error."""
    return error.retry_after if isinstance(error, RateLimited) else None


def log_retries(logger: logging.Logger, provider: str) -> Callable[[RetryCallState], None]:
    """A tenacity ``before_sleep`` that logs, at INFO, which attempt failed and why."""

    def before_sleep(state: RetryCallState) -> None:
        logger.info(
            "provider %s: retrying after attempt %d failed: %s",
            provider,
            state.attempt_number,
            failure_of(state),
        )

    return before_sleep


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a transport retries ``Transient`` and ``RateLimited`` failures.

    ``attempts`` counts the first try. Backoff doubles from ``backoff_seconds`` up to
    ``max_backoff_seconds``; a 429 waits its ``Retry-After`` instead, but only when that is at
    most ``max_retry_after_seconds`` — a longer wait is the caller's to schedule, so the
    ``RateLimited`` is raised at once. ``sleep`` is injectable so tests need not wait.
    """

    attempts: int = 4
    backoff_seconds: float = 0.5
    max_backoff_seconds: float = 4.0
    max_retry_after_seconds: float = 5.0
    jitter_seconds: float = 0.0
    sleep: Sleep = field(default=_sleep, repr=False)

    def backoff(self, attempt: int) -> float:
        """The backoff after failed attempt number ``attempt`` (1-based), ignoring any
        ``Retry-After``; up to ``jitter_seconds`` are added at random."""
        base = min(self.max_backoff_seconds, self.backoff_seconds * 2.0 ** (attempt - 1))
        if self.jitter_seconds > 0:
            base += random.uniform(0, self.jitter_seconds)  # noqa: S311 - spreading retries
        return base

    def waits_for(self, retry_after: float | None) -> bool:
        """Whether a server's ``Retry-After`` (None: it gave none) is short enough to wait
        for here rather than hand to the caller."""
        return retry_after is None or retry_after <= self.max_retry_after_seconds

    def pause(self, retry_after: float | None, attempt: int) -> float:
        """The pause after failed attempt number ``attempt``: the server's ``Retry-After``
        (capped) when it gave one, else the backoff."""
        if retry_after is not None:
            return min(retry_after, self.max_retry_after_seconds)
        return self.backoff(attempt)

    def should_retry(self, error: BaseException) -> bool:
        if isinstance(error, RateLimited):
            return self.waits_for(error.retry_after)
        return isinstance(error, Transient)

    def wait_seconds(self, error: BaseException | None, attempt: int) -> float:
        """The pause after failed attempt number ``attempt`` (1-based)."""
        return self.pause(rate_limit_retry_after(error), attempt)

    async def run(
        self,
        call: Callable[[], Awaitable[T]],
        *,
        retry: Callable[[BaseException], bool] | None = None,
        before_sleep: Callable[[RetryCallState], None] | None = None,
    ) -> T:
        """``call()`` under this policy. ``retry`` decides which errors are tried again
        (default ``should_retry``); a ``RateLimited``'s ``retry_after`` sets the pause."""

        def wait(state: RetryCallState) -> float:
            return self.wait_seconds(failure_of(state), state.attempt_number)

        loop = AsyncRetrying(
            stop=stop_after_attempt(max(1, self.attempts)),
            wait=wait,
            retry=retry_if_exception(self.should_retry if retry is None else retry),
            before_sleep=before_sleep,
            reraise=True,
            sleep=self.sleep,
        )
        async for attempt in loop:
            with attempt:
                return await call()
        raise AssertionError("tenacity stopped without a result or an error")  # pragma: no cover
