"""The end of a local instance on disk: its termination, and what is kept once it is gone.

``terminate`` is what ``LocalProvider.delete`` does to an instance directory: a running one
gets its termination recorded (``terminate.json``) and its runner SIGTERM, and the deadline
after which every process group of the pod is SIGKILLed (``observe.enforce_deadline``); a
second delete with a shorter grace brings that deadline forward, never back. A finished one
is released: its directory goes, and its containers' logs (current and previous run) and
specs move to ``<state_dir>/retained-logs/<id>`` so ``kubectl logs`` of a completed pod still
works; a delete of an instance already released drops those too.

Invariants: only files and signals, no provider state (the caller keeps its index); every
step can be repeated (a retried delete never fails on what an earlier one removed).
"""

from __future__ import annotations

import contextlib
import enum
import shutil
import signal
import time
from pathlib import Path

from vk_provider.sdk import InstanceState
from vk_provider_adapters.local import podnet
from vk_provider_adapters.local.layout import (
    CONTAINER_LOG,
    CONTAINER_ORDER,
    CONTAINER_SPEC,
    CONTAINERS_DIR,
    PREVIOUS_LOG,
    container_dir,
    container_names,
)
from vk_provider_adapters.local.observe import enforce_deadline, kill_all, observe
from vk_provider_adapters.local.processes import signal_runner
from vk_provider_adapters.local.records import (
    RETAINED_LOGS_DIR,
    TERMINATE_FILE,
    Termination,
    read_record,
    read_termination,
    write_json,
)

ACTIVE = frozenset({InstanceState.PENDING, InstanceState.RUNNING, InstanceState.TERMINATING})


class Outcome(enum.Enum):
    """What ``terminate`` did: the instance was gone already, is released, or is stopping."""

    GONE = "gone"
    RELEASED = "released"
    STOPPING = "stopping"


def retained_dir(state_dir: Path, instance_id: str) -> Path:
    """Where a released instance's logs are kept."""
    return state_dir / RETAINED_LOGS_DIR / instance_id


def release(directory: Path) -> None:
    """Remove a finished instance, keeping its containers' logs for a later ``logs`` call."""
    retained = retained_dir(directory.parent, directory.name)
    shutil.rmtree(retained, ignore_errors=True)
    names = container_names(directory)
    for name in names:
        source = container_dir(directory, name)
        target = container_dir(retained, name)
        target.mkdir(parents=True, exist_ok=True)
        for kept in (CONTAINER_LOG, PREVIOUS_LOG, CONTAINER_SPEC):
            with contextlib.suppress(FileNotFoundError):
                (source / kept).replace(target / kept)
    if names:
        write_json(retained / CONTAINERS_DIR / CONTAINER_ORDER, names)
    podnet.remove(directory)  # its processes are gone: its network goes too
    shutil.rmtree(directory, ignore_errors=True)


def terminate(directory: Path, grace_seconds: float, *, provider: str) -> Outcome:
    """Delete the instance in ``directory`` with ``grace_seconds`` for its processes."""
    record = read_record(directory)
    instance = observe(directory, provider=provider)
    if record is None or instance is None:
        # Already gone: a second delete also drops the retained logs.
        shutil.rmtree(retained_dir(directory.parent, directory.name), ignore_errors=True)
        return Outcome.GONE
    if instance.state not in ACTIVE:
        # Finished: release it. SIGKILL first in case the runner is still on its way out.
        kill_all(directory, record)
        release(directory)
        return Outcome.RELEASED
    now = time.time()
    deadline = now + max(0.0, grace_seconds)
    termination = read_termination(directory)
    if termination is None:
        termination = Termination(requested_at=now, kill_deadline=deadline)
        write_json(directory / TERMINATE_FILE, termination.to_json())
        if record.process is not None and grace_seconds > 0:
            # To the runner: it stops the containers as a kubelet stops a pod (app
            # containers first, then the sidecars), each program getting one SIGTERM.
            signal_runner(record.process, signal.SIGTERM)
    elif deadline < termination.kill_deadline:
        termination = Termination(termination.requested_at, deadline, termination.killed_at)
        write_json(directory / TERMINATE_FILE, termination.to_json())
    enforce_deadline(directory, record, termination, now)
    return Outcome.STOPPING
