"""The hand-over's next step for one held training gang, from what the cluster shows. Pure.

A held gang (``HeldGang``: a Kueue Workload whose ``vk-provider.io/handover`` check is
Pending, or pods gated by the ``vk-provider.io/handover`` scheduling gate) is released only
once the own nodes it will take are free, the inference it displaces having moved first.
The state of a hand-over lives in the cluster, not in the agent: the nodes it takes carry
the **claim** — a NoSchedule taint and a label ``vk-provider.io/handover=<gang id>`` — so
new pods stay off them and an agent that restarts resumes from what it reads. ``decide``
maps (gang, own nodes, pods terminating, room elsewhere) to one action:

- ``CLAIM`` the nodes of the least displacing plan (``domain.handover.plan``), when the
  displaced pods' GPUs fit elsewhere (the virtual node's room plus free own GPUs outside
  the plan); else ``HOLD`` saying what is missing;
- ``EVICT`` the displaced pods still running on claimed nodes (the caller paces them with
  ``paced`` and the Eviction API, which honours their PodDisruptionBudgets);
- ``WAIT`` while evicted pods terminate;
- ``RELEASE`` when the members fit the claimed nodes with every pod still there counted and
  every pod of the displaced pods' controllers is Ready again (their replacements serve);
  a gang that displaces nothing is released at once, unclaimed;
- ``UNCLAIM`` when the claimed nodes can no longer take the gang (a node gone or cordoned):
  the claim is dropped and the next step plans afresh.

Invariants: a plan displaces only lower-priority GPU pods (``domain.handover``); nothing is
evicted before its nodes are claimed, so a restart never loses which pods were meant; a
gang is released only when it fits without preempting anyone (or by policy ``force``);
gang ids are valid label values and equal for equal gang keys.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vk_provider.domain.handover import Gang, NodePod, OwnNode, Plan, plan

HANDOVER = "vk-provider.io/handover"  # gate, taint and label key; Kueue controllerName
JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class HeldGang:
    """A training workload held for its hand-over."""

    key: str  # "PodGroup ns/name", "Workload ns/name"
    members: tuple[int, ...]  # each member's GPUs
    priority: int

    @property
    def id(self) -> str:
        """The gang's claim value: a label value (63 characters at most), stable per key."""
        return "g-" + hashlib.sha256(self.key.encode()).hexdigest()[:16]

    def as_gang(self) -> Gang:
        return Gang(self.members, self.priority)


@dataclass(frozen=True, slots=True)
class NodeView:
    """An own node as the hand-over sees it."""

    name: str
    gpus: int  # allocatable
    usable: bool  # schedulable and Ready
    claim: str | None  # the gang id of its hand-over taint, if any
    pods: tuple[NodePod, ...] = ()

    def own(self, *, without: frozenset[str] = frozenset()) -> OwnNode:
        return OwnNode(self.name, self.gpus, tuple(p for p in self.pods if p.key not in without))

    @property
    def free(self) -> int:
        return max(self.gpus - sum(p.gpus for p in self.pods), 0)


@dataclass(frozen=True, slots=True)
class HandoverView:
    """One held gang as ``GET /v1/overflow`` shows it."""

    gang: str
    gpus: int
    members: int
    step: str
    reason: str
    nodes: tuple[str, ...]
    displaced: tuple[str, ...]
    for_seconds: float


class Action(enum.Enum):
    HOLD = "hold"
    CLAIM = "claim"
    EVICT = "evict"
    WAIT = "wait"
    RELEASE = "release"
    UNCLAIM = "unclaim"


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    reason: str
    plan: Plan | None = None
    nodes: tuple[str, ...] = ()  # claimed (CLAIM), bound to (RELEASE); () releases unbound
    evict: tuple[NodePod, ...] = ()


