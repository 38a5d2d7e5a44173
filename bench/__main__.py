"""The whole benchmark in one run on a local control plane of its own; prints one table.

    flock /tmp/vk-cluster.lock .venv/bin/python -m bench [--pods 1000] [--rounds 3]
        [--large-pods 10000] [--large-rounds 3] [--burst-pods 200]

Against one API server (a ``LocalCluster`` named ``vk-bench`` under a temporary directory,
taken down at the end):

1. ``--rounds`` throughput rounds at ``--pods`` pods: the minimal client on aiohttp
   (``bench.raw``), KWOK with its fast stages, the agent with an in-memory provider, the agent
   with the ``local`` provider (``bench.subjects``) — in an order rotated each round; the
   agent's idle CPU holding the pods and its RSS;
2. the burst: ``--burst-pods`` pods bound at once to an agent with three in-memory providers
   whose instances take 5 s to start; until all are Running, and the creates it cost;
3. ``--large-rounds`` rounds at ``--large-pods`` pods: KWOK and the memory provider, rotated;
   idle CPU and RSS holding them; then a graceful deletion of all of them, timed;
4. freed slot → reuse, and outage → replacement, on two ``local`` providers;
5. placement (``bench.placement``, in process) and the local runner's start-up cost.

Between runs each run's namespace is deleted and waited for, so every run starts on the same
settled cluster. Every ratio is taken within a round and summarised as min / median / max
over the rounds (``bench.figures``); a target is met when the median meets it. Benchmarks,
not tests: nothing here asserts a speed (the smoke test only checks that the table is
printed at tiny sizes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
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
from bench.figures import Figure, Target, ratio, rotated, table
from bench.kube import Endpoint, check, pod_manifest, watch_pods
from bench.subjects import SLEEP, SUBJECTS, Measured, Subjects, local_provider, memory_provider
from vk_provider_adapters.local.faults import inject_loss
from vk_provider_adapters.local.launch import PACKAGE_ROOT, runner_command
from vk_provider_dev.cluster.binaries import ensure_binaries
from vk_provider_dev.cluster.cluster import LocalCluster

BURST_PROVIDERS = 3
BURST_START_SECONDS = 5.0


def _per_round(rounds: list[dict[str, Measured]], subject: str) -> list[Measured]:
    return [r[subject] for r in rounds if subject in r]


class Bench:
    def __init__(self, root: Path, cluster: LocalCluster, endpoint: Endpoint, pods: int) -> None:
        self.root = root
        self.cluster = cluster
        self.endpoint = endpoint
        self.pods = pods
        self.subjects = Subjects(root, cluster, endpoint)
        self.rows: list[tuple[str, str]] = []
        self.figures: list[Figure] = []
        self.slot_wait = 20.0

    def row(self, what: str, value: str) -> None:
        self.rows.append((what, value))
        print(f"  {what:<52} {value}", flush=True)

    def figure(
        self, name: str, values: list[float], unit: str = "", target: Target | None = None
    ) -> Figure:
        figure = Figure(name, unit, target, list(values))
        self.figures.append(figure)
        print(f"  {name:<60} {figure.spread():<34} {target or ''} {figure.verdict()}", flush=True)
        return figure

    def agent(self, name: str, providers: list[dict[str, Any]]) -> agentproc.Agent:
        return self.subjects.agent(name, providers)

    async def stop(self, client: httpx.AsyncClient, agent: agentproc.Agent, ns: str) -> None:
        await self.subjects.stop_agent(client, agent, ns)

    # --- 1 and 3. rounds ----------------------------------------------------------------

    async def rounds(
        self,
        client: httpx.AsyncClient,
        subjects: Sequence[str],
        *,
        count: int,
        rounds: int,
        label: str,
        deletion: bool = False,
    ) -> list[dict[str, Measured]]:
        """``rounds`` rounds of ``subjects`` at ``count`` pods, the order rotated each round."""
        taken: list[dict[str, Measured]] = []
        for index in range(rounds):
            order = rotated(list(subjects), index)
            print(f"{label} round {index + 1}/{rounds}: {', '.join(order)}", flush=True)
            measured: dict[str, Measured] = {}
            for subject in order:
                measured[subject] = await self.subjects.run(
                    client, subject, count=count, tag=f"{label}{index}", deletion=deletion
                )
                print(f"    {subject:<8} {runs.summary(measured[subject].result)}", flush=True)
            taken.append(measured)
        return taken

    def throughput_figures(self, rounds: list[dict[str, Measured]], count: int) -> None:
        """The figures of the rounds at ``count`` pods (the issue's targets at 1,000)."""

        def ratios(subject: str, anchor: str) -> list[float]:
            return [
                ratio(r[subject].result.throughput, r[anchor].result.throughput)
                for r in rounds
                if subject in r and anchor in r
            ]

        def p99(subject: str) -> list[float]:
            return [m.result.percentile(0.99) for m in _per_round(rounds, subject)]

        for subject in ("raw", "kwok", "memory", "local"):
            self.figure(
                f"{subject}: pods/s bind→Running ({count} pods)",
                [m.result.throughput for m in _per_round(rounds, subject)],
                " pods/s",
            )
        self.figure(
            f"memory vs KWOK throughput ({count})",
            ratios("memory", "kwok"),
            "x",
            Target(">=", 1.0, "x"),
        )
        self.figure(f"memory vs minimal client throughput ({count})", ratios("memory", "raw"), "x")
        self.figure(f"KWOK vs minimal client throughput ({count})", ratios("kwok", "raw"), "x")
        self.figure(
            f"memory p99 bind→Running ({count})", p99("memory"), " s", Target("<=", 1.0, " s")
        )
        self.figure(
            f"local vs minimal client throughput ({count})",
            ratios("local", "raw"),
            "x",
            Target(">=", 0.5, "x"),
        )
        self.figure(
            f"local p99 bind→Running ({count})", p99("local"), " s", Target("<=", 5.0, " s")
        )
        self.figure(f"minimal client p99 bind→Running ({count})", p99("raw"), " s")
        self.figure(f"KWOK p99 bind→Running ({count})", p99("kwok"), " s")
        memory = _per_round(rounds, "memory")
        self.figure(
            f"memory: agent CPU holding {count} pods, nothing changing",
            [m.idle_cpu * 100 for m in memory],
            "% of a core",
            Target("<=", 2.0, "%"),
        )
        self.figure(
            f"local: agent CPU holding {count} pods, nothing changing",
            [m.idle_cpu * 100 for m in _per_round(rounds, "local")],
            "% of a core",
        )
        self.figure(
            f"local: per-pod provider status reads while idle ({count} pods)",
            [m.idle_gets for m in _per_round(rounds, "local")],
            " per pod",
            Target("<=", 0.0),
        )
        self.figure(
            f"memory: agent RSS holding {count} pods",
            [m.result.rss_mib or math.nan for m in memory],
            " MiB",
            Target("<=", 110.0, " MiB"),
        )
        self.figure(
            f"KWOK RSS holding {count} pods",
            [m.result.rss_mib or math.nan for m in _per_round(rounds, "kwok")],
            " MiB",
        )
        self.figure(
            "memory: API writes per pod (pods, events)",
            [m.result.writes_per_pod for m in memory],
            "",
            Target("<=", 3.0),
        )
        for subject in ("raw", "kwok"):
            self.figure(
                f"{subject}: API writes per pod (pods, events)",
                [m.result.writes_per_pod for m in _per_round(rounds, subject)],
            )
        self.figure(
            "memory: API GETs per pod",
            [m.result.gets_per_pod for m in memory],
            "",
            Target("<=", 0.0),
        )
        for subject in ("raw", "kwok", "memory", "local"):
            self.figure(
                f"{subject}: CPU-seconds per pod",
                [
                    (m.result.cpu_seconds or math.nan) / m.result.pods
                    for m in _per_round(rounds, subject)
                ],
                " s",
            )
        self.figure(
            "memory: provider list calls per reconcile cycle (1 provider)",
            [m.lists_per_cycle for m in memory],
            "",
            Target("<=", 1.0),
        )

    def large_figures(self, rounds: list[dict[str, Measured]], count: int) -> None:
        memory, kwok = _per_round(rounds, "memory"), _per_round(rounds, "kwok")
        self.figure(
            f"memory vs KWOK throughput ({count})",
            [ratio(r["memory"].result.throughput, r["kwok"].result.throughput) for r in rounds],
            "x",
            Target(">=", 1.0, "x"),
        )
        self.figure(
            f"memory p99 bind→Running ({count})",
            [m.result.percentile(0.99) for m in memory],
            " s",
            Target("<=", 5.0, " s"),
        )
        self.figure(
            f"KWOK p99 bind→Running ({count})", [m.result.percentile(0.99) for m in kwok], " s"
        )
        self.figure(
            f"memory: agent CPU holding {count} pods, nothing changing",
            [m.idle_cpu * 100 for m in memory],
            "% of a core",
            Target("<=", 10.0, "%"),
        )
        self.figure(
            f"memory: agent RSS holding {count} pods",
            [m.result.rss_mib or math.nan for m in memory],
            " MiB",
            Target("<=", 250.0, " MiB"),
        )
        self.figure(
            f"memory: graceful deletion of {count} pods", [m.deletion_seconds for m in memory], " s"
        )
        self.figure(
            f"KWOK: graceful deletion of {count} pods", [m.deletion_seconds for m in kwok], " s"
        )
        self.figure(
            f"memory vs KWOK deletion time ({count})",
            [ratio(r["memory"].deletion_seconds, r["kwok"].deletion_seconds) for r in rounds],
            "x",
            Target("<=", 1.0, "x"),
        )

    # --- 2. the burst -------------------------------------------------------------------

    async def burst(self, client: httpx.AsyncClient, count: int, rounds: int) -> None:
        """``count`` pods bound at once to an agent with three in-memory providers whose
        instances take ``BURST_START_SECONDS`` to start, none able to take all of them."""
        share = count // BURST_PROVIDERS + 5
        slowest: list[float] = []
        creates: list[float] = []
        for index in range(rounds):
            providers = [
                memory_provider(
                    share,
                    f"burst{i}",
                    price=0.1 + i / 100,
                    offer={"startup_seconds": BURST_START_SECONDS},
                )
                for i in range(BURST_PROVIDERS)
            ]
            name = f"bench-burst-{index}"
            agent = self.agent(name, providers)
            try:
                before = agent.metrics()
                result = await self.subjects.measure(client, name, "burst", count, agent.pid)
                after = agent.metrics()
                slowest.append(result.percentile(1.0))
                creates.append(agentproc.operation_calls(before, after, "create") / count)
                print(f"    burst    {runs.summary(result)}", flush=True)
            finally:
                await self.stop(client, agent, name)
        self.figure(
            f"burst: {count} pods on {BURST_PROVIDERS} providers ({BURST_START_SECONDS:.0f} s "
            "start), slowest bind→Running",
            slowest,
            " s",
            Target("<=", 10.0, " s"),
        )
        self.figure("burst: provider creates per pod", creates, "", Target("<=", 1.0))

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
            body = pod_manifest(name, node, command=SLEEP, labels={"bench-run": "slot"})
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
    bench.subjects.idle_seconds = args.idle_seconds
    print(
        f"vk-provider bench: {args.rounds} rounds at {args.pods} pods, "
        f"{args.large_rounds} at {args.large_pods}, a burst of {args.burst_pods}",
        flush=True,
    )
    try:
        async with endpoint.client(connections=40) as client:
            subjects = [s for s in SUBJECTS if s != "local" or not args.skip_local]
            if args.rounds > 0:
                taken = await bench.rounds(
                    client, subjects, count=args.pods, rounds=args.rounds, label="r"
                )
                bench.throughput_figures(taken, args.pods)
                last = taken[-1]["memory"].result
                bench.row(
                    "memory: API calls per pod (pods, events), last round",
                    ", ".join(
                        f"{verb} {res}{'/' + sub if sub else ''} {n / last.pods:.2f}"
                        for (verb, res, sub), n in sorted(last.calls.items())
                    ),
                )
            if args.burst_pods > 0:
                await bench.burst(client, args.burst_pods, max(args.rounds, 1))
            if args.large_pods > 0 and args.large_rounds > 0:
                large = await bench.rounds(
                    client,
                    ["kwok", "memory"],
                    count=args.large_pods,
                    rounds=args.large_rounds,
                    label="l",
                    deletion=True,
                )
                bench.large_figures(large, args.large_pods)
            if not args.skip_recovery:
                await bench.recovery(client, args.outage_pods)
        from bench import placement

        speedup = placement.speedup(repeats=3)
        bench.row("place() vs single-pass baseline (500 offers)", f"{speedup:.2f}x decisions/s")
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
    lines = table(bench.figures)
    lines += ["", "| measure | figure |", "|---|---|"]
    lines += [f"| {what.strip()} | {value} |" for what, value in bench.rows]
    print("\nsummary")
    print("\n".join(lines), flush=True)
    return lines


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--pods", type=int, default=1000, help="pods per throughput run")
    parser.add_argument(
        "--rounds", type=int, default=3, help="throughput rounds, rotated (0: none)"
    )
    parser.add_argument(
        "--large-pods", type=int, default=10000, help="pods per large run (0: none)"
    )
    parser.add_argument("--large-rounds", type=int, default=3)
    parser.add_argument(
        "--burst-pods",
        type=int,
        default=200,
        help="pods bound at once to three providers (0: no burst)",
    )
    parser.add_argument("--outage-pods", type=int, default=50)
    parser.add_argument(
        "--slot-wait", type=float, default=20.0, help="how long a pod waits before a slot frees"
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=30.0,
        help="how long the agent's CPU is measured holding a run's pods, unchanged",
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
