"""Offers of cluster B, planned from its Nodes and its non-terminal Pods (two list calls).

A node counts when it is Ready, not cordoned, and every NoSchedule/NoExecute taint is tolerated
by the pods we would make; its free resources are allocatable minus the requests of the
non-terminal pods bound to it. Its region is its ``topology.kubernetes.io/region`` label, else
the first of ``config.regions``, else ``remote`` (the *fallback* region); with
``config.regions`` set only nodes in those regions count. Per region there are two kinds of
shapes, each one offer whose ``available`` sums what fits on every node of that shape:

- GPU shapes: ``n`` GPUs for n in 1..(the node's allocatable GPUs, at most ``max_gpus``), with
  the node's per-GPU share of CPU and memory (allocatable / allocatable GPUs, rounded down to
  whole vCPUs and GiB); ``available`` is how many times ``n`` GPUs are free, and at most what
  ``max_gpus`` leaves beside the GPUs our pods already hold. GPU memory comes from the
  ``nvidia.com/gpu.memory`` label (MiB; the smallest within a shape) or is 0.
- CPU-only shapes: 1, 2, 4, ... vCPUs up to the node's allocatable CPU, with the node's memory
  per vCPU (rounded down to half GiB); ``available`` is how many fit in its free CPU and
  memory. Nodes whose taints only GPU pods tolerate offer none.

The sku encodes the shape (``1gpu.8cpu.32gib``, ``0gpu.2cpu.8gib``), so ``create`` needs no
other state. Price = GPUs x ``gpu_price_per_hour`` + vCPUs x ``cpu_price_per_hour``; offers
dearer than ``max_price_per_hour`` are dropped; ``gpu_model`` is the configured one.

An offer is the shape one whole pod may use, however many containers it has (``resources``
shares it among them). Pods already on a node hold what the scheduler counts for them
(``pod_requests``: their containers and sidecars, or their largest init container).

Invariants: pure; quantities are read by ``vk_provider.domain.quantity`` (the one parser);
offers count requests, not usage; a node or pod that cannot be read is skipped and logged.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Final

from vk_provider.sdk import VIRTUAL_NODE_TAINT_KEY, Offer, parse_quantity
from vk_provider_adapters.kubernetes.config import KubernetesProviderConfig
from vk_provider_adapters.kubernetes.names import LABEL_MANAGED_BY, label_value
from vk_provider_adapters.payload import MalformedResponse, items, mapping

log = logging.getLogger(__name__)

GPU_RESOURCE: Final = "nvidia.com/gpu"
GPU_MEMORY_LABEL: Final = "nvidia.com/gpu.memory"  # MiB, as GPU feature discovery writes it
REGION_LABEL: Final = "topology.kubernetes.io/region"
VIRTUAL_KUBELET_TAINT: Final = VIRTUAL_NODE_TAINT_KEY
FALLBACK_REGION: Final = "remote"

# Every pod tolerates virtual nodes; GPU pods also the customary GPU node-pool taint.
TOLERATIONS: Final[tuple[Mapping[str, str], ...]] = (
    {"key": VIRTUAL_KUBELET_TAINT, "operator": "Exists"},
)
GPU_TOLERATIONS: Final[tuple[Mapping[str, str], ...]] = (
    *TOLERATIONS,
    {"key": GPU_RESOURCE, "operator": "Exists"},
)

_SKU = re.compile(r"(?P<gpus>\d{1,4})gpu\.(?P<cpu>\d+(?:\.\d+)?)cpu\.(?P<mem>\d+(?:\.\d+)?)gib")
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

_MAX_CPU_LADDER = 1 << 12


def read_quantity(value: object) -> Decimal:
    """A quantity of a JSON answer (a string, or a bare JSON number) as base units."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise MalformedResponse(f"a quantity is {type(value).__name__}, not a string")
    try:
        return parse_quantity(str(value))
    except ValueError:
        raise MalformedResponse("a quantity cannot be read") from None


def _compact(number: float) -> str:
    return f"{number:g}" if number != int(number) else str(int(number))


