"""The hand-over's steps (domain.handoverstep, domain.handoverworld): claim, evict, wait,
release, hold; the release patches; what the cluster's JSON says."""

from __future__ import annotations

from typing import Any

from vk_provider.domain.handover import NodePod
from vk_provider.domain.handoverstep import (
    HANDOVER,
    Action,
    HeldGang,
    NodeView,
    claimed_taints,
    decide,
    paced,
    pod_set_updates,
    release_pod_patch,
    selects,
)
from vk_provider.domain.handoverworld import (
    claims_in_use,
    displaced_owners,
    gated_gangs,
    kueue_gangs,
    node_views,
    unready_replacements,
    virtual_room,
)
from vk_provider.domain.overflow import (
    Flip,
    OverflowPolicy,
    OverflowState,
    Reading,
    Transition,
    held_open,
    step,
)

GANG = HeldGang("PodGroup ml/train", members=(8, 8), priority=1000)


def infer(name: str, gpus: int = 1, priority: int = 100) -> NodePod:
    return NodePod("ml", name, gpus, priority)


def nodes(claim: str | None = None) -> list[NodeView]:
    return [
        NodeView("a", 8, True, claim, (infer("i1"), infer("i2"))),
        NodeView("b", 8, True, claim, (infer("i3"),)),
        NodeView("c", 8, True, None, ()),
    ]


def test_a_gang_that_fits_without_displacing_is_released_unbound() -> None:
    decision = decide(HeldGang("g", (8,), 1000), nodes(), terminating=frozenset(), virtual_room=0)
    assert decision.action is Action.RELEASE
    assert decision.nodes == ()


def test_the_least_displacing_nodes_are_claimed_when_the_displaced_fit_elsewhere() -> None:
    decision = decide(GANG, nodes(), terminating=frozenset(), virtual_room=1)
    assert decision.action is Action.CLAIM
    assert set(decision.nodes) == {"b", "c"}
    assert [p.key for p in decision.plan.displaced] == ["ml/i3"]  # type: ignore[union-attr]


def test_no_room_elsewhere_holds_and_says_what_is_missing() -> None:
    decision = decide(
        HeldGang("g", (8, 8, 8), 1000), nodes(), terminating=frozenset(), virtual_room=1
    )
    assert decision.action is Action.HOLD
    assert "need 3 GPUs elsewhere" in decision.reason
    assert "virtual node can take 1" in decision.reason


def test_no_placement_at_all_holds() -> None:
    decision = decide(HeldGang("g", (16,), 1000), nodes(), terminating=frozenset(), virtual_room=99)
    assert decision.action is Action.HOLD
    assert "no placement" in decision.reason


def test_claimed_nodes_evict_then_wait_then_release() -> None:
    gang = HeldGang("g", (8, 8), 1000)
    claimed = [
        NodeView("a", 8, True, gang.id, (infer("i1"), infer("i2"))),
        NodeView("b", 8, True, gang.id, ()),
    ]
    evict = decide(gang, claimed, terminating=frozenset(), virtual_room=0)
    assert evict.action is Action.EVICT
    assert {p.key for p in evict.evict} == {"ml/i1", "ml/i2"}
    one_leaving = decide(gang, claimed, terminating=frozenset({"ml/i1"}), virtual_room=0)
    assert [p.key for p in one_leaving.evict] == ["ml/i2"]
    both = decide(gang, claimed, terminating=frozenset({"ml/i1", "ml/i2"}), virtual_room=0)
    assert both.action is Action.WAIT
    gone = [NodeView("a", 8, True, gang.id, ()), NodeView("b", 8, True, gang.id, ())]
    release = decide(gang, gone, terminating=frozenset(), virtual_room=0)
    assert release.action is Action.RELEASE
    assert set(release.nodes) == {"a", "b"}


def test_a_claimed_node_gone_unusable_drops_the_claim() -> None:
    gang = HeldGang("g", (8,), 1000)
    decision = decide(
        gang, [NodeView("a", 8, False, gang.id, ())], terminating=frozenset(), virtual_room=0
    )
    assert decision.action is Action.UNCLAIM


def test_pods_without_a_budget_leave_one_at_a_time() -> None:
    pods = [infer("b1"), infer("n1"), infer("n2"), infer("b2")]
    budgeted = {"ml/b1": True, "ml/b2": True, "ml/n1": False, "ml/n2": False}
    chosen = paced(pods, budgeted=budgeted, unbudgeted_leaving=0, limit=1)
    assert [p.name for p in chosen] == ["b1", "n1", "b2"]
    busy = paced(pods, budgeted=budgeted, unbudgeted_leaving=1, limit=1)
    assert [p.name for p in busy] == ["b1", "b2"]


