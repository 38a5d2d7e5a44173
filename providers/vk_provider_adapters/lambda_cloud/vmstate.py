"""The state of a pod on an active Lambda VM, from what the VM said over SSH: a pure table.

Lambda's API reports the VM (``instances.STATES``); an active VM is refined by one probe
(``remote.VmReport``): the boot script's ``phase`` and, for every container of the pod, its
``docker inspect`` state. The pod runs whole on the VM (``vk_provider_adapters.docker_run``: Docker
restarts its containers as the restartPolicy says), so the instance is the pod and each
container is reported as a kubelet would (``domain.containers.ContainerStatus``).

**The instance**, each edge (what the VM says → state: why):

- phase ``failed-host`` → LOST: this VM cannot run containers (no GPU driver, no Docker, no
  toolkit, no key); another VM may, and the offer is avoided for a while.
- phase ``exited`` → EXITED with the pod's exit code: every app container ended and Docker
  will not restart it, or a plain init container failed under restartPolicy Never. The agent
  takes a whole pod's exit as final; its phase comes from the containers.
- phase ``failed-start`` → EXITED with ``docker run``'s code (125 if unknown): an image could
  not be pulled or a container not created; the pod's fault, not the VM's.
- phase ``initializing`` or ``running`` with some container created → RUNNING.
- phase ``initializing``, ``running`` or ``exited`` without any container → no verdict
  (``state`` None: handled as an unreachable VM) when docker does not answer, else LOST: the
  pod's containers vanished from the VM.
- phase ``setup``, ``waiting-key``, ``pulling``, ``starting`` → PENDING, saying which; no phase
  yet → PENDING (cloud-init has not started the boot script); an unknown phase → PENDING.

**Each container**, from Docker's ``State.Status``:

- ``running``, ``paused`` → running since ``StartedAt``.
- ``restarting`` → waiting, ``CrashLoopBackOff``, its last run ``terminated`` with
  ``ExitCode`` at ``FinishedAt`` (Docker waits out its back-off in this state).
- ``exited``, ``dead``, ``removing`` → terminated with ``ExitCode`` (reason ``Completed``,
  ``Error`` or ``OOMKilled``).
- ``created`` with an ``Error`` → terminated, reason ``StartError`` (code 128 if Docker gave
  0); ``created`` without one → waiting, ``ContainerCreating``.
- not there, with a ``docker run`` error (``failed-start``) → terminated, ``StartError``
  with that error; not there otherwise → not reported (the agent shows it waiting).

**The endpoints** (``Instance.endpoints``): only a RUNNING instance with a public IPv4
address (Lambda's ``ip``) has any, one per TCP or UDP port the sandbox publishes on the VM
right now (``remote.PublishedPort``: ``vk_provider_adapters.docker_run`` publishes every
declared port on the same port of the VM), at ``ip`` and that host port. Read from Docker,
not from the spec: a port Docker has not bound (the sandbox not started yet, or restarting)
is not listed. SCTP is published but never listed: Lambda's firewall rules name only tcp,
udp and icmp, so no rule lets SCTP in (``firewall``).

``RestartCount`` is every container's restart count. Docker forgets a running container's
previous exit code (its ``State.ExitCode`` is 0 again once it runs), so the last termination
is reported while it is in back-off; the agent keeps it from then on.

Invariants: pure; total (every report has a verdict); RUNNING only once a container exists;
endpoints only with RUNNING.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final

from vk_provider.sdk import ContainerState as Runtime
from vk_provider.sdk import ContainerStatus, InstanceState, PortEndpoint, Termination
from vk_provider_adapters.lambda_cloud.remote import (
    ContainerReport,
    ContainerState,
    PublishedPort,
    VmReport,
)

_RUNNING: Final = frozenset({"running", "paused"})
_ENDED: Final = frozenset({"exited", "dead", "removing"})
_BOOTING: Final = {
    "": "cloud-init is preparing the VM",
    "setup": "preparing the VM",
    "waiting-key": "waiting for the agent to deliver the secret environment's key",
    "pulling": "pulling the pod's images",
    "starting": "starting the pod sandbox",
}
_MESSAGE_MAX: Final = 400
# Docker's protocol → Kubernetes' (the pod's declared ``protocol``); SCTP: see above.
_REACHABLE: Final = {"tcp": "TCP", "udp": "UDP"}
START_ERROR: Final = "StartError"
BACK_OFF: Final = "CrashLoopBackOff"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the instance's state is; ``state`` None: the VM gave no verdict."""

    state: InstanceState | None
    message: str
    exit_code: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    containers: tuple[ContainerStatus, ...] = ()
    init_containers: tuple[ContainerStatus, ...] = ()
    endpoints: tuple[PortEndpoint, ...] = ()


