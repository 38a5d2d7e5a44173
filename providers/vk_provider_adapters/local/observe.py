"""A local instance's state, derived in one place from its files and the liveness of its runner.

``observe(directory, provider=...)`` reads an instance directory (``records.py``,
``layout.py``) and returns the ``Instance`` a cloud would report, each container included.
It acts as well as reads: a lost instance's processes are killed, an overdue termination is
escalated to SIGKILL (so a program ignoring SIGTERM ends even across agent restarts), and a
finished runner is reaped.

Invariants: the state is a function of the files and the processes they name; SIGKILL goes
to the runner's process group and to every container's (each program leads its own); a
directory without ``instance.json`` is no instance (None).
"""

from __future__ import annotations

import json
import logging
import signal
import time
from datetime import datetime
from pathlib import Path

from vk_provider.sdk import (
    ContainerState,
    ContainerStatus,
    Instance,
    InstanceState,
    PortEndpoint,
    WorkloadSpec,
)
from vk_provider.sdk import Termination as Ended
from vk_provider_adapters.local.layout import (
    RunStatus,
    container_names,
    container_process,
    container_spec,
    container_status,
)
from vk_provider_adapters.local.processes import is_running, reap, signal_group
from vk_provider_adapters.local.records import (
    ENDPOINTS_FILE,
    EXIT_FILE,
    LOST_FILE,
    STARTED_FILE,
    TERMINATE_FILE,
    Record,
    Termination,
    instant,
    mtime,
    read_exit_code,
    read_record,
    read_termination,
    read_text,
    write_json,
)

log = logging.getLogger(__name__)

LOCAL_IP = "127.0.0.1"


def exposed_ports(spec: WorkloadSpec, address: str) -> list[dict[str, object]]:
    """Every port an app container or sidecar declares, at ``address`` and its own number
    (the process runs on this machine: it listens on the port it declares)."""
    return [
        {
            "container_port": port.container_port,
            "protocol": port.protocol,
            "address": address,
            "port": port.container_port,
        }
        for container in (*(c for c in spec.init_containers if c.sidecar), *spec.containers)
        for port in container.ports
    ]


def read_endpoints(directory: Path) -> tuple[PortEndpoint, ...]:
    """The endpoints written at create; none when ports are not exposed (or unreadable)."""
    text = read_text(directory / ENDPOINTS_FILE)
    if not text:
        return ()
    try:
        return tuple(PortEndpoint(**entry) for entry in json.loads(text))
    except (ValueError, TypeError):
        return ()


_STATES = {
    "waiting": ContainerState.WAITING,
    "running": ContainerState.RUNNING,
    "terminated": ContainerState.TERMINATED,
}


def kill_all(directory: Path, record: Record) -> None:
    """SIGKILL the runner's process group and every container's."""
    if record.process is not None:
        signal_group(record.process, signal.SIGKILL)
    for name in container_names(directory):
        process = container_process(directory, name)
        if process is not None:
            signal_group(process, signal.SIGKILL)


def enforce_deadline(directory: Path, record: Record, termination: Termination, now: float) -> None:
    """Past the termination's kill deadline: SIGKILL everything still running."""
    if record.process is None or now < termination.kill_deadline:
        return
    if is_running(record.process):
        log.info("%s: grace period over, sending SIGKILL", directory.name)
        kill_all(directory, record)
        if termination.killed_at is None:
            killed = Termination(termination.requested_at, termination.kill_deadline, now)
            write_json(directory / TERMINATE_FILE, killed.to_json())


def _status(name: str, run: RunStatus) -> ContainerStatus:
    last = None
    if run.last_exit_code is not None:
        last = Ended(
            exit_code=run.last_exit_code,
            reason=run.last_reason,
            started_at=instant(run.last_started_at),
            finished_at=instant(run.last_finished_at),
        )
    return ContainerStatus(
        name=name,
        state=_STATES[run.state],
        reason=run.reason,
        message=run.message,
        exit_code=run.exit_code,
        started_at=instant(run.started_at),
        finished_at=instant(run.finished_at),
        restart_count=run.restart_count,
        last_termination=last,
    )


def containers(directory: Path) -> tuple[tuple[ContainerStatus, ...], tuple[ContainerStatus, ...]]:
    """(app containers, init containers) as the runner last wrote them."""
    apps: list[ContainerStatus] = []
    inits: list[ContainerStatus] = []
    for name in container_names(directory):
        run = container_status(directory, name)
        spec = container_spec(directory, name) or {}
        status = _status(name, run) if run else ContainerStatus(name, ContainerState.WAITING)
        (inits if spec.get("init") else apps).append(status)
    return tuple(apps), tuple(inits)


def observe(directory: Path, *, provider: str, ip: str = LOCAL_IP) -> Instance | None:
    """The instance's state from its files and its runner; None if it does not exist.
    ``ip`` is where the agent reaches its processes (this machine, or their namespace)."""
    record = read_record(directory)
    if record is None:
        return None
    process = record.process
    alive = process is not None and is_running(process)
    if process is not None and not alive:
        reap(process)

    def instance(
        state: InstanceState,
        *,
        message: str = "",
        exit_code: int | None = None,
        finished_at: datetime | None = None,
    ) -> Instance:
        apps, inits = containers(directory)
        # Reached while its processes run: terminating ones still serve (their endpoints
        # turn terminating, not gone, until they have stopped).
        running = state in (InstanceState.RUNNING, InstanceState.TERMINATING)
        return Instance(
            provider=provider,
            instance_id=record.instance_id,
            pod_uid=record.pod_uid,
            attempt=record.attempt,
            state=state,
            offer_key=record.offer_key,
            exit_code=exit_code,
            message=message,
            started_at=mtime(directory / STARTED_FILE),
            finished_at=finished_at,
            ip=ip,
            price_per_hour=record.price_per_hour,
            containers=apps,
            init_containers=inits,
            endpoints=read_endpoints(directory) if running else (),
        )

    lost_message = read_text(directory / LOST_FILE)
    if lost_message is not None:
        if alive:
            kill_all(directory, record)
        return instance(
            InstanceState.LOST,
            message=lost_message or "instance lost",
            finished_at=mtime(directory / LOST_FILE),
        )
    exit_code = read_exit_code(directory)
    finished_at = mtime(directory / EXIT_FILE)
    termination = read_termination(directory)
    if termination is not None:
        if alive:
            enforce_deadline(directory, record, termination, time.time())
            return instance(InstanceState.TERMINATING, message="termination requested")
        return instance(
            InstanceState.TERMINATED,
            exit_code=exit_code,
            finished_at=finished_at or instant(termination.killed_at),
            message="terminated on request",
        )
    if exit_code is not None:
        return instance(InstanceState.EXITED, exit_code=exit_code, finished_at=finished_at)
    if alive:
        started = (directory / STARTED_FILE).exists()
        return instance(InstanceState.RUNNING if started else InstanceState.PENDING)
    message = "process vanished" if process is not None else "launch interrupted"
    return instance(InstanceState.LOST, message=message)
