"""The domain models on the wire: each model of ``vk_provider.domain`` to its protobuf message
of ``proto/vkprovider/v1/provider.proto`` and back, in one place for the server and the client.
This module carries what a plugin answers (capabilities, offers, instances with their
container statuses, logs, usage) and ``WireError``; ``wire_workload.py`` carries what the
agent asks it to run (``WorkloadSpec`` and its containers).

Invariants:
- ``x == from_pb(to_pb(x))`` for every model the protocol carries (tested): optional fields
  travel as proto3 ``optional`` or as unset sub-messages, so ``None`` stays ``None``.
- Decoding never trusts the other side: an enum value this version does not know, or a
  message that cannot be a model, raises ``WireError`` naming the field; the client turns it
  into ``Transient`` (a plugin of another version), never a crash of the agent.
- Every number a plugin answers is checked when decoded: prices, sizes, counts and durations
  are finite, >= 0 and at most the ``MAX_*`` bounds below (counts are integers on the wire);
  attempts, restart counts and usage are >= 0; timestamps are within years 1-9999. So a NaN
  or negative price (which every budget cap would let through: ``nan > cap`` is False) never
  reaches placement or the ledger.
- Secret env values are carried (the plugin must run the container with them) but never put
  in an error message.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from vk_provider.sdk import (
    Capabilities,
    ContainerState,
    ContainerStatus,
    ContainerUsage,
    Instance,
    InstanceState,
    LogOptions,
    Offer,
    PortEndpoint,
    Termination,
)
from vk_provider_adapters.plugin._gen.vkprovider.v1 import provider_pb2 as pb


class WireError(ValueError):
    """A message from the other side is not a valid model; the message names the field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


_INSTANCE_STATES = {
    InstanceState.PENDING: pb.Instance.PENDING,
    InstanceState.RUNNING: pb.Instance.RUNNING,
    InstanceState.EXITED: pb.Instance.EXITED,
    InstanceState.TERMINATING: pb.Instance.TERMINATING,
    InstanceState.TERMINATED: pb.Instance.TERMINATED,
    InstanceState.LOST: pb.Instance.LOST,
}
_INSTANCE_STATES_BACK = {wire: state for state, wire in _INSTANCE_STATES.items()}
_CONTAINER_STATES = {
    ContainerState.WAITING: pb.ContainerStatus.WAITING,
    ContainerState.RUNNING: pb.ContainerStatus.RUNNING,
    ContainerState.TERMINATED: pb.ContainerStatus.TERMINATED,
}
_CONTAINER_STATES_BACK = {wire: state for state, wire in _CONTAINER_STATES.items()}
_PROBES_BY = ("provider", "agent", "none")

# What a plugin may answer: far beyond any real machine or price, so nothing real is refused,
# yet small enough that the agent's sums and comparisons (placement, budget caps) stay sane.
MAX_PRICE_PER_HOUR = 1_000_000.0  # $/hour, for one whole instance
MAX_GPUS = 1024
MAX_VCPUS = 100_000.0
MAX_GIB = 1_000_000.0  # memory and GPU memory
MAX_AVAILABLE = 1_000_000
MAX_STARTUP_SECONDS = 7 * 86400.0


# --------------------------------------------------------------------------- small parts


def _timestamp(when: datetime | None) -> Timestamp | None:
    if when is None:
        return None
    stamp = Timestamp()
    stamp.FromDatetime(when if when.tzinfo else when.replace(tzinfo=UTC))
    return stamp


def _when(
    message: pb.Instance | pb.ContainerStatus | pb.Termination | pb.ContainerUsage,
    field: str,
    where: str,
) -> datetime | None:
    if not message.HasField(field):
        return None
    stamp: Timestamp = getattr(message, field)
    try:
        return stamp.ToDatetime(tzinfo=UTC)
    except (ValueError, OverflowError):
        raise WireError(
            f"{where}.{field}", f"not a valid time ({stamp.seconds} s, {stamp.nanos} ns)"
        ) from None


def _amount(value: float, field: str, most: float) -> float:
    """A finite quantity from 0 to ``most`` (a price, a size, a duration)."""
    if not math.isfinite(value) or not 0 <= value <= most:
        raise WireError(field, f"must be a finite number from 0 to {most:g}, not {value!r}")
    return value


def _count(value: int, field: str, most: int = 2**63 - 1) -> int:
    """A whole number from 0 to ``most``."""
    if not 0 <= value <= most:
        raise WireError(field, f"must be a whole number from 0 to {most}, not {value}")
    return value


# --------------------------------------------------------------------------- capabilities


def capabilities_to_pb(capabilities: Capabilities, *, restart_container: bool) -> pb.Capabilities:
    """What the plugin offers over the wire; exec and port-forward never cross it."""
    return pb.Capabilities(
        logs=capabilities.logs,
        follow_logs=capabilities.follow_logs,
        log_timestamps=capabilities.log_timestamps,
        previous_logs=capabilities.previous_logs,
        multi_container=capabilities.multi_container,
        init_containers=capabilities.init_containers,
        sidecars=capabilities.sidecars,
        usage=capabilities.usage,
        probes=capabilities.probes,
        restart_container=restart_container,
    )