@dataclass(frozen=True, slots=True, order=True)
class Shape:
    """What one instance may use: GPUs, vCPUs and memory; encoded into ``Offer.sku``."""

    gpus: int
    vcpus: float
    memory_gib: float

    @property
    def sku(self) -> str:
        return f"{self.gpus}gpu.{_compact(self.vcpus)}cpu.{_compact(self.memory_gib)}gib"

    @classmethod
    def parse(cls, sku: str) -> Shape | None:
        match = _SKU.fullmatch(sku)
        if match is None:
            return None
        shape = cls(int(match["gpus"]), float(match["cpu"]), float(match["mem"]))
        return shape if shape.vcpus > 0 and shape.memory_gib > 0 else None


@dataclass(frozen=True, slots=True)
class OfferScope:
    """What the configuration says about offers."""

    provider: str
    regions: tuple[str, ...]
    gpu_model: str | None
    gpu_price_per_hour: float
    cpu_price_per_hour: float
    max_gpus: int
    max_price_per_hour: float | None

    @classmethod
    def from_config(cls, config: KubernetesProviderConfig) -> OfferScope:
        return cls(
            provider=config.name,
            regions=tuple(dict.fromkeys(config.regions)),
            gpu_model=config.gpu_model,
            gpu_price_per_hour=config.gpu_price_per_hour,
            cpu_price_per_hour=config.cpu_price_per_hour,
            max_gpus=config.max_gpus,
            max_price_per_hour=config.max_price_per_hour,
        )

    @property
    def fallback_region(self) -> str:
        """The region of nodes without a region label."""
        return self.regions[0] if self.regions else FALLBACK_REGION

    def price(self, shape: Shape) -> float:
        return round(
            shape.gpus * self.gpu_price_per_hour + shape.vcpus * self.cpu_price_per_hour, 6
        )


