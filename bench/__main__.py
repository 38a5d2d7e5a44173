"""The whole benchmark in one run on a local control plane of its own; prints one table.

    flock /tmp/vk-cluster.lock .venv/bin/python -m bench [--pods 1000] [--rss-pods 10000]

In order, against one API server (a ``LocalCluster`` named ``vk-bench`` under a temporary
directory, taken down at the end):

1. the raw-client baseline (``bench.raw``): ``--pods`` pods bound to a node of its own;
2. the agent with an in-memory instant provider (``memory``): the same pods; its RSS idle
   and after them; provider list calls per reconcile cycle;
3. the agent with the ``local`` provider (a runner forked per pod): the same pods;
4. freed slot → reuse: a full offer, a pod waiting for it (long enough for its back-off to
   grow), one pod deleted; until the waiting pod runs;
5. outage → replacement: a 50-replica Deployment on a local provider whose instances are
   all lost at once; until 50 replacements run on the other provider;
6. the agent's RSS with ``--rss-pods`` pods Running (memory provider), last;
7. placement (``bench.placement``, in process) and the local runner's start-up cost.

Between the steps each run's namespace is deleted and waited for, so every throughput run
starts on the same settled cluster.

Ratios are against the baseline measured in the same run; absolute figures depend on the
machine. Benchmarks, not tests: nothing here asserts a speed (the smoke test only checks
that the table is printed at tiny sizes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench import agentproc, runs
from bench.kube import Endpoint, check, node_manifest, watch_pods
from vk_provider_adapters.local.faults import inject_loss
from vk_provider_adapters.local.launch import PACKAGE_ROOT, runner_command
from vk_provider_dev.cluster.binaries import ensure_binaries
from vk_provider_dev.cluster.cluster import LocalCluster

SLEEP = ["sleep", "100000"]
CPU_OFFER = {"sku": "cpu", "gpu_count": 0, "vcpus": 4, "memory_gib": 8}


def memory_provider(capacity: int) -> dict[str, Any]:
    offer = {**CPU_OFFER, "price_per_hour": 0.1, "capacity": capacity}
    return {"name": "mem", "type": "memory", "enabled": True, "offers": [offer]}


def local_provider(name: str, price: float, capacity: int, **extra: Any) -> dict[str, Any]:
    offers = [{**CPU_OFFER, "price_per_hour": price, "capacity": capacity}]
    offers += extra.pop("more_offers", [])
    return {"name": name, "type": "local", "enabled": True, "offers": offers, **extra}


class Bench:
    def __init__(self, root: Path, cluster: LocalCluster, endpoint: Endpoint, pods: int) -> None:
        self.root = root
        self.cluster = cluster
        self.endpoint = endpoint
        self.pods = pods
        self.rows: list[tuple[str, str]] = []
        self.slot_wait = 20.0
        self.idle_seconds = 30.0

    def row(self, what: str, value: str) -> None:
        self.rows.append((what, value))
        print(f"  {what:<52} {value}", flush=True)

    def agent(self, name: str, providers: list[dict[str, Any]]) -> agentproc.Agent:
        agent = agentproc.start_agent(
            self.root / name,
            node=name,
            kubeconfig=self.cluster.kubeconfig,
            ca=self.cluster.pki.ca.cert,
            providers=providers,
        )
        agentproc.wait_until(
            lambda: agent.rest_url() or not agent.alive(), timeout=120, what="the agent's REST API"
        )
        if not agent.alive():
            raise RuntimeError(f"agent {name} exited:\n{agent.log_text()[-3000:]}")
        return agent

    async def stop(self, client: httpx.AsyncClient, agent: agentproc.Agent, ns: str) -> None:
        with contextlib.suppress(Exception):
            await runs.delete_pods(client, ns, "bench-run")
            await runs.wait_pods_gone(client, ns, "bench-run")
        agent.stop()
        agentproc.reap_runners(self.root / agent.node)
        await client.delete(f"/api/v1/nodes/{agent.node}")
        await runs.delete_namespace(client, ns)

    # --- 1. the raw baseline ------------------------------------------------------------

    async def raw(self, client: httpx.AsyncClient) -> runs.RunResult:
        node = "bench-raw"
        response = await client.post("/api/v1/nodes", json=node_manifest(node))
        if response.status_code != 409:
            await check(response)
        raw = agentproc.Child(
            [sys.executable, "-m", "bench.raw", "--node", node, *self.endpoint.args()],
            self.root / "raw.log",
        )
        raw.start()
        try:
            result = await runs.measure(
                client,
                node=node,
                namespace="bench-raw",
                count=self.pods,
                run="raw",
                command=SLEEP,
                pid=lambda: raw.pid,
            )
        finally:
            raw.stop()
            await runs.delete_pods(client, "bench-raw", "bench-run")
            await client.delete(f"/api/v1/nodes/{node}")
            await runs.delete_namespace(client, "bench-raw")
        self.row("raw baseline: bind→Running", runs.summary(result))
        return result

    # --- 2. the memory provider ---------------------------------------------------------

    async def memory(self, client: httpx.AsyncClient, base: runs.RunResult) -> runs.RunResult:
        agent = self.agent("bench-mem", [memory_provider(self.pods + 10)])
        try:
            await asyncio.sleep(5)  # a few reconcile cycles: what idle means
            idle = agentproc.rss_mib(agent.pid)
            before = agent.metrics()
            result = await runs.measure(
                client,
                node=agent.node,
                namespace="bench-mem",
                count=self.pods,
                run="mem",
                command=SLEEP,
                pid=lambda: agent.pid,
            )
            await asyncio.sleep(6)  # the status polls and reconcile cycles of Running pods
            after = agent.metrics()
            # Idle: the pods Running, nothing changing; what the agent spends holding them.
            cpu_before, idle_started = agentproc.cpu_seconds(agent.pid), time.monotonic()
            await asyncio.sleep(self.idle_seconds)
            idle_cpu = (agentproc.cpu_seconds(agent.pid) - cpu_before) / (
                time.monotonic() - idle_started
            )
            self.row("memory provider: bind→Running", runs.summary(result))
            self.row("  throughput vs raw baseline", f"{result.throughput / base.throughput:.2f}x")
            self.report_calls(result, base)
            self.row("  agent CPU-seconds per pod", f"{(result.cpu_seconds or 0) / self.pods:.4f}")
            self.row(
                "  raw baseline CPU-seconds per pod", f"{(base.cpu_seconds or 0) / base.pods:.4f}"
            )
            self.row(
                f"  agent CPU holding {self.pods} pods, nothing changing",
                f"{idle_cpu * 100:.1f}% of a core (over {self.idle_seconds:.0f} s)",
            )
            self.row("  agent RSS idle", f"{idle:.0f} MiB")
            self.row(f"  agent RSS with {self.pods} pods Running", f"{result.rss_mib:.0f} MiB")
            cycles = after.get("vk_provider_reconcile_duration_seconds_count", 0) - before.get(
                "vk_provider_reconcile_duration_seconds_count", 0
            )
            lists = sum(
                v - before.get(k, 0)
                for k, v in after.items()
                if k.startswith("vk_provider_request_duration_seconds_count")
                and "[operation=list" in k
            )
            self.row(
                "  provider list calls per reconcile cycle (1 provider)",
                f"{lists / cycles:.2f}" if cycles else "no cycle",
            )
        finally:
            await self.stop(client, agent, "bench-mem")
        return result

    async def rss(self, client: httpx.AsyncClient, rss_pods: int) -> None:
        """The agent's RSS with ``rss_pods`` pods Running (memory provider): last, so the
        throughput runs before it all start on the same settled cluster."""
        agent = self.agent("bench-rss", [memory_provider(rss_pods + 10)])
        try:
            result = await runs.measure(
                client,
                node=agent.node,
                namespace="bench-rss",
                count=rss_pods,
                run="rss",
                command=SLEEP,
                pid=lambda: agent.pid,
                deadline_seconds=3600,
            )
            await asyncio.sleep(6)  # the status polls and reconcile cycles of Running pods
            self.row(
                f"agent RSS with {rss_pods} pods Running", f"{agentproc.rss_mib(agent.pid):.0f} MiB"
            )
            self.row(f"  ({rss_pods} pods: bind→Running)", runs.summary(result))
        finally:
            await self.stop(client, agent, "bench-rss")

    def report_calls(self, result: runs.RunResult, base: runs.RunResult) -> None:
        calls = ", ".join(
            f"{verb} {res}{'/' + sub if sub else ''} {count / result.pods:.2f}"
            for (verb, res, sub), count in sorted(result.calls.items())
        )
        self.row("  API calls per pod (pods, events)", calls)
        self.row(
            "  API writes / GETs per pod (agent)",
            f"{result.writes_per_pod:.2f} / {result.gets_per_pod:.2f}",
        )
        self.row(
            "  API writes / GETs per pod (raw baseline)",
            f"{base.writes_per_pod:.2f} / {base.gets_per_pod:.2f}",
        )

    # --- 3. the local provider ----------------------------------------------------------

    async def local(self, client: httpx.AsyncClient, base: runs.RunResult) -> runs.RunResult:
        agent = self.agent("bench-local", [local_provider("local-a", 0.1, self.pods + 10)])
        try:
            result = await runs.measure(
                client,
                node=agent.node,
                namespace="bench-local",
                count=self.pods,
                run="local",
                command=SLEEP,
                pid=lambda: agent.pid,
            )
            self.row("local provider: bind→Running", runs.summary(result))
            self.row("  throughput vs raw baseline", f"{result.throughput / base.throughput:.2f}x")
            self.row("  agent CPU-seconds per pod", f"{(result.cpu_seconds or 0) / self.pods:.4f}")
        finally:
            await self.stop(client, agent, "bench-local")
        return result

    # --- 4 and 5. freed slot, outage ----------------------------------------------------

    async def recovery(self, client: httpx.AsyncClient, replicas: int) -> None:
        slot = {
            "sku": "slot",
            "gpu_model": "L4",
            "gpu_count": 1,
            "gpu_memory_gib": 24,
            "vcpus": 4,
            "memory_gib": 16,
            "price_per_hour": 0.5,
            "capacity": 2,
        }
        agent = self.agent(
            "bench-recovery",
            [
                local_provider("cheap", 0.1, replicas + 5, more_offers=[slot]),
                local_provider("other", 0.2, replicas + 5),
            ],
        )
        ns = "bench-recovery"
        try:
            await runs.ensure_namespace(client, ns)
            await self.freed_slot(client, agent.node, ns)
            await self.outage(client, agent, ns, replicas)
        finally:
            with contextlib.suppress(Exception):
                await client.delete(f"/apis/apps/v1/namespaces/{ns}/deployments/outage")
            await self.stop(client, agent, ns)
            with contextlib.suppress(Exception):
                await runs.delete_pods(client, ns, "app=outage")

    async def freed_slot(self, client: httpx.AsyncClient, node: str, ns: str) -> None:
        base = "/api/v1/namespaces/" + ns + "/pods"
        names = [f"slot-{i}" for i in range(3)]
        for name in names:
            body = runs.pod_manifest(name, node, command=SLEEP, labels={"bench-run": "slot"})
            body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
            body["metadata"]["annotations"] = {"vk-provider.io/gpu": "L4"}
            await check(await client.post(base, json=body))

        async def phases() -> dict[str, str]:
            got = await check(await client.get(base, params={"labelSelector": "bench-run=slot"}))
            return {p["metadata"]["name"]: p["status"].get("phase", "") for p in got["items"]}

        deadline = time.monotonic() + 120
        while sum(p == "Running" for p in (await phases()).values()) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the slot offer's two pods did not run")
            await asyncio.sleep(0.2)
        waiting = next(n for n, p in (await phases()).items() if p != "Running")
        await asyncio.sleep(self.slot_wait)  # the waiting pod's back-off grows (5 s, 10 s, ...)
        victim = next(n for n, p in (await phases()).items() if p == "Running")
        freed = time.monotonic()
        await check(await client.delete(f"{base}/{victim}"))
        while (await phases()).get(waiting) != "Running":
            if time.monotonic() - freed > 300:
                raise RuntimeError("the freed slot was not reused in 300 s")
            await asyncio.sleep(0.05)
        reused = time.monotonic() - freed
        self.row(
            f"freed slot → reused (pod waited {self.slot_wait:.0f} s first)", f"{reused:.2f} s"
        )

    async def outage(
        self, client: httpx.AsyncClient, agent: agentproc.Agent, ns: str, replicas: int
    ) -> None:
        labels = {"app": "outage", "bench-run": "outage"}
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "outage"},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "outage"}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": agent.node},
                        "terminationGracePeriodSeconds": 0,
                        "tolerations": [
                            {"key": "virtual-kubelet.io/provider", "operator": "Exists"}
                        ],
                        "containers": [{"name": "app", "image": "bench", "command": SLEEP}],
                    },
                },
            },
        }
        await check(
            await client.post(f"/apis/apps/v1/namespaces/{ns}/deployments", json=deployment)
        )
        running: dict[str, str] = {}  # pod name -> provider, while Running and not failed

        async def watcher() -> None:
            async for kind, pod in watch_pods(client, agent.node):
                meta = pod["metadata"]
                if (meta.get("labels") or {}).get("app") != "outage":
                    continue
                phase = (pod.get("status") or {}).get("phase")
                if kind == "DELETED" or phase != "Running" or meta.get("deletionTimestamp"):
                    running.pop(meta["name"], None)
                else:
                    running[meta["name"]] = (meta.get("labels") or {}).get(
                        "vk-provider.io/provider", "?"
                    )

        watch = asyncio.create_task(watcher())
        try:
            deadline = time.monotonic() + 300
            while sum(p == "cheap" for p in running.values()) < replicas:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{replicas} outage pods did not run on 'cheap'")
                await asyncio.sleep(0.1)
            lost = list(running)
            state_dir = agent.provider_dirs["cheap"]
            instances = [d.name for d in state_dir.iterdir() if d.name.startswith("local-")]
            started = time.monotonic()
            for instance in instances:
                with contextlib.suppress(FileNotFoundError):
                    inject_loss(state_dir, instance, "bench: the provider lost it")
            while sum(1 for n in running if n not in lost) < replicas:
                if time.monotonic() - started > 300:
                    raise RuntimeError("the outage was not replaced in 300 s")
                await asyncio.sleep(0.05)
            replaced = time.monotonic() - started
            where = sorted({p for n, p in running.items() if n not in lost})
            self.row(f"outage of {replicas} pods → all replaced", f"{replaced:.2f} s (on {where})")
        finally:
            watch.cancel()


def runner_start_seconds(argv: Sequence[str], repeats: int = 9) -> float:
    """Median wall time of ``argv`` (a runner start that only prints its usage)."""
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        subprocess.run(argv, cwd=PACKAGE_ROOT, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - began)
    return runs.median(times)


async def run(args: argparse.Namespace, root: Path) -> None:
    """Start a control plane of the benchmark's own, measure on it, take it down."""
    cluster = LocalCluster("vk-bench", root=root / "cluster")
    cluster.up(ensure_binaries())
    try:
        await measure_on(cluster, args, root)
    finally:
        cluster.down()
        agentproc.reap_runners(root)


