"""The operator's view of a running agent on the real control plane: offers by GPU, the
placement dry run against what the agent then does, and the metrics after a pod runs.

The agent runs the demo's simulated clouds (``cluster.demo.SIMULATED_PROVIDERS``); the CLI is
run as the demo prints it (``demo.shell_command``: the absolute path in the virtualenv).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from tests.helpers import wait_for
from tests.integration.agent_harness import REST_TOKEN, AgentHarness, AgentProcess, pod_on
from vk_provider.kube.client import KubeClient
from vk_provider_dev.cluster.demo import SIMULATED_PROVIDERS, shell_command

pytestmark = pytest.mark.integration
SLEEP = [sys.executable, "-c", "import time; time.sleep(3600)"]


async def started(agents: AgentHarness) -> tuple[AgentProcess, str]:
    agent = agents.start(providers=[dict(p) for p in SIMULATED_PROVIDERS])

    async def url() -> str | None:
        return agent.rest_url()

    base = await wait_for(url, timeout=60, what="the REST API to listen")
    async with httpx.AsyncClient(base_url=base) as http:

        async def ready() -> bool:
            return (await http.get("/readyz")).status_code == 200

        await wait_for(ready, timeout=90, what="/readyz 200")
    return agent, base


def cli(base: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``vk-provider ARGS`` as the demo prints it, in a shell, against the agent at ``base``."""
    env = {**os.environ, "VK_PROVIDER_URL": base, "VK_PROVIDER_TOKEN": REST_TOKEN}
    done = subprocess.run(
        ["bash", "-c", shell_command("vk-provider", *args)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done


def rows(output: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if line.strip()]


async def test_offers_on_the_demo_clouds_are_grouped_by_gpu(agents: AgentHarness) -> None:
    _, base = await started(agents)
    table = cli(base, "offers").stdout
    lines = rows(table)
    assert lines[0][:3] == ["GPU", "QTY", "$/GPU/H"]
    known = {"L40S", "A100-80GB", "H100-PCIE", "H100-SXM"}
    models = [line[0] for line in lines if line[0] in known]
    # Cheapest per GPU first: L40S 0.99, A100 1.39, H100-PCIE 2.49, H100-SXM 2.69.
    assert models == ["L40S", "A100-80GB", "H100-PCIE", "H100-SXM"], table
    sxm = next(line for line in lines if line[0] == "H100-SXM")
    assert sxm == [
        "H100-SXM",
        "1",
        "$2.6900/h",
        "-",
        "$2.6900/h",
        "-",
        "80",
        "GiB",
        "16",
        "128",
        "GiB",
        "eu-ro-1",
        "sim-runpod",
    ]
    assert "4 of 4 offers shown, cheapest per GPU first" in table
    h100 = cli(base, "offers", "--gpu", "H100").stdout
    assert "A100" not in h100 and "L40S" not in h100 and "2 of 2 offers shown" in h100
    as_json = json.loads(cli(base, "offers", "-o", "json").stdout)
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {REST_TOKEN}"}
    ) as http:
        assert as_json == (await http.get("/v1/gpus", params={"limit": 5})).json()
    wide = rows(cli(base, "offers", "-o", "wide", "--provider", "sim-lambda").stdout)
    assert wide[2][-4:] == ["gpu_1x_h100_pcie", "1", "-", "4s"]


async def test_place_names_the_offer_the_agent_then_chooses_and_each_refusal(
    agents: AgentHarness,
    api: KubeClient,
    kube: ApiClient,
    kubeconfig: Path,
    namespace: str,
    tmp_path: Path,
) -> None:
    agent, base = await started(agents)
    # Refused everywhere: each offer by the filter that says why.
    picky = pod_on(agent.node, "picky", command=SLEEP)
    picky["metadata"]["annotations"] = {
        "vk-provider.io/gpu": "H100",
        "vk-provider.io/max-price": "2.0",
    }
    refused = cli(base, "place", "-f", "-", "-n", namespace, stdin=yaml.safe_dump(picky)).stdout
    assert refused.startswith(f"pod {namespace}/picky fits no offer now (NoCapacity")
    why = {line[0]: line[2] for line in rows(refused) if line[0].startswith("sim-")}
    assert why == {
        "sim-modal/l40s/us-west": "gpu-model",
        "sim-runpod/a100-80gb/eu-ro-1": "gpu-model",
        "sim-lambda/gpu_1x_h100_pcie/us-east-1": "price",
        "sim-runpod/h100-sxm/eu-ro-1": "price",
    }

    # Placeable: the dry run's first offer is the one the agent launches.
    wanted = pod_on(agent.node, "infer", command=SLEEP)
    wanted["metadata"]["annotations"] = {"vk-provider.io/gpu": "H100,A100-80GB"}
    manifest = tmp_path / "infer.yaml"
    manifest.write_text(yaml.safe_dump(wanted))
    answer = json.loads(
        cli(base, "place", "-f", str(manifest), "-n", namespace, "-o", "json").stdout
    )
    assert answer["outcome"] == "placed"
    chosen = answer["chosen"]["key"]
    assert chosen == "sim-runpod/a100-80gb/eu-ro-1"
    assert [c["offer"]["key"] for c in answer["candidates"]][:1] == [chosen]
    assert {r["offer"]["key"]: r["filter"] for r in answer["refused"]} == {
        "sim-modal/l40s/us-west": "gpu-model"
    }
    await client.CoreV1Api(kube).create_namespaced_pod(namespace, wanted)

    async def running() -> dict[str, Any] | None:
        pod = await api.get_pod(namespace, "infer")
        return pod if pod and (pod.get("status") or {}).get("phase") == "Running" else None

    pod = await wait_for(running, timeout=90, what="the pod Running")
    assert pod["metadata"]["annotations"]["vk-provider.io/offer"] == chosen

    # The existing pod, read through the API with the caller's kubeconfig.
    again = cli(base, "place", f"{namespace}/infer", "--kubeconfig", str(kubeconfig))
    assert again.stdout.startswith(f"pod {namespace}/infer ")
    assert "sim-runpod/a100-80gb/eu-ro-1" in again.stdout

    # The metrics, renamed, and the new families present now that a pod ran.
    async with httpx.AsyncClient(base_url=base) as http:
        exposition = (await http.get("/metrics")).text
    assert "vk_provider_provider_" not in exposition
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in exposition.splitlines()
        if line and not line.startswith("#")
    }
    assert samples['vk_provider_pod_start_duration_seconds_count{provider="sim-runpod"}'] == 1
    assert samples['vk_provider_workqueue_queue_duration_seconds_count{name="pods"}'] >= 1
    assert samples['vk_provider_workqueue_work_duration_seconds_count{name="pods"}'] >= 1
    assert samples['vk_provider_workqueue_adds_total{name="pods"}'] >= 1
    assert 'vk_provider_workqueue_depth{name="pods"}' in samples
    assert samples['vk_provider_instances{provider="sim-runpod",state="Running"}'] == 1
    assert samples['vk_provider_up{provider="sim-runpod"}'] == 1
    created = 'vk_provider_request_duration_seconds_count{operation="create",provider="sim-runpod"}'
    assert samples[created] == 1
    assert any(name.startswith("vk_provider_build_info{") for name in samples)
