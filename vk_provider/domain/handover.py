"""The hand-over's plan: which own nodes a held training gang takes, and whom that displaces.
Pure.

A gang (``Gang``: its members' GPU requests and its priority) must bind all at once on the
own nodes. Pods already there that have a lower priority may be displaced (moved to the
virtual node before the gang is released); pods of the gang's priority or higher stay.
``plan`` chooses how many members go to each own node and which pods leave, displacing as
little as it can, in this order (the order kube-scheduler's preemption uses to pick a node):

1. the highest priority among the displaced pods, lowest first;
2. the sum of their priorities;
3. how many pods are displaced;
4. how many GPUs they free (fewer: less rented capacity needed).

Fragmentation is part of it: a member fits a node only whole (an 8-GPU member needs 8 GPUs on
one node), so free GPUs spread over several nodes do not make room.

The search is exact: for each candidate highest priority (ascending) a dynamic programme over
the nodes finds the plan of least (sum, count, GPUs); the first priority with any plan wins.
Per node, the cheapest set of pods to displace for each amount of GPUs is found by trying
every subset of the node's displaceable GPU pods (at most ``EXACT_PODS_PER_NODE`` of them;
beyond that, lowest priority and largest first, which is no longer guaranteed least).

Invariants: a plan never displaces a pod whose priority is the gang's or higher, nor a pod
without GPUs; on every chosen node, the GPUs of the pods that stay plus the members placed
there fit the node's allocatable; every member is placed; ``plan`` is None exactly when no
placement exists.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

EXACT_PODS_PER_NODE = 14


@dataclass(frozen=True, slots=True)
class NodePod:
    """A pod bound to an own node: who, how many GPUs, at what priority."""

    namespace: str
    name: str
    gpus: int
    priority: int

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class OwnNode:
    """An own node the gang may use (the caller leaves out cordoned and NotReady nodes)."""

    name: str
    gpus: int  # allocatable
    pods: tuple[NodePod, ...] = ()

    @property
    def used(self) -> int:
        return sum(p.gpus for p in self.pods)


@dataclass(frozen=True, slots=True)
class Gang:
    members: tuple[int, ...]  # each member's GPUs
    priority: int


@dataclass(frozen=True, slots=True, order=True)
class Cost:
    """What a plan displaces, compared in the module docstring's order."""

    highest: int
    priorities: int
    pods: int
    gpus: int

    @staticmethod
    def of(pods: Iterable[NodePod]) -> Cost:
        chosen = list(pods)
        if not chosen:
            return NO_COST
        return Cost(
            highest=max(p.priority for p in chosen),
            priorities=sum(p.priority for p in chosen),
            pods=len(chosen),
            gpus=sum(p.gpus for p in chosen),
        )


# Below every real priority (Kubernetes priorities are int32).
NO_COST = Cost(highest=-(2**31) - 1, priorities=0, pods=0, gpus=0)


