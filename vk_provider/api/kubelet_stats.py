"""The kubelet API's ``/stats/summary`` and ``/metrics/resource``: CPU and memory figures.

Both render one :class:`Summary` (what the agent knows of usage now):

- ``/stats/summary`` is kubelet's ``stats/v1alpha1`` Summary: the node and, per pod, per
  container ``cpu`` (``time``, ``usageNanoCores``, ``usageCoreNanoSeconds``) and ``memory``
  (``time``, ``workingSetBytes``), with ``startTime``s.
- ``/metrics/resource`` is the Prometheus text that metrics-server reads
  (``pkg/kubelet/metrics/collectors/resource_metrics.go``): ``node_cpu_usage_seconds_total``,
  ``node_memory_working_set_bytes``, ``container_*`` and ``pod_*`` with labels ``container``,
  ``namespace``, ``pod``, ``container_start_time_seconds``, and ``resource_scrape_error``;
  samples carry their measurement time in milliseconds, as kubelet's do.

Invariants: pure functions of the Summary; a figure that is not known is left out (a pod whose
provider reports no usage does not appear; nothing is ever reported as zero for "unknown").
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from aiohttp import web

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Usage:
    """One measurement: cumulative CPU time, the working set, and (when two samples allow
    it) the CPU rate."""

    timestamp: datetime
    cpu_core_nanoseconds: int
    memory_working_set_bytes: int
    usage_nano_cores: int | None = None


@dataclass(frozen=True, slots=True)
class ContainerStats:
    name: str
    start_time: datetime | None
    usage: Usage


@dataclass(frozen=True, slots=True)
class PodStats:
    namespace: str
    name: str
    uid: str
    start_time: datetime | None
    containers: tuple[ContainerStats, ...]

    def usage(self) -> Usage | None:
        """The pod's total: sums of its containers, at the latest of their times."""
        if not self.containers:
            return None
        rates = [c.usage.usage_nano_cores for c in self.containers]
        return Usage(
            timestamp=max(c.usage.timestamp for c in self.containers),
            cpu_core_nanoseconds=sum(c.usage.cpu_core_nanoseconds for c in self.containers),
            memory_working_set_bytes=sum(c.usage.memory_working_set_bytes for c in self.containers),
            usage_nano_cores=None if None in rates else sum(r or 0 for r in rates),
        )


@dataclass(frozen=True, slots=True)
class Summary:
    node_name: str
    node_start_time: datetime
    node_usage: Usage | None
    pods: tuple[PodStats, ...]
    # Some provider's usage could not be read (its pods are missing from this summary).
    scrape_error: bool = False


class StatsSource(Protocol):
    async def summary(self) -> Summary:
        """Usage of the node and its pods now (pods whose providers report usage)."""
        ...


# --------------------------------------------------------------------------- /stats/summary


def _time(moment: datetime) -> str:
    # metav1.Time: RFC 3339 in UTC, whole seconds.
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cpu(usage: Usage) -> JSON:
    cpu: JSON = {"time": _time(usage.timestamp)}
    if usage.usage_nano_cores is not None:
        cpu["usageNanoCores"] = usage.usage_nano_cores
    cpu["usageCoreNanoSeconds"] = usage.cpu_core_nanoseconds
    return cpu


def _memory(usage: Usage) -> JSON:
    return {"time": _time(usage.timestamp), "workingSetBytes": usage.memory_working_set_bytes}


def summary_json(summary: Summary) -> JSON:
    node: JSON = {"nodeName": summary.node_name, "startTime": _time(summary.node_start_time)}
    if summary.node_usage is not None:
        node["cpu"] = _cpu(summary.node_usage)
        node["memory"] = _memory(summary.node_usage)
    pods = []
    for pod in summary.pods:
        item: JSON = {
            "podRef": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
        }
        if pod.start_time is not None:
            item["startTime"] = _time(pod.start_time)
        containers = []
        for container in pod.containers:
            entry: JSON = {"name": container.name}
            if container.start_time is not None:
                entry["startTime"] = _time(container.start_time)
            entry["cpu"] = _cpu(container.usage)
            entry["memory"] = _memory(container.usage)
            containers.append(entry)
        item["containers"] = containers
        total = pod.usage()
        if total is not None:
            item["cpu"] = _cpu(total)
            item["memory"] = _memory(total)
        pods.append(item)
    return {"node": node, "pods": pods}


