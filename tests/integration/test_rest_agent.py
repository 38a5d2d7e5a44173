"""The agent's REST API and metrics against the real control plane agree with the pods."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import httpx
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from tests.helpers import wait_for
from tests.integration.agent_harness import REST_TOKEN, AgentHarness, pod_on
from vk_provider.kube.client import KubeClient

pytestmark = pytest.mark.integration
SLEEP = [sys.executable, "-c", "import time; time.sleep(3600)"]
CLOUDS = [
    {
        "name": "cheap",
        "offers": [
            {
                "sku": "a",
                "gpu_model": "A100-80GB",
                "gpu_count": 1,
                "price_per_hour": 1.25,
                "capacity": 1,
            }
        ],
    },
    {
        "name": "dear",
        "offers": [
            {
                "sku": "h",
                "gpu_model": "H100-SXM",
                "gpu_count": 1,
                "price_per_hour": 2.5,
                "capacity": 3,
            }
        ],
    },
]


async def test_rest_pods_and_metrics_match_the_annotations(
    api: KubeClient, kube: ApiClient, namespace: str, agents: AgentHarness
) -> None:
    agent = agents.start(providers=CLOUDS)

    async def url() -> str | None:
        return agent.rest_url()

    base = await wait_for(url, timeout=30, what="the REST API to listen")
    headers = {"Authorization": f"Bearer {REST_TOKEN}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=10) as http:

        async def ready() -> bool:
            return (await http.get("/readyz")).status_code == 200

        await wait_for(ready, timeout=60, what="/readyz 200")
        core = client.CoreV1Api(kube)
        for name in ("r1", "r2", "r3"):
            await core.create_namespaced_pod(namespace, pod_on(agent.node, name, command=SLEEP))

        async def placed() -> list[dict[str, Any]] | None:
            pods, _ = await api.list_node_pods(agent.node)
            mine = [p for p in pods if p["metadata"]["namespace"] == namespace]
            running = [p for p in mine if p["status"].get("phase") == "Running"]
            return running if len(running) == 3 else None

        pods = await wait_for(placed, timeout=60, what="3 pods Running")
        by_name = {p["metadata"]["name"]: p["metadata"]["annotations"] for p in pods}

        async def listed() -> list[dict[str, Any]] | None:
            rows = (await http.get("/v1/pods")).json()
            rows = [r for r in rows if r["namespace"] == namespace]
            return rows if len(rows) == 3 and all(r["phase"] == "Running" for r in rows) else None

        rows = await wait_for(listed, timeout=30, what="/v1/pods to list the 3 pods")
        for row in rows:
            annotations = by_name[row["name"]]
            assert row["provider"] == annotations["vk-provider.io/provider"]
            assert row["instance_id"] == annotations["vk-provider.io/instance-id"]
            assert row["price_per_hour"] == pytest.approx(
                float(annotations["vk-provider.io/price-per-hour"])
            )
        expected_rate = sum(float(a["vk-provider.io/price-per-hour"]) for a in by_name.values())
        assert expected_rate == pytest.approx(1.25 + 2.5 + 2.5)

        metrics = (await http.get("/metrics")).text
        rates = {
            line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("vk_provider_spend_dollars_per_hour{")
        }
        assert sum(v for k, v in rates.items() if f'namespace="{namespace}"' in k) == pytest.approx(
            expected_rate
        )
        assert 'vk_provider_pods{phase="Running",provider="dear"} 2.0' in metrics
        assert 'vk_provider_pods{phase="Running",provider="cheap"} 1.0' in metrics
        assert 'vk_provider_placement_attempts_total{result="launched"}' in metrics

        spend = (await http.get("/v1/spend")).json()
        assert spend["total"]["per_hour"] == pytest.approx(expected_rate)
        unauthorised = await http.get("/v1/pods", headers={"Authorization": "Bearer wrong"})
        assert unauthorised.status_code == 401

    cli = subprocess.run(
        [sys.executable, "-m", "vk_provider", "providers", "--url", base, "--token", REST_TOKEN],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    assert "cheap" in cli.stdout and "dear" in cli.stdout
    assert "closed" in cli.stdout
