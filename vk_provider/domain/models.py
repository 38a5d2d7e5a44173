"""Provider-neutral domain models: what the agent asks of a provider and what it gets back.

These are the only types an adapter speaks. They are frozen value objects with no Kubernetes
or HTTP types in them.

Invariants:
- A ``WorkloadSpec`` carries the pod UID and the launch attempt; together they are the
  idempotency key of a create (``request_id``), and every instance a provider makes carries
  them (in its name, tags or labels) so the agent can find it again after a restart.
- Secret values never appear in ``repr``/``str`` of any model here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from ipaddress import IPv6Address, ip_address

from vk_provider.domain.containers import ContainerSpec, ContainerStatus
from vk_provider.domain.envvar import EnvVar, Port

__all__ = ["EnvVar", "Port"]  # adapters import them from here, with the rest of the models


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A pod to run, translated once from the pod (``vk_provider.domain.workload``).

    One shape for every provider: the pod's app containers (at least one; ``main`` is the
    first), its init containers in order (native sidecars among them), its restart policy,
    and the pod's effective resources (kubelet's: what the pod holds at its largest), which is
    what an offer must fit. A provider that runs one container per instance runs ``main``;
    ``PodShape`` (``domain.placement``) keeps pods with more containers away from it.
    """

    pod_uid: str
    namespace: str
    pod_name: str
    containers: tuple[ContainerSpec, ...]
    init_containers: tuple[ContainerSpec, ...] = ()
    restart_policy: str = "Always"
    gpu_count: int = 0
    gpu_models: tuple[str, ...] = ()
    min_gpu_memory_gib: float = 0.0
    cpu: float = 0.0
    memory_bytes: int = 0
    labels: tuple[tuple[str, str], ...] = ()
    attempt: int = 0

    def __post_init__(self) -> None:
        if not self.containers:
            raise ValueError("a WorkloadSpec needs at least one app container (containers)")

    @property
    def main(self) -> ContainerSpec:
        """The first app container: the one a single-container provider runs."""
        return self.containers[0]

    @property
    def every_container(self) -> tuple[ContainerSpec, ...]:
        """Init containers (sidecars among them) in order, then the app containers."""
        return (*self.init_containers, *self.containers)

    @property
    def secret_values(self) -> tuple[str, ...]:
        """Every secret env value of every container: what must never leave unredacted."""
        return tuple(v.value for c in self.every_container for v in c.env if v.secret and v.value)

    @property
    def request_id(self) -> str:
        """Idempotency key of one launch: the same pod and attempt never makes two instances."""
        return f"{self.pod_uid}.{self.attempt}"


@dataclass(frozen=True, slots=True)
class Offer:
    """Something a provider can launch now, priced per hour for the whole instance."""

    provider: str
    sku: str
    region: str
    gpu_model: str | None
    gpu_count: int
    gpu_memory_gib: float
    vcpus: float
    memory_gib: float
    price_per_hour: float
    spot: bool = False
    available: int = 1
    startup_seconds: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.provider}/{self.sku}/{self.region}"


class InstanceState(enum.Enum):
    """Where an instance is in its life, as the provider reports it."""

    PENDING = "Pending"  # accepted, not running yet (provisioning, pulling, booting)
    RUNNING = "Running"  # the container runs
    EXITED = "Exited"  # the container ended on its own; ``exit_code`` says how
    TERMINATING = "Terminating"  # we asked for termination and it is under way
    TERMINATED = "Terminated"  # gone because we asked
    LOST = "Lost"  # lost, preempted or failed by the provider, not by the container


@dataclass(frozen=True, slots=True)
class PortEndpoint:
    """Where a client in the cluster reaches one declared container port of an instance: the
    address and port the provider exposes it at (an IP address, or a hostname the provider
    gives instead), for that ``container_port`` and ``protocol``."""

    container_port: int
    protocol: str
    address: str
    port: int

    @property
    def address_type(self) -> str:
        """The EndpointSlice address type: IPv4, IPv6 or FQDN."""
        try:
            parsed = ip_address(self.address)
        except ValueError:
            return "FQDN"
        return "IPv6" if isinstance(parsed, IPv6Address) else "IPv4"


@dataclass(frozen=True, slots=True)
class Instance:
    """A provider's view of one launched workload."""

    provider: str
    instance_id: str
    pod_uid: str
    attempt: int
    state: InstanceState
    offer_key: str = ""
    exit_code: int | None = None
    message: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    ip: str | None = None
    price_per_hour: float = 0.0
    # Per container, for providers that run whole pods (``Capabilities.multi_container``);
    # empty for a single-container provider, whose one container is the instance itself.
    containers: tuple[ContainerStatus, ...] = ()
    init_containers: tuple[ContainerStatus, ...] = ()
    # Each declared container port the provider exposes, where the cluster reaches it; a
    # declared port missing here is not reachable (its Services leave this pod out).
    endpoints: tuple[PortEndpoint, ...] = ()


@dataclass(frozen=True, slots=True)
class LogOptions:
    """What `kubectl logs` asks for; providers honour what their capabilities say."""

    tail_lines: int | None = None
    follow: bool = False
    timestamps: bool = False
    since_seconds: int | None = None
    limit_bytes: int | None = None
    container: str | None = None  # None: the (only, or first) app container
    previous: bool = False  # the previous attempt's output (kubectl logs --previous)


@dataclass(frozen=True, slots=True)
class Capabilities:
    """Optional features of a provider, read once at start-up."""

    logs: bool = True
    follow_logs: bool = False
    log_timestamps: bool = False
    previous_logs: bool = False
    # Whole pods: several app containers, init containers, native sidecars; a provider that
    # runs them restarts their containers itself (restartPolicy) and reports each.
    multi_container: bool = False
    init_containers: bool = False
    sidecars: bool = False
    # Optional operations (``contract.SupportsExec`` ...).
    exec: bool = False
    # kubectl attach to the container's own console (``contract.SupportsAttach``); without
    # it, attach follows the container's log (``follow_logs``).
    attach: bool = False
    port_forward: bool = False
    usage: bool = False
    # Who runs probes: the provider's own runtime ("provider", a remote kubelet), the agent
    # ("agent": the containers are reachable from it), or nobody ("none").
    probes: str = "none"
