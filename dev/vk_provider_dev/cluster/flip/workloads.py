"""Manifests of the flip story's workloads (pure builders): gang training, GPU inference.

Training is gang-scheduled with Kubernetes' native Workload API. Kubernetes 1.37 schedules
a ``PodGroup`` (``scheduling.k8s.io/v1beta1``, feature gate ``GenericWorkload``;
``flags.GANG_SCHEDULING`` turns it on) all or nothing: no pod of a group with
``gang.minCount: N`` binds until N of them can bind at once, and a group at a higher priority
preempts lower-priority pods (inference) as one. Pods join a group through
``spec.schedulingGroup.podGroupName``.

Inference is a plain Deployment of GPU pods (``gpu_deployment``) at a lower PriorityClass,
with a PodDisruptionBudget (``pod_disruption_budget``) that the descheduler's evictions honour.

Invariants (from the API server's validation, measured): a PodGroup's priority must equal its
pods' priority, so both name the same PriorityClass; ``minCount`` is at least 1. GPU requests
equal limits (extended resources cannot be overcommitted). Containers are ``pause``: nothing
pulls it on KWOK nodes, and on the virtual node the provider decides what runs.
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
    gates: tuple[str, ...] = (),
) -> JSON:
    """One member of ``group`` asking for ``gpus`` GPUs (requests = limits, as for GPUs),
    held by the scheduling ``gates`` (the hand-over's ``vk-provider.io/handover``)."""
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
    if gates:
        spec["schedulingGates"] = [{"name": gate} for gate in gates]
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
    gates: tuple[str, ...] = (),
) -> list[JSON]:
    """``count`` members of ``group`` named ``<group>-0 ..``."""
    return [
        gang_pod(
            f"{group}-{index}",
            namespace=namespace,
            group=group,
            gpus=gpus,
            priority_class_name=priority_class_name,
            gates=gates,
        )
        for index in range(count)
    ]


def deployments_path(namespace: str) -> str:
    return f"/apis/apps/v1/namespaces/{namespace}/deployments"


def pdbs_path(namespace: str) -> str:
    return f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"


def gpu_deployment(
    name: str,
    *,
    namespace: str,
    replicas: int,
    gpus: int,
    priority_class_name: str | None = None,
    tolerations: list[JSON] | None = None,
    image: str = PAUSE_IMAGE,
    command: list[str] | None = None,
) -> JSON:
    """``replicas`` pods labelled ``app=<name>``, each asking ``gpus`` GPUs."""
    container: JSON = {
        "name": "serve",
        "image": image,
        "resources": {
            "requests": {GPU_RESOURCE: str(gpus)},
            "limits": {GPU_RESOURCE: str(gpus)},
        },
    }
    if command:
        container["command"] = command
    pod_spec: JSON = {"containers": [container], "terminationGracePeriodSeconds": 2}
    if priority_class_name:
        pod_spec["priorityClassName"] = priority_class_name
    if tolerations:
        pod_spec["tolerations"] = tolerations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec},
        },
    }


def pod_disruption_budget(name: str, *, namespace: str, app: str, max_unavailable: int = 1) -> JSON:
    """A PDB over ``app=<app>`` pods allowing ``max_unavailable`` disruptions at a time."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": {"app": app}}},
    }


# --------------------------------------------------------------------------- Kueue

KUEUE_API: Final = "/apis/kueue.x-k8s.io/v1beta2"


def kueue_queue(
    suffix: str, *, namespace: str, gpus: int, admission_check: str | None
) -> list[tuple[str, JSON]]:
    """(path, object) to create, in order, for training through Kueue: a ResourceFlavor for
    the own nodes (``gpu.pool=own``), the AdmissionCheck ``admission_check`` (its controller
    is the hand-over's, ``vk-provider.io/handover``; None: no check), a ClusterQueue
    ``train-<suffix>`` of ``gpus`` GPUs using both, and a LocalQueue ``main`` in
    ``namespace``. Cluster-scoped objects first; delete them in reverse."""
    flavor, queue = f"own-{suffix}", f"train-{suffix}"
    objects: list[tuple[str, JSON]] = [
        (
            f"{KUEUE_API}/resourceflavors",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": flavor},
                "spec": {"nodeLabels": {"gpu.pool": "own"}},
            },
        )
    ]
    spec: JSON = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": [GPU_RESOURCE],
                "flavors": [
                    {"name": flavor, "resources": [{"name": GPU_RESOURCE, "nominalQuota": gpus}]}
                ],
            }
        ],
    }
    if admission_check:
        objects.append(
            (
                f"{KUEUE_API}/admissionchecks",
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "AdmissionCheck",
                    "metadata": {"name": admission_check},
                    "spec": {"controllerName": "vk-provider.io/handover"},
                },
            )
        )
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": admission_check}]}
    objects.append(
        (
            f"{KUEUE_API}/clusterqueues",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ClusterQueue",
                "metadata": {"name": queue},
                "spec": spec,
            },
        )
    )
    objects.append(
        (
            f"{KUEUE_API}/namespaces/{namespace}/localqueues",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": "main", "namespace": namespace},
                "spec": {"clusterQueue": queue},
            },
        )
    )
    return objects


def jobs_path(namespace: str) -> str:
    return f"/apis/batch/v1/namespaces/{namespace}/jobs"


def kueue_training_job(
    name: str, *, namespace: str, count: int, gpus: int, priority_class_name: str
) -> JSON:
    """A Job of ``count`` pods x ``gpus`` GPUs in the LocalQueue ``main``, labelled
    ``gang=<name>`` like the native gang's pods."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"kueue.x-k8s.io/queue-name": "main"},
        },
        "spec": {
            "parallelism": count,
            "completions": count,
            "template": {
                "metadata": {"labels": {"gang": name}},
                "spec": {
                    "restartPolicy": "Never",
                    "priorityClassName": priority_class_name,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "train",
                            "image": PAUSE_IMAGE,
                            "resources": {
                                "requests": {GPU_RESOURCE: str(gpus)},
                                "limits": {GPU_RESOURCE: str(gpus)},
                            },
                        }
                    ],
                },
            },
        },
    }