@dataclass(frozen=True, slots=True)
class Resources:
    gpus: Decimal = Decimal(0)
    cpu: Decimal = Decimal(0)
    memory: Decimal = Decimal(0)  # bytes

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.gpus + other.gpus, self.cpu + other.cpu, self.memory + other.memory)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.gpus - other.gpus, self.cpu - other.cpu, self.memory - other.memory)

    @classmethod
    def of(cls, values: object, where: str) -> Resources:
        """From a ``resources``-style mapping (``allocatable``, ``requests``); absent is 0."""
        if values is None:
            return cls()
        if not isinstance(values, dict):
            raise MalformedResponse(f"{where} is not an object")

        def amount(name: str) -> Decimal:
            raw = values.get(name)
            return Decimal(0) if raw is None else read_quantity(raw)

        return cls(amount(GPU_RESOURCE), amount("cpu"), amount("memory"))

    def fits(self, other: Resources) -> int:
        """How many times ``other`` fits into this (``other`` has some non-zero dimension)."""
        pairs = (
            (self.gpus, other.gpus),
            (self.cpu, other.cpu),
            (self.memory, other.memory),
        )
        counts = [int(mine // theirs) for mine, theirs in pairs if theirs > 0]
        return max(0, min(counts)) if counts else 0


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    """One node of B as the offer planner sees it."""

    name: str
    region: str
    allocatable: Resources
    free: Resources
    gpu_memory_gib: float
    takes_cpu_pods: bool  # its taints are tolerated without the GPU toleration


def tolerated(taint: Mapping[str, object], tolerations: Iterable[Mapping[str, str]]) -> bool:
    """Kubernetes' toleration matching, for the tolerations this adapter sets."""
    for toleration in tolerations:
        effect = toleration.get("effect", "")
        if effect and effect != taint.get("effect"):
            continue
        if toleration.get("operator") == "Exists":
            if not toleration.get("key") or toleration["key"] == taint.get("key"):
                return True
        elif toleration.get("key") == taint.get("key") and toleration.get("value", "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def _ready(status: Mapping[str, object]) -> bool:
    conditions = status.get("conditions")
    if not isinstance(conditions, list):
        return False
    return any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in conditions
    )


def _container_request(container: object, where: str) -> Resources:
    """A container's requests; a resource with only a limit requests its limit (as the API
    server defaults it)."""
    body = mapping(container, where)
    resources = mapping(body.get("resources"), f"{where}.resources")
    requests = mapping(resources.get("requests"), f"{where}.resources.requests")
    limits = mapping(resources.get("limits"), f"{where}.resources.limits")

    def amount(name: str) -> Decimal:
        raw = requests.get(name, limits.get(name))
        return Decimal(0) if raw is None else read_quantity(raw)

    return Resources(amount(GPU_RESOURCE), amount("cpu"), amount("memory"))


def _larger(a: Resources, b: Resources) -> Resources:
    return Resources(max(a.gpus, b.gpus), max(a.cpu, b.cpu), max(a.memory, b.memory))


def pod_requests(pod: Mapping[str, object]) -> Resources:
    """What a pod holds on its node: its containers (and sidecars) or its largest init
    container, whichever is more, plus its overhead."""
    spec = mapping(pod.get("spec"), "pod spec")
    total = Resources()
    containers = spec.get("containers")
    for index, container in enumerate(containers if isinstance(containers, list) else []):
        total = total + _container_request(container, f"spec.containers[{index}]")
    init_peak = Resources()
    inits = spec.get("initContainers")
    for index, container in enumerate(inits if isinstance(inits, list) else []):
        request = _container_request(container, f"spec.initContainers[{index}]")
        if isinstance(container, dict) and container.get("restartPolicy") == "Always":
            total = total + request  # a sidecar runs beside the containers
        else:
            init_peak = _larger(init_peak, request)
    overhead = Resources.of(spec.get("overhead"), "spec.overhead")
    return _larger(total, init_peak) + overhead


def _node_name(pod: Mapping[str, object]) -> str:
    spec = pod.get("spec")
    name = spec.get("nodeName") if isinstance(spec, dict) else None
    return name if isinstance(name, str) else ""


def _phase(pod: Mapping[str, object]) -> str:
    status = pod.get("status")
    phase = status.get("phase") if isinstance(status, dict) else None
    return phase if isinstance(phase, str) else ""


def node_capacities(nodes: object, pods: object, scope: OfferScope) -> list[NodeCapacity]:
    """The nodes of B our pods may run on, with what is free on each (see the module
    docstring); a node or pod that cannot be read is skipped and logged."""
    used: dict[str, Resources] = {}
    for pod in items(pods, "pod list"):
        bound_to = _node_name(pod)
        if not bound_to or _phase(pod) in _TERMINAL_PHASES:
            continue
        try:
            used[bound_to] = used.get(bound_to, Resources()) + pod_requests(pod)
        except MalformedResponse as exc:
            log.warning("provider %s: ignoring a pod on node %s: %s", scope.provider, bound_to, exc)
    found: list[NodeCapacity] = []
    for node in items(nodes, "node list"):
        try:
            capacity = _node_capacity(node, used, scope)
        except MalformedResponse as exc:
            log.warning("provider %s: ignoring a node: %s", scope.provider, exc)
            continue
        if capacity is not None:
            found.append(capacity)
    return found


def _node_capacity(
    node: Mapping[str, object], used: Mapping[str, Resources], scope: OfferScope
) -> NodeCapacity | None:
    metadata = mapping(node.get("metadata"), "node metadata")
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise MalformedResponse("a node has no name")
    spec = mapping(node.get("spec"), f"node {name} spec")
    status = mapping(node.get("status"), f"node {name} status")
    if spec.get("unschedulable") is True or not _ready(status):
        return None
    taints = spec.get("taints")
    hard = [
        t
        for t in (taints if isinstance(taints, list) else [])
        if isinstance(t, dict) and t.get("effect") in ("NoSchedule", "NoExecute")
    ]
    if not all(tolerated(t, GPU_TOLERATIONS) for t in hard):
        return None
    labels = mapping(metadata.get("labels"), f"node {name} labels")
    region = labels.get(REGION_LABEL)
    region = region if isinstance(region, str) and region else scope.fallback_region
    if scope.regions and region not in scope.regions:
        return None
    allocatable = Resources.of(status.get("allocatable"), f"node {name} allocatable")
    free = allocatable - used.get(name, Resources())
    free = Resources(
        max(free.gpus, Decimal(0)), max(free.cpu, Decimal(0)), max(free.memory, Decimal(0))
    )
    gpu_memory = 0.0
    raw_memory = labels.get(GPU_MEMORY_LABEL)
    if isinstance(raw_memory, str) and raw_memory.isdigit():
        gpu_memory = int(raw_memory) / 1024
    return NodeCapacity(
        name=name,
        region=region,
        allocatable=allocatable,
        free=free,
        gpu_memory_gib=gpu_memory,
        takes_cpu_pods=all(tolerated(t, TOLERATIONS) for t in hard),
    )


def gpus_in_use(pods: object, *, namespace: str, provider: str) -> int:
    """The GPUs our non-terminal pods hold (for ``max_gpus``)."""
    ours = label_value(provider)
    total = Decimal(0)
    for pod in items(pods, "pod list"):
        metadata = pod.get("metadata")
        if not isinstance(metadata, dict) or metadata.get("namespace") != namespace:
            continue
        labels = metadata.get("labels")
        if not isinstance(labels, dict) or labels.get(LABEL_MANAGED_BY) != ours:
            continue
        if _phase(pod) in _TERMINAL_PHASES:
            continue
        with contextlib.suppress(MalformedResponse):
            total += pod_requests(pod).gpus
    return int(total)


def _share(total: Decimal, parts: int) -> float:
    """``total / parts`` rounded down to a whole number, or to tenths below 1."""
    share = total / parts
    if share >= 1:
        return float(math.floor(share))
    return math.floor(share * 10) / 10


def _node_shapes(node: NodeCapacity, scope: OfferScope) -> Iterator[tuple[Shape, int]]:
    """Every shape the node offers and how many of it are free now."""
    alloc = node.allocatable
    memory_gib = alloc.memory / 2**30
    gpus = int(alloc.gpus)
    if gpus > 0:
        cpu_share, memory_share = _share(alloc.cpu, gpus), _share(memory_gib, gpus)
        if cpu_share > 0 and memory_share > 0:
            for count in range(1, min(gpus, scope.max_gpus) + 1):
                shape = Shape(count, round(count * cpu_share, 3), round(count * memory_share, 3))
                yield shape, int(node.free.gpus // count)
    if node.takes_cpu_pods and alloc.cpu >= 1:
        per_cpu = math.floor(memory_gib / alloc.cpu * 2) / 2
        vcpus = 1
        while per_cpu > 0 and vcpus <= alloc.cpu and vcpus <= _MAX_CPU_LADDER:
            memory = vcpus * per_cpu
            need = Resources(cpu=Decimal(vcpus), memory=Decimal(memory) * 2**30)
            yield Shape(0, float(vcpus), memory), node.free.fits(need)
            vcpus *= 2


def plan_offers(nodes: Iterable[NodeCapacity], scope: OfferScope, *, gpus_used: int) -> list[Offer]:
    """Offers per region and shape (pure; see the module docstring)."""
    available: dict[tuple[str, Shape], int] = {}
    gpu_memory: dict[tuple[str, Shape], float] = {}
    for node in nodes:
        for shape, count in _node_shapes(node, scope):
            key = (node.region, shape)
            available[key] = available.get(key, 0) + count
            known = gpu_memory.get(key)
            gpu_memory[key] = (
                node.gpu_memory_gib if known is None else min(known, node.gpu_memory_gib)
            )
    budget = max(0, scope.max_gpus - gpus_used)
    offers: list[Offer] = []
    for (region, shape), count in sorted(available.items()):
        if shape.gpus:
            count = min(count, budget // shape.gpus)
        price = scope.price(shape)
        if scope.max_price_per_hour is not None and price > scope.max_price_per_hour:
            continue
        offers.append(
            Offer(
                provider=scope.provider,
                sku=shape.sku,
                region=region,
                gpu_model=scope.gpu_model if shape.gpus else None,
                gpu_count=shape.gpus,
                gpu_memory_gib=gpu_memory[(region, shape)] if shape.gpus else 0.0,
                vcpus=shape.vcpus,
                memory_gib=shape.memory_gib,
                price_per_hour=price,
                available=count,
            )
        )
    return offers
