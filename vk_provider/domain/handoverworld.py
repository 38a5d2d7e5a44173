"""What the hand-over reads from the cluster, as ``domain.handoverstep`` values. Pure.

From the API's JSON (nodes, pods, PodDisruptionBudgets, Kueue Workloads): the own nodes
(``node_views``: every node but virtual ones), the gangs held by the scheduling gate
(``gated_gangs``) or by our Kueue AdmissionCheck (``kueue_gangs``), the room on the virtual
node, which pods a PodDisruptionBudget covers, and which claims are still needed after their
gang was released (``claims_in_use``).

Invariants: finished pods (Succeeded, Failed) hold nothing; a terminating pod still holds its
GPUs on its node (the scheduler counts it until it is gone); a gated gang is complete only
when its PodGroup's ``minCount`` pods exist; only Workloads with quota reserved and our check
Pending are held.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vk_provider.domain.handover import NodePod
from vk_provider.domain.handoverstep import (
    DISPLACED,
    HANDOVER,
    HeldGang,
    NodeView,
    claim_of,
    gang_of_pods,
    gang_of_workload,
    owner_of,
    pod_gpus,
    selects,
)

JSON = dict[str, Any]
VIRTUAL_TYPE = "virtual-kubelet"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("spec") or {}


def key(obj: Mapping[str, Any]) -> str:
    return f"{_meta(obj).get('namespace')}/{_meta(obj).get('name')}"


def finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def terminating(pod: Mapping[str, Any]) -> bool:
    return bool(_meta(pod).get("deletionTimestamp"))


def is_virtual(node: Mapping[str, Any]) -> bool:
    return (_meta(node).get("labels") or {}).get("type") == VIRTUAL_TYPE


def _ready(node: Mapping[str, Any]) -> bool:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def _allocatable_gpus(node: Mapping[str, Any]) -> int:
    value = ((node.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu", 0)
    try:
        return int(str(value))
    except ValueError:
        return 0


def node_pod(pod: Mapping[str, Any]) -> NodePod:
    return NodePod(
        namespace=str(_meta(pod).get("namespace")),
        name=str(_meta(pod).get("name")),
        gpus=pod_gpus(_spec(pod)),
        priority=int(_spec(pod).get("priority") or 0),
    )


def node_views(
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> list[NodeView]:
    """The own nodes with the GPU pods bound to them, sorted by name."""
    by_node: dict[str, list[NodePod]] = defaultdict(list)
    for pod in pods:
        bound = _spec(pod).get("nodeName")
        if bound and not finished(pod) and pod_gpus(_spec(pod)) > 0:
            by_node[str(bound)].append(node_pod(pod))
    views = []
    for node in nodes:
        if is_virtual(node):
            continue
        name = str(_meta(node).get("name"))
        views.append(
            NodeView(
                name=name,
                gpus=_allocatable_gpus(node),
                usable=_ready(node) and not _spec(node).get("unschedulable"),
                claim=claim_of(node),
                pods=tuple(sorted(by_node.get(name, ()), key=lambda p: p.key)),
            )
        )
    return sorted(views, key=lambda v: v.name)


def virtual_room(node: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]]) -> int:
    """GPUs the virtual node can still take: its allocatable minus what its pods request."""
    if node is None:
        return 0
    name = _meta(node).get("name")
    used = sum(
        pod_gpus(_spec(p)) for p in pods if _spec(p).get("nodeName") == name and not finished(p)
    )
    return max(_allocatable_gpus(node) - used, 0)


def terminating_keys(pods: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    return frozenset(key(p) for p in pods if terminating(p) and not finished(p))


def budgeted(
    pods: Iterable[NodePod],
    all_pods: Mapping[str, Mapping[str, Any]],
    pdbs: Sequence[Mapping[str, Any]],
) -> dict[str, bool]:
    """For each pod, whether a PodDisruptionBudget in its namespace selects it."""
    covered: dict[str, bool] = {}
    for pod in pods:
        labels = _meta(all_pods.get(pod.key) or {}).get("labels") or {}
        covered[pod.key] = any(
            _meta(pdb).get("namespace") == pod.namespace
            and selects(_spec(pdb).get("selector"), labels)
            for pdb in pdbs
        )
    return covered


def gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == HANDOVER for g in _spec(pod).get("schedulingGates") or [])


def group_of(pod: Mapping[str, Any]) -> str:
    """The gang a pod belongs to: its PodGroup (``spec.schedulingGroup``), else itself."""
    namespace = _meta(pod).get("namespace")
    group = (_spec(pod).get("schedulingGroup") or {}).get("podGroupName")
    if group:
        return f"PodGroup {namespace}/{group}"
    return f"Pod {namespace}/{_meta(pod).get('name')}"


@dataclass(frozen=True, slots=True)
class GatedGang:
    gang: HeldGang
    pods: tuple[Mapping[str, Any], ...]  # the gated ones
    members_present: int  # pods of the group, gated or not, not finished


def gated_gangs(pods: Iterable[Mapping[str, Any]]) -> list[GatedGang]:
    """The gangs with gated pods, by group key (sorted)."""
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    present: dict[str, int] = defaultdict(int)
    for pod in pods:
        if finished(pod) or terminating(pod):
            continue
        group = group_of(pod)
        present[group] += 1
        if gated(pod):
            groups[group].append(pod)
    return [
        GatedGang(gang_of_pods(group, members), tuple(members), present[group])
        for group, members in sorted(groups.items())
    ]


def check_state(workload: Mapping[str, Any], checks: frozenset[str]) -> JSON | None:
    """Our AdmissionCheck's state on ``workload`` (the first of ``checks`` it has)."""
    for state in (workload.get("status") or {}).get("admissionChecks") or []:
        if state.get("name") in checks:
            return dict(state)
    return None


