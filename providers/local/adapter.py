"""The local provider: runs each container's command as a process on this machine.

For development, the demo and end-to-end tests. There are no containers and no images: the
pod's ``command`` + ``args`` run as a local process under ``providers.local.runner``, and the
offers are simulated from the configuration (prices, capacity, launch latency, faults).

Every instance is a directory ``<state_dir>/local-<pod uid>-<attempt>/``; the directory is the
only state, so a fresh ``LocalProvider`` (an agent restart) finds every instance again, and the
processes, like cloud machines, keep running while no agent watches them::

    instance.json    who it is for (pod uid, attempt, offer, price, created) and the runner's
                     ProcessRecord (pid + kernel start time, so a recycled pid is never ours)
    env.json         the program's environment (owner-only; the runner deletes it once read)
    container.log    the program's output in CRI log format (written by the runner)
    runner.log       the runner's own output (tracebacks only)
    started          created by the runner when the program starts (mtime = start time)
    exit             the program's exit code, written atomically by the runner
    terminate.json   a termination request and its SIGKILL deadline (written by ``delete``)
    lost             a fault-injected loss (see ``inject_loss``); its text is the message

Invariants:
- One instance per ``spec.request_id``: the directory name is derived from it, so a second
  create of the same request returns the first instance and starts no process.
- The state of an instance is derived from those files and the liveness of the runner, in one
  place (``_observe``); reads escalate a termination to SIGKILL once its deadline (stored on
  disk) has passed, so a program ignoring SIGTERM ends even across agent restarts.
- SIGTERM goes to the runner, which forwards it to the program (as a container runtime signals
  only PID 1); SIGKILL goes to the runner's whole process group (runner, program, children).
- A scan of the state dir (``list_ours``, ``offers``, the capacity check of ``create``)
  forgets instances it finds TERMINATED by removing their directory, and ``delete`` of an
  instance that no longer runs removes its directory; ``get`` then raises ``NotFound``.
- Faults come from the configuration and are overridden by ``<state_dir>/faults.json``, read
  on every call, so another process (a test, the demo) can change them while the agent runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import random
import re
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from providers.local.config import LocalProviderConfig
from providers.local.processes import (
    ProcessRecord,
    is_running,
    start_process,
    start_ticks,
)
from providers.simulated import SimulatedOffer, simulated_offer
from vk_provider.domain.errors import (
    AuthFailed,
    CapacityUnavailable,
    InvalidSpec,
    NotFound,
    ProviderError,
    RateLimited,
    Transient,
)
from vk_provider.domain.models import (
    Capabilities,
    Instance,
    InstanceState,
    LogOptions,
    Offer,
    WorkloadSpec,
)

log = logging.getLogger(__name__)

INSTANCE_FILE = "instance.json"
LOG_FILE = "container.log"
# Logs of instances that were released, kept until the instance is deleted once more (the
# agent does that when the pod goes), so `kubectl logs` works for completed pods.
RETAINED_LOGS_DIR = "retained-logs"
RUNNER_LOG_FILE = "runner.log"
STARTED_FILE = "started"
EXIT_FILE = "exit"
ENV_FILE = "env.json"
TERMINATE_FILE = "terminate.json"
LOST_FILE = "lost"
FAULTS_FILE = "faults.json"
_FAULTS_LOCK_FILE = ".faults.lock"

_INSTANCE_ID = re.compile(r"local-[A-Za-z0-9][A-Za-z0-9._-]*")
# Variables the program inherits from the agent; everything else comes from the pod spec.
_BASE_ENV = ("PATH", "HOME", "LANG")
_ACTIVE = frozenset({InstanceState.PENDING, InstanceState.RUNNING, InstanceState.TERMINATING})
_FOLLOW_POLL_SECONDS = 0.2
# The directory that holds the ``providers`` package: the runner starts there so that
# ``python -m providers.local.runner`` runs this very code, installed or not.
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent
_COMMAND_FIELD = "spec.containers[0].command"


class LocalProviderDisabled(RuntimeError):
    """The configuration did not opt in to running commands on this machine."""


# --- fault injection (usable from another process) ---------------------------------------


@dataclass(frozen=True, slots=True)
class _Faults:
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
_CALL_ERRORS: tuple[Callable[[str], ProviderError], ...] = (
    lambda p: Transient("injected 503 Service Unavailable", provider=p),
    lambda p: RateLimited("injected 429 Too Many Requests", provider=p, retry_after=0.5),
    lambda p: Transient("injected timeout", provider=p),
)
# What an injected create failure raises: the classes a real cloud answers with.
_CREATE_ERRORS: dict[str, Callable[[str, str], ProviderError]] = {
    "capacity": lambda m, p: CapacityUnavailable(m, provider=p),
    "transient": lambda m, p: Transient(m, provider=p),
    "rate_limited": lambda m, p: RateLimited(m, provider=p, retry_after=1.0),
    "auth": lambda m, p: AuthFailed(m, provider=p),
}


@contextlib.contextmanager
def _faults_locked(state_dir: Path) -> Iterator[Path]:
    """Hold the faults lock: ``fail_creates`` is decremented by one process, set by another."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with (state_dir / _FAULTS_LOCK_FILE).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield state_dir / FAULTS_FILE
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read_fault_overrides(path: Path) -> dict[str, float | int | str]:
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
            or (key == "create_error" and value in _CREATE_ERRORS)
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
        if create_error not in _CREATE_ERRORS:
            raise ValueError(f"create_error must be one of {', '.join(_CREATE_ERRORS)}")
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
    with _faults_locked(state_dir) as path:
        _write_json(path, {**_read_fault_overrides(path), **updates})


