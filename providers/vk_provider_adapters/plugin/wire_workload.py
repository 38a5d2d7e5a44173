"""Workloads on the wire: ``WorkloadSpec`` and its containers (env, ports, volume mounts,
probes) to the protobuf messages of ``proto/vkprovider/v1/provider.proto`` and back.

The half of ``wire.py`` that carries what to run (the agent to the plugin, in ``Create``);
``wire.py`` carries what comes back (capabilities, offers, instances, logs, usage) and the
error type both use.

Invariants (those of ``wire.py``):
- ``spec == spec_from_pb(spec_to_pb(spec))`` (tested, and ``test_plugin_wire_parity`` fails
  when a field is added on one side only); ``None`` travels as an unset ``optional``.
- Decoding never trusts the other side: a probe kind or scheme this version does not know,
  or a spec without an app container, raises ``WireError`` naming the field.
- Secret env values are carried (the plugin runs the container with them) but never put in
  an error message.
"""

from __future__ import annotations

from vk_provider.sdk import ContainerSpec, EnvVar, Port, Probe, VolumeMount, WorkloadSpec
from vk_provider_adapters.plugin._gen.vkprovider.v1 import provider_pb2 as pb
from vk_provider_adapters.plugin.wire import WireError

_PROBE_KINDS = ("exec", "http", "tcp", "grpc")


def _env(env: tuple[EnvVar, ...]) -> list[pb.EnvVar]:
    return [pb.EnvVar(name=e.name, value=e.value, secret=e.secret) for e in env]


def _env_back(env: list[pb.EnvVar]) -> tuple[EnvVar, ...]:
    return tuple(EnvVar(name=e.name, value=e.value, secret=e.secret) for e in env)


def _ports(ports: tuple[Port, ...]) -> list[pb.Port]:
    return [
        pb.Port(container_port=p.container_port, protocol=p.protocol, name=p.name) for p in ports
    ]


def _ports_back(ports: list[pb.Port]) -> tuple[Port, ...]:
    return tuple(
        Port(
            container_port=p.container_port,
            protocol=p.protocol,
            name=p.name if p.HasField("name") else None,
        )
        for p in ports
    )


def _optional_str(message: pb.WorkloadSpec | pb.ContainerSpec, field: str) -> str | None:
    return str(getattr(message, field)) if message.HasField(field) else None


def _probe_to_pb(probe: Probe | None) -> pb.Probe | None:
    if probe is None:
        return None
    return pb.Probe(
        kind=probe.kind,
        command=list(probe.command),
        port=probe.port,
        host=probe.host,
        path=probe.path,
        scheme=probe.scheme,
        headers=[pb.Header(name=n, value=v) for n, v in probe.headers],
        grpc_service=probe.grpc_service,
        initial_delay_seconds=probe.initial_delay_seconds,
        period_seconds=probe.period_seconds,
        timeout_seconds=probe.timeout_seconds,
        success_threshold=probe.success_threshold,
        failure_threshold=probe.failure_threshold,
    )


def _probe_from_pb(parent: pb.ContainerSpec, field: str, where: str) -> Probe | None:
    if not parent.HasField(field):
        return None
    message: pb.Probe = getattr(parent, field)
    kind = message.kind
    if kind not in _PROBE_KINDS:
        raise WireError(f"{where}.{field}.kind", f"unknown probe kind {kind!r}")
    scheme = message.scheme or "HTTP"
    if scheme not in ("HTTP", "HTTPS"):
        raise WireError(f"{where}.{field}.scheme", f"must be HTTP or HTTPS, not {scheme!r}")
    return Probe(
        kind=kind,  # type: ignore[arg-type]  # checked against _PROBE_KINDS above
        command=tuple(message.command),
        port=message.port,
        host=message.host,
        path=message.path or "/",
        scheme="HTTPS" if scheme == "HTTPS" else "HTTP",
        headers=tuple((h.name, h.value) for h in message.headers),
        grpc_service=message.grpc_service,
        initial_delay_seconds=message.initial_delay_seconds,
        period_seconds=message.period_seconds,
        timeout_seconds=message.timeout_seconds,
        success_threshold=message.success_threshold,
        failure_threshold=message.failure_threshold,
    )


