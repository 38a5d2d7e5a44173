"""The state of a pod on an active Lambda VM, from what the VM said over SSH: a pure table.

Lambda's API reports the VM (``instances.STATES``); an active VM is refined by one probe
(``remote.VmReport``): the container's ``docker inspect`` state when the container exists, the
boot script's ``phase`` when it does not. Each edge (what the VM says → state: why):

- container ``running`` (or ``paused``, ``restarting``) → RUNNING: only a running container is.
- container ``exited``, ``dead`` or ``removing`` → EXITED with its exit code: the agent's
  restart policy decides.
- container ``created`` with an error → EXITED with its code (128 if Docker gave 0): it could
  not start (say, no GPU device driver); a container failure, so the restart policy decides.
- container ``created`` without an error → PENDING: ``docker run`` is starting it.
- no container, phase ``failed-start`` → EXITED with ``docker run``'s code (125 if unknown):
  the image could not be pulled or the container not created; the pod's fault, not the VM's.
- no container, phase ``failed-host`` → LOST: this VM cannot run containers (no GPU driver, no
  Docker, no toolkit, no key); another VM may, and the offer is avoided for a while.
- no container, phase ``running`` or ``exited`` → LOST: the container vanished from the VM;
  unless docker does not answer: no verdict (``state`` None), handled as an unreachable VM.
- no container, phase ``setup``, ``waiting-key``, ``pulling``, ``starting`` → PENDING, saying
  which; no phase yet → PENDING (cloud-init has not started the boot script); docker not
  answering before ``running`` → PENDING too (it is being installed or restarted).

Invariants: pure; total (every report has a verdict); RUNNING only for a running container.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final

from providers.lambda_cloud.remote import VmReport
from vk_provider.domain.models import InstanceState

_RUNNING: Final = frozenset({"running", "paused", "restarting"})
_ENDED: Final = frozenset({"exited", "dead", "removing"})
_BOOTING: Final = {
    "": "cloud-init is preparing the VM",
    "setup": "preparing the VM",
    "waiting-key": "waiting for the agent to deliver the secret environment's key",
    "pulling": "pulling the image",
    "starting": "starting the container",
}
_MESSAGE_MAX: Final = 400


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the instance's state is; ``state`` None: the VM gave no verdict."""

    state: InstanceState | None
    message: str
    exit_code: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_MAX else text[: _MESSAGE_MAX - 3] + "..."


def verdict(report: VmReport) -> Verdict:
    """The instance's state given one probe of its VM (the table above)."""
    container = report.container
    if container is not None:
        started, finished = container.started_at, container.finished_at
        if container.status in _RUNNING:
            note = "" if container.status == "running" else f"the container is {container.status}"
            return Verdict(InstanceState.RUNNING, note, started_at=started)
        if container.status in _ENDED:
            why = "OOMKilled" if container.oom_killed else _short(container.error)
            message = f"the container exited with {container.exit_code}"
            return Verdict(
                InstanceState.EXITED,
                f"{message}: {why}" if why else message,
                exit_code=container.exit_code,
                started_at=started,
                finished_at=finished,
            )
        if container.error:
            return Verdict(
                InstanceState.EXITED,
                f"the container could not start: {_short(container.error)}",
                exit_code=container.exit_code or 128,
                finished_at=finished,
            )
        return Verdict(InstanceState.PENDING, "the container is created and starting")
    phase, said = report.phase, _short(report.phase_message)
    if phase == "failed-start":
        detail = _short(report.start_error) or said
        return Verdict(
            InstanceState.EXITED,
            f"docker run failed: {detail}",
            exit_code=_exit_code(report.phase_message),
        )
    if phase == "failed-host":
        return Verdict(InstanceState.LOST, f"the VM cannot run the container: {said}")
    if phase in ("running", "exited"):
        if report.docker_error:
            return Verdict(None, f"docker on the VM does not answer: {_short(report.docker_error)}")
        return Verdict(InstanceState.LOST, "the container vanished from the VM")
    booting = _BOOTING.get(phase)
    if booting is None:
        return Verdict(InstanceState.PENDING, f"the boot script says {phase[:40]!r}: {said}")
    return Verdict(InstanceState.PENDING, said or booting)


def _exit_code(message: str) -> int:
    """docker run's exit code from ``docker run exited with <code>``; 125 (Docker's own
    failure) when the message has none."""
    last = message.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() and 0 < int(last) < 256 else 125
