"""Placement by price and capacity, failover, circuit breaking and budget caps, end to end.

Three `local` providers at different prices stand in for three clouds.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from tests.helpers import wait_for
from tests.integration.agent_harness import AgentHarness, AgentProcess, pod_on
from vk_provider.kube.client import KubeClient
from vk_provider_adapters.local.faults import set_faults

pytestmark = pytest.mark.integration
PY = sys.executable
SLEEP = [PY, "-c", "import time; time.sleep(3600)"]


def _provider(name: str, price: float, capacity: int, *, gpu: bool = True) -> dict[str, Any]:
    offer: dict[str, Any] = {"sku": "std", "price_per_hour": price, "capacity": capacity}
    if gpu:
        offer.update({"gpu_model": "A100-80GB", "gpu_count": 1, "gpu_memory_gib": 80})
    return {"name": name, "offers": [offer]}


THREE_CLOUDS = [_provider("cheap", 1.0, 2), _provider("mid", 2.0, 2), _provider("dear", 3.0, 4)]


async def _ready(api: KubeClient, agent: AgentProcess) -> None:
    async def ready() -> bool:
        node = await api.get_node(agent.node)
        conditions = ((node or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    await wait_for(ready, timeout=60, what="node Ready")


async def _pods(api: KubeClient, agent: AgentProcess, namespace: str) -> list[dict[str, Any]]:
    pods, _ = await api.list_node_pods(agent.node)
    return [p for p in pods if p["metadata"]["namespace"] == namespace]


def _running(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]


async def _create(
    kube: ApiClient, namespace: str, agent: AgentProcess, names: list[str], **kw: Any
) -> None:
    core = client.CoreV1Api(kube)
    await asyncio.gather(
        *(
            core.create_namespaced_pod(namespace, pod_on(agent.node, n, command=SLEEP, **kw))
            for n in names
        )
    )


async def _events(kube: ApiClient, namespace: str, reason: str) -> list[Any]:
    items = (await client.CoreV1Api(kube).list_namespaced_event(namespace)).items
    return [e for e in items if e.reason == reason]


async def test_cheapest_first_then_spill_over(
    api: KubeClient, kube: ApiClient, namespace: str, agents: AgentHarness
) -> None:
    agent = agents.start(providers=THREE_CLOUDS)
    await _ready(api, agent)
    # One by one, so each placement sees the previous one's capacity taken.
    for i in range(5):
        await _create(kube, namespace, agent, [f"p{i}"])

        async def placed(count: int = i + 1) -> bool:
            return len(_running(await _pods(api, agent, namespace))) == count

        await wait_for(placed, timeout=30, what=f"{i + 1} pods Running")
    providers = Counter(
        p["metadata"]["annotations"]["vk-provider.io/provider"]
        for p in await _pods(api, agent, namespace)
    )
    assert providers == {"cheap": 2, "mid": 2, "dear": 1}
    selected = await _events(kube, namespace, "ProviderSelected")
    assert any("placed on cheap" in e.message for e in selected)


async def test_five_pods_at_once_spread_over_offers_with_one_create_each(
    api: KubeClient, kube: ApiClient, namespace: str, agents: AgentHarness
) -> None:
    """Five pods created together on clouds with room for 2, 2 and 4: the creates under way
    count against their offer, so two go to the cheapest, two to the next and one to the
    third at once; no create is refused (no ProviderCreateFailed Warning)."""
    agent = agents.start(providers=THREE_CLOUDS)
    await _ready(api, agent)
    await _create(kube, namespace, agent, [f"p{i}" for i in range(5)])

    async def all_running() -> bool:
        return len(_running(await _pods(api, agent, namespace))) == 5

    await wait_for(all_running, timeout=60, what="5 pods Running")
    providers = Counter(
        p["metadata"]["annotations"]["vk-provider.io/provider"]
        for p in await _pods(api, agent, namespace)
    )
    assert providers == {"cheap": 2, "mid": 2, "dear": 1}
    assert not await _events(kube, namespace, "ProviderCreateFailed")
    made = [ln for ln in agent.log_text().splitlines() if "placed on" in ln]
    assert len(made) == 5, made  # one create each


async def test_a_failing_provider_is_avoided_and_its_breaker_opens(
    api: KubeClient, kube: ApiClient, namespace: str, agents: AgentHarness
) -> None:
    agent = agents.start(
        providers=THREE_CLOUDS,
        placement={"breaker_threshold": 2, "breaker_cooldown_seconds": 300},
    )
    await _ready(api, agent)
    set_faults(agent.local_dir("cheap"), create_failure_rate=1.0, create_error="transient")
    await _create(kube, namespace, agent, ["a", "b"])

    async def both_running() -> list[dict[str, Any]] | None:
        running = _running(await _pods(api, agent, namespace))
        return running if len(running) == 2 else None

    running = await wait_for(both_running, timeout=60, what="both pods Running elsewhere")
    assert {p["metadata"]["annotations"]["vk-provider.io/provider"] for p in running} == {"mid"}
    failures = await _events(kube, namespace, "ProviderCreateFailed")
    assert any("cheap" in e.message and "Transient" in e.message for e in failures)
    assert "circuit breaker of provider cheap opened" in agent.log_text()


async def test_max_price_below_every_offer_stays_pending_saying_why(
    api: KubeClient, kube: ApiClient, namespace: str, agents: AgentHarness
) -> None:
    agent = agents.start(providers=THREE_CLOUDS)
    await _ready(api, agent)
    await _create(
        kube,
        namespace,
        agent,
        ["frugal"],
        metadata={"annotations": {"vk-provider.io/max-price": "0.5"}},
    )

    async def event() -> Any:
        found = await _events(kube, namespace, "NoCapacity")
        return found[0] if found else None

    no_capacity = await wait_for(event, timeout=30, what="a NoCapacity event")
    assert "3 by price" in no_capacity.message
    pod = await api.get_pod(namespace, "frugal")
    assert pod is not None and pod["status"]["phase"] == "Pending"


async def test_budget_cap_holds_under_a_burst_and_frees_room(
    api: KubeClient, kube: ApiClient, namespace: str, agents: AgentHarness
) -> None:
    agent = agents.start(
        providers=[_provider("cpu-cloud", 1.0, 60, gpu=False)],
        budget={"global_per_hour": 10.0},
        intervals={"retry_backoff_seconds": 1},
    )
    await _ready(api, agent)
    names = [f"burst-{i}" for i in range(50)]
    await _create(kube, namespace, agent, names, gpus=0)

    async def spend() -> float:
        pods = await _pods(api, agent, namespace)
        return sum(
            float(p["metadata"].get("annotations", {}).get("vk-provider.io/price-per-hour", 0))
            for p in pods
            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        )

    async def ten_running() -> bool:
        return len(_running(await _pods(api, agent, namespace))) == 10

    await wait_for(ten_running, timeout=60, what="10 pods Running under the cap")
    for _ in range(10):  # the cap holds while the other 40 keep retrying
        assert await spend() <= 10.0 + 1e-9
        await asyncio.sleep(0.3)
    assert len(_running(await _pods(api, agent, namespace))) == 10
    assert await _events(kube, namespace, "BudgetExceeded")

    # Room appears: three pods go, three waiting ones are placed promptly.
    core = client.CoreV1Api(kube)
    gone = [p["metadata"]["name"] for p in _running(await _pods(api, agent, namespace))][:3]
    for name in gone:
        await core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    async def refilled() -> bool:
        running = [
            p
            for p in _running(await _pods(api, agent, namespace))
            if p["metadata"]["name"] not in gone
        ]
        return len(running) == 10

    await wait_for(refilled, timeout=30, what="waiting pods to take the freed budget")
    assert await spend() <= 10.0 + 1e-9


def _gpus(node: dict[str, Any] | None) -> tuple[int, str]:
    """The node's allocatable GPUs and the heartbeat of the status that says so."""
    status = (node or {}).get("status") or {}
    ready = [c for c in status.get("conditions") or [] if c["type"] == "Ready"]
    beat = ready[0].get("lastHeartbeatTime", "") if ready else ""
    return int((status.get("allocatable") or {}).get("nvidia.com/gpu", "0")), beat