def decide(
    gang: HeldGang,
    nodes: Sequence[NodeView],
    *,
    terminating: frozenset[str],
    virtual_room: int,
    unready_replacements: int = 0,
) -> Decision:
    """The next step of ``gang``'s hand-over (module docstring). ``unready_replacements``:
    pods of the displaced pods' controllers not Ready yet (the replacements still starting)."""
    claimed = [n for n in nodes if n.claim == gang.id]
    if claimed:
        return _claimed(gang, claimed, terminating, unready_replacements)
    open_nodes = [n for n in nodes if n.usable and n.claim is None]
    found = plan([n.own() for n in open_nodes], gang.as_gang())
    if found is None:
        wanted = sum(gang.members)
        largest = max(gang.members, default=0)
        return Decision(
            Action.HOLD,
            f"no placement on the own nodes: {len(gang.members)} member(s), {wanted} GPUs "
            f"(largest {largest} on one node) do not fit {len(open_nodes)} usable node(s) "
            "even displacing every lower-priority pod",
        )
    if not found.displaced:
        return Decision(Action.RELEASE, f"room without a hand-over: {found.describe()}", found)
    chosen = set(found.nodes)
    elsewhere = sum(n.free for n in open_nodes if n.name not in chosen)
    room = virtual_room + elsewhere
    if room < found.cost.gpus:
        return Decision(
            Action.HOLD,
            f"the displaced pods need {found.cost.gpus} GPUs elsewhere; the virtual node can "
            f"take {virtual_room} and the other own nodes {elsewhere}: {found.describe()}",
            found,
        )
    return Decision(Action.CLAIM, f"hand-over planned: {found.describe()}", found, found.nodes)


def _claimed(
    gang: HeldGang, claimed: Sequence[NodeView], terminating: frozenset[str], unready: int
) -> Decision:
    gang_ = gang.as_gang()
    if any(not n.usable for n in claimed):
        lost = ", ".join(n.name for n in claimed if not n.usable)
        return Decision(Action.UNCLAIM, f"claimed node(s) {lost} no longer usable: planning again")
    now = plan([n.own() for n in claimed], gang_)
    if now is not None and not now.displaced:
        if unready:
            return Decision(
                Action.WAIT,
                f"the claimed nodes are free; waiting for {unready} replacement(s) of the "
                "displaced pods to be Ready",
                now,
            )
        return Decision(
            Action.RELEASE, f"the claimed nodes are free: {now.describe()}", now, now.nodes
        )
    after = plan([n.own(without=terminating) for n in claimed], gang_)
    if after is None:
        return Decision(
            Action.UNCLAIM, "the claimed nodes can no longer take the gang: planning again"
        )
    moving = tuple(p for p in after.displaced if p.key not in terminating)
    if moving:
        return Decision(
            Action.EVICT,
            f"moving {len(moving)} pod(s) off the claimed nodes: {after.describe()}",
            after,
            evict=moving,
        )
    leaving = sum(1 for n in claimed for p in n.pods if p.key in terminating)
    return Decision(
        Action.WAIT, f"waiting for {leaving} evicted pod(s) to leave the claimed nodes", after
    )


def paced(
    pods: Iterable[NodePod],
    *,
    budgeted: Mapping[str, bool],
    unbudgeted_leaving: int,
    limit: int,
) -> tuple[NodePod, ...]:
    """The pods to evict now: every one a PodDisruptionBudget covers (the Eviction API
    refuses those beyond its budget), and of the others only as many as keep ``limit``
    leaving at once (``unbudgeted_leaving`` already are)."""
    chosen: list[NodePod] = []
    room = max(limit - unbudgeted_leaving, 0)
    for pod in pods:
        if budgeted.get(pod.key, False):
            chosen.append(pod)
        elif room > 0:
            chosen.append(pod)
            room -= 1
    return tuple(chosen)


# --- label selectors (PodDisruptionBudget v1 semantics) ----------------------------------


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a LabelSelector selects ``labels``; None selects nothing, {} everything."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key = expression.get("key", "")
        operator = expression.get("operator")
        values = set(expression.get("values") or [])
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


# --- the claim on a node -------------------------------------------------------------------


DISPLACED = "vk-provider.io/handover-displaced"  # node annotation: the displaced's controllers


def owner_of(pod: Mapping[str, Any]) -> str | None:
    """``namespace/Kind/name`` of the pod's controller, or None for a bare pod."""
    meta = pod.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            return f"{meta.get('namespace')}/{ref.get('kind')}/{ref.get('name')}"
    return None


def claim_taint(gang_id: str) -> JSON:
    return {"key": HANDOVER, "value": gang_id, "effect": "NoSchedule"}


def claim_of(node: Mapping[str, Any]) -> str | None:
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("key") == HANDOVER:
            return str(taint.get("value") or "")
    return None


