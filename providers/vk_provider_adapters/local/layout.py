"""Where each container of a local instance keeps its files (whole pods).

An instance directory (``records.py``) holds the pod's plan and one subdirectory per
container::

    pod.json                          the plan the pod runner follows: pod name, restart
                                      policy, crash-loop back-off, init and app containers
    containers/order.json             every container's name, init containers first
    containers/<name>/spec.json       argv, working directory, ports, init / sidecar (no env)
    containers/<name>/env.json        its environment (owner-only; kept while the instance
                                      lives, so `kubectl exec` gets the container's own)
    containers/<name>/status.json     what it is doing: waiting / running / terminated, reason,
                                      exit code, times, restart count, last termination
    containers/<name>/process.json    the running program's ProcessRecord (pid + start ticks;
                                      the program leads a process group of its own)
    containers/<name>/container.log   the current run's output (CRI log format)
    containers/<name>/previous.log    the previous run's output (kubectl logs --previous)
    containers/<name>/restart.json    a restart request (a failed liveness probe), with grace

The pod runner (``runner.py``) writes them; the provider, exec, usage and logs read them.

Invariants: a name is the pod's container name (a DNS label, so a safe path segment); files
are replaced atomically; every reader treats a missing or unreadable file as "not yet"
(None), never as an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from vk_provider_adapters.local.processes import ProcessRecord

POD_PLAN = "pod.json"
CONTAINERS_DIR = "containers"
CONTAINER_ORDER = "order.json"
CONTAINER_LOG = "container.log"
PREVIOUS_LOG = "previous.log"
CONTAINER_ENV = "env.json"
CONTAINER_SPEC = "spec.json"
CONTAINER_STATUS = "status.json"
CONTAINER_PROCESS = "process.json"
CONTAINER_RESTART = "restart.json"


def container_dir(instance_dir: Path, name: str) -> Path:
    return instance_dir / CONTAINERS_DIR / name


def _read(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def container_names(instance_dir: Path) -> list[str]:
    """The containers of an instance, in the pod's order (init containers first)."""
    names = _read(instance_dir / CONTAINERS_DIR / CONTAINER_ORDER)
    return [str(n) for n in names] if isinstance(names, list) else []


def container_process(instance_dir: Path, name: str) -> ProcessRecord | None:
    """The container's running program, as the runner recorded it (None when not running)."""
    data = _read(container_dir(instance_dir, name) / CONTAINER_PROCESS)
    if not isinstance(data, dict):
        return None
    try:
        return ProcessRecord.from_json(data)
    except (ValueError, KeyError, TypeError):
        return None


def container_env(instance_dir: Path, name: str) -> dict[str, str] | None:
    data = _read(container_dir(instance_dir, name) / CONTAINER_ENV)
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else None


def container_spec(instance_dir: Path, name: str) -> dict[str, object] | None:
    """``{"argv": [...], "cwd": "...", "ports": [...], "sidecar": bool, "init": bool}``."""
    data = _read(container_dir(instance_dir, name) / CONTAINER_SPEC)
    return data if isinstance(data, dict) else None


@dataclass(frozen=True, slots=True)
class RunStatus:
    """``status.json``: one container as the runner last saw it (times are epoch seconds)."""

    state: str  # "waiting", "running", "terminated"
    reason: str = ""
    message: str = ""
    exit_code: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    restart_count: int = 0
    last_exit_code: int | None = None
    last_reason: str = ""
    last_started_at: float | None = None
    last_finished_at: float | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "state": self.state,
            "reason": self.reason,
            "message": self.message,
            "exit_code": self.exit_code,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "restart_count": self.restart_count,
            "last_exit_code": self.last_exit_code,
            "last_reason": self.last_reason,
            "last_started_at": self.last_started_at,
            "last_finished_at": self.last_finished_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> RunStatus:
        def number(key: str) -> float | None:
            value = data.get(key)
            return float(value) if isinstance(value, int | float) else None

        def integer(key: str) -> int | None:
            value = data.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        state = data.get("state")
        if state not in ("waiting", "running", "terminated"):
            raise ValueError(f"unknown container state {state!r}")
        return cls(
            state=str(state),
            reason=str(data.get("reason") or ""),
            message=str(data.get("message") or ""),
            exit_code=integer("exit_code"),
            started_at=number("started_at"),
            finished_at=number("finished_at"),
            restart_count=integer("restart_count") or 0,
            last_exit_code=integer("last_exit_code"),
            last_reason=str(data.get("last_reason") or ""),
            last_started_at=number("last_started_at"),
            last_finished_at=number("last_finished_at"),
        )


def container_status(instance_dir: Path, name: str) -> RunStatus | None:
    data = _read(container_dir(instance_dir, name) / CONTAINER_STATUS)
    if not isinstance(data, dict):
        return None
    try:
        return RunStatus.from_json(data)
    except ValueError:
        return None
