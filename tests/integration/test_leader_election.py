"""Two replicas of one agent under pod churn: one leads, the other takes over when it dies.

Both replicas are real `vk-provider run` processes with the same configuration — the same
node name and the same `local` provider state directory, as two replicas of one Deployment
share their providers — against the real control plane, with the default election timings
(15 s lease, 10 s renew deadline, 2 s retry). While a Deployment on the node is scaled up
and down and its pods deleted, the leader is SIGKILLed (the follower must take over within
a lease duration and a retry period, keep the Node object, adopt what runs and launch no
duplicate), or frozen with SIGSTOP past the lease duration (woken up, it must find it lost
the lease, launch nothing and exit non-zero; restarted, it follows).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from tests.helpers import wait_for
from tests.integration.agent_harness import (
    TOLERATION,
    AgentHarness,
    AgentProcess,
    local_providers,
)
from vk_provider.domain.models import InstanceState
from vk_provider.kube.client import KubeClient
from vk_provider_dev.cluster.components import AUDITED_NAMESPACE

pytestmark = pytest.mark.integration

LEASE_NAMESPACE = AUDITED_NAMESPACE  # the agent's own ($POD_NAMESPACE, as the harness sets it)
LEASE_DURATION = 15
RETRY_PERIOD = 2
RENEWED_WITHIN = 5.0  # seconds from a restarted replica's start to its node Lease renewed
# A takeover waits one lease duration from the follower's last sight of a renewal, and is
# noticed on its next read: at most duration + retry period after the kill, plus the time a
# loaded 2-core machine takes to answer.
TAKEOVER_BOUND = LEASE_DURATION + RETRY_PERIOD + 3
LIVE = (InstanceState.PENDING, InstanceState.RUNNING)


@dataclass
class Observed:
    duplicates: list[tuple[float, str, list[str]]] = field(default_factory=list)
    samples: int = 0


def _deployment(node: str, replicas: int) -> dict[str, Any]:
    labels = {"app": "web"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "tolerations": [TOLERATION],
                    "terminationGracePeriodSeconds": 2,
                    "containers": [
                        {"name": "c", "image": "example.com/c:1", "command": ["sleep", "3600"]}
                    ],
                },
            },
        },
    }


async def _holder(api: KubeClient, node: str) -> str:
    lease = await api.get_lease(f"vk-provider-leader-{node}", namespace=LEASE_NAMESPACE)
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


async def _leader(api: KubeClient, replicas: list[AgentProcess]) -> AgentProcess:
    async def elected() -> AgentProcess | None:
        holder = await _holder(api, replicas[0].node)
        return next((r for r in replicas if r.pod_name == holder), None)

    return await wait_for(elected, timeout=60, what="a leader to be elected")


async def _node_ready(api: KubeClient, node: str) -> str:
    async def ready() -> str | None:
        found = await api.get_node(node)
        conditions = (found or {}).get("status", {}).get("conditions") or []
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            return str(found["metadata"]["uid"]) if found else None
        return None

    return await wait_for(ready, timeout=60, what="the node Ready")


async def _rest(agent: AgentProcess) -> str:
    async def url() -> str | None:
        return agent.rest_url()

    return await wait_for(url, timeout=30, what="the REST API to listen")


async def _watch_duplicates(agent: AgentProcess, seen: Observed, stop: asyncio.Event) -> None:
    """Sample the shared provider: never two live instances for one pod."""
    (provider,) = local_providers(agent)
    while not stop.is_set():
        with contextlib.suppress(Exception):
            per_pod: dict[str, list[str]] = {}
            for instance in await provider.list_ours():
                if instance.state in LIVE:
                    per_pod.setdefault(instance.pod_uid, []).append(instance.instance_id)
            seen.samples += 1
            for uid, ids in per_pod.items():
                if len(ids) > 1:
                    seen.duplicates.append((time.monotonic(), uid, ids))
        await asyncio.sleep(0.5)


async def _churn(apps: client.AppsV1Api, core: client.CoreV1Api, namespace: str) -> None:
    """Scale the Deployment between 3 and 6 replicas and delete a pod now and then."""
    rng = random.Random(15)
    while True:
        with contextlib.suppress(ApiException, OSError):
            await apps.patch_namespaced_deployment_scale(
                "web", namespace, {"spec": {"replicas": rng.randint(3, 6)}}
            )
        await asyncio.sleep(rng.uniform(1, 3))
        with contextlib.suppress(ApiException, OSError):
            pods = (await core.list_namespaced_pod(namespace, label_selector="app=web")).items
            if pods:
                victim = rng.choice(pods).metadata.name
                await core.delete_namespaced_pod(victim, namespace)
        await asyncio.sleep(rng.uniform(1, 3))


@contextlib.asynccontextmanager
async def _churning(
    kube: ApiClient, namespace: str, agent: AgentProcess, seen: Observed
) -> AsyncIterator[None]:
    apps, core = client.AppsV1Api(kube), client.CoreV1Api(kube)
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(_churn(apps, core, namespace)),
        asyncio.create_task(_watch_duplicates(agent, seen, stop)),
    ]
    try:
        yield
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _converged(
    kube: ApiClient, api: KubeClient, namespace: str, agent: AgentProcess, replicas: int
) -> dict[str, str]:
    """Scale to ``replicas`` and wait until each pod runs on exactly one instance and no
    instance runs for a pod that is gone; the pods' instance ids."""
    apps = client.AppsV1Api(kube)
    await apps.patch_namespaced_deployment_scale("web", namespace, {"spec": {"replicas": replicas}})
    (provider,) = local_providers(agent)

    async def settled() -> dict[str, str] | None:
        pods, _ = await api.list_node_pods(agent.node)
        mine = [p for p in pods if p["metadata"]["namespace"] == namespace]
        running = [
            p
            for p in mine
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]
        live = [i for i in await provider.list_ours() if i.state in LIVE]
        per_pod: dict[str, list[str]] = {}
        for instance in live:
            per_pod.setdefault(instance.pod_uid, []).append(instance.instance_id)
        uids = {p["metadata"]["uid"] for p in running}
        if len(running) != len(mine) or len(running) != replicas or set(per_pod) != uids:
            return None
        if any(len(ids) != 1 for ids in per_pod.values()):
            return None
        return {uid: ids[0] for uid, ids in per_pod.items()}

    return await wait_for(settled, timeout=120, interval=1, what=f"{replicas} pods Running")