def test_label_selectors_follow_the_api() -> None:
    labels = {"app": "infer", "tier": "gpu"}
    assert selects({}, labels)
    assert not selects(None, labels)
    assert selects({"matchLabels": {"app": "infer"}}, labels)
    assert not selects({"matchLabels": {"app": "web"}}, labels)
    assert selects(
        {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]}, labels
    )
    assert not selects({"matchExpressions": [{"key": "x", "operator": "Exists"}]}, labels)
    assert selects({"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}, labels)
    assert not selects(
        {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["infer"]}]}, labels
    )


def test_the_release_patch_removes_the_gate_and_binds_to_the_claim() -> None:
    pod: dict[str, Any] = {
        "metadata": {"name": "t0", "namespace": "ml", "resourceVersion": "42"},
        "spec": {
            "schedulingGates": [{"name": HANDOVER}, {"name": "other"}],
            "tolerations": [{"key": "x", "operator": "Exists"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["a"]}
                                ]
                            }
                        ]
                    }
                }
            },
        },
    }
    patch = release_pod_patch(pod, "g-1")
    assert patch["metadata"]["resourceVersion"] == "42"
    assert patch["spec"]["schedulingGates"] == [{"name": "other"}]
    assert {"key": HANDOVER, "operator": "Equal", "value": "g-1", "effect": "NoSchedule"} in patch[
        "spec"
    ]["tolerations"]
    term = patch["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"][0]
    assert {"key": "zone", "operator": "In", "values": ["a"]} in term["matchExpressions"]
    assert {"key": HANDOVER, "operator": "In", "values": ["g-1"]} in term["matchExpressions"]
    unbound = release_pod_patch(pod, None)
    assert set(unbound["spec"]) == {"schedulingGates"}


def test_kueue_pod_set_updates_bind_every_pod_set() -> None:
    workload = {"spec": {"podSets": [{"name": "main", "count": 4}, {"name": "aux", "count": 1}]}}
    updates = pod_set_updates(workload, "g-1")
    assert [u["name"] for u in updates] == ["main", "aux"]
    assert all(u["nodeSelector"] == {HANDOVER: "g-1"} for u in updates)
    assert pod_set_updates(workload, None) == []


def test_the_claim_taint_replaces_only_its_own() -> None:
    taints = [{"key": "a", "effect": "NoSchedule"}, {"key": HANDOVER, "value": "old"}]
    assert claimed_taints(taints, "new") == [
        {"key": "a", "effect": "NoSchedule"},
        {"key": HANDOVER, "value": "new", "effect": "NoSchedule"},
    ]
    assert claimed_taints(taints, None) == [{"key": "a", "effect": "NoSchedule"}]


def _pod(
    name: str, *, node: str = "", gpus: int = 1, gated: bool = False, **spec: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ml", "labels": {}},
        "spec": {
            "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}],
            "priority": spec.pop("priority", 0),
            **spec,
        },
        "status": {"phase": "Running" if node else "Pending"},
    }
    if node:
        body["spec"]["nodeName"] = node
    if gated:
        body["spec"]["schedulingGates"] = [{"name": HANDOVER}]
    return body


def _node(name: str, gpus: int, *, virtual: bool = False, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"type": "virtual-kubelet"} if virtual else {}},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def test_the_world_is_read_from_the_api_objects() -> None:
    pods = [
        _pod("i1", node="a", priority=100),
        _pod("v1", node="vk", gpus=2),
        _pod("t0", gpus=8, gated=True, priority=1000, schedulingGroup={"podGroupName": "train"}),
        _pod("t1", gpus=8, gated=True, priority=1000, schedulingGroup={"podGroupName": "train"}),
    ]
    nodes_ = [_node("a", 8), _node("b", 8, ready=False), _node("vk", 5, virtual=True)]
    views = node_views(nodes_, pods)
    assert [(v.name, v.usable, [p.name for p in v.pods]) for v in views] == [
        ("a", True, ["i1"]),
        ("b", False, []),
    ]
    assert virtual_room(nodes_[2], pods) == 3
    (gang,) = gated_gangs(pods)
    assert gang.gang.key == "PodGroup ml/train"
    assert gang.gang.members == (8, 8) and gang.gang.priority == 1000


