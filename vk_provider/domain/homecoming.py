"""The way home, dearest first: which rented pods to evict now that the overflow is closed. Pure.

When the flip closes, the pods on the virtual node should go home — the most expensive first,
since every minute of the dearest rented GPU costs the most. ``choose`` picks, in order of
price (highest first, then name), the pods whose GPUs fit on one usable own node right now
(``nodeFit``: free GPUs there, after what the pods already leaving will need at home), and
paces them: every pod a PodDisruptionBudget covers is offered to the Eviction API in that
order (it refuses those beyond the budget, so the dearest goes first and the next only once
its replacement is Ready at home); of the others only ``limit`` leave at once.

Only pods with a controller (a ReplicaSet, a StatefulSet...) move: a bare pod evicted is a
pod lost. Pods that tolerate the closed overflow taint stay (they chose the virtual node).

Invariants: a pod is chosen only when it fits a usable own node, counting every pod chosen
or leaving before it; the order is by price descending, stable by key; never more than
``limit`` unbudgeted pods leaving at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Rented:
    """A pod on the virtual node, as the way home sees it."""

    namespace: str
    name: str
    gpus: int
    price: float  # per hour, from the pod's annotation (0 when unknown)
    budgeted: bool  # a PodDisruptionBudget selects it
    leaving: bool  # deletion under way
    movable: bool  # has a controller and does not tolerate the closed overflow taint

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def choose(rented: Iterable[Rented], home_free: Sequence[int], *, limit: int) -> list[Rented]:
    """The pods to evict now, dearest first (module docstring)."""
    pods = list(rented)
    free = sorted(home_free)
    for pod in pods:
        if pod.leaving:  # its replacement needs room at home
            _take(free, pod.gpus)
    room = max(limit - sum(1 for p in pods if p.leaving and not p.budgeted), 0)
    chosen: list[Rented] = []
    for pod in sorted(
        (p for p in pods if p.movable and not p.leaving), key=lambda p: (-p.price, p.key)
    ):
        if not pod.budgeted and room == 0:
            continue
        if not _take(free, pod.gpus):
            continue
        chosen.append(pod)
        if not pod.budgeted:
            room -= 1
    return chosen


def _take(free: list[int], gpus: int) -> bool:
    """Take ``gpus`` from the fullest node that still fits them (best fit); False if none."""
    for index, amount in enumerate(free):
        if amount >= gpus:
            free[index] = amount - gpus
            free.sort()
            return True
    return False
