"""Where each container of a local instance keeps its files (whole pods).

An instance directory (``records.py``) holds one subdirectory per container, in the pod's
order (init containers first)::

    containers/<name>/container.log   the current run's output (CRI log format)
    containers/<name>/previous.log    the previous run's output (kubectl logs --previous)
    containers/<name>/env.json        its environment (owner-only; kept while the instance
                                      lives, so `kubectl exec` gets the container's own)
    containers/<name>/spec.json       argv, working directory, ports, probes (no env)
    containers/<name>/process.json    the running program's ProcessRecord (pid + start ticks)
    containers/<name>/started         mtime = when the current run started
    containers/<name>/exit            the last run's exit code (atomic)
    containers/<name>/restarts        how often it was restarted (an integer)
    containers/order.json             the names, in order

The pod runner (``runner.py``) writes them; the provider, exec, usage and logs read them.

Invariants: a name is the pod's container name (a DNS label, so a safe path segment); every
reader treats a missing file as "not yet" (None), never as an error.
"""

from __future__ import annotations

import json
from pathlib import Path

from providers.local.processes import ProcessRecord

CONTAINERS_DIR = "containers"
CONTAINER_LOG = "container.log"
PREVIOUS_LOG = "previous.log"
CONTAINER_ENV = "env.json"
CONTAINER_SPEC = "spec.json"
CONTAINER_PROCESS = "process.json"
CONTAINER_STARTED = "started"
CONTAINER_EXIT = "exit"
CONTAINER_RESTARTS = "restarts"


def container_dir(instance_dir: Path, name: str) -> Path:
    return instance_dir / CONTAINERS_DIR / name


def container_names(instance_dir: Path) -> list[str]:
    """The containers of an instance, in the pod's order (init containers first)."""
    order = instance_dir / CONTAINERS_DIR / "order.json"
    try:
        names = json.loads(order.read_text())
    except (OSError, ValueError):
        return []
    return [str(n) for n in names] if isinstance(names, list) else []


def container_process(instance_dir: Path, name: str) -> ProcessRecord | None:
    """The container's running program, as the runner recorded it (None when not running)."""
    try:
        data = json.loads((container_dir(instance_dir, name) / CONTAINER_PROCESS).read_text())
        return ProcessRecord.from_json(data)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def container_env(instance_dir: Path, name: str) -> dict[str, str] | None:
    try:
        data = json.loads((container_dir(instance_dir, name) / CONTAINER_ENV).read_text())
    except (OSError, ValueError):
        return None
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else None


def container_spec(instance_dir: Path, name: str) -> dict[str, object] | None:
    """``{"argv": [...], "cwd": "...", "ports": [...], "sidecar": bool, "init": bool}``."""
    try:
        data = json.loads((container_dir(instance_dir, name) / CONTAINER_SPEC).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
