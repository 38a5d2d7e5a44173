"""The kubelet API tests again, with the API server verifying the agent's serving certificate.

A control plane of this module's own runs the API server with
``--kubelet-certificate-authority`` (the cluster CA: ``ClusterFlags.verify_kubelets``), as a
careful production cluster does; each agent asks the cluster to sign its serving certificate
(``kubelet_api.serving.source: cluster``, approving its own request with the rights of
deploy/rbac-serving.yaml, ``kubelet_node.start_agent_on``). The tests are
``test_kubelet_endpoints``' own, collected here unchanged: the ``control_plane`` fixture below
overrides the session's for them (and for every fixture they use that builds on it), and
``metrics`` runs a metrics-server of its own on it for ``kubectl top``: metrics-server, too,
verifies the kubelet's certificate against the cluster CA.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import yaml
from kubernetes_asyncio.client.api_client import ApiClient

from tests.integration.agent_harness import AgentHarness, pod_on
from tests.integration.kubelet_node import Commands
from tests.integration.test_agent import _ready_node
from tests.integration.test_kubelet_endpoints import (
    IDLE,
    LOCAL,
    running_pod,
    test_attach_follows_the_containers_output,
    test_exec_on_a_provider_without_it_says_why,
    test_exec_one_shot_interactive_and_on_a_terminal,
    test_kubectl_top_pod_and_node,
    test_logs_previous_returns_the_run_before,
    test_pods_and_running_pods_through_the_node_proxy,
    test_port_forward_reaches_the_pods_port,
)
from vk_provider.kube.client import KubeClient
from vk_provider_dev.cluster import netns
from vk_provider_dev.cluster.binaries import ensure_binaries
from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.flags import ClusterFlags
from vk_provider_dev.cluster.metrics_server import MetricsServer, ensure_metrics_server

pytestmark = pytest.mark.integration

__all__ = [
    "test_attach_follows_the_containers_output",
    "test_exec_on_a_provider_without_it_says_why",
    "test_exec_one_shot_interactive_and_on_a_terminal",
    "test_kubectl_top_pod_and_node",
    "test_logs_previous_returns_the_run_before",
    "test_pods_and_running_pods_through_the_node_proxy",
    "test_port_forward_reaches_the_pods_port",
]


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A control plane whose API server verifies kubelets against the cluster CA."""
    cluster = LocalCluster(f"vkt-verify-{os.getpid()}", root=tmp_path_factory.mktemp("verify"))
    try:
        cluster.up(ensure_binaries(), flags=ClusterFlags(verify_kubelets=True))
        assert cluster.flags().verify_kubelets
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="module")
def metrics(control_plane: LocalCluster) -> Iterator[MetricsServer]:
    """A metrics-server of this module's cluster (the session's belongs to the other)."""
    server = MetricsServer(control_plane, ensure_metrics_server())
    try:
        server.start()
        yield server
    finally:
        server.stop()


async def test_a_self_signed_kubelet_is_not_trusted_by_this_api_server(
    agents: AgentHarness,
    api: KubeClient,
    kube: ApiClient,
    namespace: str,
    node_link: netns.VethNamespace,
    kubectl: Commands,
) -> None:
    """The check is on: an agent configured with a self-signed certificate gets no
    ``kubectl logs`` through this API server, so the tests above pass on the cluster-signed
    one, not on a trust that is not there."""
    agent = agents.start(providers=[LOCAL], node={"address": node_link.host_address}, start=False)
    config = yaml.safe_load(agent.config_path.read_text())
    config["kubelet_api"]["listen"] = f"{node_link.host_address}:0"
    agent.config_path.write_text(yaml.safe_dump(config))
    agent.start()
    await _ready_node(api, agent)
    await running_pod(kube, api, namespace, pod_on(agent.node, "plain", command=IDLE))
    result = kubectl.run("logs", "-n", namespace, "plain")
    assert result.returncode != 0, result.stdout
    assert "x509" in result.stderr or "certificate" in result.stderr, result.stderr
