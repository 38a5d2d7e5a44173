"""Probe results turned into verdicts, as kubelet's prober does. Pure: no I/O, no clock.

A probe runs every ``period_seconds``; its verdict flips to success after
``success_threshold`` consecutive successes and to failure after ``failure_threshold``
consecutive failures, and otherwise stays. A readiness verdict starts as failure (a container
is not ready until its probe says so), a liveness verdict as success, a startup verdict as
unknown (not started).

Invariants: a verdict changes only on a threshold; counting restarts from zero on every change
of result, so one flapping answer never flips a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

from vk_provider.domain.containers import Probe


@dataclass(slots=True)
class ProbeCounter:
    """The running verdict of one probe of one container run."""

    success_threshold: int
    failure_threshold: int
    verdict: bool | None
    successes: int = 0
    failures: int = 0

    @classmethod
    def readiness(cls, probe: Probe) -> ProbeCounter:
        return cls(probe.success_threshold, probe.failure_threshold, verdict=False)

    @classmethod
    def liveness(cls, probe: Probe) -> ProbeCounter:
        return cls(1, probe.failure_threshold, verdict=True)

    @classmethod
    def startup(cls, probe: Probe) -> ProbeCounter:
        return cls(1, probe.failure_threshold, verdict=None)

    def observe(self, ok: bool) -> bool:
        """Count one result; True when the verdict changed."""
        if ok:
            self.successes += 1
            self.failures = 0
            flip = self.successes >= self.success_threshold and self.verdict is not True
            if flip:
                self.verdict = True
        else:
            self.failures += 1
            self.successes = 0
            flip = self.failures >= self.failure_threshold and self.verdict is not False
            if flip:
                self.verdict = False
        return flip