def capabilities_from_pb(message: pb.Capabilities) -> Capabilities:
    probes = message.probes or "none"
    if probes not in _PROBES_BY:
        raise WireError("capabilities.probes", f"unknown value {probes!r}")
    return Capabilities(
        logs=message.logs,
        follow_logs=message.follow_logs,
        log_timestamps=message.log_timestamps,
        previous_logs=message.previous_logs,
        multi_container=message.multi_container,
        init_containers=message.init_containers,
        sidecars=message.sidecars,
        exec=False,
        port_forward=False,
        usage=message.usage,
        probes=probes,
    )


# --------------------------------------------------------------------------- offers


def offer_to_pb(offer: Offer) -> pb.Offer:
    return pb.Offer(
        provider=offer.provider,
        sku=offer.sku,
        region=offer.region,
        gpu_model=offer.gpu_model,
        gpu_count=offer.gpu_count,
        gpu_memory_gib=offer.gpu_memory_gib,
        vcpus=offer.vcpus,
        memory_gib=offer.memory_gib,
        price_per_hour=offer.price_per_hour,
        spot=offer.spot,
        available=offer.available,
        startup_seconds=offer.startup_seconds,
    )


def offer_from_pb(message: pb.Offer, where: str = "offer") -> Offer:
    """The offer, its numbers checked (``where`` prefixes the field an error names)."""
    return Offer(
        provider=message.provider,
        sku=message.sku,
        region=message.region,
        gpu_model=message.gpu_model if message.HasField("gpu_model") else None,
        gpu_count=_count(message.gpu_count, f"{where}.gpu_count", MAX_GPUS),
        gpu_memory_gib=_amount(message.gpu_memory_gib, f"{where}.gpu_memory_gib", MAX_GIB),
        vcpus=_amount(message.vcpus, f"{where}.vcpus", MAX_VCPUS),
        memory_gib=_amount(message.memory_gib, f"{where}.memory_gib", MAX_GIB),
        price_per_hour=_amount(
            message.price_per_hour, f"{where}.price_per_hour", MAX_PRICE_PER_HOUR
        ),
        spot=message.spot,
        available=_count(message.available, f"{where}.available", MAX_AVAILABLE),
        startup_seconds=_amount(
            message.startup_seconds, f"{where}.startup_seconds", MAX_STARTUP_SECONDS
        ),
    )


# --------------------------------------------------------------------------- instances


def _termination_to_pb(termination: Termination | None) -> pb.Termination | None:
    if termination is None:
        return None
    return pb.Termination(
        exit_code=termination.exit_code,
        reason=termination.reason,
        message=termination.message,
        started_at=_timestamp(termination.started_at),
        finished_at=_timestamp(termination.finished_at),
    )


def _status_to_pb(status: ContainerStatus) -> pb.ContainerStatus:
    return pb.ContainerStatus(
        name=status.name,
        state=_CONTAINER_STATES[status.state],
        reason=status.reason,
        message=status.message,
        exit_code=status.exit_code,
        started_at=_timestamp(status.started_at),
        finished_at=_timestamp(status.finished_at),
        restart_count=status.restart_count,
        last_termination=_termination_to_pb(status.last_termination),
        ready=status.ready,
        started=status.started,
    )


def _status_from_pb(message: pb.ContainerStatus, where: str) -> ContainerStatus:
    state = _CONTAINER_STATES_BACK.get(message.state)
    if state is None:
        raise WireError(f"{where}.state", f"unknown container state {message.state}")
    last = None
    if message.HasField("last_termination"):
        t = message.last_termination
        last = Termination(
            exit_code=t.exit_code,
            reason=t.reason,
            message=t.message,
            started_at=_when(t, "started_at", f"{where}.last_termination"),
            finished_at=_when(t, "finished_at", f"{where}.last_termination"),
        )
    return ContainerStatus(
        name=message.name,
        state=state,
        reason=message.reason,
        message=message.message,
        exit_code=message.exit_code if message.HasField("exit_code") else None,
        started_at=_when(message, "started_at", where),
        finished_at=_when(message, "finished_at", where),
        restart_count=_count(message.restart_count, f"{where}.restart_count"),
        last_termination=last,
        ready=message.ready if message.HasField("ready") else None,
        started=message.started if message.HasField("started") else None,
    )


def instance_to_pb(instance: Instance) -> pb.Instance:
    return pb.Instance(
        provider=instance.provider,
        instance_id=instance.instance_id,
        pod_uid=instance.pod_uid,
        attempt=instance.attempt,
        state=_INSTANCE_STATES[instance.state],
        offer_key=instance.offer_key,
        exit_code=instance.exit_code,
        message=instance.message,
        started_at=_timestamp(instance.started_at),
        finished_at=_timestamp(instance.finished_at),
        ip=instance.ip,
        price_per_hour=instance.price_per_hour,
        containers=[_status_to_pb(s) for s in instance.containers],
        init_containers=[_status_to_pb(s) for s in instance.init_containers],
        endpoints=[
            pb.PortEndpoint(
                container_port=e.container_port, protocol=e.protocol, address=e.address, port=e.port
            )
            for e in instance.endpoints
        ],
    )


