"""The agent with an out-of-process provider: its only provider is ``type: grpc`` to the local
adapter served by `vk-provider plugin serve` in its own process (a Unix socket).

A pod runs to Running through the plugin and `kubectl logs` (and `-f`) read its output through
the kubelet API, the agent and the plugin. Then the plugin is SIGKILLed: that is a provider
outage (docs/operating.md "When a provider is down"): the breaker opens, the running pod stays
Running (no verdict on a pod while its provider cannot be asked), a new pod waits Pending.
When the plugin is back the breaker closes, the waiting pod runs, and the first pod still has
its instance.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from tests.helpers import wait_for
from tests.integration.agent_harness import (
    DEFAULT_OFFERS,
    REST_TOKEN,
    AgentHarness,
    AgentProcess,
    pod_on,
    reap_runners,
)
from tests.plugin_process import PluginProcess, local_entry
from vk_provider.kube.client import KubeClient
from vk_provider_adapters.local.adapter import LocalProvider
from vk_provider_adapters.local.config import LocalProviderConfig

pytestmark = pytest.mark.integration
PY = sys.executable
TICKER = [
    PY,
    "-c",
    "import time\nprint('hello through the plugin', flush=True)\n"
    "while True:\n    print('tick', flush=True)\n    time.sleep(0.5)\n",
]


@pytest.fixture
async def plugin(tmp_path: Path) -> AsyncIterator[PluginProcess]:
    """The local adapter served out of process; its instances are ended afterwards."""
    entry = local_entry("local-behind-grpc", tmp_path / "plugin-instances", DEFAULT_OFFERS)
    process = PluginProcess(
        entry=entry, root=tmp_path / "plugin", listen=f"unix://{tmp_path / 'plugin.sock'}"
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()
        local = LocalProvider(
            LocalProviderConfig.model_validate({"type": "local", **entry}),
            state_dir=tmp_path / "plugin-instances",
        )
        for instance in await local.list_ours():
            await local.delete(instance.instance_id, grace_seconds=0)
        await local.close()
        reap_runners(tmp_path)


def _kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(PY).parent / "kubectl"), "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def _pod(api: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    pod = await api.get_pod(namespace, name)
    assert pod is not None, f"pod {name} vanished"
    return pod


async def _phase(api: KubeClient, namespace: str, name: str, phase: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        pod = await _pod(api, namespace, name)
        return pod if (pod.get("status") or {}).get("phase") == phase else None

    return await wait_for(check, timeout=90, what=f"pod {name} {phase}")


async def _rest(agent: AgentProcess) -> str:
    async def url() -> str | None:
        if agent.process is not None and agent.process.poll() is not None:
            pytest.fail(f"agent exited {agent.process.returncode}:\n{agent.log_text()[-3000:]}")
        return agent.rest_url()

    return await wait_for(url, timeout=60, what="the REST API to listen")


async def test_a_pod_runs_through_a_grpc_plugin_and_a_dead_plugin_is_a_provider_outage(
    api: KubeClient,
    kube: ApiClient,
    namespace: str,
    agents: AgentHarness,
    kubeconfig: Path,
    plugin: PluginProcess,
) -> None:
    agent = agents.start(
        providers=[
            {"type": "grpc", "name": "plugged", "address": plugin.address, "timeout_seconds": 3}
        ],
        placement={"breaker_threshold": 2, "breaker_cooldown_seconds": 2},
    )
    base = await _rest(agent)
    core = client.CoreV1Api(kube)
    headers = {"Authorization": f"Bearer {REST_TOKEN}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=10) as http:

        async def breaker(state: str) -> bool:
            answer = await http.get("/v1/providers/plugged")
            return answer.status_code == 200 and answer.json()["breaker_state"] == state

        async def ready() -> bool:
            return (await http.get("/readyz")).status_code == 200

        await wait_for(ready, timeout=60, what="/readyz 200")
        await core.create_namespaced_pod(namespace, pod_on(agent.node, "first", command=TICKER))
        running = await _phase(api, namespace, "first", "Running")
        annotations = running["metadata"]["annotations"]
        assert annotations["vk-provider.io/provider"] == "plugged"
        instance_id = annotations["vk-provider.io/instance-id"]
        (status,) = running["status"]["containerStatuses"]
        assert status["ready"] is True and "running" in status["state"]

        # kubectl logs: the API server -> the agent's kubelet API -> gRPC -> the plugin.
        async def logged() -> str | None:
            done = await asyncio.to_thread(_kubectl, kubeconfig, "logs", "-n", namespace, "first")
            return done.stdout if "hello through the plugin" in done.stdout else None

        await wait_for(logged, timeout=30, what="kubectl logs through the plugin")
        follow = subprocess.Popen(
            [
                *(str(Path(PY).parent / "kubectl"), "--kubeconfig", str(kubeconfig)),
                *("logs", "-f", "--tail=0", "-n", namespace, "first"),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert follow.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(follow.stdout.readline), timeout=30)
            assert line.strip() == "tick"  # streamed: written after the read began
        finally:
            follow.kill()
            follow.wait()

        # ---- the plugin dies: a provider outage
        plugin.kill()
        await wait_for(lambda: breaker("open"), timeout=60, what="the breaker to open")
        await core.create_namespaced_pod(namespace, pod_on(agent.node, "second", command=TICKER))

        # While it is down: the running pod keeps running with its instance (no verdict
        # without an answer), the new one waits; checked after the breaker has probed the
        # dead plugin twice more (cool-down 2 s), many pod-status rounds later.
        async def failures() -> int:
            return int((await http.get("/v1/providers/plugged")).json()["consecutive_failures"])

        opened_with = await failures()

        async def probed_twice() -> bool:
            return await failures() >= opened_with + 2

        await wait_for(probed_twice, timeout=60, what="two more failed probes of the plugin")
        pod = await _pod(api, namespace, "first")
        assert pod["status"]["phase"] == "Running", pod["status"]
        assert pod["metadata"]["annotations"]["vk-provider.io/instance-id"] == instance_id
        waiting = await _pod(api, namespace, "second")
        assert waiting["status"].get("phase", "Pending") == "Pending"
        assert "vk-provider.io/instance-id" not in (waiting["metadata"].get("annotations") or {})
        problem = (await http.get("/v1/providers/plugged")).json()["last_error"]
        assert problem and "Transient" in problem and "plugin at unix://" in problem

        # ---- the plugin is back: the breaker closes, the waiting pod runs
        plugin.start()
        await wait_for(lambda: breaker("closed"), timeout=90, what="the breaker to close")
        await _phase(api, namespace, "second", "Running")
        pod = await _pod(api, namespace, "first")
        assert pod["status"]["phase"] == "Running"
        assert pod["metadata"]["annotations"]["vk-provider.io/instance-id"] == instance_id
        done = await asyncio.to_thread(
            _kubectl, kubeconfig, "logs", "-n", namespace, "first", "--tail=1"
        )
        assert done.returncode == 0 and done.stdout.strip() == "tick", done.stderr