async def _pair(agents: AgentHarness) -> tuple[AgentProcess, AgentProcess]:
    first = agents.start(providers=[{"name": "local-a", "offers": _offers()}])
    second = agents.replica(first)
    return first, second


def _offers() -> list[dict[str, Any]]:
    return [
        {
            "sku": "cpu",
            "gpu_count": 0,
            "vcpus": 4,
            "memory_gib": 8,
            "price_per_hour": 0.1,
            "capacity": 20,
        }
    ]


async def test_sigkill_of_the_leader_hands_over_without_duplicates_or_lost_pods(
    kube: ApiClient, api: KubeClient, agents: AgentHarness, namespace: str
) -> None:
    pair = await _pair(agents)
    leader = await _leader(api, list(pair))
    follower = next(r for r in pair if r is not leader)
    node_uid = await _node_ready(api, leader.node)

    # The follower is live, not ready, and says why; it serves no /v1 data of its own.
    async with httpx.AsyncClient(base_url=await _rest(follower), timeout=15) as http:
        assert (await http.get("/healthz")).status_code == 200

        async def says_follower() -> bool:
            answer = await http.get("/readyz")
            return answer.status_code == 503 and f"not the leader ({leader.pod_name} leads)" in (
                answer.text
            )

        await wait_for(says_follower, timeout=30, what="the follower's /readyz")
        headers = {"Authorization": "Bearer test-rest-token"}
        pods = await http.get("/v1/pods", headers=headers)
        assert pods.status_code == 503 and leader.pod_name in pods.text, pods.text
    assert "node " + leader.node + " registered" not in follower.log_text()

    await client.AppsV1Api(kube).create_namespaced_deployment(
        namespace, _deployment(leader.node, 4)
    )
    before = await _converged(kube, api, namespace, leader, 4)
    seen = Observed()
    async with _churning(kube, namespace, leader, seen):
        await asyncio.sleep(6)  # churn under the leader first
        assert leader.process is not None
        leader.process.send_signal(signal.SIGKILL)
        leader.process.wait()
        killed = time.monotonic()

        async def taken_over() -> bool:
            return await _holder(api, leader.node) == follower.pod_name

        await wait_for(taken_over, timeout=60, interval=0.2, what="the follower to take over")
        takeover = time.monotonic() - killed
        await asyncio.sleep(10)  # churn under the new leader
    print(f"takeover after SIGKILL: {takeover:.1f}s; duplicate samples: {seen.samples}")
    assert takeover <= TAKEOVER_BOUND, f"takeover took {takeover:.1f}s"

    after = await _converged(kube, api, namespace, follower, 5)
    assert await _node_ready(api, follower.node) == node_uid  # no second registration
    assert seen.samples > 20 and seen.duplicates == [], seen.duplicates
    # What ran before and survived the churn was adopted, never launched again.
    for uid in set(before) & set(after):
        assert after[uid] == before[uid], (uid, before[uid], after[uid])
    assert "lost the lease" not in follower.log_text()