def claimed_taints(taints: Sequence[Mapping[str, Any]], gang_id: str | None) -> list[JSON]:
    """The node's taints with the hand-over claim for ``gang_id`` (None: without one)."""
    others = [dict(t) for t in taints if t.get("key") != HANDOVER]
    return others if gang_id is None else [*others, claim_taint(gang_id)]


def toleration(gang_id: str) -> JSON:
    return {"key": HANDOVER, "operator": "Equal", "value": gang_id, "effect": "NoSchedule"}


# --- releasing -----------------------------------------------------------------------------


def release_pod_patch(pod: Mapping[str, Any], gang_id: str | None) -> JSON:
    """A merge patch that releases a gated pod: its gate removed, and (bound to claimed
    nodes) the claim's toleration added and a node-affinity term requiring the claim's label
    ANDed into every term it has. The patch carries the pod's resourceVersion."""
    spec = pod.get("spec") or {}
    gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != HANDOVER]
    patch_spec: JSON = {"schedulingGates": gates}
    if gang_id is not None:
        tolerations = [t for t in spec.get("tolerations") or [] if t.get("key") != HANDOVER]
        patch_spec["tolerations"] = [*tolerations, toleration(gang_id)]
        patch_spec["affinity"] = _bound_affinity(spec.get("affinity") or {}, gang_id)
    metadata = pod.get("metadata") or {}
    return {"metadata": {"resourceVersion": metadata.get("resourceVersion")}, "spec": patch_spec}


def _bound_affinity(affinity: Mapping[str, Any], gang_id: str) -> JSON:
    requirement = {"key": HANDOVER, "operator": "In", "values": [gang_id]}
    node_affinity = dict(affinity.get("nodeAffinity") or {})
    required = dict(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [dict(t) for t in required.get("nodeSelectorTerms") or []] or [{}]
    bound = []
    for term in terms:
        expressions = [e for e in term.get("matchExpressions") or [] if e.get("key") != HANDOVER]
        bound.append({**term, "matchExpressions": [*expressions, requirement]})
    required["nodeSelectorTerms"] = bound
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    return {**affinity, "nodeAffinity": node_affinity}


def pod_set_updates(workload: Mapping[str, Any], gang_id: str | None) -> list[JSON]:
    """Kueue ``podSetUpdates`` binding every pod set to the claimed nodes (none unbound)."""
    if gang_id is None:
        return []
    return [
        {
            "name": pod_set.get("name", "main"),
            "nodeSelector": {HANDOVER: gang_id},
            "tolerations": [toleration(gang_id)],
        }
        for pod_set in (workload.get("spec") or {}).get("podSets") or []
    ]


# --- what a gang asks for ------------------------------------------------------------------

GPU = "nvidia.com/gpu"


def pod_gpus(spec: Mapping[str, Any]) -> int:
    """GPUs a pod spec requests (the largest init container or the containers' sum)."""
    total = sum(_container_gpus(c) for c in spec.get("containers") or [])
    init = max((_container_gpus(c) for c in spec.get("initContainers") or []), default=0)
    return max(total, init)


def _container_gpus(container: Mapping[str, Any]) -> int:
    resources = container.get("resources") or {}
    value = (resources.get("requests") or {}).get(GPU) or (resources.get("limits") or {}).get(GPU)
    try:
        return int(str(value)) if value is not None else 0
    except ValueError:
        return 0


def gang_of_workload(workload: Mapping[str, Any]) -> HeldGang:
    metadata = workload.get("metadata") or {}
    spec = workload.get("spec") or {}
    members: list[int] = []
    for pod_set in spec.get("podSets") or []:
        gpus = pod_gpus(((pod_set.get("template") or {}).get("spec")) or {})
        members.extend([gpus] * int(pod_set.get("count") or 0))
    return HeldGang(
        key=f"Workload {metadata.get('namespace')}/{metadata.get('name')}",
        members=tuple(m for m in members if m > 0),
        priority=int(spec.get("priority") or 0),
    )


def gang_of_pods(key: str, pods: Sequence[Mapping[str, Any]]) -> HeldGang:
    members = tuple(g for g in (pod_gpus(p.get("spec") or {}) for p in pods) if g > 0)
    priority = max((int((p.get("spec") or {}).get("priority") or 0) for p in pods), default=0)
    return HeldGang(key=key, members=members, priority=priority)
