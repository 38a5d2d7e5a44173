"""The faults a ``LocalProvider`` injects into its own calls, as configured and overridden.

What a call of the provider suffers: latency and random failures of every call
(``api_latency_seconds``, ``call_failure_rate``), failed creates (``create_failure_rate``,
and ``fail_creates``: the next N creates fail with ``create_error``), and creates that work
but whose answer is lost (a third of ``call_failure_rate``). The configuration gives the
defaults; ``<state_dir>/faults.json`` (``faults.py``, written by another process) overrides
them and is read on every call, so a test or the demo changes them while the agent runs.

Invariants: the random draws come from one injectable ``random.Random`` (tests decide which
calls fail); ``fail_creates`` is decremented under the file lock of ``faults.py``, so two
processes never both take the last one.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from vk_provider_adapters.local.config import LocalFaults
from vk_provider_adapters.local.faults import (
    CALL_ERRORS,
    CREATE_ERRORS,
    FAULTS_FILE,
    Faults,
    faults_locked,
    read_fault_overrides,
)
from vk_provider_adapters.local.records import write_json


class FaultInjector:
    """The faults of one local provider: ``configured`` overridden by its state dir's file."""

    def __init__(
        self, provider: str, configured: LocalFaults, state_dir: Path, rng: random.Random
    ) -> None:
        self._provider = provider
        self._configured = configured
        self._state_dir = state_dir
        self._rng = rng

    def current(self) -> Faults:
        configured = self._configured
        overrides = read_fault_overrides(self._state_dir / FAULTS_FILE)
        return Faults(
            create_failure_rate=float(
                overrides.get("create_failure_rate", configured.create_failure_rate)
            ),
            api_latency_seconds=float(
                overrides.get("api_latency_seconds", configured.api_latency_seconds)
            ),
            fail_creates=int(overrides.get("fail_creates", 0)),
            create_error=str(overrides.get("create_error", configured.create_error)),
            call_failure_rate=float(overrides.get("call_failure_rate", 0.0)),
        )

    async def before_call(self, faults: Faults) -> None:
        """The latency of a call, then its random failure (one of ``CALL_ERRORS``)."""
        if faults.api_latency_seconds > 0:
            await asyncio.sleep(faults.api_latency_seconds)
        if faults.call_failure_rate > 0 and self._rng.random() < faults.call_failure_rate:
            raise self._rng.choice(CALL_ERRORS)(self._provider)

    def answer_lost(self) -> bool:
        """Whether a create that worked loses its answer on the way back."""
        rate = self.current().call_failure_rate
        return rate > 0 and self._rng.random() < rate / 3

    def fail_create(self) -> None:
        """Raise the configured create error if this create is one that fails."""
        faults = self.current()
        error = CREATE_ERRORS.get(faults.create_error, CREATE_ERRORS["capacity"])
        with faults_locked(self._state_dir) as path:
            overrides = read_fault_overrides(path)
            remaining = int(overrides.get("fail_creates", 0))
            if remaining > 0:
                write_json(path, {**overrides, "fail_creates": remaining - 1})
                raise error("injected create failure (fail_creates)", self._provider)
        rate = faults.create_failure_rate
        if rate > 0 and self._rng.random() < rate:
            raise error(f"injected create failure (create_failure_rate {rate})", self._provider)
