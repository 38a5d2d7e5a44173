"""The real components around the overflow flip, on a cluster of their own.

This module uses a second control plane with native gang scheduling switched on
(``gang_cluster`` in conftest.py, ``flags.GANG_SCHEDULING``), starts KWOK with two own GPU
nodes of 8 GPUs, kube-state-metrics and Prometheus with the flip's recording rules
(``start_flip_components``), and checks each piece the flip story rests on: the flags survive
a restart and the API server reports its version; KWOK runs pods on its nodes and no other;
``flip:own_gpus_full`` follows them through Prometheus' HTTP API; a PodGroup binds all or
nothing; the descheduler evicts a pod from a node whose overflow taint it does not tolerate,
one per cycle, and says so. Everything started here is stopped by the fixtures, whatever the
tests do.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import wait_until
from vk_provider_dev.cluster.binaries import ensure_binaries
from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.flags import GANG_SCHEDULING
from vk_provider_dev.cluster.flip import workloads
from vk_provider_dev.cluster.flip.adminapi import AdminApi
from vk_provider_dev.cluster.flip.descheduler import OVERFLOW_TAINT, PLUGIN
from vk_provider_dev.cluster.flip.kwok import node_ready
from vk_provider_dev.cluster.flip.stack import FlipComponents

pytestmark = pytest.mark.integration
KUBECTL = str(Path(sys.executable).parent / "kubectl")
JSON = dict[str, Any]


@pytest.fixture(scope="module")
def flip(two_node_flip: FlipComponents) -> FlipComponents:
    return two_node_flip


@pytest.fixture
def namespace(flip: FlipComponents) -> Iterator[str]:
    """A namespace of the test's own; on exit its pods are gone (their GPUs free again)."""
    api = flip.api
    name = f"t-{uuid.uuid4().hex[:8]}"
    api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    wait_until(
        lambda: api.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        timeout=60,
        what=f"ServiceAccount default in {name}",
    )
    try:
        yield name
    finally:
        api.delete(f"/api/v1/namespaces/{name}")
        wait_until(
            lambda: not api.items(f"/api/v1/namespaces/{name}/pods"),
            timeout=90,
            what=f"the pods of {name} to be gone",
        )


def _pods(api: AdminApi, namespace: str, **selectors: str) -> list[JSON]:
    return api.items(f"/api/v1/namespaces/{namespace}/pods", **selectors)


def _running_on(api: AdminApi, namespace: str, app: str) -> dict[str, str]:
    """name → node of the ``app`` pods that are Running and not being deleted."""
    return {
        pod["metadata"]["name"]: pod["spec"]["nodeName"]
        for pod in _pods(api, namespace, labelSelector=f"app={app}")
        if pod["status"].get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")
    }


# --------------------------------------------------------------------------- the cluster


