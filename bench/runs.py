"""One measured run: create pods bound to a node, watch them until Running, and count.

``measure`` is the same for the raw baseline and the agent: the driver creates ``count``
pods (``spec.nodeName`` set: bound at creation, at most ``create_concurrency`` creates in
flight), its own watch notes when each is first seen Running, and the API server's
``apiserver_request_total`` is read before and after. Throughput is pods per second from
the first create to the last Running; latency is per pod, from its create's answer to the
watch event that shows it Running. The driver's own calls (one create per pod, its list and
watch) are subtracted from the API counts, so what is left is the node agent's.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from bench.kube import JSON, check, diff, pod_manifest, request_counts, watch_pods


@dataclass
class RunResult:
    pods: int
    seconds: float
    latencies: list[float]
    calls: dict[tuple[str, str, str], float] = field(default_factory=dict)
    cpu_seconds: float | None = None
    rss_mib: float | None = None

    @property
    def throughput(self) -> float:
        return self.pods / self.seconds if self.seconds > 0 else 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def per_pod(self, verb: str, resource: str, subresource: str = "") -> float:
        return self.calls.get((verb, resource, subresource), 0.0) / max(self.pods, 1)

    @property
    def writes_per_pod(self) -> float:
        writes = ("POST", "PUT", "PATCH", "DELETE", "APPLY")
        total = sum(
            v
            for (verb, res, _), v in self.calls.items()
            if verb in writes and res in ("pods", "events")
        )
        return total / max(self.pods, 1)

    @property
    def gets_per_pod(self) -> float:
        return self.per_pod("GET", "pods")


async def ensure_namespace(client: httpx.AsyncClient, name: str) -> None:
    response = await client.post(
        "/api/v1/namespaces",
        json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
    )
    if response.status_code not in (201, 409):
        await check(response)
    # Pods are admitted only once the namespace's default ServiceAccount exists.
    deadline = time.monotonic() + 60
    while (await client.get(f"/api/v1/namespaces/{name}/serviceaccounts/default")).is_error:
        if time.monotonic() > deadline:
            raise RuntimeError(f"namespace {name} has no default ServiceAccount after 60s")
        await asyncio.sleep(0.2)


async def delete_pods(client: httpx.AsyncClient, namespace: str, selector: str) -> None:
    """Force-delete (grace 0) the namespace's pods matching ``selector``."""
    await check(
        await client.request(
            "DELETE",
            f"/api/v1/namespaces/{namespace}/pods",
            params={"labelSelector": selector, "gracePeriodSeconds": "0"},
        )
    )


async def delete_namespace(client: httpx.AsyncClient, name: str, within: float = 600) -> None:
    """Delete namespace ``name`` and wait until it is gone, its pods and Events with it, so
    the next run starts on a settled cluster (the namespace controller's clean-up of a
    thousand pods and their Events would otherwise run beside it)."""
    await client.delete(f"/api/v1/namespaces/{name}")
    deadline = time.monotonic() + within
    while (await client.get(f"/api/v1/namespaces/{name}")).status_code != 404:
        if time.monotonic() > deadline:
            raise RuntimeError(f"namespace {name} still there after {within:.0f}s")
        await asyncio.sleep(0.5)


async def wait_pods_gone(client: httpx.AsyncClient, namespace: str, selector: str) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        body = await check(
            await client.get(
                f"/api/v1/namespaces/{namespace}/pods",
                params={"labelSelector": selector, "limit": "1"},
            )
        )
        if not body.get("items"):
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"pods {selector} in {namespace} still there after 600s")


