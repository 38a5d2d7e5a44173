"""Requests and limits of the remote pod's containers on the offer's shape (pure).

One app container and no init containers (also every older caller's ``WorkloadSpec``): the
requests are the workload's own cpu and memory, the limits the offer's whole shape (vCPUs,
memory, ``nvidia.com/gpu``): the pod is guaranteed what it asked for and may burst to what
was paid for.

Several containers: each requests its own cpu and memory and gets its own GPUs
(``gpu_count`` as its ``nvidia.com/gpu`` limit, which the API server copies into its
request), so B's scheduler and device plugin put every GPU into the container that asked for
it; GPUs of the shape that no container asked for are not given to any. CPU and memory limits
split the shape so that the containers running *at the same time* never add up to more than
the offer:

- app containers and sidecars, which run together: each gets its own request plus an equal
  share of the headroom (the shape minus all of their requests);
- a plain init container, which runs before the app beside only the sidecars declared before
  it: the shape minus those sidecars' limits, and never less than its own request.

Requests are explicit, even 0: without them the API server would copy the limits into the
requests. A limit that comes out 0 (the other containers' requests fill the shape and this one
asked for nothing) is left out, which is what kubelet makes of a 0 limit anyway.

Invariants: pure; every limit is at least its request; whenever the requests of the
containers that run together fit into the shape, so do their limits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from vk_provider.sdk import ContainerSpec, WorkloadSpec
from vk_provider_adapters.kubernetes.offers import GPU_RESOURCE, Shape

JSON = dict[str, object]
_MIB = 2**20


def cpu_quantity(vcpus: float) -> str:
    """vCPUs as millicores (``1500m``), rounded up."""
    return f"{_millicores(vcpus)}m"


def memory_quantity(gib: float) -> str:
    """GiB as MiB (``1536Mi``), rounded up."""
    return f"{_mebibytes(gib)}Mi"


def _millicores(vcpus: float) -> int:
    return math.ceil(round(max(0.0, vcpus) * 1000, 6))


def _mebibytes(gib: float) -> int:
    return math.ceil(round(max(0.0, gib) * 1024, 6))


def _memory(amount: int) -> str:
    return f"{amount // _MIB}Mi" if amount % _MIB == 0 else str(amount)


def container_resources(
    spec: WorkloadSpec,
    shape: Shape,
    *,
    apps: Sequence[ContainerSpec],
    inits: Sequence[ContainerSpec],
) -> tuple[list[JSON], list[JSON]]:
    """The ``resources`` of every (init container, app container), in order (module
    docstring)."""
    if len(apps) == 1 and not inits:
        return [], [_whole_shape(spec, shape)]
    cpu_cap = _millicores(shape.vcpus)
    memory_cap = _mebibytes(shape.memory_gib) * _MIB
    together = [c for c in inits if c.sidecar] + list(apps)
    cpu = _split(cpu_cap, [_millicores(c.cpu) for c in together])
    memory = _split(memory_cap, [max(0, c.memory_bytes) for c in together])
    sidecars = len(together) - len(apps)
    sidecar_limits = iter(zip(cpu[:sidecars], memory[:sidecars], strict=True))
    held_cpu = held_memory = 0  # the limits of the sidecars started so far
    init_resources: list[JSON] = []
    for container in inits:
        if container.sidecar:
            cpu_limit, memory_limit = next(sidecar_limits)
            held_cpu, held_memory = held_cpu + cpu_limit, held_memory + memory_limit
        else:
            cpu_limit = max(_millicores(container.cpu), cpu_cap - held_cpu)
            memory_limit = max(max(0, container.memory_bytes), memory_cap - held_memory)
        init_resources.append(_own(container, cpu_limit, memory_limit))
    app_resources = [
        _own(c, cpu_limit, memory_limit)
        for c, cpu_limit, memory_limit in zip(apps, cpu[sidecars:], memory[sidecars:], strict=True)
    ]
    return init_resources, app_resources


def _split(cap: int, requests: Sequence[int]) -> list[int]:
    """Each request plus an equal share of what the requests leave of ``cap``."""
    if not requests:
        return []
    share = max(0, cap - sum(requests)) // len(requests)
    return [request + share for request in requests]


def _own(container: ContainerSpec, cpu_limit: int, memory_limit: int) -> JSON:
    limits: dict[str, str] = {}
    if cpu_limit > 0:
        limits["cpu"] = f"{cpu_limit}m"
    if memory_limit > 0:
        limits["memory"] = _memory(memory_limit)
    if container.gpu_count > 0:
        limits[GPU_RESOURCE] = str(container.gpu_count)
    resources: JSON = {
        # Explicit requests, even 0: without them the API server would copy the limits.
        "requests": {
            "cpu": cpu_quantity(container.cpu),
            "memory": str(max(0, container.memory_bytes)),
        }
    }
    if limits:
        resources["limits"] = limits
    return resources


def _whole_shape(spec: WorkloadSpec, shape: Shape) -> JSON:
    """One container: the workload's requests, the whole shape as limits."""
    limits: dict[str, str] = {
        "cpu": cpu_quantity(shape.vcpus),
        "memory": memory_quantity(shape.memory_gib),
    }
    if shape.gpus:
        limits[GPU_RESOURCE] = str(shape.gpus)
    return {
        # Explicit requests, even 0: without them the API server would copy the limits.
        "requests": {"cpu": cpu_quantity(spec.cpu), "memory": str(max(0, spec.memory_bytes))},
        "limits": limits,
    }
