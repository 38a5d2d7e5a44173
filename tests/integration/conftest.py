"""Fixtures of the integration tests: agents under test and a dict-speaking API client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.integration.agent_harness import AgentHarness
from vk_provider.cluster.cluster import LocalCluster
from vk_provider.kube.client import KubeClient


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
