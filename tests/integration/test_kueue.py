"""Kueue v0.19 on the local control plane, as the hand-over will use it (docs/flip-components.md).

KWOK with two own nodes of 8 GPUs, and Kueue built from the Go module proxy
(``start_kueue``): a ResourceFlavor for the own nodes, a ClusterQueue of 16 GPUs and a
LocalQueue. A training Job in the queue is suspended by Kueue's webhook, gets a Workload,
is admitted within the quota and runs; a second one beyond the quota waits with its reason;
a Job outside any queue is none of Kueue's business. On stop the webhooks are gone, so
nothing is left failing closed.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.helpers import wait_until
from vk_provider_dev.cluster.flip import kueue as kueue_mod
from vk_provider_dev.cluster.flip.stack import FlipComponents

pytestmark = pytest.mark.integration
KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
JSON = dict[str, Any]


@pytest.fixture(scope="module")
def flip(two_node_flip: FlipComponents) -> FlipComponents:
    two_node_flip.start_kueue()
    return two_node_flip


def _job(name: str, *, namespace: str, parallelism: int, gpus: int, queue: str | None) -> JSON:
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "template": {
                "metadata": {"labels": {"job": name}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {
                                "requests": {"nvidia.com/gpu": str(gpus)},
                                "limits": {"nvidia.com/gpu": str(gpus)},
                            },
                        }
                    ],
                },
            },
        },
    }


def _condition(obj: JSON | None, kind: str) -> JSON | None:
    for condition in ((obj or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return None


def _workload_of(flip: FlipComponents, namespace: str, job: str) -> JSON | None:
    for workload in flip.api.items(f"{KUEUE_API}/namespaces/{namespace}/workloads"):
        owners = workload["metadata"].get("ownerReferences") or []
        if any(o.get("kind") == "Job" and o.get("name") == job for o in owners):
            return workload
    return None


def test_a_queued_job_is_admitted_within_quota_and_one_beyond_waits(
    flip: FlipComponents,
) -> None:
    api = flip.api
    suffix = uuid.uuid4().hex[:6]
    namespace, flavor, queue = f"kq-{suffix}", f"own-{suffix}", f"gpus-{suffix}"
    api.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    api.create(
        f"{KUEUE_API}/resourceflavors",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": flavor},
            "spec": {"nodeLabels": {"gpu.pool": "own"}},
        },
    )
    api.create(
        f"{KUEUE_API}/clusterqueues",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": queue},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": flavor,
                                "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 16}],
                            }
                        ],
                    }
                ],
            },
        },
    )
    api.create(
        f"{KUEUE_API}/namespaces/{namespace}/localqueues",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "main", "namespace": namespace},
            "spec": {"clusterQueue": queue},
        },
    )
    jobs = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    try:
        created = api.create(
            jobs, _job("train", namespace=namespace, parallelism=2, gpus=8, queue="main")
        )
        assert created["spec"]["suspend"] is True  # Kueue's webhook suspended it on create

        def admitted() -> JSON | None:
            workload = _workload_of(flip, namespace, "train")
            condition = _condition(workload, "Admitted")
            return workload if condition and condition["status"] == "True" else None

        workload = wait_until(admitted, timeout=90, what="the Workload admitted")
        assert workload["status"]["admission"]["clusterQueue"] == queue

        def running() -> list[JSON] | None:
            pods = api.items(f"/api/v1/namespaces/{namespace}/pods", labelSelector="job=train")
            on_own = [p for p in pods if p["spec"].get("nodeName") in flip.nodes]
            ready = [p for p in on_own if p["status"].get("phase") == "Running"]
            return ready if len(ready) == 2 else None

        assert {p["spec"]["nodeName"] for p in wait_until(running, timeout=90, what="2 pods")} == (
            set(flip.nodes)
        )

        api.create(jobs, _job("more", namespace=namespace, parallelism=1, gpus=8, queue="main"))

        def waiting() -> JSON | None:
            condition = _condition(_workload_of(flip, namespace, "more"), "QuotaReserved")
            return condition if condition and condition["status"] == "False" else None

        reason = wait_until(waiting, timeout=60, what="the second Workload waiting for quota")
        assert "nvidia.com/gpu" in reason["message"], reason
        assert (api.get(f"{jobs}/more") or {})["spec"]["suspend"] is True

        outside = api.create(
            jobs, _job("plain", namespace=namespace, parallelism=1, gpus=0, queue=None)
        )
        assert not outside["spec"].get("suspend"), "a Job in no queue is left alone"
    finally:
        api.delete(f"/api/v1/namespaces/{namespace}")
        wait_until(
            lambda: not api.items(f"/api/v1/namespaces/{namespace}/pods"),
            timeout=90,
            what=f"the pods of {namespace} gone",
        )
        api.delete(f"{KUEUE_API}/clusterqueues/{queue}")
        api.delete(f"{KUEUE_API}/resourceflavors/{flavor}")


def test_stopping_kueue_removes_its_webhooks(flip: FlipComponents) -> None:
    """Its webhooks fail closed: once Kueue is stopped they must be gone, or every Job and
    Kueue object write in the cluster would be refused."""
    assert flip.api.get(f"{kueue_mod.MUTATING}/{kueue_mod.WEBHOOK_NAME}") is not None
    flip.stop_kueue()
    assert flip.api.get(f"{kueue_mod.MUTATING}/{kueue_mod.WEBHOOK_NAME}") is None
    assert flip.api.get(f"{kueue_mod.VALIDATING}/{kueue_mod.WEBHOOK_NAME}") is None
    flip.start_kueue()
    assert flip.api.get(f"{kueue_mod.MUTATING}/{kueue_mod.WEBHOOK_NAME}") is not None
