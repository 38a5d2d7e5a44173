"""The hand-over's plan (``domain.handover.plan``): which own nodes a held gang takes.

Checked against brute force on small clusters (every placement of every member, every set
of pods to displace): the plan is valid, and displaces exactly as little as the best one,
in the order the module states (highest priority, sum of priorities, pods, GPUs).
"""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from vk_provider.domain.handover import Cost, Gang, NodePod, OwnNode, Plan, plan

TRAINING = 1000


def _node(name: str, gpus: int, *pods: tuple[int, int]) -> OwnNode:
    return OwnNode(
        name,
        gpus,
        tuple(NodePod("ml", f"{name}-p{i}", g, prio) for i, (g, prio) in enumerate(pods)),
    )


def test_a_gang_takes_the_nodes_whose_pods_matter_least() -> None:
    nodes = [
        _node("a", 8, (1, 100), (1, 100)),  # two inference replicas
        _node("b", 8, (1, 500)),  # one more important service
        _node("c", 8, (4, 100)),  # one big inference replica
        _node("d", 8),  # empty
    ]
    found = plan(nodes, Gang((8, 8), TRAINING))
    assert found is not None
    assert set(found.nodes) == {"d", "c"}  # nothing, then the one pod of priority 100
    assert [p.key for p in found.displaced] == ["ml/c-p0"]
    assert found.cost == Cost(highest=100, priorities=100, pods=1, gpus=4)


def test_free_gpus_spread_over_nodes_do_not_take_a_whole_member() -> None:
    """8 GPUs free in all, 4 on each node: an 8-GPU member must displace someone."""
    nodes = [_node("a", 8, (4, 100)), _node("b", 8, (4, 100))]
    found = plan(nodes, Gang((8,), TRAINING))
    assert found is not None and len(found.displaced) == 1
    assert found.placements[0].members == (8,)


def test_pods_of_the_gangs_priority_or_higher_are_never_displaced() -> None:
    nodes = [_node("a", 8, (1, TRAINING)), _node("b", 8, (1, 2000))]
    assert plan(nodes, Gang((8,), TRAINING)) is None
    assert plan(nodes, Gang((7, 7), TRAINING)) is not None  # fits beside them


def test_pods_without_gpus_stay_and_an_empty_gang_displaces_nothing() -> None:
    nodes = [_node("a", 8, (0, 1))]
    found = plan(nodes, Gang((8,), TRAINING))
    assert found is not None and found.displaced == ()
    assert plan(nodes, Gang((), TRAINING)) == Plan((), found.cost)


def test_the_description_names_nodes_and_pods() -> None:
    found = plan([_node("a", 8, (2, 100))], Gang((8,), TRAINING))
    assert found is not None
    assert found.describe() == (
        "1 member(s), 8 GPUs on a: displaces 1 pod(s), 2 GPUs, highest priority 100 (ml/a-p0)"
    )


def _brute(nodes: list[OwnNode], gang: Gang) -> Cost | None:
    best: Cost | None = None
    for where in itertools.product(range(len(nodes)), repeat=len(gang.members)):
        need = Counter()
        for member, index in zip(gang.members, where, strict=True):
            need[index] += member
        choices = []
        for index, node in enumerate(nodes):
            movable = [p for p in node.pods if p.gpus > 0 and p.priority < gang.priority]
            free = node.gpus - node.used
            options = [
                s
                for k in range(len(movable) + 1)
                for s in itertools.combinations(movable, k)
                if free + sum(p.gpus for p in s) >= need[index]
            ]
            choices.append(options)
        for combo in itertools.product(*choices):
            cost = Cost.of(p for subset in combo for p in subset)
            if best is None or cost < best:
                best = cost
    return best


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[OwnNode], Gang]:
    nodes = []
    for n in range(draw(st.integers(1, 3))):
        gpus = draw(st.sampled_from([4, 8]))
        pods = []
        left = gpus
        for _ in range(draw(st.integers(0, 3))):
            g = draw(st.integers(0, max(left, 0)))
            left -= g
            pods.append((g, draw(st.sampled_from([10, 100, 500, TRAINING, 2000]))))
        nodes.append(_node(f"n{n}", gpus, *pods))
    members = tuple(draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=3)))
    return nodes, Gang(members, TRAINING)


def _valid(found: Plan, nodes: list[OwnNode], gang: Gang) -> None:
    assert sorted(m for p in found.placements for m in p.members) == sorted(gang.members)
    by_name = {n.name: n for n in nodes}
    assert len(set(found.nodes)) == len(found.nodes)
    for placement in found.placements:
        node = by_name[placement.node]
        moved = set(placement.displaced)
        assert moved <= set(node.pods)
        assert all(p.priority < gang.priority and p.gpus > 0 for p in moved)
        staying = sum(p.gpus for p in node.pods if p not in moved)
        assert staying + sum(placement.members) <= node.gpus


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_the_plan_is_valid_and_displaces_as_little_as_the_best_placement(
    cluster: tuple[list[OwnNode], Gang],
) -> None:
    nodes, gang = cluster
    found = plan(nodes, gang)
    best = _brute(nodes, gang)
    if best is None:
        assert found is None
        return
    assert found is not None
    _valid(found, nodes, gang)
    assert found.cost == best