def reached_at(published: tuple[PublishedPort, ...], ip: str | None) -> tuple[PortEndpoint, ...]:
    """Where the cluster reaches each published TCP and UDP port: ``ip`` and its host port."""
    if not ip:
        return ()
    return tuple(
        PortEndpoint(port.container_port, _REACHABLE[port.protocol], ip, port.host_port)
        for port in published
        if port.protocol in _REACHABLE
    )


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_MAX else text[: _MESSAGE_MAX - 3] + "..."


def _reason(state: ContainerState) -> str:
    if state.oom_killed:
        return "OOMKilled"
    return "Completed" if state.exit_code == 0 else "Error"


def container_status(report: ContainerReport) -> ContainerStatus | None:
    """One container as a kubelet reports it (the second table above); None: not there."""
    state, name = report.state, report.name
    if state is None:
        if not report.start_error:
            return None
        return ContainerStatus(
            name, Runtime.TERMINATED, START_ERROR, _short(report.start_error), exit_code=128
        )
    restarts = state.restart_count
    if state.status in _RUNNING:
        return ContainerStatus(
            name, Runtime.RUNNING, started_at=state.started_at, restart_count=restarts
        )
    if state.status == "restarting":
        last = Termination(
            exit_code=state.exit_code,
            reason=_reason(state),
            message=_short(state.error),
            started_at=state.started_at,
            finished_at=state.finished_at,
        )
        message = f"back-off restarting failed container {name}"
        return ContainerStatus(
            name, Runtime.WAITING, BACK_OFF, message, restart_count=restarts, last_termination=last
        )
    if state.status in _ENDED:
        return ContainerStatus(
            name,
            Runtime.TERMINATED,
            _reason(state),
            _short(state.error),
            exit_code=state.exit_code,
            started_at=state.started_at,
            finished_at=state.finished_at,
            restart_count=restarts,
        )
    if state.error or report.start_error:
        return ContainerStatus(
            name,
            Runtime.TERMINATED,
            START_ERROR,
            _short(state.error or report.start_error),
            exit_code=state.exit_code or 128,
            finished_at=state.finished_at,
            restart_count=restarts,
        )
    return ContainerStatus(name, Runtime.WAITING, "ContainerCreating", restart_count=restarts)


def verdict(report: VmReport, *, ip: str | None = None) -> Verdict:
    """The instance's state given one probe of its VM at ``ip`` (the tables above)."""
    apps: list[ContainerStatus] = []
    inits: list[ContainerStatus] = []
    for container in report.containers:
        status = container_status(container)
        if status is not None:
            (apps if container.kind == "app" else inits).append(status)
    started = [s.started_at for s in (*inits, *apps) if s.started_at is not None]
    finished = [s.finished_at for s in (*inits, *apps) if s.finished_at is not None]

    def found(state: InstanceState, message: str, exit_code: int | None = None) -> Verdict:
        ended = state is InstanceState.EXITED
        running = state is InstanceState.RUNNING
        return Verdict(
            state,
            message,
            exit_code=exit_code,
            started_at=min(started, default=None),
            finished_at=max(finished, default=None) if ended else None,
            containers=tuple(apps),
            init_containers=tuple(inits),
            endpoints=reached_at(report.published, ip) if running else (),
        )

    phase, said = report.phase, _short(report.phase_message)
    if phase == "failed-host":
        return found(InstanceState.LOST, f"the VM cannot run the pod: {said}")
    if phase == "failed-start":
        errors = [report.start_error, *(c.start_error for c in report.containers)]
        errors += [c.state.error for c in report.containers if c.state is not None]
        detail = next((_short(error) for error in errors if error), "")
        return found(
            InstanceState.EXITED,
            f"{said}: {detail}" if detail else said,
            exit_code=_code(report.exit_code, default=_exit_code(report.phase_message)),
        )
    if phase in ("initializing", "running", "exited") and not report.created:
        if report.docker_error:
            return Verdict(None, f"docker on the VM does not answer: {_short(report.docker_error)}")
        return Verdict(InstanceState.LOST, "the pod's containers vanished from the VM")
    if phase == "exited":
        return found(InstanceState.EXITED, said, exit_code=_code(report.exit_code, default=1))
    if phase in ("initializing", "running"):
        return found(InstanceState.RUNNING, "" if phase == "running" else said)
    booting = _BOOTING.get(phase)
    if booting is None:
        return found(InstanceState.PENDING, f"the boot script says {phase[:40]!r}: {said}")
    return found(InstanceState.PENDING, said or booting)


def _code(text: str, *, default: int) -> int:
    text = text.strip()
    return int(text) if text.isdigit() and int(text) < 256 else default


def _exit_code(message: str) -> int:
    """docker run's exit code from ``... exited with <code>``; 125 (Docker's own failure) when
    the message has none."""
    last = message.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() and 0 < int(last) < 256 else 125