def _container_to_pb(container: ContainerSpec) -> pb.ContainerSpec:
    return pb.ContainerSpec(
        name=container.name,
        image=container.image,
        command=list(container.command),
        args=list(container.args),
        env=_env(container.env),
        ports=_ports(container.ports),
        working_dir=container.working_dir,
        cpu=container.cpu,
        memory_bytes=container.memory_bytes,
        gpu_count=container.gpu_count,
        restart_policy=container.restart_policy,
        startup_probe=_probe_to_pb(container.startup_probe),
        readiness_probe=_probe_to_pb(container.readiness_probe),
        liveness_probe=_probe_to_pb(container.liveness_probe),
        volume_mounts=[
            pb.VolumeMount(
                volume=m.volume, mount_path=m.mount_path, read_only=m.read_only, sub_path=m.sub_path
            )
            for m in container.volume_mounts
        ],
    )


def _container_from_pb(message: pb.ContainerSpec, where: str) -> ContainerSpec:
    return ContainerSpec(
        name=message.name,
        image=message.image,
        command=tuple(message.command),
        args=tuple(message.args),
        env=_env_back(list(message.env)),
        ports=_ports_back(list(message.ports)),
        working_dir=_optional_str(message, "working_dir"),
        cpu=message.cpu,
        memory_bytes=message.memory_bytes,
        gpu_count=message.gpu_count,
        restart_policy=_optional_str(message, "restart_policy"),
        startup_probe=_probe_from_pb(message, "startup_probe", where),
        readiness_probe=_probe_from_pb(message, "readiness_probe", where),
        liveness_probe=_probe_from_pb(message, "liveness_probe", where),
        volume_mounts=tuple(
            VolumeMount(m.volume, m.mount_path, m.read_only, m.sub_path)
            for m in message.volume_mounts
        ),
    )


def spec_to_pb(spec: WorkloadSpec) -> pb.WorkloadSpec:
    return pb.WorkloadSpec(
        pod_uid=spec.pod_uid,
        namespace=spec.namespace,
        pod_name=spec.pod_name,
        gpu_count=spec.gpu_count,
        gpu_models=list(spec.gpu_models),
        min_gpu_memory_gib=spec.min_gpu_memory_gib,
        cpu=spec.cpu,
        memory_bytes=spec.memory_bytes,
        labels=[pb.Label(key=k, value=v) for k, v in spec.labels],
        attempt=spec.attempt,
        containers=[_container_to_pb(c) for c in spec.containers],
        init_containers=[_container_to_pb(c) for c in spec.init_containers],
        restart_policy=spec.restart_policy,
    )


def spec_from_pb(message: pb.WorkloadSpec) -> WorkloadSpec:
    if not message.containers:
        raise WireError("spec.containers", "must hold at least one app container")
    return WorkloadSpec(
        pod_uid=message.pod_uid,
        namespace=message.namespace,
        pod_name=message.pod_name,
        gpu_count=message.gpu_count,
        gpu_models=tuple(message.gpu_models),
        min_gpu_memory_gib=message.min_gpu_memory_gib,
        cpu=message.cpu,
        memory_bytes=message.memory_bytes,
        labels=tuple((label.key, label.value) for label in message.labels),
        attempt=message.attempt,
        containers=tuple(
            _container_from_pb(c, f"spec.containers[{i}]") for i, c in enumerate(message.containers)
        ),
        init_containers=tuple(
            _container_from_pb(c, f"spec.init_containers[{i}]")
            for i, c in enumerate(message.init_containers)
        ),
        restart_policy=message.restart_policy or "Always",
    )
