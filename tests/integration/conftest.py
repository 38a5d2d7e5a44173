"""Fixtures of the integration tests: agents under test, a dict-speaking API client, and a
gang-scheduling cluster for the overflow flip's tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes_asyncio import config
from kubernetes_asyncio.client.api_client import ApiClient

from tests.integration.agent_harness import AgentHarness

# Session fixtures of the kubelet API tests, defined once here: a session-scoped fixture
# imported into two test modules would be two fixtures, set up twice (one veth pair, one
# network namespace name per session).
from tests.integration.kubelet_node import kubectl, metrics, node_link
from vk_provider.kube.client import KubeClient
from vk_provider_dev.cluster.binaries import ensure_binaries
from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.flags import GANG_SCHEDULING
from vk_provider_dev.cluster.flip.stack import FlipComponents, start_flip_components
from vk_provider_dev.cluster.flip.tools import ensure_flip_tools


@pytest.fixture(scope="module")
def gang_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A control plane of the module's own with native gang scheduling (``GANG_SCHEDULING``):
    for the overflow flip's tests, which add KWOK nodes, KSM and Prometheus beside it
    (``vk_provider_dev.cluster.flip.stack.start_flip_components``)."""
    cluster = LocalCluster(f"vkt-gang-{os.getpid()}", root=tmp_path_factory.mktemp("gang"))
    try:
        cluster.up(ensure_binaries(), flags=GANG_SCHEDULING)
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="module")
def two_node_flip(
    gang_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FlipComponents]:
    """KWOK with two own GPU nodes of 8 GPUs, kube-state-metrics and Prometheus beside the
    module's ``gang_cluster``; everything it started is stopped afterwards, whatever the
    tests did (Kueue and the descheduler included, when a test started them)."""
    components = start_flip_components(
        gang_cluster,
        directory=tmp_path_factory.mktemp("flip"),
        own_nodes=2,
        tools=ensure_flip_tools(),
    )
    with components:
        yield components
    for child in (components.kwok, components.ksm, components.prometheus, components.kueue):
        assert child is None or not child.running, f"{child} left running"


@pytest.fixture
def gang_agents(gang_cluster: LocalCluster, tmp_path: Path) -> Iterator[AgentHarness]:
    """Agents on the module's ``gang_cluster``; all stopped and cleaned up afterwards."""
    harness = AgentHarness(gang_cluster, tmp_path)
    try:
        yield harness
    finally:
        harness.stop_all()


@pytest.fixture
async def gang_kube(gang_cluster: LocalCluster) -> AsyncIterator[KubeClient]:
    api = await KubeClient.connect(gang_cluster.kubeconfig)
    try:
        yield api
    finally:
        await api.close()


@pytest.fixture
async def gang_raw(gang_cluster: LocalCluster) -> AsyncIterator[ApiClient]:
    """The official client on ``gang_cluster`` (Events, namespaces)."""
    api = await config.new_client_from_config(config_file=str(gang_cluster.kubeconfig))
    try:
        yield api
    finally:
        await api.close()


@pytest.fixture
def agents(control_plane: LocalCluster, tmp_path: Path) -> Iterator[AgentHarness]:
    """Start agents with ``agents.start(...)``; all are stopped and cleaned up afterwards."""
    harness = AgentHarness(control_plane, tmp_path)
    try:
        yield harness
    finally:
        harness.stop_all()


@pytest.fixture
async def api(kubeconfig: Path) -> AsyncIterator[KubeClient]:
    kube = await KubeClient.connect(kubeconfig)
    try:
        yield kube
    finally:
        await kube.close()


@pytest.fixture
def cpu_hog() -> Iterator[int]:
    """One busy process per core beside the test, as a loaded CI machine has; all killed after."""
    count = os.cpu_count() or 2
    hogs = [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for _ in range(count)
    ]
    try:
        yield count
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


__all__ = ["kubectl", "metrics", "node_link"]  # fixtures from kubelet_node
