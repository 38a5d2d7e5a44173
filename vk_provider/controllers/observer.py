"""What the controllers report as they work: the seam between them and the metrics.

The controllers call a ``ControllerObserver``; ``vk_provider.api.metrics.Metrics`` implements
it with Prometheus counters. Controllers therefore never import the faces above them, and
tests pass ``NO_OBSERVER`` or a recorder of their own.
"""

from __future__ import annotations

from typing import Protocol


class ControllerObserver(Protocol):
    def placement(self, outcome: str) -> None:
        """One placement attempt ended: launched, no_capacity, budget_exceeded, invalid, retry."""
        ...

    def launch_failed(self, provider: str, error: str) -> None:
        """One candidate refused a create (``error`` is the error class name)."""
        ...

    def reconciled(self, seconds: float) -> None:
        """One reconciliation cycle took ``seconds``."""
        ...

    def instance_terminated(self, provider: str, reason: str) -> None:
        """Reconciliation terminated an instance (orphan, duplicate, ended pod)."""
        ...

    def pod_started(self, provider: str, seconds: float) -> None:
        """A pod was first reported Running, ``seconds`` after it was bound to the node."""
        ...


class _Ignore:
    def placement(self, outcome: str) -> None:
        return None

    def launch_failed(self, provider: str, error: str) -> None:
        return None

    def reconciled(self, seconds: float) -> None:
        return None

    def instance_terminated(self, provider: str, reason: str) -> None:
        return None

    def pod_started(self, provider: str, seconds: float) -> None:
        return None


NO_OBSERVER: ControllerObserver = _Ignore()