async def wait_watching(event: asyncio.Event, watch: asyncio.Task[None], seconds: float) -> None:
    """Wait for ``event``; raise what ended ``watch`` if it ended first (a crashed watch is
    reported as itself, not as a timeout), ``TimeoutError`` after ``seconds``."""
    waiter = asyncio.create_task(event.wait())
    try:
        done, _ = await asyncio.wait(
            {waiter, watch}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        waiter.cancel()
    if waiter in done:
        return
    if watch in done:
        watch.result()  # raises what ended it
        raise RuntimeError("the driver's watch ended")
    raise TimeoutError(f"not done after {seconds:.0f}s")


async def delete_gracefully(
    client: httpx.AsyncClient,
    *,
    node: str,
    namespace: str,
    run: str,
    count: int,
    grace_seconds: int = 30,
    delete_concurrency: int = 32,
    deadline_seconds: float = 900.0,
) -> float:
    """Delete the run's ``count`` pods (named as ``measure`` named them) with a grace period,
    one DELETE each with ``delete_concurrency`` in flight (as a ReplicaSet scaled down
    deletes), so the node agent must finish each: end its instance, then remove the pod.
    Returns the seconds from the first delete call to the last pod's removal, as the
    driver's watch saw it."""
    gone: set[str] = set()
    all_gone = asyncio.Event()

    async def watcher() -> None:
        async for kind, pod in watch_pods(client, node):
            meta = pod["metadata"]
            if meta.get("namespace") == namespace and kind == "DELETED":
                gone.add(meta["name"])
                if len(gone) >= count:
                    all_gone.set()

    gate = asyncio.Semaphore(delete_concurrency)

    async def delete(i: int) -> None:
        async with gate:
            response = await client.delete(
                f"/api/v1/namespaces/{namespace}/pods/{run}-{i:05d}",
                params={"gracePeriodSeconds": grace_seconds},
            )
            if response.status_code != 404:  # gone already: the watch has seen it
                await check(response)

    watch = asyncio.create_task(watcher())
    await asyncio.sleep(0.5)  # the watch is usually established before the first delete
    started = time.monotonic()
    try:
        await asyncio.gather(*(delete(i) for i in range(count)))
        deadline = started + deadline_seconds
        while True:
            # The watch may have listed after the first pods went, or re-listed past some
            # DELETED events: then the listing, polled, says when the last one went.
            with contextlib.suppress(TimeoutError):
                await wait_watching(all_gone, watch, 2.0)
                return time.monotonic() - started
            remaining = await check(
                await client.get(
                    f"/api/v1/namespaces/{namespace}/pods",
                    params={"labelSelector": f"bench-run={run}", "limit": "1"},
                )
            )
            if not remaining.get("items"):
                return time.monotonic() - started
            if time.monotonic() > deadline:
                raise TimeoutError(f"{run}: pods left {deadline_seconds:.0f}s after deletion")
    finally:
        watch.cancel()


async def measure(
    client: httpx.AsyncClient,
    *,
    node: str,
    namespace: str,
    count: int,
    run: str,
    command: list[str],
    pid: Callable[[], int | None] = lambda: None,
    create_concurrency: int = 32,
    deadline_seconds: float = 900.0,
    settle_seconds: float = 5.0,
) -> RunResult:
    from bench.agentproc import cpu_seconds, rss_mib  # /proc readers

    await ensure_namespace(client, namespace)
    created: dict[str, float] = {}
    running: dict[str, float] = {}
    all_running = asyncio.Event()

    async def watcher() -> None:
        async for kind, pod in watch_pods(client, node):
            meta = pod["metadata"]
            if (
                meta.get("namespace") != namespace
                or (meta.get("labels") or {}).get("bench-run") != run
            ):
                continue
            name = meta["name"]
            if kind != "DELETED" and (pod.get("status") or {}).get("phase") == "Running":
                running.setdefault(name, time.monotonic())
                if len(running) >= count:
                    all_running.set()

    before = await request_counts(client)
    process = pid()
    cpu_before = cpu_seconds(process) if process else None
    watch = asyncio.create_task(watcher())
    await asyncio.sleep(0.5)  # the watch is established before the first create
    gate = asyncio.Semaphore(create_concurrency)
    started = time.monotonic()

    async def create(i: int) -> None:
        name = f"{run}-{i:05d}"
        body: JSON = pod_manifest(name, node, command=command, labels={"bench-run": run})
        async with gate:
            await check(await client.post(f"/api/v1/namespaces/{namespace}/pods", json=body))
        created[name] = time.monotonic()

    try:
        await asyncio.gather(*(create(i) for i in range(count)))
        await wait_watching(all_running, watch, deadline_seconds)
    finally:
        watch.cancel()
    ended = max(running.values())
    # The agent writes Events after the statuses, at a kubelet's rate (events.qps): wait
    # until the last have landed before counting, so they are counted (throughput is taken
    # above, at the last Running).
    await asyncio.sleep(settle_seconds)
    after = await settled_counts(client)
    calls = diff(after, before)
    # The driver's own calls: one create per pod; its watch (and a list if it re-listed).
    calls[("POST", "pods", "")] = calls.get(("POST", "pods", ""), 0.0) - count
    calls = {k: v for k, v in calls.items() if v > 0 and k[1] in ("pods", "events")}
    result = RunResult(
        pods=count,
        seconds=ended - started,
        latencies=[running[n] - created[n] for n in running if n in created],
        calls=calls,
    )
    if process:
        result.cpu_seconds = cpu_seconds(process) - (cpu_before or 0.0)
        result.rss_mib = rss_mib(process)
    return result


async def settled_counts(
    client: httpx.AsyncClient, *, quiet_seconds: float = 3.0, within: float = 600.0
) -> dict[tuple[str, str, str], float]:
    """The API server's request counts once no Event was written for ``quiet_seconds``
    (polled each second, for at most ``within`` seconds: then as they are)."""
    counts = await request_counts(client)
    quiet_since = time.monotonic()
    deadline = quiet_since + within
    while time.monotonic() < deadline and time.monotonic() - quiet_since < quiet_seconds:
        await asyncio.sleep(1.0)
        latest = await request_counts(client)
        if _event_writes(latest) != _event_writes(counts):
            quiet_since = time.monotonic()
        counts = latest
    return counts


def _event_writes(counts: dict[tuple[str, str, str], float]) -> float:
    return sum(
        v
        for (verb, resource, _), v in counts.items()
        if resource == "events" and verb in ("POST", "PATCH", "PUT", "DELETE")
    )


def summary(result: RunResult) -> str:
    return (
        f"{result.throughput:8.1f} pods/s  p50 {result.percentile(0.5):6.2f}s  "
        f"p99 {result.percentile(0.99):6.2f}s  ({result.pods} pods in {result.seconds:.1f}s)"
    )


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