async def measure_on(cluster: LocalCluster, args: argparse.Namespace, root: Path) -> list[str]:
    """Every measurement on ``cluster`` (running); the summary table's lines."""
    server = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    endpoint = Endpoint(server, cluster.pki.ca.cert, cluster.pki.admin.cert, cluster.pki.admin.key)
    bench = Bench(root, cluster, endpoint, args.pods)
    bench.slot_wait = args.slot_wait
    bench.idle_seconds = args.idle_seconds
    print(f"vk-provider bench: {args.pods} pods, RSS at {args.rss_pods}", flush=True)
    try:
        async with endpoint.client(connections=40) as client:
            base = await bench.raw(client)
            await bench.memory(client, base)
            if not args.skip_local:
                await bench.local(client, base)
            if not args.skip_recovery:
                await bench.recovery(client, args.outage_pods)
            if args.rss_pods > 0:
                await bench.rss(client, args.rss_pods)
        from bench import placement

        ratio = placement.speedup(repeats=3)
        bench.row("place() vs single-pass baseline (500 offers)", f"{ratio:.2f}x decisions/s")
        launched = [*runner_command(Path("x"), startup_seconds=0)[:4], "--help"]
        plain = [sys.executable, "-m", "vk_provider_adapters.local.runner", "--help"]
        bench.row(
            "local runner start, as launched (-S)",
            f"{runner_start_seconds(launched) * 1000:.0f} ms",
        )
        bench.row(
            "local runner start with site packages (-m)",
            f"{runner_start_seconds(plain) * 1000:.0f} ms",
        )
    finally:
        agentproc.reap_runners(root)
    lines = [f"| {what.strip()} | {value} |" for what, value in bench.rows]
    print("\nsummary\n| measure | figure |\n|---|---|")
    print("\n".join(lines), flush=True)
    return lines


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--pods", type=int, default=1000, help="pods per throughput run")
    parser.add_argument("--rss-pods", type=int, default=10000, help="pods for the RSS figure")
    parser.add_argument("--outage-pods", type=int, default=50)
    parser.add_argument(
        "--slot-wait", type=float, default=20.0, help="how long a pod waits before a slot frees"
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=30.0,
        help="how long the agent's CPU is measured holding the memory run's pods, unchanged",
    )
    parser.add_argument("--skip-local", action="store_true")
    parser.add_argument("--skip-recovery", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vk-bench-") as tmp:
        asyncio.run(run(args, Path(tmp)))


if __name__ == "__main__":
    main()