def clear_faults(state_dir: Path) -> None:
    """Drop every override: the configured faults apply again."""
    with _faults_locked(state_dir) as path, contextlib.suppress(FileNotFoundError):
        path.unlink()


def inject_loss(state_dir: Path, instance_id: str, message: str = "injected instance loss") -> None:
    """Make an instance LOST (as if the cloud reclaimed it); its processes are killed on the
    provider's next look at it."""
    directory = state_dir / instance_id
    if not _INSTANCE_ID.fullmatch(instance_id) or not (directory / INSTANCE_FILE).exists():
        raise FileNotFoundError(f"no local instance {instance_id!r} in {state_dir}")
    _write_atomically(directory / LOST_FILE, message.encode())


# --- on-disk records ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Record:
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
    def from_json(cls, data: dict[str, object]) -> _Record:
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
class _Termination:
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
    def from_json(cls, data: dict[str, object]) -> _Termination:
        killed_at = data.get("killed_at")
        return cls(
            requested_at=float(str(data["requested_at"])),
            kill_deadline=float(str(data["kill_deadline"])),
            killed_at=None if killed_at is None else float(str(killed_at)),
        )


def _write_atomically(path: Path, content: bytes, *, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as file:
        file.write(content)
    tmp.replace(path)


def _write_json(path: Path, data: object, *, mode: int = 0o644) -> None:
    _write_atomically(path, json.dumps(data, indent=2).encode(), mode=mode)


def _read_json(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None
    return data if isinstance(data, dict) else None


def _read_record(directory: Path) -> _Record | None:
    try:
        data = _read_json(directory / INSTANCE_FILE)
        return None if data is None else _Record.from_json(data)
    except (ValueError, KeyError, TypeError) as exc:
        # Written atomically, so only tampering gets here; such a directory is not an instance.
        log.warning("ignoring %s: unreadable %s (%s)", directory, INSTANCE_FILE, exc)
        return None


def _read_termination(directory: Path) -> _Termination | None:
    data = _read_json(directory / TERMINATE_FILE)
    return None if data is None else _Termination.from_json(data)


def _mtime(path: Path) -> datetime | None:
    try:
        return datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)
    except FileNotFoundError:
        return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def _read_exit_code(directory: Path) -> int | None:
    try:
        return int((directory / EXIT_FILE).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _instant(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=UTC)


# --- processes ----------------------------------------------------------------------------


def _signal_group(process: ProcessRecord, sig: signal.Signals) -> None:
    """Signal the runner's process group, only if the recorded runner is still that process."""
    if is_running(process):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)


def _signal_runner(process: ProcessRecord, sig: signal.Signals) -> None:
    if is_running(process):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(process.pid, sig)


def _reap(process: ProcessRecord) -> None:
    # While the agent that started a runner lives, it is the runner's parent: collect the exit
    # status so finished runners do not stay zombies. Only a zombie that still carries the
    # recorded start time is ours; after an agent restart init reaps and this is a no-op.
    if start_ticks(process.pid) == process.start_ticks:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(process.pid, os.WNOHANG)


# --- CRI logs -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogLine:
    """One parsed line of a CRI log file."""

    timestamp: bytes
    epoch_ns: int | None
    stream: bytes
    partial: bool
    content: bytes

    def render(self, *, timestamps: bool) -> bytes:
        """As kubelet serves it: optional timestamp prefix; partial lines get no newline."""
        prefix = self.timestamp + b" " if timestamps else b""
        return prefix + self.content + (b"" if self.partial else b"\n")


def parse_timestamp(value: bytes) -> int | None:
    """RFC3339 UTC (``...Z``, any fraction) to nanoseconds since the epoch; None if not one."""
    try:
        text = value.decode("ascii")
        if not text.endswith("Z"):
            return None
        head, _, fraction = text[:-1].partition(".")
        if fraction and not fraction.isdigit():
            return None
        whole = datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        return None
    return int(whole.timestamp()) * 1_000_000_000 + int(fraction.ljust(9, "0")[:9] or 0)


def parse_cri_line(raw: bytes) -> LogLine | None:
    """``<timestamp> <stdout|stderr> <F|P>[:tags] <content>``; None for anything else."""
    parts = raw.split(b" ", 3)
    if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr") or not parts[2]:
        return None
    return LogLine(
        timestamp=parts[0],
        epoch_ns=parse_timestamp(parts[0]),
        stream=parts[1],
        partial=parts[2].startswith(b"P"),
        content=parts[3] if len(parts) == 4 else b"",
    )


def select_history(
    lines: list[LogLine], *, tail_lines: int | None, since_ns: int | None
) -> list[LogLine]:
    """The existing lines `kubectl logs` asks for: newer than ``since_ns``, then the last N."""
    if since_ns is not None:
        lines = [line for line in lines if line.epoch_ns is None or line.epoch_ns >= since_ns]
    if tail_lines is not None:
        lines = lines[-tail_lines:] if tail_lines > 0 else []
    return lines


def _read_complete_lines(path: Path, offset: int) -> tuple[list[LogLine], int]:
    """Parsed complete lines from ``offset`` on, and the offset after the last complete one."""
    try:
        with path.open("rb") as file:
            file.seek(offset)
            data = file.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
    parsed = (parse_cri_line(raw) for raw in data[:end].split(b"\n")[:-1])
    return [line for line in parsed if line is not None], offset + end


class _ByteBudget:
    """``limit_bytes``: cuts the output at exactly that many bytes, as kubelet does."""

    def __init__(self, limit: int | None) -> None:
        self._left = limit

    @property
    def spent(self) -> bool:
        return self._left is not None and self._left <= 0

    def take(self, chunk: bytes) -> bytes:
        if self._left is None:
            return chunk
        chunk = chunk[: self._left]
        self._left -= len(chunk)
        return chunk


@contextlib.contextmanager
def _io_errors_as_transient(provider: str) -> Iterator[None]:
    """The contract lets only ``domain.errors`` escape: a failing disk is worth a retry."""
    try:
        yield
    except OSError as exc:
        raise Transient(f"local provider state I/O failed: {exc}", provider=provider) from exc


# --- the provider -------------------------------------------------------------------------


class LocalProvider:
    """``domain.contract.Provider`` running containers' commands as local processes."""

    def __init__(
        self,
        config: LocalProviderConfig,
        *,
        state_dir: Path,
        rng: random.Random | None = None,
    ) -> None:
        if not config.enabled:
            raise LocalProviderDisabled(
                f"provider {config.name!r} (type local) runs commands on this machine; "
                "set enabled: true to allow it"
            )
        self._config = config
        self._state_dir = config.state_dir if config.state_dir is not None else state_dir
        self._state_dir.mkdir(parents=True, exist_ok=True)
        self._offers: dict[str, SimulatedOffer] = {offer.sku: offer for offer in config.offers}
        # Injectable so tests decide which creates the failure rate fails.
        self._rng = rng if rng is not None else random.Random()  # noqa: S311 - not crypto

    @property
    def name(self) -> str:
        return self._config.name

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(logs=True, follow_logs=True, log_timestamps=True)

    @property
    def state_dir(self) -> Path:
        """Where instances live; pass it to ``inject_loss`` and ``set_faults``."""
        return self._state_dir

    async def offers(self) -> list[Offer]:
        await self._delay()
        with _io_errors_as_transient(self.name):
            active = self._active_by_sku()
        return [self._offer(offer, active.get(offer.sku, 0)) for offer in self._offers.values()]

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        await self._delay()
        # No await from here on: the capacity check and the claim of the directory happen
        # without another call of this provider in between.
        with _io_errors_as_transient(self.name):
            created = self._create(spec, offer)
        if self._lost_response():
            raise Transient("injected timeout after the create went through", provider=self.name)
        return created

    async def get(self, instance_id: str) -> Instance:
        await self._delay()
        with _io_errors_as_transient(self.name):
            instance = self._observe(self._directory(instance_id))
        if instance is None:
            raise NotFound(f"no local instance {instance_id!r}", provider=self.name)
        return instance

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        await self._delay()
        if not _INSTANCE_ID.fullmatch(instance_id):
            return  # not a name we ever give, so it does not exist: done
        with _io_errors_as_transient(self.name):
            self._delete(self._state_dir / instance_id, grace_seconds)

    async def list_ours(self) -> list[Instance]:
        await self._delay()
        with _io_errors_as_transient(self.name):
            return [instance for _, instance in self._scan()]

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        await self._delay()
        directory = self._directory(instance_id)
        with _io_errors_as_transient(self.name):
            if _read_record(directory) is None:
                retained = self._retained_log(instance_id)
                if not retained.exists():
                    raise NotFound(f"no local instance {instance_id!r}", provider=self.name)
                finished = LogOptions(
                    tail_lines=options.tail_lines,
                    timestamps=options.timestamps,
                    since_seconds=options.since_seconds,
                    limit_bytes=options.limit_bytes,
                )
                async for chunk in self._stream_log(directory, finished, path=retained):
                    yield chunk
                return
            async for chunk in self._stream_log(directory, options):
                yield chunk

    async def close(self) -> None:
        """Nothing to release: like cloud machines, instances outlive the agent."""

    # --- internals ------------------------------------------------------------------------

    async def _delay(self) -> None:
        with _io_errors_as_transient(self.name):
            faults = self._faults()
        if faults.api_latency_seconds > 0:
            await asyncio.sleep(faults.api_latency_seconds)
        if faults.call_failure_rate > 0 and self._rng.random() < faults.call_failure_rate:
            raise self._rng.choice(_CALL_ERRORS)(self.name)

    def _lost_response(self) -> bool:
        """A flaky create that worked but whose answer is lost on the way back."""
        rate = self._faults().call_failure_rate
        return rate > 0 and self._rng.random() < rate / 3

    def _faults(self) -> _Faults:
        configured = self._config.faults
        overrides = _read_fault_overrides(self._state_dir / FAULTS_FILE)
        return _Faults(
            create_failure_rate=float(
                overrides.get("create_failure_rate", configured.create_failure_rate)
            ),
            api_latency_seconds=float(
                overrides.get("api_latency_seconds", configured.api_latency_seconds)
            ),
            fail_creates=int(overrides.get("fail_creates", 0)),
            create_error=str(overrides.get("create_error", configured.create_error)),
            call_failure_rate=float(overrides.get("call_failure_rate", 0.0)),
        )

    def _create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        instance_id = f"local-{spec.pod_uid}-{spec.attempt}"
        if not _INSTANCE_ID.fullmatch(instance_id):
            raise InvalidSpec(
                f"pod uid {spec.pod_uid!r} cannot name a local instance",
                provider=self.name,
                field="metadata.uid",
            )
        directory = self._state_dir / instance_id
        existing = self._observe(directory)
        if existing is not None:
            return existing
        argv = [*spec.command, *spec.args]
        env = self._environment(spec)
        self._check_runnable(argv, env)
        configured = self._offers.get(offer.sku)
        if configured is None or offer.provider != self.name:
            raise CapacityUnavailable(f"no offer {offer.key} here", provider=self.name)
        self._inject_create_failure()
        if self._active_by_sku().get(configured.sku, 0) >= configured.capacity:
            raise CapacityUnavailable(
                f"offer {offer.key} is at capacity ({configured.capacity} running)",
                provider=self.name,
            )
        return self._launch(spec, configured, directory, argv, env)

    def _retained_log(self, instance_id: str) -> Path:
        return self._state_dir / RETAINED_LOGS_DIR / f"{instance_id}.log"

    def _release(self, directory: Path) -> None:
        """Forget a finished instance, keeping its log for a later `logs` call."""
        log_file = directory / LOG_FILE
        if log_file.exists():
            retained = self._retained_log(directory.name)
            retained.parent.mkdir(exist_ok=True)
            log_file.replace(retained)
        shutil.rmtree(directory, ignore_errors=True)

    def _delete(self, directory: Path, grace_seconds: float) -> None:
        record = _read_record(directory)
        instance = self._observe(directory)
        if record is None or instance is None:
            # Already gone: a second delete also drops the retained log.
            self._retained_log(directory.name).unlink(missing_ok=True)
            return
        if instance.state not in _ACTIVE:
            # Finished: release it. SIGKILL first in case the runner is still on its way out.
            if record.process is not None:
                _signal_group(record.process, signal.SIGKILL)
            self._release(directory)
            return
        now = time.time()
        deadline = now + max(0.0, grace_seconds)
        termination = _read_termination(directory)
        if termination is None:
            termination = _Termination(requested_at=now, kill_deadline=deadline)
            _write_json(directory / TERMINATE_FILE, termination.to_json())
            if record.process is not None and grace_seconds > 0:
                # To the runner only: it forwards SIGTERM to the program, the way a container
                # runtime signals PID 1, so the program sees one SIGTERM, not one per process.
                _signal_runner(record.process, signal.SIGTERM)
        elif deadline < termination.kill_deadline:
            termination = _Termination(termination.requested_at, deadline, termination.killed_at)
            _write_json(directory / TERMINATE_FILE, termination.to_json())
        self._enforce_deadline(directory, record, termination, now)

    def _inject_create_failure(self) -> None:
        faults = self._faults()
        error = _CREATE_ERRORS.get(faults.create_error, _CREATE_ERRORS["capacity"])
        with _faults_locked(self._state_dir) as path:
            overrides = _read_fault_overrides(path)
            remaining = int(overrides.get("fail_creates", 0))
            if remaining > 0:
                _write_json(path, {**overrides, "fail_creates": remaining - 1})
                raise error("injected create failure (fail_creates)", self.name)
        rate = faults.create_failure_rate
        if rate > 0 and self._rng.random() < rate:
            raise error(f"injected create failure (create_failure_rate {rate})", self.name)

    def _offer(self, offer: SimulatedOffer, active: int) -> Offer:
        return simulated_offer(self.name, offer, active=active)

    def _directory(self, instance_id: str) -> Path:
        # The id names a directory: refuse anything that could point outside the state dir.
        if not _INSTANCE_ID.fullmatch(instance_id):
            raise NotFound(f"no local instance {instance_id!r}", provider=self.name)
        return self._state_dir / instance_id

    def _environment(self, spec: WorkloadSpec) -> dict[str, str]:
        env = {name: os.environ[name] for name in _BASE_ENV if name in os.environ}
        env.update({var.name: var.value for var in spec.env})
        return env

    def _check_runnable(self, argv: list[str], env: dict[str, str]) -> None:
        if not argv:
            raise InvalidSpec(
                "the local provider runs the container's command as a local process and "
                "ignores the image, so the container needs a command (or args)",
                provider=self.name,
                field=_COMMAND_FIELD,
            )
        if any("\0" in arg for arg in argv):
            raise InvalidSpec(
                "command and args must not contain NUL characters",
                provider=self.name,
                field=_COMMAND_FIELD,
            )
        for name, value in env.items():
            if not name or "=" in name or "\0" in name or "\0" in value:
                raise InvalidSpec(
                    f"environment variable {name!r} cannot be set on a process",
                    provider=self.name,
                    field="spec.containers[0].env",
                )

    def _launch(
        self,
        spec: WorkloadSpec,
        offer: SimulatedOffer,
        directory: Path,
        argv: list[str],
        env: dict[str, str],
    ) -> Instance:
        # A directory without instance.json is what an interrupted create left; start over.
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        record = _Record(
            instance_id=directory.name,
            pod_uid=spec.pod_uid,
            attempt=spec.attempt,
            sku=offer.sku,
            offer_key=self._offer(offer, 0).key,
            price_per_hour=offer.price_per_hour,
            created_at=time.time(),
            process=None,
        )
        # Recorded before the process starts: an agent dying in between leaves an instance
        # that reports LOST instead of a directory nobody recognises.
        _write_json(directory / INSTANCE_FILE, record.to_json())
        _write_json(directory / ENV_FILE, env, mode=0o600)  # may hold secrets: owner only
        workdir = Path(spec.working_dir) if spec.working_dir else directory
        runner = [
            sys.executable,
            "-m",
            "providers.local.runner",
            "--log",
            str(directory / LOG_FILE),
            "--exit-file",
            str(directory / EXIT_FILE),
            "--started-file",
            str(directory / STARTED_FILE),
            "--env-file",
            str(directory / ENV_FILE),
            "--cwd",
            str(workdir if workdir.is_dir() else directory),
            "--start-delay",
            str(offer.startup_seconds),
            "--",
            *argv,
        ]
        try:
            process = start_process(
                f"local-runner {directory.name}",
                runner,
                log_file=directory / RUNNER_LOG_FILE,
                cwd=_PACKAGE_ROOT,
            )
        except (OSError, RuntimeError) as exc:
            shutil.rmtree(directory, ignore_errors=True)
            raise Transient(f"cannot start the local runner: {exc}", provider=self.name) from exc
        record = dataclasses.replace(record, process=process)
        _write_json(directory / INSTANCE_FILE, record.to_json())
        log.info("started %s for pod %s (pid %d)", directory.name, spec.pod_uid, process.pid)
        instance = self._observe(directory)
        assert instance is not None  # we just wrote it
        return instance

    def _scan(self) -> list[tuple[_Record, Instance]]:
        """Every instance in one directory scan; TERMINATED ones are forgotten on the way."""
        found: list[tuple[_Record, Instance]] = []
        for directory in sorted(self._state_dir.iterdir()):
            if not _INSTANCE_ID.fullmatch(directory.name) or not directory.is_dir():
                continue
            record = _read_record(directory)
            instance = self._observe(directory)
            if record is None or instance is None:
                continue
            if instance.state is InstanceState.TERMINATED:
                self._release(directory)
                continue
            found.append((record, instance))
        return found

    def _active_by_sku(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for record, instance in self._scan():
            if instance.state in _ACTIVE:
                counts[record.sku] = counts.get(record.sku, 0) + 1
        return counts

    async def _stream_log(
        self, directory: Path, options: LogOptions, *, path: Path | None = None
    ) -> AsyncIterator[bytes]:
        path = path or directory / LOG_FILE
        since_ns = (
            None
            if options.since_seconds is None
            else time.time_ns() - options.since_seconds * 1_000_000_000
        )
        budget = _ByteBudget(options.limit_bytes)
        lines, offset = _read_complete_lines(path, 0)
        lines = select_history(lines, tail_lines=options.tail_lines, since_ns=since_ns)
        finished = not options.follow
        while True:
            for line in lines:
                chunk = budget.take(line.render(timestamps=options.timestamps))
                if chunk:
                    yield chunk
                if budget.spent:
                    return
            if finished:
                return
            # Look at the process before reading: once it is seen finished, the read that
            # follows holds everything it wrote, and the stream can end.
            instance = self._observe(directory)
            finished = instance is None or instance.state not in _ACTIVE
            if not finished:
                await asyncio.sleep(_FOLLOW_POLL_SECONDS)
            lines, offset = _read_complete_lines(path, offset)

    def _enforce_deadline(
        self, directory: Path, record: _Record, termination: _Termination, now: float
    ) -> None:
        if record.process is None or now < termination.kill_deadline:
            return
        if is_running(record.process):
            log.info("%s: grace period over, sending SIGKILL", directory.name)
            _signal_group(record.process, signal.SIGKILL)
            if termination.killed_at is None:
                killed = _Termination(termination.requested_at, termination.kill_deadline, now)
                _write_json(directory / TERMINATE_FILE, killed.to_json())

    def _observe(self, directory: Path) -> Instance | None:
        """The instance's state from its files and its runner; None if it does not exist.

        Acts as well as reads: a lost instance's processes are killed, an overdue termination
        is escalated to SIGKILL, and a finished runner is reaped.
        """
        record = _read_record(directory)
        if record is None:
            return None
        process = record.process
        alive = process is not None and is_running(process)
        if process is not None and not alive:
            _reap(process)

        lost_message = _read_text(directory / LOST_FILE)
        if lost_message is not None:
            if process is not None and alive:
                _signal_group(process, signal.SIGKILL)
            return self._instance(
                record,
                directory,
                InstanceState.LOST,
                message=lost_message or "instance lost",
                finished_at=_mtime(directory / LOST_FILE),
            )
        exit_code = _read_exit_code(directory)
        finished_at = _mtime(directory / EXIT_FILE)
        termination = _read_termination(directory)
        if termination is not None:
            if alive:
                self._enforce_deadline(directory, record, termination, time.time())
                return self._instance(
                    record, directory, InstanceState.TERMINATING, message="termination requested"
                )
            return self._instance(
                record,
                directory,
                InstanceState.TERMINATED,
                exit_code=exit_code,
                finished_at=finished_at or _instant(termination.killed_at),
                message="terminated on request",
            )
        if exit_code is not None:
            return self._instance(
                record,
                directory,
                InstanceState.EXITED,
                exit_code=exit_code,
                finished_at=finished_at,
            )
        if alive:
            started = (directory / STARTED_FILE).exists()
            state = InstanceState.RUNNING if started else InstanceState.PENDING
            return self._instance(record, directory, state)
        message = "process vanished" if process is not None else "launch interrupted"
        return self._instance(record, directory, InstanceState.LOST, message=message)

    def _instance(
        self,
        record: _Record,
        directory: Path,
        state: InstanceState,
        *,
        message: str = "",
        exit_code: int | None = None,
        finished_at: datetime | None = None,
    ) -> Instance:
        return Instance(
            provider=self.name,
            instance_id=record.instance_id,
            pod_uid=record.pod_uid,
            attempt=record.attempt,
            state=state,
            offer_key=record.offer_key,
            exit_code=exit_code,
            message=message,
            started_at=_mtime(directory / STARTED_FILE),
            finished_at=finished_at,
            ip="127.0.0.1",
            price_per_hour=record.price_per_hour,
        )
