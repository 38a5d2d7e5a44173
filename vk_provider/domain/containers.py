"""A pod's containers as a provider sees them: what to run, and what each is doing.

``ContainerSpec`` is one container of a workload (app container, init container, or native
sidecar: an init container with ``restart_policy="Always"``), with its probes; a
``ContainerStatus`` is what a provider reports about one of them; ``ContainerUsage`` its CPU
and memory. A single-container provider never needs these: ``WorkloadSpec``'s own fields
describe the one container, and the agent relaunches the instance to restart it.

Invariants: frozen values; secret env values never appear in a ``repr`` (``EnvVar``); a probe
is one of exec, http, tcp, grpc with kubelet's defaults.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from vk_provider.domain.envvar import EnvVar, Port

ProbeKind = Literal["exec", "http", "tcp", "grpc"]


@dataclass(frozen=True, slots=True)
class Probe:
    """A startup, readiness or liveness probe, with kubelet's semantics and defaults."""

    kind: ProbeKind
    command: tuple[str, ...] = ()  # exec
    port: int = 0  # http, tcp, grpc
    host: str = ""  # http, tcp: default the container's address
    path: str = "/"  # http
    scheme: Literal["HTTP", "HTTPS"] = "HTTP"
    headers: tuple[tuple[str, str], ...] = ()
    grpc_service: str = ""
    initial_delay_seconds: int = 0
    period_seconds: int = 10
    timeout_seconds: int = 1
    success_threshold: int = 1
    failure_threshold: int = 3


@dataclass(frozen=True, slots=True)
class VolumeMount:
    """An ``emptyDir`` volume of the pod mounted into one container (the service-account
    token volume is never mounted: a rented machine gets no cluster credentials)."""

    volume: str
    mount_path: str
    read_only: bool = False
    sub_path: str = ""


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    name: str
    image: str
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: tuple[EnvVar, ...] = ()
    ports: tuple[Port, ...] = ()
    working_dir: str | None = None
    cpu: float = 0.0
    memory_bytes: int = 0
    gpu_count: int = 0
    # Init containers only: "Always" makes it a native sidecar (runs beside the app).
    restart_policy: str | None = None
    startup_probe: Probe | None = None
    readiness_probe: Probe | None = None
    liveness_probe: Probe | None = None
    # The pod's emptyDir volumes this container mounts; providers that share them between
    # the pod's containers honour them (the others give each container its own filesystem).
    volume_mounts: tuple[VolumeMount, ...] = ()

    @property
    def sidecar(self) -> bool:
        return self.restart_policy == "Always"


class ContainerState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    TERMINATED = "terminated"


@dataclass(frozen=True, slots=True)
class Termination:
    exit_code: int
    reason: str = ""
    message: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class ContainerStatus:
    """One container as the provider's runtime reports it (kubelet's containerStatuses)."""

    name: str
    state: ContainerState
    reason: str = ""  # waiting: why (e.g. PodInitializing); terminated: Completed / Error
    message: str = ""
    exit_code: int | None = None  # terminated
    started_at: datetime | None = None  # running or terminated
    finished_at: datetime | None = None  # terminated
    restart_count: int = 0
    last_termination: Termination | None = None
    # The provider's own verdicts of the readiness and startup probes (a remote kubelet);
    # None when the provider does not probe (the agent may).
    ready: bool | None = None
    started: bool | None = None


@dataclass(frozen=True, slots=True)
class ContainerUsage:
    """CPU and memory of one container, as metrics-server reads them from a kubelet."""

    name: str
    cpu_core_nanoseconds: int  # cumulative CPU time used
    memory_working_set_bytes: int
    timestamp: datetime
