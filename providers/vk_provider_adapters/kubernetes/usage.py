"""Usage of a remote pod from B's ``metrics.k8s.io`` (metrics-server's ``PodMetrics``).

Why ``metrics.k8s.io`` and not B's ``/api/v1/nodes/<node>/proxy/stats/summary``: reading a
node's summary through the API server needs ``get nodes/proxy``, which is every kubelet
endpoint of every node (exec into any pod included); ``PodMetrics`` needs ``get`` on
``pods.metrics.k8s.io`` in the adapter's own namespace, read-only. The price: B must run
metrics-server (without it, or before its first scrape, a pod has no usage and is left out
of A's ``/stats/summary``, never reported as zero).

``PodMetrics`` carries a CPU *rate* (``usage.cpu`` over ``window``, ending at ``timestamp``)
and the working set; a kubelet's summary carries cumulative CPU time. ``CpuCounter`` turns
the rates into a counter: the first sample counts its window's CPU time, each later one the
rate times the time since the previous sample. Its rate is metrics-server's; its origin is
the agent's first sample, so the total is not the container's lifetime CPU. Pure.

Invariants: a counter never goes down; a sample not newer than the last adds nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from vk_provider.sdk import parse_quantity
from vk_provider_adapters.payload import MalformedResponse

METRICS_API = "/apis/metrics.k8s.io/v1beta1"


def pod_metrics_path(namespace: str, name: str) -> str:
    return f"{METRICS_API}/namespaces/{namespace}/pods/{name}"


@dataclass(frozen=True, slots=True)
class ContainerSample:
    name: str
    nanocores: int
    memory_bytes: int


@dataclass(frozen=True, slots=True)
class PodSample:
    timestamp: datetime
    window_seconds: float
    containers: tuple[ContainerSample, ...]


def parse_pod_metrics(body: object) -> PodSample:
    """A ``PodMetrics`` object; ``MalformedResponse`` naming the field when it is not one."""
    if not isinstance(body, Mapping):
        raise MalformedResponse("PodMetrics: not an object")
    stamp = body.get("timestamp")
    try:
        timestamp = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        raise MalformedResponse("PodMetrics.timestamp: not a time") from None
    window = _seconds(body.get("window"))
    containers = []
    for index, entry in enumerate(body.get("containers") or ()):
        where = f"PodMetrics.containers[{index}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("usage"), Mapping):
            raise MalformedResponse(f"{where}: not a container's usage")
        usage = entry["usage"]
        try:
            cpu = parse_quantity(str(usage.get("cpu", "0")))
            memory = parse_quantity(str(usage.get("memory", "0")))
        except ValueError:
            raise MalformedResponse(f"{where}.usage: not a quantity") from None
        containers.append(
            ContainerSample(
                name=str(entry.get("name", "")),
                nanocores=max(0, int(cpu * 1_000_000_000)),
                memory_bytes=max(0, int(memory)),
            )
        )
    return PodSample(timestamp, window, tuple(containers))


def _seconds(window: object) -> float:
    """A Go duration as metrics-server writes it (``15s``, ``1m0s``, ``10.5s``); 0 if absent."""
    text = str(window or "")
    total, number = 0.0, ""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    index = 0
    while index < len(text):
        char = text[index]
        if char.isdigit() or char == ".":
            number += char
            index += 1
            continue
        unit = "ms" if text.startswith("ms", index) else char
        if unit not in units or not number:
            raise MalformedResponse("PodMetrics.window: not a duration")
        total += float(number) * units[unit]
        number = ""
        index += len(unit)
    if number:
        raise MalformedResponse("PodMetrics.window: not a duration")
    return total


@dataclass(frozen=True, slots=True)
class CpuCounter:
    """Cumulative CPU nanoseconds of one container run, as of ``at`` (module docstring)."""

    at: datetime
    total: int


def advance(
    previous: CpuCounter | None, *, nanocores: int, at: datetime, window_seconds: float
) -> CpuCounter:
    if previous is None:
        return CpuCounter(at, int(nanocores * window_seconds))
    elapsed = (at - previous.at).total_seconds()
    if elapsed <= 0:
        return previous
    return CpuCounter(at, previous.total + int(nanocores * elapsed))
