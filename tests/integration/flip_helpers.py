"""Helpers of the overflow flip's end-to-end tests (test_flip_story, test_handover): samplers
of the overflow taint and of Ready inference replicas, offers, and the flip agent."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from tests.helpers import wait_for
from tests.integration.agent_harness import AgentHarness, AgentProcess
from vk_provider.kube.client import KubeClient
from vk_provider_dev.cluster.flip.stack import FlipComponents

KEY = "virtual-kubelet.io/provider"
PY = sys.executable
# An inference replica's command on the local provider: a server that only keeps running.
LOOP = "import time\nprint('serving', flush=True)\nwhile True: time.sleep(0.5)\n"


@dataclass
class Watch:
    """What the samplers saw: the overflow taint's effects, and Ready inference replicas."""

    effects: list[tuple[float, str | None]] = field(default_factory=list)
    ready: list[tuple[float, int]] = field(default_factory=list)
    sample_ready: bool = False

    def transitions(self) -> list[str | None]:
        changes: list[str | None] = []
        for _, effect in self.effects:
            if not changes or changes[-1] != effect:
                changes.append(effect)
        return changes


def is_ready(pod: dict[str, Any]) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


async def inference_pods(api: KubeClient, namespace: str) -> list[dict[str, Any]]:
    pods = await api.list_pods(namespace=namespace, label_selector="app=infer")
    return [p for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]


async def sample_flip(api: KubeClient, node: str, namespace: str, watch: Watch) -> None:
    while True:
        with contextlib.suppress(Exception):
            found = await api.get_node(node)
            taints = ((found or {}).get("spec") or {}).get("taints") or []
            effects = [t.get("effect") for t in taints if t.get("key") == KEY]
            watch.effects.append((time.monotonic(), ",".join(sorted(effects)) or None))
            if watch.sample_ready:
                ready = sum(1 for p in await inference_pods(api, namespace) if is_ready(p))
                watch.ready.append((time.monotonic(), ready))
        await asyncio.sleep(0.25)


async def node_events(raw: ApiClient, node: str) -> list[Any]:
    events = await client.CoreV1Api(raw).list_namespaced_event("default")
    return [e for e in events.items if e.involved_object.name == node]


async def taint_effect(api: KubeClient, node: str) -> str | None:
    found = await api.get_node(node)
    taints = ((found or {}).get("spec") or {}).get("taints") or []
    effects = [t["effect"] for t in taints if t.get("key") == KEY]
    return effects[0] if len(effects) == 1 else None


async def until_effect(api: KubeClient, node: str, effect: str, *, within: float) -> float:
    async def reached() -> bool:
        return await taint_effect(api, node) == effect

    await wait_for(reached, timeout=within, interval=0.2, what=f"overflow taint {effect}")
    return time.monotonic()


def an_offer(sku: str, *, gpus: int, price: float, capacity: int) -> dict[str, Any]:
    return {
        "sku": sku,
        "gpu_model": "A100-80GB",
        "gpu_count": gpus,
        "gpu_memory_gib": 80,
        "vcpus": 8,
        "memory_gib": 64,
        "price_per_hour": price,
        "capacity": capacity,
    }


def flip_agent(
    agents: AgentHarness,
    components: FlipComponents,
    offers: list[dict[str, Any]],
    *,
    close_after: float,
    log_level: str = "debug",
) -> AgentProcess:
    """The agent on one ``local`` provider with the flip on, reading the components'
    Prometheus every second, opening after 3 s of full own GPUs."""
    return agents.start(
        log_level=log_level,
        providers=[{"name": "cloud", "offers": offers}],
        overflow={
            "enabled": True,
            "prometheus": {"url": components.prometheus.url, "timeout_seconds": 2},
            "interval_seconds": 1,
            "open_after_seconds": 3,
            "close_after_seconds": close_after,
        },
    )


def create_object(components: FlipComponents, path: str, body: dict[str, Any]) -> None:
    components.api.create(path, body)


async def node_ready(api: KubeClient, node: str, agent: AgentProcess) -> None:
    async def ready() -> bool:
        if agent.process is not None and agent.process.poll() is not None:
            pytest.fail(f"agent exited:\n{agent.log_text()[-3000:]}")
        found = await api.get_node(node)
        for condition in ((found or {}).get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Ready":
                return bool(condition.get("status") == "True")
        return False

    await wait_for(ready, timeout=90, what=f"node {node} Ready")