async def test_a_frozen_leader_finds_it_lost_and_exits_without_launching(
    kube: ApiClient, api: KubeClient, agents: AgentHarness, namespace: str
) -> None:
    pair = await _pair(agents)
    leader = await _leader(api, list(pair))
    follower = next(r for r in pair if r is not leader)
    node_uid = await _node_ready(api, leader.node)
    await client.AppsV1Api(kube).create_namespaced_deployment(
        namespace, _deployment(leader.node, 4)
    )
    await _converged(kube, api, namespace, leader, 4)
    assert leader.process is not None
    seen = Observed()
    async with _churning(kube, namespace, leader, seen):
        leader.process.send_signal(signal.SIGSTOP)
        try:
            stopped = time.monotonic()

            async def taken_over() -> bool:
                return await _holder(api, leader.node) == follower.pod_name

            await wait_for(taken_over, timeout=60, interval=0.2, what="the follower to lead")
            takeover = time.monotonic() - stopped
            await asyncio.sleep(6)  # the new leader launches for the churn meanwhile
            log_before_wake = len(leader.log_text())
        finally:
            leader.process.send_signal(signal.SIGCONT)
        code = await asyncio.to_thread(leader.process.wait, 60)
        await asyncio.sleep(4)
    print(f"takeover after SIGSTOP: {takeover:.1f}s; the old leader exited {code}")
    assert takeover <= TAKEOVER_BOUND, f"takeover took {takeover:.1f}s"
    assert code != 0
    woken = leader.log_text()[log_before_wake:]
    assert "lost the lease" in woken, woken[-3000:]
    assert not re.search(r"started \S+ for pod", woken), woken  # the local provider's launch
    assert seen.duplicates == [], seen.duplicates

    # Restarted (same pod name, as a container restart keeps it), it follows.
    leader.start()
    async with httpx.AsyncClient(base_url=await _rest_after(leader, log_before_wake)) as http:

        async def follows() -> bool:
            answer = await http.get("/readyz")
            return answer.status_code == 503 and follower.pod_name in answer.text

        await wait_for(follows, timeout=30, what="the restarted replica to follow")
    assert await _holder(api, leader.node) == follower.pod_name
    await _converged(kube, api, namespace, follower, 4)
    assert await _node_ready(api, follower.node) == node_uid


async def _rest_after(agent: AgentProcess, offset: int) -> str:
    """The REST address the agent logged after ``offset`` (its restart binds a new port)."""

    async def url() -> str | None:
        text = agent.log_text()[offset:]
        marker = "REST API on "
        if marker not in text:
            return None
        host, port = text.rsplit(marker, 1)[1].split()[0].rsplit(":", 1)
        return f"http://{host}:{port}"

    return await wait_for(url, timeout=30, what="the restarted REST API")


async def _node_lease_renewed(api: KubeClient, node: str) -> str:
    lease = await api.get_lease(node, namespace="kube-node-lease")
    return str(((lease or {}).get("spec") or {}).get("renewTime") or "")


async def test_a_restarted_agent_takes_its_own_lease_back_at_once_and_nothing_goes_unready(
    kube: ApiClient, api: KubeClient, agents: AgentHarness, namespace: str
) -> None:
    """SIGKILLed and started again on the same state directory, outside a pod (no
    ``POD_NAME``: the identity kept there), the agent is the same replica: it renews its own
    election Lease at once instead of waiting a lease duration for its dead self, so the node
    Lease is renewed again well before the node controller would mark the node NotReady, and
    no pod on it turns Ready=False."""
    agent = agents.start(providers=[{"name": "local-a", "offers": _offers()}], env={"POD_NAME": ""})
    await _node_ready(api, agent.node)
    await client.AppsV1Api(kube).create_namespaced_deployment(namespace, _deployment(agent.node, 2))
    before = await _converged(kube, api, namespace, agent, 2)
    identity = await _holder(api, agent.node)
    assert identity and not identity.endswith("-0"), identity  # not the harness's POD_NAME

    unready: list[str] = []
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            node = await api.get_node(agent.node) or {}
            for condition in node.get("status", {}).get("conditions") or []:
                if condition["type"] == "Ready" and condition["status"] != "True":
                    unready.append(f"node {condition['status']}")
            pods, _ = await api.list_node_pods(agent.node)
            for pod in pods:
                for condition in pod.get("status", {}).get("conditions") or []:
                    if condition["type"] == "Ready" and condition["status"] != "True":
                        unready.append(f"pod {pod['metadata']['name']}")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)

    sampler = asyncio.create_task(sample())
    try:
        assert agent.process is not None
        agent.process.send_signal(signal.SIGKILL)
        agent.process.wait()
        last = await _node_lease_renewed(api, agent.node)
        agent.start()
        started = time.monotonic()

        async def renewed() -> bool:
            return await _node_lease_renewed(api, agent.node) > last

        await wait_for(renewed, timeout=60, interval=0.1, what="the node Lease renewed")
        elapsed = time.monotonic() - started
        after = await _converged(kube, api, namespace, agent, 2)
    finally:
        stop.set()
        await sampler
    print(f"node Lease renewed {elapsed:.1f}s after the restart")
    # Waiting for its own election Lease to expire would take a whole lease duration (15 s);
    # the same replica renews the node Lease within 5 s of its process starting (imports,
    # config, the election and the first renewal included).
    assert elapsed <= RENEWED_WITHIN, f"{elapsed:.1f}s"
    assert await _holder(api, agent.node) == identity
    assert unready == [], unready
    assert after == before  # adopted, not launched again
