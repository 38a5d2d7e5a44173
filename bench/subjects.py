"""The subjects a throughput round measures, each on a node of its own, the same pods each.

- ``raw``: ``bench.raw``, the minimal client on the agent's HTTP stack (aiohttp);
- ``kwok``: KWOK v0.8.0 (the binary the project builds, ``vk-provider cluster binaries
  --flip``) with its *fast* stages, playing one node: the external anchor, a Go program
  whose whole job is to make pods Running;
- ``memory``: the real agent with an in-memory instant provider;
- ``local``: the real agent with the ``local`` provider (a runner process per pod).

Every subject gets a node of its own name per round (KWOK treats a node it managed before as
someone else's until that Lease expires) and a namespace of its own, deleted and waited for
after it, so each run starts on the same settled server. Each process runs only for its own
run: nothing of one subject watches the API server during another's.

``Subjects.run`` returns a ``Measured``: the ``runs.RunResult`` with the process's CPU and
RSS and, for the agent, its idle CPU and per-pod provider reads holding the pods and its
list calls per reconcile cycle; with ``deletion`` (KWOK, memory) the pods are then deleted
gracefully and the time until the last is gone is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import agentproc, runs
from bench.figures import ratio
from bench.kube import Endpoint, check, node_manifest
from bench.raw import LISTED
from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.flip.kwok import gpu_node, start_kwok
from vk_provider_dev.cluster.flip.tools import ensure_kwok

SLEEP = ["sleep", "100000"]
CPU_OFFER = {"sku": "cpu", "gpu_count": 0, "vcpus": 4, "memory_gib": 8}
SUBJECTS = ("raw", "kwok", "memory", "local")


def memory_provider(capacity: int, name: str = "mem", **extra: Any) -> dict[str, Any]:
    offer = {**CPU_OFFER, "price_per_hour": extra.pop("price", 0.1), "capacity": capacity}
    offer.update(extra.pop("offer", {}))
    return {"name": name, "type": "memory", "enabled": True, "offers": [offer], **extra}


def local_provider(name: str, price: float, capacity: int, **extra: Any) -> dict[str, Any]:
    offers = [{**CPU_OFFER, "price_per_hour": price, "capacity": capacity}]
    offers += extra.pop("more_offers", [])
    return {"name": name, "type": "local", "enabled": True, "offers": offers, **extra}


@dataclass(slots=True)
class Measured:
    """One subject's run: the throughput result and what was taken beside it."""

    result: runs.RunResult
    idle_cpu: float = math.nan  # share of one core holding the pods, nothing changing
    idle_gets: float = math.nan  # per-pod provider reads (get) per pod while idle
    lists_per_cycle: float = math.nan  # provider list calls per reconcile cycle, whole run
    deletion_seconds: float = math.nan


