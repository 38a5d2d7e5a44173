"""Fault injection for the local provider, usable from another process (a test, the demo).

Faults come from the configuration and are overridden by ``<state_dir>/faults.json``, read on
every call, so another process can change them while the agent runs. ``inject_loss`` makes one
instance LOST as if the cloud reclaimed it; ``inject_instance`` starts one the agent never
asked for (a duplicate of an attempt, or an orphan).

Invariants: ``faults.json`` is read and written under a file lock (``fail_creates`` is
decremented by one process and set by another); an unreadable override is ignored, never an
error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from vk_provider.sdk import (
    AuthFailed,
    CapacityUnavailable,
    ProviderError,
    RateLimited,
    Transient,
)
from vk_provider_adapters.local.launch import (
    PACKAGE_ROOT,
    LocalContainer,
    runner_command,
    write_pod,
)
from vk_provider_adapters.local.processes import start_process
from vk_provider_adapters.local.records import (
    INSTANCE_FILE,
    INSTANCE_ID,
    LOST_FILE,
    RUNNER_LOG_FILE,
    Record,
    read_record,
    write_atomically,
    write_json,
)

FAULTS_FILE = "faults.json"
_FAULTS_LOCK_FILE = ".faults.lock"


@dataclass(frozen=True, slots=True)
class Faults:
    create_failure_rate: float = 0.0
    api_latency_seconds: float = 0.0
    fail_creates: int = 0
    create_error: str = "capacity"
    call_failure_rate: float = 0.0


_FAULT_KEYS = frozenset(
    {
        "create_failure_rate",
        "api_latency_seconds",
        "fail_creates",
        "create_error",
        "call_failure_rate",
    }
)
# Flaky-cloud faults (``call_failure_rate``): any call may fail like a real API does, and a
# create may even succeed and *then* report failure (a lost response), which is what makes
# duplicates possible in real clouds.
CALL_ERRORS: tuple[Callable[[str], ProviderError], ...] = (
    lambda p: Transient("injected 503 Service Unavailable", provider=p),
    lambda p: RateLimited("injected 429 Too Many Requests", provider=p, retry_after=0.5),
    lambda p: Transient("injected timeout", provider=p),
)
# What an injected create failure raises: the classes a real cloud answers with.
CREATE_ERRORS: dict[str, Callable[[str, str], ProviderError]] = {
    "capacity": lambda m, p: CapacityUnavailable(m, provider=p),
    "transient": lambda m, p: Transient(m, provider=p),
    "rate_limited": lambda m, p: RateLimited(m, provider=p, retry_after=1.0),
    "auth": lambda m, p: AuthFailed(m, provider=p),
}


@contextlib.contextmanager
def faults_locked(state_dir: Path) -> Iterator[Path]:
    """Hold the faults lock: ``fail_creates`` is decremented by one process, set by another."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with (state_dir / _FAULTS_LOCK_FILE).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield state_dir / FAULTS_FILE
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read_fault_overrides(path: Path) -> dict[str, float | int | str]:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        key: value
        for key, value in data.items()
        if key in _FAULT_KEYS
        and (
            (isinstance(value, int | float) and not isinstance(value, bool))
            or (key == "create_error" and value in CREATE_ERRORS)
        )
    }


def set_faults(
    state_dir: Path,
    *,
    create_failure_rate: float | None = None,
    api_latency_seconds: float | None = None,
    fail_creates: int | None = None,
    create_error: str | None = None,
    call_failure_rate: float | None = None,
) -> None:
    """Override the configured faults of the provider using ``state_dir``; None leaves a value.

    ``fail_creates=N`` makes the next N creates fail; ``create_error`` says how (capacity,
    transient, rate_limited, auth; default that of the configuration).
    """
    updates: dict[str, float | int | str] = {}
    if call_failure_rate is not None:
        if not 0 <= call_failure_rate <= 1:
            raise ValueError("call_failure_rate must be between 0 and 1")
        updates["call_failure_rate"] = call_failure_rate
    if create_error is not None:
        if create_error not in CREATE_ERRORS:
            raise ValueError(f"create_error must be one of {', '.join(CREATE_ERRORS)}")
        updates["create_error"] = create_error
    if create_failure_rate is not None:
        if not 0 <= create_failure_rate <= 1:
            raise ValueError("create_failure_rate must be between 0 and 1")
        updates["create_failure_rate"] = create_failure_rate
    if api_latency_seconds is not None:
        if api_latency_seconds < 0:
            raise ValueError("api_latency_seconds must not be negative")
        updates["api_latency_seconds"] = api_latency_seconds
    if fail_creates is not None:
        if fail_creates < 0:
            raise ValueError("fail_creates must not be negative")
        updates["fail_creates"] = fail_creates
    with faults_locked(state_dir) as path:
        write_json(path, {**read_fault_overrides(path), **updates})


def clear_faults(state_dir: Path) -> None:
    """Drop every override: the configured faults apply again."""
    with faults_locked(state_dir) as path, contextlib.suppress(FileNotFoundError):
        path.unlink()


def inject_loss(state_dir: Path, instance_id: str, message: str = "injected instance loss") -> None:
    """Make an instance LOST (as if the cloud reclaimed it); its processes are killed on the
    provider's next look at it."""
    directory = state_dir / instance_id
    if not INSTANCE_ID.fullmatch(instance_id) or not (directory / INSTANCE_FILE).exists():
        raise FileNotFoundError(f"no local instance {instance_id!r} in {state_dir}")
    write_atomically(directory / LOST_FILE, message.encode())


def inject_instance(
    state_dir: Path, *, like: str | None = None, pod_uid: str | None = None, suffix: str
) -> str:
    """Start an instance the agent never asked for, as a cloud can make one (a create that
    went through twice, or one the agent lost track of); returns its id.

    ``like`` names an existing instance whose pod, attempt and offer the new one copies (a
    duplicate of the same attempt); ``pod_uid`` instead makes one for that pod (an orphan when
    no such pod exists). Its one container runs ``sleep`` until it is terminated.
    """
    if like is not None:
        source = read_record(state_dir / like)
        if source is None:
            raise FileNotFoundError(f"no local instance {like!r} in {state_dir}")
        record = dataclasses.replace(source, instance_id=f"{like}-{suffix}", process=None)
    elif pod_uid is not None:
        record = Record(
            instance_id=f"local-{pod_uid}-0-{suffix}",
            pod_uid=pod_uid,
            attempt=0,
            sku="injected",
            offer_key="injected/injected/local",
            price_per_hour=0.0,
            created_at=time.time(),
            process=None,
        )
    else:
        raise ValueError("give like= or pod_uid=")
    directory = state_dir / record.instance_id
    directory.mkdir(parents=True)
    sleeper = LocalContainer(
        name="main", argv=("sleep", "3600"), env={"PATH": os.environ.get("PATH", "")}
    )
    write_pod(
        directory,
        pod_name="injected",
        restart_policy="Never",
        backoff_seconds=10,
        inits=[],
        apps=[sleeper],
    )
    write_json(directory / INSTANCE_FILE, record.to_json())
    process = start_process(
        f"local-runner {directory.name}",
        runner_command(directory, startup_seconds=0),
        log_file=directory / RUNNER_LOG_FILE,
        cwd=PACKAGE_ROOT,
    )
    write_json(directory / INSTANCE_FILE, dataclasses.replace(record, process=process).to_json())
    return record.instance_id
