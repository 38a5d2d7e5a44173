"""The local provider's on-disk state: one directory per instance, and its files.

Every instance is a directory ``<state_dir>/local-<pod uid>-<attempt>/``; the directory is the
only state, so a fresh ``LocalProvider`` (an agent restart) finds every instance again::

    instance.json    who it is for (pod uid, attempt, offer, price, created) and the runner's
                     ProcessRecord (pid + kernel start time, so a recycled pid is never ours)
    pod.json, containers/...   the pod's plan and its containers' files (``layout.py``)
    runner.log       the runner's own output (tracebacks only)
    started          created by the runner when the first container starts (mtime = then)
    exit             the pod's exit code, written atomically by the runner when it ends
    terminate.json   a termination request and its SIGKILL deadline (written by ``delete``)
    lost             a fault-injected loss (see ``faults.inject_loss``); its text is the message

Beside the instances, the state directory holds ``spawner.log`` (the runner spawner's own
output, ``spawner.py``) and the fault overrides (``faults.py``).

Invariants: files are written atomically (a reader sees the old content or the new, never
half); a file that is missing or unreadable reads as None, never as an exception.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from vk_provider_adapters.local.processes import ProcessRecord

log = logging.getLogger(__name__)

INSTANCE_FILE = "instance.json"
# Logs of instances that were released (per container, as ``layout.py`` places them), kept
# until the instance is deleted once more (the agent does that when the pod goes), so
# `kubectl logs` works for completed pods.
RETAINED_LOGS_DIR = "retained-logs"
RUNNER_LOG_FILE = "runner.log"
STARTED_FILE = "started"
EXIT_FILE = "exit"
TERMINATE_FILE = "terminate.json"
LOST_FILE = "lost"
# Where the instance's declared ports are reached (``local.address``), written at create.
ENDPOINTS_FILE = "endpoints.json"

INSTANCE_ID = re.compile(r"local-[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True, slots=True)
class Record:
    """``instance.json``: written at create, never changed afterwards except to add the process."""

    instance_id: str
    pod_uid: str
    attempt: int
    sku: str
    offer_key: str
    price_per_hour: float
    created_at: float
    process: ProcessRecord | None

    def to_json(self) -> dict[str, object]:
        return {
            "instance_id": self.instance_id,
            "pod_uid": self.pod_uid,
            "attempt": self.attempt,
            "sku": self.sku,
            "offer_key": self.offer_key,
            "price_per_hour": self.price_per_hour,
            "created_at": self.created_at,
            "process": None if self.process is None else self.process.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Record:
        process = data.get("process")
        return cls(
            instance_id=str(data["instance_id"]),
            pod_uid=str(data["pod_uid"]),
            attempt=int(str(data["attempt"])),
            sku=str(data["sku"]),
            offer_key=str(data["offer_key"]),
            price_per_hour=float(str(data["price_per_hour"])),
            created_at=float(str(data["created_at"])),
            process=ProcessRecord.from_json(process) if isinstance(process, dict) else None,
        )


@dataclass(frozen=True, slots=True)
class Termination:
    """``terminate.json``: when termination was asked for and when SIGTERM turns to SIGKILL."""

    requested_at: float
    kill_deadline: float
    killed_at: float | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "requested_at": self.requested_at,
            "kill_deadline": self.kill_deadline,
            "killed_at": self.killed_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Termination:
        killed_at = data.get("killed_at")
        return cls(
            requested_at=float(str(data["requested_at"])),
            kill_deadline=float(str(data["kill_deadline"])),
            killed_at=None if killed_at is None else float(str(killed_at)),
        )


def write_atomically(path: Path, content: bytes, *, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as file:
        file.write(content)
    tmp.replace(path)


def write_json(path: Path, data: object, *, mode: int = 0o644, atomic: bool = True) -> None:
    """``data`` as JSON in ``path``: atomically (a temporary file renamed), unless the caller
    knows nobody reads ``path`` yet (a new instance's plan, before its ``instance.json``)."""
    content = json.dumps(data, indent=2).encode()
    if atomic:
        write_atomically(path, content, mode=mode)
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as file:
        file.write(content)


def read_json(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None
    return data if isinstance(data, dict) else None


def read_record(directory: Path) -> Record | None:
    try:
        data = read_json(directory / INSTANCE_FILE)
        return None if data is None else Record.from_json(data)
    except (ValueError, KeyError, TypeError) as exc:
        # Written atomically, so only tampering gets here; such a directory is not an instance.
        log.warning("ignoring %s: unreadable %s (%s)", directory, INSTANCE_FILE, exc)
        return None


def read_termination(directory: Path) -> Termination | None:
    data = read_json(directory / TERMINATE_FILE)
    return None if data is None else Termination.from_json(data)


def mtime(path: Path) -> datetime | None:
    try:
        return datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)
    except FileNotFoundError:
        return None


def read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def read_exit_code(directory: Path) -> int | None:
    try:
        return int((directory / EXIT_FILE).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def instant(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=UTC)
