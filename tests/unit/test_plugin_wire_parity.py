"""The gRPC wire (``vk_provider_adapters.plugin.wire`` and ``wire_workload``) against the
protocol's own descriptors.

Two checks that fail when a field is added on one side only:

- every domain type that crosses the wire has exactly the fields of its message (the few
  differences are listed in ``NOT_ON_BOTH``, each with its reason);
- samples that set every domain field, sent through the wire modules, set every field of every
  message reachable from the request and answer types, and come back equal: a field the
  mapping forgets in one direction is either unset on the wire or lost on the way back.

Shown by mutation: deleting ``gpu_models=...`` from ``spec_to_pb`` fails the second test with
``('vkprovider.v1.WorkloadSpec', 'gpu_models')`` unset; adding ``int32 spare = 99;`` to a
message (and regenerating) fails the first with ``spare`` on the wire only.
"""

from __future__ import annotations

import dataclasses

from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message

from tests.unit.test_plugin_wire import APP, SPEC, T0, T1
from vk_provider.domain import containers, models
from vk_provider.domain.containers import (
    ContainerState,
    ContainerStatus,
    ContainerUsage,
    Termination,
)
from vk_provider.domain.models import (
    Capabilities,
    Instance,
    InstanceState,
    LogOptions,
    Offer,
    PortEndpoint,
)
from vk_provider_adapters.plugin import wire, wire_workload
from vk_provider_adapters.plugin._gen.vkprovider.v1 import provider_pb2 as pb

# message -> (fields only on the wire, fields only in the domain type), with why.
NOT_ON_BOTH: dict[str, tuple[set[str], set[str]]] = {
    # restart_container is the adapter's method, not a flag; exec, attach and port-forward
    # never cross the wire (the plugin cannot reach a container's streams).
    "Capabilities": ({"restart_container"}, {"exec", "attach", "port_forward"}),
}


def _domain_types() -> dict[str, type]:
    found = {}
    for module in (models, containers):
        for name, value in vars(module).items():
            if dataclasses.is_dataclass(value) and isinstance(value, type):
                found[name] = value
    return found


def test_every_domain_type_on_the_wire_has_exactly_its_messages_fields() -> None:
    domain = _domain_types()
    compared = 0
    for name, message in vars(pb).items():
        if not (isinstance(message, type) and issubclass(message, Message)) or name not in domain:
            continue
        on_wire = {f.name for f in message.DESCRIPTOR.fields}
        in_domain = {f.name for f in dataclasses.fields(domain[name])}
        assert (on_wire - in_domain, in_domain - on_wire) == NOT_ON_BOTH.get(
            name, (set(), set())
        ), name
        compared += 1
    assert compared >= 10  # Offer, WorkloadSpec, ContainerSpec, Probe, Instance, ...


def _reachable(descriptor: Descriptor, into: set[tuple[str, str]]) -> None:
    for field in descriptor.fields:
        key = (descriptor.full_name, field.name)
        if key in into:
            continue
        into.add(key)
        sub = field.message_type
        if sub is not None and not sub.full_name.startswith("google."):
            _reachable(sub, into)


def _set(message: Message, into: set[tuple[str, str]]) -> None:
    for field, value in message.ListFields():
        into.add((message.DESCRIPTOR.full_name, field.name))
        if field.message_type is None or field.message_type.full_name.startswith("google."):
            continue
        values = value if field.is_repeated else [value]
        for item in values:
            if isinstance(item, Message):
                _set(item, into)


# The whole pod of test_plugin_wire, its HTTP probe with every field set.
READY = (
    dataclasses.replace(APP.readiness_probe, host="127.0.0.1", initial_delay_seconds=2)
    if APP.readiness_probe
    else None
)
FULL_SPEC = dataclasses.replace(SPEC, containers=(dataclasses.replace(APP, readiness_probe=READY),))
INSTANCE = Instance(
    provider="p",
    instance_id="i-1",
    pod_uid="uid-1",
    attempt=2,
    state=InstanceState.EXITED,
    offer_key="p/cpu/local",
    exit_code=3,
    message="ended",
    started_at=T0,
    finished_at=T1,
    ip="127.0.0.1",
    price_per_hour=0.25,
    containers=(
        ContainerStatus(
            name="app",
            state=ContainerState.TERMINATED,
            reason="Error",
            exit_code=3,
            message="exit status 3",
            started_at=T0,
            finished_at=T1,
            restart_count=2,
            last_termination=Termination(
                exit_code=137, reason="OOMKilled", message="killed", started_at=T0, finished_at=T1
            ),
            ready=True,
            started=True,
        ),
    ),
    init_containers=(
        ContainerStatus(name="migrate", state=ContainerState.TERMINATED, exit_code=0),
    ),
    endpoints=(
        PortEndpoint(8000, "TCP", "203.0.113.7", 40123),
        PortEndpoint(8080, "TCP", "abc123-8080.proxy.runpod.net", 443),
    ),
)
OFFER = Offer(
    "p", "h100", "us", "H100", 8, 80, 96, 1024, 20.5, spot=True, available=3, startup_seconds=2.5
)
LOGS = LogOptions(
    container="app",
    previous=True,
    tail_lines=5,
    follow=True,
    timestamps=True,
    since_seconds=5,
    limit_bytes=10,
)
USAGE = [ContainerUsage("app", 123_000_000_000, 2**28, T0)]
CAPABILITIES = Capabilities(
    follow_logs=True,
    log_timestamps=True,
    previous_logs=True,
    multi_container=True,
    init_containers=True,
    sidecars=True,
    usage=True,
    probes="agent",
)


def test_full_samples_set_every_reachable_field_and_come_back_equal() -> None:
    messages = [
        wire_workload.spec_to_pb(FULL_SPEC),
        wire.instance_to_pb(INSTANCE),
        wire.offer_to_pb(OFFER),
        wire.log_request_to_pb("i-1", LOGS),
        wire.usage_to_pb(USAGE),
        wire.capabilities_to_pb(CAPABILITIES, restart_container=True),
    ]
    reachable: set[tuple[str, str]] = set()
    seen: set[tuple[str, str]] = set()
    for message in messages:
        _reachable(message.DESCRIPTOR, reachable)
        _set(message, seen)
    assert sorted(reachable - seen) == []
    assert wire_workload.spec_from_pb(messages[0]) == FULL_SPEC
    assert wire.instance_from_pb(messages[1], provider="p") == INSTANCE
    assert wire.offer_from_pb(messages[2]) == OFFER
    assert wire.log_options_from_pb(messages[3]) == LOGS
    assert wire.usage_from_pb(messages[4]) == USAGE
    assert wire.capabilities_from_pb(messages[5]) == CAPABILITIES
