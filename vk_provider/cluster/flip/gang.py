"""Manifests for gang-scheduled training with Kubernetes' native Workload API (pure builders).

Kubernetes 1.37 schedules a ``PodGroup`` (``scheduling.k8s.io/v1beta1``, feature gate
``GenericWorkload``; ``flags.GANG_SCHEDULING`` turns it on) all or nothing: no pod of a group
with ``gang.minCount: N`` binds until N of them can bind at once, and a group at a higher
priority preempts lower-priority pods (inference) as one. Pods join a group through
``spec.schedulingGroup.podGroupName``.

Invariants (from the API server's validation, measured): a PodGroup's priority must equal its
pods' priority, so both name the same PriorityClass; ``minCount`` is at least 1.
"""

from __future__ import annotations

from typing import Any, Final

JSON = dict[str, Any]
GPU_RESOURCE: Final = "nvidia.com/gpu"
PRIORITY_CLASSES: Final = "/apis/scheduling.k8s.io/v1/priorityclasses"
PAUSE_IMAGE: Final = "registry.k8s.io/pause:3.10"


def pod_groups_path(namespace: str) -> str:
    return f"/apis/scheduling.k8s.io/v1beta1/namespaces/{namespace}/podgroups"


def pods_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


def priority_class(name: str, value: int, *, description: str = "") -> JSON:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "globalDefault": False,
        "description": description or f"{name} ({value})",
    }


def pod_group(
    name: str, *, namespace: str, min_count: int, priority_class_name: str | None = None
) -> JSON:
    """A gang: none of its pods binds until ``min_count`` of them can."""
    if min_count < 1:
        raise ValueError(f"minCount must be at least 1, not {min_count}")
    spec: JSON = {"schedulingPolicy": {"gang": {"minCount": min_count}}}
    if priority_class_name:
        spec["priorityClassName"] = priority_class_name
    return {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def gang_pod(
    name: str,
    *,
    namespace: str,
    group: str,
    gpus: int,
    priority_class_name: str | None = None,
    labels: dict[str, str] | None = None,
    image: str = PAUSE_IMAGE,
) -> JSON:
    """One member of ``group`` asking for ``gpus`` GPUs (requests = limits, as for GPUs)."""
    spec: JSON = {
        "schedulingGroup": {"podGroupName": group},
        "containers": [
            {
                "name": "train",
                "image": image,
                "resources": {
                    "requests": {GPU_RESOURCE: str(gpus)},
                    "limits": {GPU_RESOURCE: str(gpus)},
                },
            }
        ],
        "terminationGracePeriodSeconds": 1,
    }
    if priority_class_name:
        spec["priorityClassName"] = priority_class_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"gang": group, **(labels or {})},
        },
        "spec": spec,
    }


def gang_pods(
    group: str,
    *,
    namespace: str,
    count: int,
    gpus: int,
    priority_class_name: str | None = None,
) -> list[JSON]:
    """``count`` members of ``group`` named ``<group>-0 ..``."""
    return [
        gang_pod(
            f"{group}-{index}",
            namespace=namespace,
            group=group,
            gpus=gpus,
            priority_class_name=priority_class_name,
        )
        for index in range(count)
    ]