def test_kueue_holds_only_pending_checks_with_quota() -> None:
    def workload(name: str, state: str, reserved: bool) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {
                "priority": 1000,
                "podSets": [
                    {
                        "name": "main",
                        "count": 2,
                        "template": {
                            "spec": {
                                "containers": [{"resources": {"requests": {"nvidia.com/gpu": "8"}}}]
                            }
                        },
                    }
                ],
            },
            "status": {
                "admissionChecks": [{"name": "handover", "state": state}],
                "conditions": [
                    {"type": "QuotaReserved", "status": "True" if reserved else "False"}
                ],
            },
        }

    found = kueue_gangs(
        [
            workload("a", "Pending", True),
            workload("b", "Pending", False),
            workload("c", "Ready", True),
        ],
        frozenset({"handover"}),
    )
    assert [(g.key, g.members) for g, _ in found] == [("Workload ml/a", (8, 8))]
    released = workload("c", "Ready", True)
    gang_id = kueue_gangs([workload("c", "Pending", True)], frozenset({"handover"}))[0][0].id
    assert gang_id in claims_in_use([], [released], frozenset({"handover"}), [])
    tolerating = {"key": HANDOVER, "value": gang_id}
    bound = [_pod(f"p{i}", node="a", tolerations=[tolerating]) for i in range(2)]
    assert gang_id not in claims_in_use(bound, [released], frozenset({"handover"}), [])


def test_a_hand_over_opens_the_flip_and_keeps_it_from_closing() -> None:
    closed = Flip(OverflowState.CLOSED)
    opened, transition = held_open(closed, None, reason="the hand-over of X", now=100)
    assert opened.state is OverflowState.OPEN
    assert transition is not None and transition.reason == "Handover"
    closing = Transition(OverflowState.CLOSED, "OwnGPUsFree", "closed")
    kept, none = held_open(Flip(OverflowState.CLOSED), closing, reason="X", now=100)
    assert kept.state is OverflowState.OPEN and none is None
    assert held_open(closed, None, reason="", now=100) == (closed, None)


def test_samples_from_before_the_hold_ended_never_close_the_flip() -> None:
    """Prometheus lags: samples computed while the hand-over held the flip open show the
    own GPUs free (the training not bound yet); they must not start the close timer."""
    policy = OverflowPolicy(open_after=3, close_after=5, close_min_free_gpus=None)
    held, _ = held_open(Flip(OverflowState.OPEN), None, reason="X", now=1000)
    free = Reading(allocatable=32, requested=0, unscheduled=0, sampled_at=995)
    later = Reading(allocatable=32, requested=0, unscheduled=0, sampled_at=999)
    flip, transition = step(held, free, now=1002, policy=policy, needed=1)
    flip, transition = step(flip, later, now=1010, policy=policy, needed=1)
    assert flip.state is OverflowState.OPEN and transition is None
    assert flip.free_since is None


def test_free_claimed_nodes_wait_for_the_replacements_to_be_ready() -> None:
    gang = HeldGang("g", (8,), 1000)
    free = [NodeView("a", 8, True, gang.id, ())]
    waiting = decide(gang, free, terminating=frozenset(), virtual_room=0, unready_replacements=2)
    assert waiting.action is Action.WAIT and "2 replacement(s)" in waiting.reason
    ready = decide(gang, free, terminating=frozenset(), virtual_room=0, unready_replacements=0)
    assert ready.action is Action.RELEASE


def test_the_displaced_controllers_are_read_from_the_claimed_nodes() -> None:
    gang_id = "g-1"
    node = {
        "metadata": {
            "name": "a",
            "annotations": {"vk-provider.io/handover-displaced": '["ml/ReplicaSet/infer-1"]'},
        },
        "spec": {"taints": [{"key": HANDOVER, "value": gang_id, "effect": "NoSchedule"}]},
    }
    other = {"metadata": {"name": "b"}, "spec": {}}
    owners = displaced_owners([node, other], gang_id)
    assert owners == {"ml/ReplicaSet/infer-1"}

    def replica(name: str, *, ready: bool) -> dict[str, Any]:
        return {
            "metadata": {
                "name": name,
                "namespace": "ml",
                "ownerReferences": [{"kind": "ReplicaSet", "name": "infer-1", "controller": True}],
            },
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }

    pods = [replica("r1", ready=True), replica("r2", ready=False), _pod("x")]
    assert unready_replacements(pods, owners) == 1