@dataclass(slots=True)
class Subjects:
    root: Path
    cluster: LocalCluster
    endpoint: Endpoint
    idle_seconds: float = 30.0

    def agent(self, name: str, providers: list[dict[str, Any]]) -> agentproc.Agent:
        agent = agentproc.start_agent(
            self.root / name,
            node=name,
            kubeconfig=self.cluster.kubeconfig,
            ca=self.cluster.pki.ca.cert,
            providers=providers,
        )
        try:
            agentproc.wait_until(
                lambda: agent.rest_url() or not agent.alive(),
                timeout=120,
                what="the agent's REST API",
            )
            if not agent.alive():
                raise RuntimeError(f"agent {name} exited:\n{agent.log_text()[-3000:]}")
        except BaseException:
            agent.stop()
            agentproc.reap_runners(self.root / name)
            raise
        return agent

    async def stop_agent(
        self, client: httpx.AsyncClient, agent: agentproc.Agent, namespace: str
    ) -> None:
        with contextlib.suppress(Exception):
            await runs.delete_pods(client, namespace, "bench-run")
            await runs.wait_pods_gone(client, namespace, "bench-run")
        agent.stop()
        agentproc.reap_runners(self.root / agent.node)
        await client.delete(f"/api/v1/nodes/{agent.node}")
        await runs.delete_namespace(client, namespace)

    async def measure(
        self, client: httpx.AsyncClient, node: str, run: str, count: int, pid: int
    ) -> runs.RunResult:
        """``runs.measure`` of ``count`` pods bound to ``node`` (its namespace has the node's
        name), the CPU and RSS those of process ``pid``."""
        return await runs.measure(
            client, node=node, namespace=node, count=count, run=run, command=SLEEP, pid=lambda: pid
        )

    async def run(
        self,
        client: httpx.AsyncClient,
        subject: str,
        *,
        count: int,
        tag: str,
        deletion: bool = False,
    ) -> Measured:
        """Measure ``subject`` (one of ``SUBJECTS``) with ``count`` pods; ``tag`` names the
        round (node and namespace names)."""
        if subject == "raw":
            return await self.raw(client, count=count, tag=tag)
        if subject == "kwok":
            return await self.kwok(client, count=count, tag=tag, deletion=deletion)
        if subject == "memory":
            return await self.memory(client, count=count, tag=tag, deletion=deletion)
        if subject == "local":
            return await self.local(client, count=count, tag=tag)
        raise ValueError(f"no subject {subject!r}; one of {', '.join(SUBJECTS)}")

    async def raw(self, client: httpx.AsyncClient, *, count: int, tag: str) -> Measured:
        node, namespace = f"bench-raw-{tag}", f"bench-raw-{tag}"
        raw = agentproc.Child(
            [sys.executable, "-m", "bench.raw", "--node", node, *self.endpoint.args()],
            self.root / f"{node}.log",
        )
        try:
            response = await client.post("/api/v1/nodes", json=node_manifest(node))
            if response.status_code != 409:
                await check(response)
            raw.start()
            # Started, imported and listing, as the agent and KWOK are before their runs.
            agentproc.wait_until(
                lambda: LISTED in raw.log_text() or not raw.alive(),
                timeout=60,
                what="the minimal client's first listing",
            )
            if not raw.alive():
                raise RuntimeError(f"bench.raw exited:\n{raw.log_text()[-3000:]}")
            result = await self.measure(client, node, "raw", count, raw.pid)
        finally:
            raw.stop()
            with contextlib.suppress(Exception):
                await runs.delete_pods(client, namespace, "bench-run")
            await client.delete(f"/api/v1/nodes/{node}")
            await runs.delete_namespace(client, namespace)
        return Measured(result)

    async def kwok(
        self, client: httpx.AsyncClient, *, count: int, tag: str, deletion: bool
    ) -> Measured:
        node, namespace = f"bench-kwok-{tag}", f"bench-kwok-{tag}"
        manifest = gpu_node(node, gpus=0, pods=count + 10, pool="bench")
        kwok = None
        try:
            await check(await client.post("/api/v1/nodes", json=manifest))
            kwok = start_kwok(
                ensure_kwok(),
                kubeconfig=self.cluster.kubeconfig,
                directory=self.root / node,
                pod_complete=False,
            )
            await _node_ready(client, node)
            result = await self.measure(client, node, "kwok", count, kwok.child.pid)
            measured = Measured(result)
            if deletion:
                measured.deletion_seconds = await runs.delete_gracefully(
                    client, node=node, namespace=namespace, run="kwok", count=count
                )
        finally:
            with contextlib.suppress(Exception):
                await runs.delete_pods(client, namespace, "bench-run")
                await runs.wait_pods_gone(client, namespace, "bench-run")
            if kwok is not None:
                kwok.stop()
            await client.delete(f"/api/v1/nodes/{node}")
            await runs.delete_namespace(client, namespace)
        return measured

    async def memory(
        self, client: httpx.AsyncClient, *, count: int, tag: str, deletion: bool
    ) -> Measured:
        providers = [memory_provider(count + 10)]
        return await self.agent_run(
            client, "mem", providers, count=count, tag=tag, deletion=deletion
        )

    async def local(self, client: httpx.AsyncClient, *, count: int, tag: str) -> Measured:
        providers = [local_provider("local-a", 0.1, count + 10)]
        return await self.agent_run(client, "local", providers, count=count, tag=tag)

    async def agent_run(
        self,
        client: httpx.AsyncClient,
        run: str,
        providers: list[dict[str, Any]],
        *,
        count: int,
        tag: str,
        deletion: bool = False,
    ) -> Measured:
        """The agent with ``providers``: ``count`` pods to Running, then idle, its RSS, its
        list calls per reconcile cycle, and with ``deletion`` a graceful deletion of them."""
        name = namespace = f"bench-{run}-{tag}"
        agent = self.agent(name, providers)
        try:
            before = agent.metrics()
            result = await self.measure(client, name, run, count, agent.pid)
            measured = await self.idle(agent, result)
            after = agent.metrics()
            measured.lists_per_cycle = ratio(
                agentproc.operation_calls(before, after, "list"),
                agentproc.reconcile_cycles(before, after),
            )
            result.rss_mib = agentproc.rss_mib(agent.pid)
            if deletion:
                measured.deletion_seconds = await runs.delete_gracefully(
                    client, node=name, namespace=namespace, run=run, count=count
                )
        finally:
            await self.stop_agent(client, agent, namespace)
        return measured

    async def idle(self, agent: agentproc.Agent, result: runs.RunResult) -> Measured:
        """What the agent costs holding the run's pods, nothing changing: its share of one
        core over ``idle_seconds`` and its per-pod provider reads then, after the status
        polls and reconcile cycles that follow the last start have run (6 s)."""
        await asyncio.sleep(6)
        before, cpu, started = agent.metrics(), agentproc.cpu_seconds(agent.pid), time.monotonic()
        await asyncio.sleep(self.idle_seconds)
        spent = agentproc.cpu_seconds(agent.pid) - cpu
        elapsed = time.monotonic() - started
        gets = agentproc.operation_calls(before, agent.metrics(), "get")
        return Measured(result, idle_cpu=spent / elapsed, idle_gets=gets / max(result.pods, 1))


async def _node_ready(client: httpx.AsyncClient, node: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while True:
        got = await client.get(f"/api/v1/nodes/{node}")
        if got.status_code == 200:
            conditions = (got.json().get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"KWOK did not make node {node} Ready in {within:.0f}s")
        await asyncio.sleep(0.2)
