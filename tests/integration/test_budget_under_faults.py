"""Budget caps hold on the provider side, live, while 30% of provider calls fail.

One ``local`` provider whose every call fails 30% of the time (and a tenth of its creates
work but lose their answer); 50 pods in two namespaces, one with a cap of its own, one under
the default cap, all under a global cap. Every half second the test lists what the provider
has (through its own ``LocalProvider`` on the same state directory) and adds up the $/h of
every instance that is not gone — starting, running, exited or terminating — per namespace
(by the pod UID the instance carries). No sample may pass a cap. Half-way, pods are deleted
in both namespaces, so the room of terminating instances is reused under the faults too.
With the faults off and the pods settled, ``/v1/spend`` reports what the provider bills.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from tests.conftest import fresh_namespace
from tests.helpers import wait_for
from tests.integration.agent_harness import (
    REST_TOKEN,
    AgentHarness,
    local_providers,
    pod_on,
)
from vk_provider.domain.models import InstanceState
from vk_provider.kube.client import KubeClient
from vk_provider_adapters.local.faults import set_faults

pytestmark = pytest.mark.integration
SLEEP = [sys.executable, "-c", "import time; time.sleep(3600)"]
PRICE = 1.0
GLOBAL_CAP, OWN_CAP, DEFAULT_CAP = 12.0, 8.0, 5.0
PODS_PER_NAMESPACE = 25


@pytest.fixture
async def other_namespace(kube: ApiClient) -> AsyncIterator[str]:
    async with fresh_namespace(kube) as name:
        yield name


async def test_caps_hold_at_the_provider_while_a_third_of_its_calls_fail(
    api: KubeClient,
    kube: ApiClient,
    namespace: str,
    other_namespace: str,
    agents: AgentHarness,
) -> None:
    capped, defaulted = namespace, other_namespace
    agent = agents.start(
        providers=[
            {
                "name": "flaky",
                "offers": [{"sku": "std", "price_per_hour": PRICE, "capacity": 100}],
            }
        ],
        budget={
            "global_per_hour": GLOBAL_CAP,
            "namespaces": {capped: OWN_CAP},
            "default_namespace_per_hour": DEFAULT_CAP,
        },
        intervals={"retry_backoff_seconds": 1, "retry_backoff_max_seconds": 4},
    )
    (provider,) = local_providers(agent)
    set_faults(agent.local_dir("flaky"), call_failure_rate=0.3)
    namespace_of: dict[str, str] = {}
    samples: list[dict[str, float]] = []
    violations: list[str] = []

    async def provider_side() -> dict[str, float] | None:
        try:
            listed = await provider.list_ours()
        except Exception:  # its own faults: this sample is skipped, the next one counts
            return None
        totals = {capped: 0.0, defaulted: 0.0, "": 0.0}
        for instance in listed:
            if instance.state is not InstanceState.TERMINATED:
                totals[namespace_of.get(instance.pod_uid, "")] += instance.price_per_hour
        return totals

    async def sample(stop: asyncio.Event) -> None:
        while not stop.is_set():
            totals = await provider_side()
            if totals is not None:
                samples.append(totals)
                everything = sum(totals.values())
                if everything > GLOBAL_CAP + 1e-9:
                    violations.append(f"${everything}/h alive > global cap {GLOBAL_CAP}")
                for ns, cap in ((capped, OWN_CAP), (defaulted, DEFAULT_CAP)):
                    if totals[ns] > cap + 1e-9:
                        violations.append(f"${totals[ns]}/h alive in {ns} > its cap {cap}")
            await asyncio.sleep(0.5)

    core = client.CoreV1Api(kube)

    async def create(ns: str, name: str) -> None:
        created = await core.create_namespaced_pod(
            ns, pod_on(agent.node, name, command=SLEEP, gpus=0, grace=2)
        )
        namespace_of[created.metadata.uid] = ns

    async def running(ns: str) -> list[str]:
        pods, _ = await api.list_node_pods(agent.node)
        return [
            p["metadata"]["name"]
            for p in pods
            if p["metadata"]["namespace"] == ns
            and (p.get("status") or {}).get("phase") == "Running"
        ]

    stop = asyncio.Event()
    sampler = asyncio.create_task(sample(stop))
    try:
        await asyncio.gather(
            *(create(ns, f"b-{i}") for ns in (capped, defaulted) for i in range(PODS_PER_NAMESPACE))
        )

        async def full() -> bool:
            return (
                len(await running(capped)) >= OWN_CAP - 1
                and len(await running(defaulted)) >= DEFAULT_CAP - 1
            )

        await wait_for(full, timeout=180, what="both namespaces near their caps")
        for ns in (capped, defaulted):  # room appears while the faults go on
            for name in (await running(ns))[:3]:
                await core.delete_namespaced_pod(name, ns)
        await asyncio.sleep(20)
        set_faults(agent.local_dir("flaky"), call_failure_rate=0.0)
        await wait_for(full, timeout=120, what="the freed room taken again")
    finally:
        stop.set()
        await sampler
    assert not violations, violations[:5]
    assert len(samples) >= 20  # it looked, often, and the caps were reached, not avoided
    assert max(s[capped] for s in samples) >= OWN_CAP - 1
    assert max(s[defaulted] for s in samples) >= DEFAULT_CAP - 1

    # Settled, with no faults: what the agent says is spent now is what the provider bills.
    async def url() -> str | None:
        return agent.rest_url()

    base = await wait_for(url, timeout=30, what="the REST API to listen")
    headers = {"Authorization": f"Bearer {REST_TOKEN}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=10) as http:

        async def agreed() -> tuple[float, float] | None:
            totals = await provider_side()
            spend: dict[str, Any] = (await http.get("/v1/spend")).json()
            reported = float(spend["total"]["per_hour"])
            if totals is None or abs(sum(totals.values()) - reported) > 1e-9:
                return None
            return reported, sum(totals.values())

        await wait_for(agreed, timeout=60, what="/v1/spend to equal what the provider bills")