def _condition(workload: Mapping[str, Any], kind: str) -> bool:
    for condition in (workload.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return bool(condition.get("status") == "True")
    return False


def quota_reserved(workload: Mapping[str, Any]) -> bool:
    """Quota reserved and not finished: a Workload whose check decides its admission."""
    return _condition(workload, "QuotaReserved") and not _condition(workload, "Finished")


def kueue_gangs(
    workloads: Iterable[Mapping[str, Any]], checks: frozenset[str]
) -> list[tuple[HeldGang, Mapping[str, Any]]]:
    """The Workloads our check holds: quota reserved, our check Pending, not finished."""
    held = []
    for workload in workloads:
        state = check_state(workload, checks)
        if state is None or state.get("state") != "Pending" or not quota_reserved(workload):
            continue
        held.append((gang_of_workload(workload), workload))
    return sorted(held, key=lambda pair: pair[0].key)


def claims_in_use(
    pods: Iterable[Mapping[str, Any]],
    workloads: Iterable[Mapping[str, Any]],
    checks: frozenset[str],
    held: Iterable[str],
) -> set[str]:
    """Claim ids still needed: of gangs held, of released pods not yet bound (they tolerate
    the claim), and of Workloads our check released whose pods are not all bound yet."""
    needed = set(held)
    bound: dict[str, int] = defaultdict(int)
    for pod in pods:
        if finished(pod):
            continue
        for toleration in _spec(pod).get("tolerations") or []:
            if toleration.get("key") == HANDOVER and toleration.get("value"):
                claim = str(toleration["value"])
                if _spec(pod).get("nodeName"):
                    bound[claim] += 1
                elif not terminating(pod):
                    needed.add(claim)
    for workload in workloads:
        state = check_state(workload, checks)
        if state is None or state.get("state") != "Ready" or not quota_reserved(workload):
            continue
        gang = gang_of_workload(workload)
        if bound[gang.id] < len(gang.members):
            needed.add(gang.id)
    return needed


def displaced_owners(nodes: Iterable[Mapping[str, Any]], gang_id: str) -> set[str]:
    """The controllers of the pods a hand-over displaces, as its claimed nodes record them
    (``vk-provider.io/handover-displaced``, written with the claim)."""
    owners: set[str] = set()
    for node in nodes:
        if claim_of(node) != gang_id:
            continue
        text = (_meta(node).get("annotations") or {}).get(DISPLACED) or "[]"
        try:
            listed = json.loads(text)
        except ValueError:
            continue
        if isinstance(listed, list):
            owners.update(str(o) for o in listed)
    return owners


def pod_ready(pod: Mapping[str, Any]) -> bool:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def unready_replacements(pods: Iterable[Mapping[str, Any]], owners: set[str]) -> int:
    """Pods of ``owners`` that are neither Ready nor leaving: replacements still starting."""
    return sum(
        1
        for pod in pods
        if not finished(pod)
        and not terminating(pod)
        and owner_of(pod) in owners
        and not pod_ready(pod)
    )