@dataclass(frozen=True, slots=True)
class Placement:
    node: str
    members: tuple[int, ...]  # GPUs of each member placed on the node
    displaced: tuple[NodePod, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    placements: tuple[Placement, ...]
    cost: Cost

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(p.node for p in self.placements)

    @property
    def displaced(self) -> tuple[NodePod, ...]:
        return tuple(pod for p in self.placements for pod in p.displaced)

    def describe(self) -> str:
        members = sum(len(p.members) for p in self.placements)
        gpus = sum(sum(p.members) for p in self.placements)
        moved = self.displaced
        if not moved:
            return f"{members} member(s), {gpus} GPUs on {', '.join(self.nodes)}: displaces nothing"
        return (
            f"{members} member(s), {gpus} GPUs on {', '.join(self.nodes)}: displaces "
            f"{len(moved)} pod(s), {self.cost.gpus} GPUs, highest priority {self.cost.highest} "
            f"({', '.join(p.key for p in moved)})"
        )


def plan(nodes: Sequence[OwnNode], gang: Gang) -> Plan | None:
    """The least displacing placement of every member of ``gang`` on ``nodes``, or None."""
    if not gang.members:
        return Plan((), NO_COST)
    sizes = sorted(Counter(gang.members).items(), reverse=True)  # ((gpus, count), ...)
    options = [_options(node, gang.priority) for node in nodes]
    ceilings = sorted({o.cost.highest for per_node in options for o in per_node})
    for ceiling in ceilings:
        tables = [_table(per_node, ceiling) for per_node in options]
        found = _search(nodes, tables, sizes)
        if found is not None:
            return found
    return None


@dataclass(frozen=True, slots=True)
class _Option:
    """Pods displaced together on one node, and the GPUs free there afterwards."""

    pods: tuple[NodePod, ...]
    free: int
    cost: Cost

    @property
    def additive(self) -> tuple[int, int, int]:
        return (self.cost.priorities, self.cost.pods, self.cost.gpus)


def _options(node: OwnNode, priority: int) -> list[_Option]:
    """The ways to make room on ``node``: every subset of its displaceable GPU pods (lowest
    priority and largest first beyond ``EXACT_PODS_PER_NODE`` of them)."""
    movable = sorted(
        (p for p in node.pods if p.gpus > 0 and p.priority < priority),
        key=lambda p: (p.priority, -p.gpus, p.key),
    )
    free_now = max(node.gpus - node.used, 0)
    subsets: Iterable[tuple[NodePod, ...]]
    if len(movable) <= EXACT_PODS_PER_NODE:
        subsets = (
            subset
            for size in range(len(movable) + 1)
            for subset in itertools.combinations(movable, size)
        )
    else:
        subsets = (tuple(movable[:n]) for n in range(len(movable) + 1))
    return [
        _Option(subset, free_now + sum(p.gpus for p in subset), Cost.of(subset))
        for subset in subsets
    ]


# GPUs needed on a node -> the least additive option freeing at least that many.
_Table = dict[int, _Option]


def _table(options: Sequence[_Option], ceiling: int) -> _Table:
    """For every amount of GPUs, the option of least (priorities, pods, GPUs) that frees at
    least that many and displaces nothing above ``ceiling``."""
    table: _Table = {}
    allowed = [o for o in options if o.cost.highest <= ceiling]
    for option in allowed:
        for amount in range(option.free + 1):
            best = table.get(amount)
            if best is None or option.additive < best.additive:
                table[amount] = option
    return table


def _search(
    nodes: Sequence[OwnNode], tables: Sequence[_Table], sizes: Sequence[tuple[int, int]]
) -> Plan | None:
    """The plan of least (priorities, pods, GPUs) over ``tables`` (one per node)."""
    # members of each size still to place -> (cost so far, placements so far)
    start = tuple(count for _, count in sizes)
    states: dict[tuple[int, ...], tuple[tuple[int, int, int], tuple[Placement, ...]]] = {
        start: ((0, 0, 0), ())
    }
    for node, table in zip(nodes, tables, strict=True):
        if not table:
            continue
        room = max(table)
        following = dict(states)
        for remaining, (total, placed) in states.items():
            for take in _takes(remaining, sizes, room):
                need = sum(k * gpus for k, (gpus, _) in zip(take, sizes, strict=True))
                option = table.get(need)
                if need == 0 or option is None:
                    continue
                after = tuple(r - k for r, k in zip(remaining, take, strict=True))
                summed = (
                    total[0] + option.cost.priorities,
                    total[1] + option.cost.pods,
                    total[2] + option.cost.gpus,
                )
                members = tuple(
                    gpus for k, (gpus, _) in zip(take, sizes, strict=True) for _ in range(k)
                )
                best = following.get(after)
                if best is None or summed < best[0]:
                    placement = Placement(node.name, members, option.pods)
                    following[after] = (summed, (*placed, placement))
        states = following
    done = states.get(tuple(0 for _ in sizes))
    if done is None:
        return None
    placements = done[1]
    return Plan(placements, Cost.of(p for placement in placements for p in placement.displaced))


def _takes(
    remaining: tuple[int, ...], sizes: Sequence[tuple[int, int]], room: int
) -> Iterable[tuple[int, ...]]:
    """Every count of members per size that fits ``room`` GPUs on one node."""
    ranges = [
        range(min(left, room // gpus) + 1) for left, (gpus, _) in zip(remaining, sizes, strict=True)
    ]
    for take in itertools.product(*ranges):
        if sum(k * gpus for k, (gpus, _) in zip(take, sizes, strict=True)) <= room:
            yield take
