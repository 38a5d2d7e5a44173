"""``/pods``, ``/runningpods/``, ``/stats/summary`` and ``/metrics/resource``: rendering, the
agent's sources behind them, and the routes over real TLS.

The sources are the agent's own (``AgentPods``, ``UsageCollector``, ``AgentStreams``) on a
real ``PodStore`` and ``InstanceTracker``; providers are small fakes with fixed usage.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.kubelet_harness import NODE, StartServer, pki, start_server
from vk_provider.api.kubelet import KubeletSources
from vk_provider.api.kubelet_agent import AgentPods, AgentStreams
from vk_provider.api.kubelet_stats import (
    ContainerStats,
    PodStats,
    Summary,
    Usage,
    resource_metrics,
    summary_json,
)
from vk_provider.api.nodestats import UsageCollector
from vk_provider.api.streaming import ContainerRef, StreamingRefused
from vk_provider.controllers.instances import InstanceTracker
from vk_provider.controllers.podwatch import PodStore
from vk_provider.domain.containers import ContainerState, ContainerStatus, ContainerUsage
from vk_provider.domain.errors import Transient
from vk_provider.domain.models import (
    Capabilities,
    Instance,
    InstanceState,
    LogOptions,
    Offer,
    WorkloadSpec,
)
from vk_provider_dev.cluster.pki import ClusterPKI

__all__ = ["pki", "start_server"]

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@dataclass
class FakeProvider:
    name: str
    capabilities: Capabilities = field(default_factory=Capabilities)
    usages: dict[str, list[ContainerUsage]] = field(default_factory=dict)
    failing: bool = False
    calls: list[str] = field(default_factory=list)

    async def offers(self) -> list[Offer]:
        return []

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        raise NotImplementedError

    async def get(self, instance_id: str) -> Instance:
        raise NotImplementedError

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        return None

    async def list_ours(self) -> list[Instance]:
        return []

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        yield b""

    async def close(self) -> None:
        return None

    async def usage(self, instance_id: str) -> list[ContainerUsage]:
        self.calls.append(instance_id)
        if self.failing:
            raise Transient("usage is down", provider=self.name)
        return self.usages.get(instance_id, [])


def pod(name: str, uid: str, *, containers: tuple[str, ...] = ("main",), **annotations: str):
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid,
            "resourceVersion": "7",
            "annotations": annotations,
        },
        "spec": {
            "nodeName": NODE,
            "initContainers": [{"name": "init", "image": "busybox"}],
            "containers": [{"name": c, "image": f"img/{c}:1"} for c in containers],
        },
        "status": {"phase": "Running", "startTime": "2026-01-02T03:00:00Z"},
    }


def instance(provider: str, instance_id: str, uid: str, **extra: object) -> Instance:
    fields: dict[str, object] = {"state": InstanceState.RUNNING, "attempt": 0, **extra}
    return Instance(provider=provider, instance_id=instance_id, pod_uid=uid, **fields)  # type: ignore[arg-type]


def running(name: str, started: datetime = T0) -> ContainerStatus:
    return ContainerStatus(name=name, state=ContainerState.RUNNING, started_at=started)


@dataclass
class World:
    store: PodStore
    tracker: InstanceTracker
    providers: dict[str, FakeProvider]


@pytest.fixture
def world() -> World:
    measured = FakeProvider("local-a", Capabilities(usage=True, exec=True, follow_logs=True))
    blind = FakeProvider("cloud-b", Capabilities(usage=False))
    providers = {"local-a": measured, "cloud-b": blind}
    store = PodStore()
    store.update(pod("web", "u-web", containers=("main", "side")))
    store.update(pod("gpu", "u-gpu", **{"vk-provider.io/provider": "cloud-b"}))
    tracker = InstanceTracker(providers, on_change=lambda _uid: None)
    tracker.remember(
        instance(
            "local-a",
            "local-u-web-0",
            "u-web",
            started_at=T0,
            containers=(
                running("main"),
                running("side"),
                ContainerStatus("x", ContainerState.WAITING),
            ),
        )
    )
    tracker.remember(instance("cloud-b", "gpu-1", "u-gpu", started_at=T0))
    tracker.remember(instance("cloud-b", "orphan-1", "u-gone"))
    tracker.remember(instance("cloud-b", "done-1", "u-gpu", state=InstanceState.EXITED))
    return World(store, tracker, providers)


# --------------------------------------------------------------------------- /pods, /runningpods


def test_pods_are_the_stores_as_a_pod_list(world: World) -> None:
    pods = AgentPods(world.store, world.tracker).bound_pods()
    assert sorted(p["metadata"]["name"] for p in pods) == ["gpu", "web"]


def test_running_pods_are_what_the_instances_say(world: World) -> None:
    running_pods = AgentPods(world.store, world.tracker).running_pods()
    by_name = {p.name: p for p in running_pods}
    assert set(by_name) == {"web", "gpu"}  # the orphan has no pod, the exited one does not run
    assert by_name["web"].containers == (("main", "img/main:1"), ("side", "img/side:1"))
    assert by_name["gpu"].containers == (("main", "img/main:1"),)  # one container = instance


async def test_pod_routes_serve_pod_lists(
    start_server: StartServer, pki: ClusterPKI, world: World
) -> None:
    api = await start_server(sources=KubeletSources(pods=AgentPods(world.store, world.tracker)))
    async with api.client(pki.kubelet_client) as client:
        pods = (await client.get("/pods")).json()
        running_pods = (await client.get("/runningpods/")).json()
        no_slash = await client.get("/runningpods")
    assert pods["kind"] == "PodList" and pods["apiVersion"] == "v1"
    assert [p["metadata"]["name"] for p in pods["items"]] == ["gpu", "web"]
    assert "kind" not in pods["items"][0]  # list items, as the API server encodes them
    assert pods["items"][1]["spec"]["containers"][1]["name"] == "side"
    assert running_pods["items"][1] == {
        "metadata": {"name": "web", "namespace": "ns", "uid": "u-web", "creationTimestamp": None},
        "spec": {
            "containers": [
                {"name": "main", "image": "img/main:1", "resources": {}},
                {"name": "side", "image": "img/side:1", "resources": {}},
            ]
        },
        "status": {},
    }
    assert no_slash.status_code == 200
    verbs = {(a.verb, a.subresource) for _, a in api.authorizer.calls}
    assert verbs == {("get", "proxy")}


# --------------------------------------------------------------------------- usage


def usage(name: str, cpu: int, memory: int, at: datetime) -> ContainerUsage:
    return ContainerUsage(name, cpu, memory, at)


async def test_usage_comes_from_providers_that_measure_it_only(world: World) -> None:
    clock = Clock()
    measured = world.providers["local-a"]
    measured.usages["local-u-web-0"] = [
        usage("main", 2_000_000_000, 5_000, T0),
        usage("side", 10, 7, T0),
    ]
    collector = UsageCollector(
        node_name=NODE, store=world.store, tracker=world.tracker, providers=world.providers,
        clock=clock,
    )  # fmt: skip
    summary = await collector.summary()
    assert [p.name for p in summary.pods] == ["web"]  # gpu's provider has no usage: left out
    assert world.providers["cloud-b"].calls == []
    [web] = summary.pods
    assert [c.name for c in web.containers] == ["main", "side"]
    assert web.containers[0].usage.usage_nano_cores is None  # one sample: no rate yet
    assert summary.node_usage == Usage(T0, 2_000_000_010, 5_007)

    # A second sample: rates, and the node counter grows by what the containers grew.
    later = T0 + timedelta(seconds=10)
    measured.usages["local-u-web-0"] = [
        usage("main", 7_000_000_000, 6_000, later),
        usage("side", 5, 7, later),  # a dip (a child reaped): the counter holds
    ]
    clock.now = later
    summary = await collector.summary()
    main, side = summary.pods[0].containers
    assert main.usage.usage_nano_cores == 500_000_000  # 5 s of CPU in 10 s: half a core
    assert side.usage.cpu_core_nanoseconds == 10 and side.usage.usage_nano_cores == 0
    assert summary.node_usage == Usage(later, 7_000_000_010, 6_007)


async def test_a_restarted_container_starts_a_new_counter(world: World) -> None:
    measured = world.providers["local-a"]
    collector = UsageCollector(
        node_name=NODE, store=world.store, tracker=world.tracker, providers=world.providers
    )
    measured.usages["local-u-web-0"] = [usage("main", 9_000, 1, T0)]
    await collector.summary()
    restarted = T0 + timedelta(seconds=5)
    world.tracker.remember(
        instance("local-a", "local-u-web-0", "u-web", containers=(running("main", restarted),))
    )
    measured.usages["local-u-web-0"] = [usage("main", 1_000, 1, restarted)]
    summary = await collector.summary()
    [main] = summary.pods[0].containers
    assert (main.start_time, main.usage.cpu_core_nanoseconds) == (restarted, 1_000)
    assert main.usage.usage_nano_cores is None
    assert summary.node_usage is not None and summary.node_usage.cpu_core_nanoseconds == 10_000


async def test_a_failing_provider_is_a_scrape_error_not_zeros(world: World) -> None:
    world.providers["local-a"].failing = True
    collector = UsageCollector(
        node_name=NODE, store=world.store, tracker=world.tracker, providers=world.providers
    )
    summary = await collector.summary()
    assert summary.pods == () and summary.scrape_error
    assert "resource_scrape_error 1" in resource_metrics(summary)


async def test_no_provider_with_usage_means_no_node_figures(world: World) -> None:
    del world.providers["local-a"]
    collector = UsageCollector(
        node_name=NODE, store=world.store, tracker=world.tracker, providers=world.providers
    )
    summary = await collector.summary()
    assert summary.node_usage is None and summary.pods == ()
    assert "cpu" not in summary_json(summary)["node"]


# --------------------------------------------------------------------------- rendering

SUMMARY = Summary(
    node_name=NODE,
    node_start_time=T0,
    node_usage=Usage(T0, 3_500_000_000, 300),
    pods=(
        PodStats(
            namespace="ns",
            name='we"ird',
            uid="u-1",
            start_time=T0,
            containers=(
                ContainerStats("main", T0, Usage(T0, 3_000_000_000, 200, 250_000_000)),
                ContainerStats("side", None, Usage(T0, 500_000_000, 100, 50_000_000)),
            ),
        ),
    ),
)


def test_the_summary_is_kubelets_stats_v1alpha1() -> None:
    document = summary_json(SUMMARY)
    assert document["node"] == {
        "nodeName": NODE,
        "startTime": "2026-01-02T03:04:05Z",
        "cpu": {"time": "2026-01-02T03:04:05Z", "usageCoreNanoSeconds": 3_500_000_000},
        "memory": {"time": "2026-01-02T03:04:05Z", "workingSetBytes": 300},
    }
    [item] = document["pods"]
    assert item["podRef"] == {"name": 'we"ird', "namespace": "ns", "uid": "u-1"}
    assert item["containers"][0]["cpu"]["usageNanoCores"] == 250_000_000
    assert "startTime" not in item["containers"][1]
    assert item["cpu"]["usageNanoCores"] == 300_000_000
    assert item["memory"]["workingSetBytes"] == 300


def test_resource_metrics_parse_as_prometheus_text_with_kubelets_names() -> None:
    text = resource_metrics(SUMMARY)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    # prometheus_client strips the _total of counters from family names.
    assert set(families) >= {
        "node_cpu_usage_seconds",
        "node_memory_working_set_bytes",
        "container_cpu_usage_seconds",
        "container_memory_working_set_bytes",
        "container_start_time_seconds",
        "pod_cpu_usage_seconds",
        "pod_memory_working_set_bytes",
        "resource_scrape_error",
    }
    [node_cpu] = families["node_cpu_usage_seconds"].samples
    assert node_cpu.value == 3.5 and node_cpu.timestamp == T0.timestamp()
    containers = {s.labels["container"]: s for s in families["container_cpu_usage_seconds"].samples}
    assert containers["main"].labels == {"container": "main", "namespace": "ns", "pod": 'we"ird'}
    assert containers["side"].value == 0.5
    [start] = families["container_start_time_seconds"].samples  # side has no start time
    assert start.value == T0.timestamp()
    [pod_memory] = families["pod_memory_working_set_bytes"].samples
    assert pod_memory.value == 300
    assert "# HELP container_cpu_usage_seconds_total [STABLE]" in text
    assert (
        'container_cpu_usage_seconds_total{container="main",namespace="ns",pod="we\\"ird"} 3 '
        in text
    )


async def test_stats_routes(start_server: StartServer, pki: ClusterPKI) -> None:
    class Fixed:
        async def summary(self) -> Summary:
            return SUMMARY

    api = await start_server(sources=KubeletSources(stats=Fixed()))
    async with api.client(pki.kubelet_client) as client:
        summary = await client.get("/stats/summary")
        metrics = await client.get("/metrics/resource")
    assert summary.json()["node"]["nodeName"] == NODE
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "node_memory_working_set_bytes 300" in metrics.text
    subresources = [a.subresource for _, a in api.authorizer.calls]
    assert subresources == ["stats", "metrics"]  # nodes/stats and nodes/metrics, as kubelet's


# --------------------------------------------------------------------------- streams: locating


def test_streams_find_the_instance_or_say_why_not(world: World) -> None:
    world.store.update(pod("web", "u-web", containers=("main", "side"),
                           **{"vk-provider.io/provider": "local-a",
                              "vk-provider.io/instance-id": "local-u-web-0"}))  # fmt: skip
    world.store.update(pod("gpu", "u-gpu", **{"vk-provider.io/provider": "cloud-b",
                                              "vk-provider.io/instance-id": "gpu-1"}))  # fmt: skip
    world.store.update(pod("new", "u-new"))
    streams = AgentStreams(world.store, world.providers, node_name=NODE)
    found = streams.locate(ContainerRef("ns", "web", "u-web", "side"), "exec")
    assert (found.provider.name, found.instance_id) == ("local-a", "local-u-web-0")
    found = streams.locate(ContainerRef("ns", "web", "", "init"), "attach")  # init containers too
    cases = [
        (ContainerRef("ns", "nope", "", "main"), "exec", 404, "pod does not exist"),
        (ContainerRef("ns", "web", "u-other", "main"), "exec", 404, "pod not found"),
        (ContainerRef("ns", "web", "", "db"), "exec", 404, "container db is not valid"),
        (ContainerRef("ns", "new", "", "main"), "exec", 400, "has not started"),
        (
            ContainerRef("ns", "gpu", "", "main"),
            "exec",
            501,
            "exec is not supported by provider cloud-b",
        ),
        (ContainerRef("ns", "gpu", ""), "port-forward", 501, "port-forward is not supported"),
    ]
    for ref, operation, status, message in cases:
        with pytest.raises(StreamingRefused) as refused:
            streams.locate(ref, operation)
        assert refused.value.status == status and message in refused.value.message, ref


async def test_the_stats_summary_of_an_agent_with_nothing_running(
    start_server: StartServer, pki: ClusterPKI
) -> None:
    store, providers = PodStore(), {"local-a": FakeProvider("local-a", Capabilities(usage=True))}
    tracker = InstanceTracker(providers, on_change=lambda _uid: None)
    collector = UsageCollector(node_name=NODE, store=store, tracker=tracker, providers=providers)
    api = await start_server(sources=KubeletSources(stats=collector))
    async with api.client(pki.kubelet_client) as client:
        document = json.loads((await client.get("/stats/summary")).text)
    assert document["pods"] == []
    assert document["node"]["memory"]["workingSetBytes"] == 0  # known: nothing runs here