def instance_from_pb(message: pb.Instance, *, provider: str) -> Instance:
    """The instance as the agent's provider ``provider`` (its configured name) reports it."""
    state = _INSTANCE_STATES_BACK.get(message.state)
    if state is None:
        raise WireError("instance.state", f"unknown instance state {message.state}")
    if not message.instance_id:
        raise WireError("instance.instance_id", "is empty")
    return Instance(
        # The agent knows this provider by its own configured name, whatever the plugin calls
        # itself: annotations, the ledger and the breaker are keyed by it.
        provider=provider,
        instance_id=message.instance_id,
        pod_uid=message.pod_uid,
        attempt=_count(message.attempt, "instance.attempt"),
        state=state,
        offer_key=message.offer_key,
        exit_code=message.exit_code if message.HasField("exit_code") else None,
        message=message.message,
        started_at=_when(message, "started_at", "instance"),
        finished_at=_when(message, "finished_at", "instance"),
        ip=message.ip if message.HasField("ip") else None,
        price_per_hour=_amount(
            message.price_per_hour, "instance.price_per_hour", MAX_PRICE_PER_HOUR
        ),
        containers=tuple(
            _status_from_pb(s, f"instance.containers[{i}]")
            for i, s in enumerate(message.containers)
        ),
        init_containers=tuple(
            _status_from_pb(s, f"instance.init_containers[{i}]")
            for i, s in enumerate(message.init_containers)
        ),
        endpoints=tuple(
            _endpoint_from_pb(e, f"instance.endpoints[{i}]")
            for i, e in enumerate(message.endpoints)
        ),
    )


_PROTOCOLS = ("TCP", "UDP", "SCTP")


def _endpoint_from_pb(message: pb.PortEndpoint, where: str) -> PortEndpoint:
    """A reported endpoint, refused with the field named when it could not be reached."""
    for name in ("container_port", "port"):
        if not 1 <= getattr(message, name) <= 65535:
            raise WireError(f"{where}.{name}", f"{getattr(message, name)} is not a port (1-65535)")
    if message.protocol not in _PROTOCOLS:
        raise WireError(f"{where}.protocol", f"{message.protocol!r} is not TCP, UDP or SCTP")
    if (
        not message.address
        or len(message.address) > 253
        or any(c.isspace() for c in message.address)
    ):
        raise WireError(f"{where}.address", "is not an IP address or a hostname")
    return PortEndpoint(
        container_port=message.container_port,
        protocol=message.protocol,
        address=message.address,
        port=message.port,
    )


# --------------------------------------------------------------------------- logs and usage


def log_request_to_pb(instance_id: str, options: LogOptions) -> pb.LogsRequest:
    return pb.LogsRequest(
        instance_id=instance_id,
        tail_lines=options.tail_lines,
        follow=options.follow,
        timestamps=options.timestamps,
        since_seconds=options.since_seconds,
        limit_bytes=options.limit_bytes,
        container=options.container,
        previous=options.previous,
    )


def log_options_from_pb(message: pb.LogsRequest) -> LogOptions:
    def optional_int(field: str) -> int | None:
        return int(getattr(message, field)) if message.HasField(field) else None

    return LogOptions(
        tail_lines=optional_int("tail_lines"),
        follow=message.follow,
        timestamps=message.timestamps,
        since_seconds=optional_int("since_seconds"),
        limit_bytes=optional_int("limit_bytes"),
        container=message.container if message.HasField("container") else None,
        previous=message.previous,
    )


def usage_to_pb(usage: list[ContainerUsage]) -> pb.UsageResponse:
    return pb.UsageResponse(
        containers=[
            pb.ContainerUsage(
                name=u.name,
                cpu_core_nanoseconds=u.cpu_core_nanoseconds,
                memory_working_set_bytes=u.memory_working_set_bytes,
                timestamp=_timestamp(u.timestamp),
            )
            for u in usage
        ]
    )


def usage_from_pb(message: pb.UsageResponse) -> list[ContainerUsage]:
    found = []
    for index, u in enumerate(message.containers):
        where = f"usage.containers[{index}]"
        timestamp = _when(u, "timestamp", where)
        if timestamp is None:
            raise WireError(f"{where}.timestamp", "is missing")
        found.append(
            ContainerUsage(
                name=u.name,
                cpu_core_nanoseconds=_count(
                    u.cpu_core_nanoseconds, f"{where}.cpu_core_nanoseconds"
                ),
                memory_working_set_bytes=_count(
                    u.memory_working_set_bytes, f"{where}.memory_working_set_bytes"
                ),
                timestamp=timestamp,
            )
        )
    return found
