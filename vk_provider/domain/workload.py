"""Pod → ``(WorkloadSpec, PlacementRequest)``: the one place a pod is read for launching.

The input is a pod exactly as the API serves it as JSON (camelCase keys), plus the Secrets and
ConfigMaps it references (fetched by the caller; ``env.references`` says which). The output is
what a provider launches (``WorkloadSpec``) and what placement filters offers by
(``PlacementRequest``, from the pod's resources and the annotations of PRODUCT.md §6).
Anything the virtual node can never honour is refused with ``InvalidPodSpec`` naming the pod
field at fault (``podspec``); the environment follows kubelet (``env``).

Invariants: pure, no I/O, no clock; the same arguments always give the same result.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from vk_provider.domain.env import EnvContext, environment, expanded_strings
from vk_provider.domain.models import WorkloadSpec
from vk_provider.domain.placement import CapacityType, PlacementRequest
from vk_provider.domain.podspec import (
    CONTAINER,
    GPU_RESOURCE,
    InvalidPodSpec,
    allowed_volumes,
    check_container,
    check_pod_level,
    mapping_field,
    ports,
    quantity_field,
    resource_field,
    single_container,
    string_field,
    string_map_field,
)
from vk_provider.domain.podview import (
    ANN_CAPACITY_TYPE,
    ANN_GPU,
    ANN_MAX_PRICE,
    ANN_MIN_GPU_MEMORY,
    ANN_PROVIDERS,
    ANN_REGIONS,
)
from vk_provider.domain.quantity import GIB, ceil_int

_GPU_MODEL: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def to_workload(
    pod: Mapping[str, Any],
    *,
    secrets: Mapping[str, Mapping[str, Any]],
    config_maps: Mapping[str, Mapping[str, Any]],
    node_name: str,
    host_ip: str,
    attempt: int = 0,
) -> WorkloadSpec:
    """Translate a pod (API JSON) into the ``WorkloadSpec`` a provider launches.

    ``secrets`` and ``config_maps`` map names (in the pod's namespace) to the objects as the API
    serves them; a name absent from them does not exist. ``node_name`` and ``host_ip`` answer
    ``spec.nodeName`` and ``status.hostIP`` field references. Raises ``InvalidPodSpec``.
    """
    metadata = mapping_field(pod, "metadata", "metadata")
    spec = mapping_field(pod, "spec", "spec")
    uid = string_field(metadata, "uid", "metadata.uid")
    if not uid:
        raise InvalidPodSpec("metadata.uid", "is missing; the pod UID keys every launch")
    pod_name = string_field(metadata, "name", "metadata.name")
    if not pod_name:
        raise InvalidPodSpec("metadata.name", "is missing")
    namespace = string_field(metadata, "namespace", "metadata.namespace") or "default"

    check_pod_level(spec)
    container = single_container(spec)
    check_container(container, allowed_volumes(spec))

    container_name = string_field(container, "name", f"{CONTAINER}.name")
    if not container_name:
        raise InvalidPodSpec(f"{CONTAINER}.name", "is missing")
    image = string_field(container, "image", f"{CONTAINER}.image").strip()
    if not image:
        raise InvalidPodSpec(f"{CONTAINER}.image", "is missing; the container needs an image")

    resources = mapping_field(container, "resources", f"{CONTAINER}.resources")
    context = EnvContext(
        pod=pod,
        container=container,
        secrets=secrets,
        config_maps=config_maps,
        node_name=node_name,
        host_ip=host_ip,
    )
    env = environment(context)
    command = expanded_strings(container, "command", env)
    args = expanded_strings(container, "args", env)
    annotations = string_map_field(metadata, "annotations", "metadata.annotations")
    labels = string_map_field(metadata, "labels", "metadata.labels")
    working_dir = string_field(container, "workingDir", f"{CONTAINER}.workingDir") or None

    return WorkloadSpec(
        pod_uid=uid,
        namespace=namespace,
        pod_name=pod_name,
        container_name=container_name,
        image=image,
        command=command,
        args=args,
        env=tuple(env.values()),
        ports=ports(container),
        working_dir=working_dir,
        gpu_count=_gpu_count(resources),
        gpu_models=_gpu_models(annotations),
        min_gpu_memory_gib=_min_gpu_memory_gib(annotations),
        cpu=_cpu(resources),
        memory_bytes=_memory_bytes(resources),
        labels=tuple(sorted(labels.items())),
        attempt=attempt,
    )


def _request_or_limit(resources: Mapping[str, Any], name: str) -> Decimal:
    value, _ = resource_field(resources, "requests", name)
    if value is None:
        value, _ = resource_field(resources, "limits", name)
    return Decimal(0) if value is None else value


def _cpu(resources: Mapping[str, Any]) -> float:
    return float(_request_or_limit(resources, "cpu"))


def _memory_bytes(resources: Mapping[str, Any]) -> int:
    return ceil_int(_request_or_limit(resources, "memory"))


def _gpu_count(resources: Mapping[str, Any]) -> int:
    value, field = resource_field(resources, "limits", GPU_RESOURCE)
    if value is None:
        value, field = resource_field(resources, "requests", GPU_RESOURCE)
    if value is None:
        return 0
    if value != value.to_integral_value():
        raise InvalidPodSpec(field, f"must be a whole number of GPUs, not {value}")
    return int(value)


def _gpu_models(annotations: Mapping[str, str]) -> tuple[str, ...]:
    raw = annotations.get(ANN_GPU)
    if raw is None:
        return ()
    field = f"metadata.annotations['{ANN_GPU}']"
    models: list[str] = []
    for part in raw.split(","):
        model = part.strip()
        if not model:
            continue
        if not _GPU_MODEL.fullmatch(model):
            raise InvalidPodSpec(
                field,
                f"{model!r} is not a GPU model name (letters, digits, '.', '_', '-'; "
                "comma-separated, e.g. H100,A100-80GB)",
            )
        if model not in models:
            models.append(model)
    return tuple(models)


def _min_gpu_memory_gib(annotations: Mapping[str, str]) -> float:
    raw = annotations.get(ANN_MIN_GPU_MEMORY)
    if raw is None:
        return 0.0
    field = f"metadata.annotations['{ANN_MIN_GPU_MEMORY}']"
    return float(quantity_field(raw.strip(), field) / GIB)


# --------------------------------------------------------------------------- placement


def _annotation_field(name: str) -> str:
    return f"metadata.annotations['{name}']"


def _max_price(annotations: Mapping[str, str]) -> float | None:
    raw = annotations.get(ANN_MAX_PRICE)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InvalidPodSpec(
            _annotation_field(ANN_MAX_PRICE), "must be a number of $/hour"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise InvalidPodSpec(_annotation_field(ANN_MAX_PRICE), "must be a finite number >= 0")
    return value


def _capacity_type(annotations: Mapping[str, str]) -> CapacityType:
    raw = annotations.get(ANN_CAPACITY_TYPE, CapacityType.ON_DEMAND.value)
    try:
        return CapacityType(raw.strip())
    except ValueError:
        raise InvalidPodSpec(
            _annotation_field(ANN_CAPACITY_TYPE), "must be one of on-demand, spot, any"
        ) from None


_LIST_ITEM: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]*")


def _names(annotations: Mapping[str, str], name: str, what: str) -> tuple[str, ...]:
    """A comma-separated list annotation; every item must be a plain name."""
    raw = annotations.get(name, "")
    items: list[str] = []
    for part in raw.split(","):
        item = part.strip()
        if not item:
            continue
        if not _LIST_ITEM.fullmatch(item):
            raise InvalidPodSpec(
                _annotation_field(name),
                f"{item!r} is not a {what} (comma-separated names, e.g. a,b)",
            )
        if item not in items:
            items.append(item)
    return tuple(items)


def placement_request(spec: WorkloadSpec, annotations: Mapping[str, str]) -> PlacementRequest:
    """What placement filters offers by: the spec's resources and the pod's annotations."""
    return PlacementRequest(
        gpu_count=spec.gpu_count,
        gpu_models=spec.gpu_models,
        min_gpu_memory_gib=spec.min_gpu_memory_gib,
        cpu=spec.cpu,
        memory_gib=spec.memory_bytes / 2**30,
        regions=_names(annotations, ANN_REGIONS, "region"),
        max_price_per_hour=_max_price(annotations),
        capacity_type=_capacity_type(annotations),
        providers=_names(annotations, ANN_PROVIDERS, "provider name"),
    )


def to_request(
    pod: Mapping[str, Any],
    *,
    secrets: Mapping[str, Mapping[str, Any]],
    config_maps: Mapping[str, Mapping[str, Any]],
    node_name: str,
    host_ip: str,
    attempt: int = 0,
) -> tuple[WorkloadSpec, PlacementRequest]:
    """The pod read once for launching: what to run, and where it may run."""
    spec = to_workload(
        pod,
        secrets=secrets,
        config_maps=config_maps,
        node_name=node_name,
        host_ip=host_ip,
        attempt=attempt,
    )
    metadata = mapping_field(pod, "metadata", "metadata")
    annotations = string_map_field(metadata, "annotations", "metadata.annotations")
    return spec, placement_request(spec, annotations)


@dataclass(frozen=True, slots=True)
class Held:
    """GPUs, vCPUs and GiB a pod requests (what it holds on the node while placed)."""

    gpus: float = 0.0
    cpu: float = 0.0
    memory_gib: float = 0.0


def held_resources(pod: Mapping[str, Any]) -> Held:
    """What the pod's container requests; a pod translation would refuse holds nothing."""
    try:
        container = single_container(mapping_field(pod, "spec", "spec"))
        resources = mapping_field(container, "resources", f"{CONTAINER}.resources")
        return Held(
            gpus=float(_gpu_count(resources)),
            cpu=_cpu(resources),
            memory_gib=_memory_bytes(resources) / 2**30,
        )
    except InvalidPodSpec:
        return Held()
