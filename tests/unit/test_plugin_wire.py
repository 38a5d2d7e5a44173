"""The domain models on the wire: every model survives the round trip; garbage is refused
with the field named."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from vk_provider.domain.containers import (
    ContainerSpec,
    ContainerState,
    ContainerStatus,
    ContainerUsage,
    Probe,
    Termination,
    VolumeMount,
)
from vk_provider.domain.models import (
    Capabilities,
    EnvVar,
    Instance,
    InstanceState,
    LogOptions,
    Offer,
    Port,
    WorkloadSpec,
)
from vk_provider_adapters.plugin import wire, wire_workload
from vk_provider_adapters.plugin._gen.vkprovider.v1 import provider_pb2 as pb

T0 = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
T1 = datetime(2026, 1, 2, 3, 5, 0, tzinfo=UTC)

APP = ContainerSpec(
    name="app",
    image="example/app:1",
    command=("python", "-m", "app"),
    args=("--port", "8000"),
    env=(EnvVar("TOKEN", "s3cret", secret=True), EnvVar("MODE", "serve")),
    ports=(Port(8000, "TCP", "http"), Port(9000)),
    working_dir="/srv",
    cpu=1.5,
    memory_bytes=2**30,
    gpu_count=1,
    startup_probe=Probe(kind="exec", command=("true",), failure_threshold=30),
    readiness_probe=Probe(
        kind="http", port=8000, path="/ready", scheme="HTTPS", headers=(("X-A", "b"),)
    ),
    liveness_probe=Probe(kind="grpc", port=9000, grpc_service="health", period_seconds=3),
    volume_mounts=(VolumeMount("models", "/models", read_only=True, sub_path="v1"),),
)
SIDECAR = ContainerSpec(
    name="proxy",
    image="example/proxy:1",
    restart_policy="Always",
    liveness_probe=Probe("tcp", port=1),
)
INIT = ContainerSpec(
    name="migrate",
    image="example/app:1",
    command=("migrate",),
    volume_mounts=(VolumeMount("models", "/models"),),
)

SPEC = WorkloadSpec(
    pod_uid="uid-1",
    namespace="ns",
    pod_name="p",
    gpu_count=1,
    gpu_models=("H100", "A100-80GB"),
    min_gpu_memory_gib=40,
    cpu=1.5,
    memory_bytes=2**30,
    labels=(("b", "2"), ("a", "1")),
    attempt=3,
    containers=(APP,),
    init_containers=(INIT, SIDECAR),
    restart_policy="OnFailure",
)


def test_a_whole_pod_spec_survives_the_wire() -> None:
    back = wire_workload.spec_from_pb(
        pb.WorkloadSpec.FromString(wire_workload.spec_to_pb(SPEC).SerializeToString())
    )
    assert back == SPEC
    assert back.request_id == SPEC.request_id


def test_a_single_container_spec_keeps_its_nones() -> None:
    spec = WorkloadSpec(
        pod_uid="u", namespace="n", pod_name="p", containers=(ContainerSpec(name="c", image="i"),)
    )
    back = wire_workload.spec_from_pb(wire_workload.spec_to_pb(spec))
    assert back == spec
    assert back.main.working_dir is None and back.restart_policy == "Always"


def test_an_instance_with_container_statuses_survives_the_wire() -> None:
    instance = Instance(
        provider="plugin-side-name",
        instance_id="i-1",
        pod_uid="uid-1",
        attempt=2,
        state=InstanceState.RUNNING,
        offer_key="x/cpu/local",
        exit_code=None,
        message="ok",
        started_at=T0,
        ip="127.0.0.1",
        price_per_hour=0.25,
        containers=(
            ContainerStatus(
                name="app",
                state=ContainerState.RUNNING,
                started_at=T0,
                restart_count=2,
                last_termination=Termination(exit_code=137, reason="Error", finished_at=T1),
                ready=True,
                started=True,
            ),
        ),
        init_containers=(
            ContainerStatus(
                name="migrate",
                state=ContainerState.TERMINATED,
                reason="Completed",
                exit_code=0,
                started_at=T0,
                finished_at=T1,
            ),
        ),
    )
    message = pb.Instance.FromString(wire.instance_to_pb(instance).SerializeToString())
    back = wire.instance_from_pb(message, provider="agent-name")
    # The agent knows the provider by its own configured name.
    assert back == Instance(**{**_fields(instance), "provider": "agent-name"})
    exited = Instance("p", "i-2", "u", 0, InstanceState.EXITED, exit_code=0, finished_at=T1)
    assert wire.instance_from_pb(wire.instance_to_pb(exited), provider="p") == exited


def _fields(instance: Instance) -> dict[str, object]:
    return {name: getattr(instance, name) for name in Instance.__slots__}  # type: ignore[attr-defined]


def test_offers_log_options_usage_and_capabilities_survive_the_wire() -> None:
    gpu = Offer("p", "h100", "us", "H100", 8, 80, 96, 1024, 20.5, spot=True, available=3)
    cpu = Offer("p", "cpu", "eu", None, 0, 0, 4, 8, 0.1, startup_seconds=2.5)
    assert [wire.offer_from_pb(wire.offer_to_pb(o)) for o in (gpu, cpu)] == [gpu, cpu]
    for options in (
        LogOptions(),
        LogOptions(tail_lines=0, follow=True, timestamps=True, since_seconds=5, limit_bytes=10),
        LogOptions(container="proxy", previous=True),
    ):
        assert wire.log_options_from_pb(wire.log_request_to_pb("i", options)) == options
    usage = [ContainerUsage("app", 123_000_000_000, 2**28, T0)]
    assert wire.usage_from_pb(wire.usage_to_pb(usage)) == usage
    capabilities = Capabilities(
        follow_logs=True, previous_logs=True, multi_container=True, usage=True, probes="agent"
    )
    assert (
        wire.capabilities_from_pb(wire.capabilities_to_pb(capabilities, restart_container=True))
        == capabilities
    )


def test_exec_and_port_forward_never_cross_the_wire() -> None:
    everything = Capabilities(exec=True, port_forward=True, usage=True)
    back = wire.capabilities_from_pb(wire.capabilities_to_pb(everything, restart_container=False))
    assert not back.exec and not back.port_forward and back.usage


@pytest.mark.parametrize(
    ("message", "field"),
    [
        (pb.Instance(instance_id="i", state=99), "instance.state"),  # type: ignore[arg-type]
        (pb.Instance(instance_id="", state=pb.Instance.RUNNING), "instance.instance_id"),
        (
            pb.Instance(
                instance_id="i",
                state=pb.Instance.RUNNING,
                containers=[pb.ContainerStatus(name="c")],
            ),
            "instance.containers[0].state",
        ),
    ],
)
def test_an_instance_this_agent_cannot_read_names_the_field(
    message: pb.Instance, field: str
) -> None:
    with pytest.raises(wire.WireError) as raised:
        wire.instance_from_pb(message, provider="p")
    assert raised.value.field == field


def test_garbled_specs_capabilities_and_usage_name_the_field() -> None:
    spec = wire_workload.spec_to_pb(SPEC)
    spec.containers[0].liveness_probe.kind = "carrier-pigeon"
    with pytest.raises(wire.WireError, match=r"spec.containers\[0\].liveness_probe.kind"):
        wire_workload.spec_from_pb(spec)
    with pytest.raises(wire.WireError, match=r"capabilities\.probes"):
        wire.capabilities_from_pb(pb.Capabilities(probes="everyone"))
    with pytest.raises(wire.WireError, match=r"usage.containers\[0\].timestamp"):
        wire.usage_from_pb(pb.UsageResponse(containers=[pb.ContainerUsage(name="c")]))


@pytest.mark.parametrize(
    ("endpoint", "field"),
    [
        (pb.PortEndpoint(container_port=0, protocol="TCP", address="a", port=1), "container_port"),
        (pb.PortEndpoint(container_port=1, protocol="TCP", address="a", port=70000), "port"),
        (pb.PortEndpoint(container_port=1, protocol="HTTP", address="a", port=1), "protocol"),
        (pb.PortEndpoint(container_port=1, protocol="TCP", address="", port=1), "address"),
    ],
)
def test_an_endpoint_no_client_could_reach_is_refused_naming_the_field(
    endpoint: pb.PortEndpoint, field: str
) -> None:
    message = pb.Instance(instance_id="i", state=pb.Instance.RUNNING, endpoints=[endpoint])
    with pytest.raises(wire.WireError) as raised:
        wire.instance_from_pb(message, provider="p")
    assert raised.value.field == f"instance.endpoints[0].{field}"