def test_the_api_server_reports_its_real_version(gang_cluster: LocalCluster) -> None:
    result = subprocess.run(
        [KUBECTL, "--kubeconfig", str(gang_cluster.kubeconfig), "version", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    server = json.loads(result.stdout)["serverVersion"]
    assert server["gitVersion"] == "v1.37.2"
    assert (server["major"], server["minor"]) == ("1", "37")


def _cmdline(pid: int | None) -> list[str]:
    assert pid is not None
    return Path(f"/proc/{pid}/cmdline").read_text().split("\0")


def _pid(cluster: LocalCluster, component: str) -> int | None:
    return next(c.pid for c in cluster.status().components if c.name == component)


def test_feature_gates_are_kept_by_a_restart(gang_cluster: LocalCluster) -> None:
    assert gang_cluster.flags() == GANG_SCHEDULING
    apiserver = _cmdline(_pid(gang_cluster, "kube-apiserver"))
    assert "--runtime-config=scheduling.k8s.io/v1beta1=true" in apiserver
    assert "--feature-gates=GenericWorkload=true,WorkloadWithJob=true" in apiserver
    before = _pid(gang_cluster, "kube-scheduler")
    gang_cluster.restart("kube-scheduler", ensure_binaries())
    after = _pid(gang_cluster, "kube-scheduler")
    assert after != before
    assert "--feature-gates=GenericWorkload=true" in _cmdline(after)


# --------------------------------------------------------------------------- KWOK + signal


LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"


def _renewed(api: AdminApi, node: str) -> str:
    lease = api.get(f"{LEASES}/{node}") or {}
    return str((lease.get("spec") or {}).get("renewTime") or "")


def test_kwok_makes_its_own_nodes_ready_and_no_other(flip: FlipComponents) -> None:
    for name in flip.nodes:
        node = flip.api.get(f"/api/v1/nodes/{name}")
        assert node_ready(node), name
        assert node is not None
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert _renewed(flip.api, name), f"KWOK holds no Lease of {name}"
    # A node without KWOK's annotation (as the virtual node is) is left alone: KWOK makes
    # no Lease for it, even after it has renewed its own nodes' Leases again.
    stranger = "not-for-kwok"
    flip.api.create("/api/v1/nodes", {"metadata": {"name": stranger}}, exist_ok=True)
    try:
        renewed = {name: _renewed(flip.api, name) for name in flip.nodes}
        wait_until(
            lambda: all(_renewed(flip.api, n) != renewed[n] for n in flip.nodes),
            timeout=90,
            interval=0.5,
            what="KWOK to renew its nodes' Leases",
        )
        assert flip.api.get(f"{LEASES}/{stranger}") is None
        assert not node_ready(flip.api.get(f"/api/v1/nodes/{stranger}"))
    finally:
        flip.api.delete(f"/api/v1/nodes/{stranger}")


def test_own_gpus_full_follows_a_deployment_through_prometheus(
    flip: FlipComponents, namespace: str
) -> None:
    prometheus = flip.prometheus
    # A real cluster always runs some pod (kube-state-metrics' own, at least); requests read
    # 0 only while kube-state-metrics exports pods at all (never "all free" on lost data).
    idle = workloads.gpu_deployment("idle", namespace=namespace, replicas=1, gpus=0)
    flip.api.create(workloads.deployments_path(namespace), idle)
    prometheus.wait_for_value("flip:own_gpus_full", lambda v: v == 0, what="own GPUs idle")
    assert prometheus.value("flip:own_gpu_allocatable:sum") == 16

    deployment = workloads.gpu_deployment("fill", namespace=namespace, replicas=2, gpus=8)
    flip.api.create(workloads.deployments_path(namespace), deployment)
    running = wait_until(
        lambda: (r := _running_on(flip.api, namespace, "fill")) and len(r) == 2 and r,
        timeout=90,
        what="both 8-GPU pods Running",
    )
    assert sorted(running.values()) == sorted(flip.nodes)
    prometheus.wait_for_value(
        "flip:own_gpus_full", lambda v: v == 1, timeout=60, what="own GPUs full"
    )
    assert prometheus.value("flip:own_gpu_requested:sum") == 16
    assert prometheus.value("flip:own_gpu_free:sum") == 0

    flip.api.delete(f"{workloads.deployments_path(namespace)}/fill")
    prometheus.wait_for_value(
        "flip:own_gpus_full", lambda v: v == 0, timeout=90, what="own GPUs free again"
    )
    assert prometheus.value("flip:own_gpu_requested:sum") == 0


# --------------------------------------------------------------------------- gang scheduling


def _condition(group: JSON | None, kind: str) -> JSON | None:
    conditions = ((group or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), None)


def test_a_pod_group_binds_all_or_nothing(flip: FlipComponents, namespace: str) -> None:
    api = flip.api
    groups = workloads.pod_groups_path(namespace)
    pods = workloads.pods_path(namespace)
    # Three 8-GPU pods that must start together; two nodes of 8 GPUs fit only two.
    api.create(groups, workloads.pod_group("big", namespace=namespace, min_count=3))
    for pod in workloads.gang_pods("big", namespace=namespace, count=3, gpus=8):
        api.create(pods, pod)
    unschedulable = wait_until(
        lambda: (
            (c := _condition(api.get(f"{groups}/big"), "PodGroupInitiallyScheduled"))
            and c.get("status") == "False"
            and c
        ),
        timeout=90,
        what="the scheduler to give up on the gang of 3",
    )
    assert unschedulable["reason"] == "Unschedulable"
    assert "minCount (3)" in unschedulable["message"]
    assert not [
        p for p in _pods(api, namespace, labelSelector="gang=big") if p["spec"].get("nodeName")
    ]

    # Two that fit together bind together.
    api.create(groups, workloads.pod_group("fits", namespace=namespace, min_count=2))
    for pod in workloads.gang_pods("fits", namespace=namespace, count=2, gpus=8):
        api.create(pods, pod)
    bound = wait_until(
        lambda: (
            (
                nodes := [
                    p["spec"].get("nodeName")
                    for p in _pods(api, namespace, labelSelector="gang=fits")
                ]
            )
            and all(nodes)
            and nodes
        ),
        timeout=90,
        what="the gang of 2 to bind",
    )
    assert sorted(bound) == sorted(flip.nodes)
    assert not [
        p for p in _pods(api, namespace, labelSelector="gang=big") if p["spec"].get("nodeName")
    ]


# --------------------------------------------------------------------------- descheduler


def _taint(api: AdminApi, node: str, taints: list[JSON]) -> None:
    api.patch(f"/api/v1/nodes/{node}", {"spec": {"taints": taints}})


def _disruptions_allowed(api: AdminApi, namespace: str, name: str) -> int:
    pdb = api.get(f"{workloads.pdbs_path(namespace)}/{name}") or {}
    return int((pdb.get("status") or {}).get("disruptionsAllowed") or 0)


def test_the_descheduler_evicts_one_pod_per_cycle_from_a_tainted_node(
    flip: FlipComponents, namespace: str
) -> None:
    api = flip.api
    deployment = workloads.gpu_deployment("infer", namespace=namespace, replicas=2, gpus=1)
    # Both replicas on the first node: the second node is cordoned meanwhile.
    first, second = flip.nodes
    api.patch(f"/api/v1/nodes/{second}", {"spec": {"unschedulable": True}})
    try:
        api.create(workloads.deployments_path(namespace), deployment)
        api.create(
            workloads.pdbs_path(namespace),
            workloads.pod_disruption_budget("infer", namespace=namespace, app="infer"),
        )
        wait_until(
            lambda: (r := _running_on(api, namespace, "infer")) and len(r) == 2 and r,
            timeout=90,
            what="two replicas Running",
        )
    finally:
        api.patch(f"/api/v1/nodes/{second}", {"spec": {"unschedulable": None}})
    key, value = OVERFLOW_TAINT.split("=")
    _taint(api, first, [{"key": key, "value": value, "effect": "NoSchedule"}])
    try:
        wait_until(
            lambda: _disruptions_allowed(api, namespace, "infer") == 1,
            timeout=60,
            what="the PDB to allow one disruption",
        )
        cycle = flip.run_descheduler_once()
        assert cycle.ok, cycle.output[-3000:]
        assert len(cycle.evictions) == 1, cycle.output[-3000:]  # maxNoOfPodsToEvictPerNode
        (eviction,) = cycle.evictions
        assert eviction.node == first
        assert eviction.strategy == PLUGIN
        assert eviction.pod.startswith(f"{namespace}/infer-")
        # The replacement goes to the untainted node; then the next cycle takes the other.
        wait_until(
            lambda: (
                sorted(_running_on(api, namespace, "infer").values()) == sorted([first, second])
            ),
            timeout=90,
            what="the evicted replica's replacement Running on the other node",
        )
        wait_until(
            lambda: _disruptions_allowed(api, namespace, "infer") == 1,
            timeout=60,
            what="the PDB to allow one disruption again",
        )
        again = flip.run_descheduler_once()
        assert len(again.evictions) == 1, again.output[-3000:]
        wait_until(
            lambda: (
                set(_running_on(api, namespace, "infer").values()) == {second}
                and len(_running_on(api, namespace, "infer")) == 2
            ),
            timeout=90,
            what="both replicas on the untainted node",
        )
        # Nothing violates the taint any more: a cycle runs, reports, and evicts nothing.
        idle = flip.run_descheduler_once()
        assert idle.ok and idle.evictions == (), idle.output[-3000:]
    finally:
        _taint(api, first, [])


def test_the_descheduler_runs_as_a_daemon_and_stops(flip: FlipComponents) -> None:
    daemon = flip.start_descheduler(interval="2s")
    try:
        assert daemon.running
        wait_until(
            lambda: len(daemon.cycles()) >= 2,
            timeout=60,
            interval=0.5,
            what="two descheduling cycles",
        )
        assert daemon.evictions() == ()
    finally:
        flip.stop_descheduler()
    assert not daemon.running