async def test_scaling_past_what_the_providers_can_run_leaves_the_rest_pending_unbound(
    api: KubeClient, kube: ApiClient, namespace: str, agents: AgentHarness
) -> None:
    """One provider with room for 2; 2 pods run, then 4 more arrive at once. The node keeps
    saying 2 GPUs through placements, offer refreshes and an agent restart (its first status
    after the restart included), so the scheduler binds none of the 4: they stay Pending,
    Unschedulable, and no create is refused."""
    agent = agents.start(providers=[_provider("only", 1.0, 2)], intervals={"offers_ttl_seconds": 1})
    await _ready(api, agent)

    async def two_gpus() -> bool:
        return _gpus(await api.get_node(agent.node))[0] == 2

    await wait_for(two_gpus, timeout=60, what="allocatable 2 GPUs")
    await _create(kube, namespace, agent, ["run-0", "run-1"])

    async def both_running() -> bool:
        return len(_running(await _pods(api, agent, namespace))) == 2

    await wait_for(both_running, timeout=60, what="2 pods Running")
    extra = [f"more-{i}" for i in range(4)]
    await _create(kube, namespace, agent, extra)
    core = client.CoreV1Api(kube)

    async def unschedulable() -> bool:
        for name in extra:
            pod = await core.read_namespaced_pod(name, namespace)
            assert not pod.spec.node_name, f"{name} bound to {pod.spec.node_name}"
            scheduled = [c for c in pod.status.conditions or [] if c.type == "PodScheduled"]
            if not scheduled or scheduled[0].reason != "Unschedulable":
                return False
        return True

    await wait_for(unschedulable, timeout=60, what="the 4 extra pods Unschedulable")
    heartbeats: set[str] = set()

    async def three_statuses_later() -> bool:
        gpus, beat = _gpus(await api.get_node(agent.node))
        assert gpus == 2, f"allocatable {gpus} GPUs at {beat}"
        assert await unschedulable(), "an extra pod was scheduled"
        heartbeats.add(beat)
        return len(heartbeats) > 3

    # Status writes every 5 s, offers refreshed every second meanwhile.
    await wait_for(three_statuses_later, timeout=90, interval=0.2, what="3 more node statuses")

    assert agent.process is not None
    agent.process.kill()
    agent.process.wait(timeout=30)
    before = _gpus(await api.get_node(agent.node))[1]
    agent.start()
    heartbeats = {before}

    async def first_status_after_restart() -> bool:
        gpus, beat = _gpus(await api.get_node(agent.node))
        if beat in heartbeats:
            return False
        assert gpus == 2, f"the first status after the restart said {gpus} GPUs"
        return True

    await wait_for(first_status_after_restart, timeout=90, interval=0.1, what="a fresh status")
    heartbeats.clear()
    await wait_for(three_statuses_later, timeout=90, interval=0.2, what="3 more node statuses")
    assert not await _events(kube, namespace, "ProviderCreateFailed")
    assert not await _events(kube, namespace, "NoCapacity")
