"""A third-party adapter, installed as its own distribution, runs pods with no agent edit.

The example package (``tests/plugins/example-provider``, installed by the test command) is
found by `vk-provider run` through the entry-point group ``vk_provider.providers``; the agent
runs against the real control plane and a pod lands on the example provider.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from tests.helpers import wait_for
from tests.integration.agent_harness import AgentHarness, pod_on
from vk_provider.domain.podview import ANN_INSTANCE, ANN_PROVIDER
from vk_provider.kube.client import KubeClient

pytestmark = pytest.mark.integration


async def test_a_pod_runs_on_an_entry_point_provider(
    api: KubeClient, kube: ApiClient, namespace: str, agents: AgentHarness
) -> None:
    agent = agents.start(providers=[{"type": "example", "name": "plugged", "price_per_hour": 0.75}])
    pod = pod_on(agent.node, "plugged-in", command=["serve"])
    await client.CoreV1Api(kube).create_namespaced_pod(namespace, pod)

    async def running() -> dict[str, Any] | None:
        found = await api.get_pod(namespace, "plugged-in")
        return found if found and (found.get("status") or {}).get("phase") == "Running" else None

    found = await wait_for(running, timeout=90, what="the pod Running on the example provider")
    annotations = found["metadata"]["annotations"]
    assert annotations[ANN_PROVIDER] == "plugged"
    assert annotations[ANN_INSTANCE].startswith("example-")