# --------------------------------------------------------------------------- /metrics/resource


_HELP = {
    "node_cpu_usage_seconds_total": (
        "counter",
        "Cumulative cpu time consumed by the node in core-seconds",
    ),
    "node_memory_working_set_bytes": ("gauge", "Current working set of the node in bytes"),
    "container_cpu_usage_seconds_total": (
        "counter",
        "Cumulative cpu time consumed by the container in core-seconds",
    ),
    "container_memory_working_set_bytes": (
        "gauge",
        "Current working set of the container in bytes",
    ),
    "container_start_time_seconds": (
        "gauge",
        "Start time of the container since unix epoch in seconds",
    ),
    "pod_cpu_usage_seconds_total": (
        "counter",
        "Cumulative cpu time consumed by the pod in core-seconds",
    ),
    "pod_memory_working_set_bytes": ("gauge", "Current working set of the pod in bytes"),
    "resource_scrape_error": (
        "gauge",
        "1 if there was an error while getting container metrics, 0 otherwise",
    ),
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


Sample = tuple[dict[str, str], float, datetime | None]


def resource_metrics(summary: Summary) -> str:
    """The Prometheus text exposition of ``/metrics/resource``."""
    series: dict[str, list[Sample]] = {name: [] for name in _HELP}
    if summary.node_usage is not None:
        usage = summary.node_usage
        series["node_cpu_usage_seconds_total"].append(
            ({}, usage.cpu_core_nanoseconds / 1e9, usage.timestamp)
        )
        series["node_memory_working_set_bytes"].append(
            ({}, float(usage.memory_working_set_bytes), usage.timestamp)
        )
    for pod in summary.pods:
        for container in pod.containers:
            labels = {"container": container.name, "namespace": pod.namespace, "pod": pod.name}
            usage = container.usage
            if container.start_time is not None and container.start_time.timestamp() > 0:
                series["container_start_time_seconds"].append(
                    (labels, container.start_time.timestamp(), None)
                )
            series["container_cpu_usage_seconds_total"].append(
                (labels, usage.cpu_core_nanoseconds / 1e9, usage.timestamp)
            )
            series["container_memory_working_set_bytes"].append(
                (labels, float(usage.memory_working_set_bytes), usage.timestamp)
            )
        total = pod.usage()
        if total is not None:
            labels = {"namespace": pod.namespace, "pod": pod.name}
            series["pod_cpu_usage_seconds_total"].append(
                (labels, total.cpu_core_nanoseconds / 1e9, total.timestamp)
            )
            series["pod_memory_working_set_bytes"].append(
                (labels, float(total.memory_working_set_bytes), total.timestamp)
            )
    series["resource_scrape_error"].append(({}, 1.0 if summary.scrape_error else 0.0, None))
    return "".join(_render(name, samples) for name, samples in series.items() if samples)


def _render(name: str, samples: list[Sample]) -> str:
    kind, text = _HELP[name]
    lines = [f"# HELP {name} [STABLE] {text}", f"# TYPE {name} {kind}"]
    for labels, value, moment in samples:
        rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
        line = f"{name}{{{rendered}}}" if rendered else name
        line += f" {_number(value)}"
        if moment is not None:
            line += f" {_millis(moment)}"
        lines.append(line)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- routes


_SOURCE = web.AppKey("kubelet_stats_source", StatsSource)


def add_stats_routes(app: web.Application, source: StatsSource) -> None:
    app[_SOURCE] = source
    app.router.add_get("/stats/summary", _summary, allow_head=False)
    app.router.add_get("/metrics/resource", _resource, allow_head=False)


async def _summary(request: web.Request) -> web.StreamResponse:
    summary = await request.app[_SOURCE].summary()
    return web.Response(text=json.dumps(summary_json(summary)), content_type="application/json")


async def _resource(request: web.Request) -> web.StreamResponse:
    summary = await request.app[_SOURCE].summary()
    return web.Response(
        body=resource_metrics(summary).encode(),
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )
