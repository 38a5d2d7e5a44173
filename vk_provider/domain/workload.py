"""Pod → ``(WorkloadSpec, PlacementRequest)``: the one place a pod is read for launching.

The input is a pod exactly as the API serves it as JSON (camelCase keys), plus the Secrets and
ConfigMaps it references (fetched by the caller; ``env.references`` says which). The output is
what a provider launches (``WorkloadSpec``: every app container, the init containers in order,
native sidecars among them, each with its environment and probes) and what placement filters
offers by (``PlacementRequest``: the pod's effective resources, its shape, the annotations of
docs/reference.md#annotations). Anything the virtual node can never honour is refused with
``InvalidPodSpec`` naming the pod field at fault (``podspec``); the environment follows
kubelet (``env``).

Effective resources follow kubelet: the larger of the app containers' and sidecars' sum and
the largest plain init container (init containers run one at a time, before the app).

Invariants: pure, no I/O, no clock; the same arguments always give the same result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from vk_provider.domain.annotations import (
    capacity_type,
    gpu_models,
    max_price,
    min_gpu_memory_gib,
    names,
)
from vk_provider.domain.containers import ContainerSpec
from vk_provider.domain.env import EnvContext, environment, expanded_strings
from vk_provider.domain.models import WorkloadSpec
from vk_provider.domain.placement import PlacementRequest, PodShape
from vk_provider.domain.podspec import (
    GPU_RESOURCE,
    InvalidPodSpec,
    Located,
    allowed_volumes,
    check_container,
    check_pod_level,
    empty_dir_volumes,
    mapping_field,
    pod_containers,
    ports,
    resource_field,
    string_field,
    string_map_field,
    volume_mounts,
)
from vk_provider.domain.podview import ANN_PROVIDERS, ANN_REGIONS
from vk_provider.domain.probes import probes
from vk_provider.domain.quantity import ceil_int
from vk_provider.domain.references import Skipped


@dataclass(frozen=True, slots=True)
class Translation:
    """A pod read for launching, and the optional references it had to skip."""

    spec: WorkloadSpec
    request: PlacementRequest
    skipped: tuple[Skipped, ...] = ()


@dataclass(frozen=True, slots=True)
class _Sizes:
    cpu: Decimal
    memory: Decimal
    gpus: int


def _sizes(container: Mapping[str, Any], path: str) -> _Sizes:
    resources = mapping_field(container, "resources", f"{path}.resources")
    return _Sizes(
        cpu=_request_or_limit(resources, "cpu", path),
        memory=_request_or_limit(resources, "memory", path),
        gpus=_gpu_count(resources, path),
    )


def _effective(apps: Sequence[Located], inits: Sequence[Located]) -> _Sizes:
    """What the pod holds at its largest (kubelet's effective request)."""
    running = [_sizes(c, p) for p, c in apps] + [
        _sizes(c, p) for p, c in inits if c.get("restartPolicy") == "Always"
    ]
    plain = [_sizes(c, p) for p, c in inits if c.get("restartPolicy") != "Always"]
    total = _Sizes(
        cpu=sum((s.cpu for s in running), Decimal(0)),
        memory=sum((s.memory for s in running), Decimal(0)),
        gpus=sum(s.gpus for s in running),
    )
    return _Sizes(
        cpu=max([total.cpu, *(s.cpu for s in plain)]),
        memory=max([total.memory, *(s.memory for s in plain)]),
        gpus=max([total.gpus, *(s.gpus for s in plain)]),
    )


def _container(
    located: Located,
    *,
    init: bool,
    pod: Mapping[str, Any],
    secrets: Mapping[str, Mapping[str, Any]],
    config_maps: Mapping[str, Mapping[str, Any]],
    node_name: str,
    host_ip: str,
    volumes: frozenset[str],
    empty_dirs: frozenset[str],
    skipped: list[Skipped],
) -> ContainerSpec:
    path, container = located
    check_container(container, volumes, path=path)
    name = string_field(container, "name", f"{path}.name")
    if not name:
        raise InvalidPodSpec(f"{path}.name", "is missing")
    image = string_field(container, "image", f"{path}.image").strip()
    if not image:
        raise InvalidPodSpec(f"{path}.image", "is missing; the container needs an image")
    context = EnvContext(
        pod=pod,
        container=container,
        secrets=secrets,
        config_maps=config_maps,
        node_name=node_name,
        host_ip=host_ip,
        path=path,
        skipped=skipped,
    )
    env = environment(context)
    restart_policy = string_field(container, "restartPolicy", f"{path}.restartPolicy") or None
    if restart_policy is not None and (not init or restart_policy != "Always"):
        raise InvalidPodSpec(
            f"{path}.restartPolicy", "only an init container may set it, and only to Always"
        )
    container_ports = ports(container, path=path)
    startup, readiness, liveness = probes(container, path, container_ports)
    if init and restart_policy is None and (startup or readiness or liveness):
        raise InvalidPodSpec(path, "an init container takes no probes (a sidecar may)")
    sizes = _sizes(container, path)
    return ContainerSpec(
        name=name,
        image=image,
        command=expanded_strings(container, "command", env, path=path),
        args=expanded_strings(container, "args", env, path=path),
        env=tuple(env.values()),
        ports=container_ports,
        working_dir=string_field(container, "workingDir", f"{path}.workingDir") or None,
        cpu=float(sizes.cpu),
        memory_bytes=ceil_int(sizes.memory),
        gpu_count=sizes.gpus,
        restart_policy=restart_policy,
        startup_probe=startup,
        readiness_probe=readiness,
        liveness_probe=liveness,
        volume_mounts=volume_mounts(container, empty_dirs, path=path),
    )


def to_workload(
    pod: Mapping[str, Any],
    *,
    secrets: Mapping[str, Mapping[str, Any]],
    config_maps: Mapping[str, Mapping[str, Any]],
    node_name: str,
    host_ip: str,
    attempt: int = 0,
    skipped: list[Skipped] | None = None,
) -> WorkloadSpec:
    """Translate a pod (API JSON) into the ``WorkloadSpec`` a provider launches.

    ``secrets`` and ``config_maps`` map names (in the pod's namespace) to the objects as the API
    serves them; a name absent from them does not exist. ``node_name`` and ``host_ip`` answer
    ``spec.nodeName`` and ``status.hostIP`` field references. Optional references that are
    missing, and envFrom keys that are no variable names, are appended to ``skipped``
    (``domain.references``). Raises ``InvalidPodSpec`` (``MissingReferenceError`` for a
    mandatory reference that does not exist yet).
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
    apps, inits = pod_containers(spec)
    volumes = allowed_volumes(spec)
    notes: list[Skipped] = [] if skipped is None else skipped
    common: dict[str, Any] = {
        "pod": pod,
        "secrets": secrets,
        "config_maps": config_maps,
        "node_name": node_name,
        "host_ip": host_ip,
        "volumes": volumes,
        "empty_dirs": empty_dir_volumes(spec),
        "skipped": notes,
    }
    containers = tuple(_container(c, init=False, **common) for c in apps)
    init_containers = tuple(_container(c, init=True, **common) for c in inits)
    names_seen = [c.name for c in (*init_containers, *containers)]
    for name in names_seen:
        if names_seen.count(name) > 1:
            raise InvalidPodSpec("spec.containers", f"container name {name!r} is used twice")
    annotations = string_map_field(metadata, "annotations", "metadata.annotations")
    labels = string_map_field(metadata, "labels", "metadata.labels")
    policy = string_field(spec, "restartPolicy", "spec.restartPolicy") or "Always"
    if policy not in ("Always", "OnFailure", "Never"):
        raise InvalidPodSpec("spec.restartPolicy", "must be Always, OnFailure or Never")
    total = _effective(apps, inits)
    return WorkloadSpec(
        pod_uid=uid,
        namespace=namespace,
        pod_name=pod_name,
        containers=containers,
        init_containers=init_containers,
        restart_policy=policy,
        gpu_count=total.gpus,
        gpu_models=gpu_models(annotations),
        min_gpu_memory_gib=min_gpu_memory_gib(annotations),
        cpu=float(total.cpu),
        memory_bytes=ceil_int(total.memory),
        labels=tuple(sorted(labels.items())),
        attempt=attempt,
    )


def _request_or_limit(resources: Mapping[str, Any], name: str, path: str) -> Decimal:
    value, _ = resource_field(resources, "requests", name, path=path)
    if value is None:
        value, _ = resource_field(resources, "limits", name, path=path)
    return Decimal(0) if value is None else value


def _gpu_count(resources: Mapping[str, Any], path: str) -> int:
    value, field = resource_field(resources, "limits", GPU_RESOURCE, path=path)
    if value is None:
        value, field = resource_field(resources, "requests", GPU_RESOURCE, path=path)
    if value is None:
        return 0
    if value != value.to_integral_value():
        raise InvalidPodSpec(field, f"must be a whole number of GPUs, not {value}")
    return int(value)


# --------------------------------------------------------------------------- placement


def placement_request(spec: WorkloadSpec, annotations: Mapping[str, str]) -> PlacementRequest:
    """What placement filters offers by: the spec's resources and the pod's annotations."""
    return PlacementRequest(
        gpu_count=spec.gpu_count,
        gpu_models=spec.gpu_models,
        min_gpu_memory_gib=spec.min_gpu_memory_gib,
        cpu=spec.cpu,
        memory_gib=spec.memory_bytes / 2**30,
        regions=names(annotations, ANN_REGIONS, "region"),
        max_price_per_hour=max_price(annotations),
        capacity_type=capacity_type(annotations),
        providers=names(annotations, ANN_PROVIDERS, "provider name"),
        shape=PodShape.of(spec),
    )


def to_request(
    pod: Mapping[str, Any],
    *,
    secrets: Mapping[str, Mapping[str, Any]],
    config_maps: Mapping[str, Mapping[str, Any]],
    node_name: str,
    host_ip: str,
    attempt: int = 0,
) -> Translation:
    """The pod read once for launching: what to run, where it may run, what was skipped."""
    skipped: list[Skipped] = []
    spec = to_workload(
        pod,
        secrets=secrets,
        config_maps=config_maps,
        node_name=node_name,
        host_ip=host_ip,
        attempt=attempt,
        skipped=skipped,
    )
    metadata = mapping_field(pod, "metadata", "metadata")
    annotations = string_map_field(metadata, "annotations", "metadata.annotations")
    return Translation(spec, placement_request(spec, annotations), tuple(dict.fromkeys(skipped)))


def without_environment(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod with every container's ``env`` and ``envFrom`` removed: what a placement dry
    run translates. Placement never depends on the environment, so a dry run needs no Secret
    or ConfigMap, and none of their values (nor a literal ``env`` value) can reach its answer.
    The input is not changed."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return dict(pod)
    stripped: dict[str, Any] = dict(spec)
    for kind in ("containers", "initContainers"):
        containers = spec.get(kind)
        if isinstance(containers, list):
            stripped[kind] = [
                {k: v for k, v in c.items() if k not in ("env", "envFrom")}
                if isinstance(c, Mapping)
                else c
                for c in containers
            ]
    return {**pod, "spec": stripped}


@dataclass(frozen=True, slots=True)
class Held:
    """GPUs, vCPUs and GiB a pod requests (what it holds on the node while placed)."""

    gpus: float = 0.0
    cpu: float = 0.0
    memory_gib: float = 0.0


def held_resources(pod: Mapping[str, Any]) -> Held:
    """What the pod requests (effective); a pod translation would refuse holds nothing."""
    try:
        total = _effective(*pod_containers(mapping_field(pod, "spec", "spec")))
    except InvalidPodSpec:
        return Held()
    return Held(
        gpus=float(total.gpus), cpu=float(total.cpu), memory_gib=float(total.memory) / 2**30
    )
