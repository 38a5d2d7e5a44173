"""Fixtures of the integration tests: agents under test and a dict-speaking API client."""

from __future__ import annotations

import os
import subprocess
import sys
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
