"""The local provider: runs each container's command as a process on this machine.

For development, the demo and end-to-end tests. There are no containers and no images: the
pod's ``command`` + ``args`` run as a local process under ``providers.local.runner``, and the
offers are simulated from the configuration (prices, capacity, launch latency, faults:
``providers.local.faults``). Every instance is a directory of files (``providers.local.records``),
so a fresh ``LocalProvider`` (an agent restart) finds every instance again, and the processes,
like cloud machines, keep running while no agent watches them. Logs are CRI log lines
(``providers.local.logs``).

Invariants:
- One instance per ``spec.request_id``: the directory name is derived from it, so a second
  create of the same request returns the first instance and starts no process.
- The state of an instance is derived from its files and the liveness of the runner, in one
  place (``_observe``); reads escalate a termination to SIGKILL once its deadline (stored on
  disk) has passed, so a program ignoring SIGTERM ends even across agent restarts.
- SIGTERM goes to the runner, which forwards it to the program (as a container runtime signals
  only PID 1); SIGKILL goes to the runner's whole process group (runner, program, children).
- A scan of the state dir (``list_ours``, ``offers``, the capacity check of ``create``)
  forgets instances it finds TERMINATED by removing their directory, and ``delete`` of an
  instance that no longer runs removes its directory; ``get`` then raises ``NotFound``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import shutil
import signal
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from pathlib import Path

from providers.local.config import LocalProviderConfig
from providers.local.faults import (
    CALL_ERRORS,
    CREATE_ERRORS,
    FAULTS_FILE,
    Faults,
    faults_locked,
    read_fault_overrides,
)
from providers.local.launch import (
    PACKAGE_ROOT,
    check_runnable,
    process_environment,
    runner_command,
)
from providers.local.logs import ByteBudget, read_complete_lines, select_history
from providers.local.processes import (
    is_running,
    reap,
    signal_group,
    signal_runner,
    start_process,
)
from providers.local.records import (
    ENV_FILE,
    EXIT_FILE,
    INSTANCE_FILE,
    INSTANCE_ID,
    LOG_FILE,
    LOST_FILE,
    RETAINED_LOGS_DIR,
    RUNNER_LOG_FILE,
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
from providers.simulated import SimulatedOffer, simulated_offer
from vk_provider.domain.errors import (
    CapacityUnavailable,
    InvalidSpec,
    NotFound,
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

_ACTIVE = frozenset({InstanceState.PENDING, InstanceState.RUNNING, InstanceState.TERMINATING})
_FOLLOW_POLL_SECONDS = 0.2


class LocalProviderDisabled(RuntimeError):
    """The configuration did not opt in to running commands on this machine."""


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
        if not INSTANCE_ID.fullmatch(instance_id):
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
            if read_record(directory) is None:
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
            raise self._rng.choice(CALL_ERRORS)(self.name)

    def _lost_response(self) -> bool:
        """A flaky create that worked but whose answer is lost on the way back."""
        rate = self._faults().call_failure_rate
        return rate > 0 and self._rng.random() < rate / 3

    def _faults(self) -> Faults:
        configured = self._config.faults
        overrides = read_fault_overrides(self._state_dir / FAULTS_FILE)
        return Faults(
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
        if not INSTANCE_ID.fullmatch(instance_id):
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
        env = process_environment(spec)
        check_runnable(argv, env, provider=self.name)
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
        record = read_record(directory)
        instance = self._observe(directory)
        if record is None or instance is None:
            # Already gone: a second delete also drops the retained log.
            self._retained_log(directory.name).unlink(missing_ok=True)
            return
        if instance.state not in _ACTIVE:
            # Finished: release it. SIGKILL first in case the runner is still on its way out.
            if record.process is not None:
                signal_group(record.process, signal.SIGKILL)
            self._release(directory)
            return
        now = time.time()
        deadline = now + max(0.0, grace_seconds)
        termination = read_termination(directory)
        if termination is None:
            termination = Termination(requested_at=now, kill_deadline=deadline)
            write_json(directory / TERMINATE_FILE, termination.to_json())
            if record.process is not None and grace_seconds > 0:
                # To the runner only: it forwards SIGTERM to the program, the way a container
                # runtime signals PID 1, so the program sees one SIGTERM, not one per process.
                signal_runner(record.process, signal.SIGTERM)
        elif deadline < termination.kill_deadline:
            termination = Termination(termination.requested_at, deadline, termination.killed_at)
            write_json(directory / TERMINATE_FILE, termination.to_json())
        self._enforce_deadline(directory, record, termination, now)

    def _inject_create_failure(self) -> None:
        faults = self._faults()
        error = CREATE_ERRORS.get(faults.create_error, CREATE_ERRORS["capacity"])
        with faults_locked(self._state_dir) as path:
            overrides = read_fault_overrides(path)
            remaining = int(overrides.get("fail_creates", 0))
            if remaining > 0:
                write_json(path, {**overrides, "fail_creates": remaining - 1})
                raise error("injected create failure (fail_creates)", self.name)
        rate = faults.create_failure_rate
        if rate > 0 and self._rng.random() < rate:
            raise error(f"injected create failure (create_failure_rate {rate})", self.name)

    def _offer(self, offer: SimulatedOffer, active: int) -> Offer:
        return simulated_offer(self.name, offer, active=active)

    def _directory(self, instance_id: str) -> Path:
        # The id names a directory: refuse anything that could point outside the state dir.
        if not INSTANCE_ID.fullmatch(instance_id):
            raise NotFound(f"no local instance {instance_id!r}", provider=self.name)
        return self._state_dir / instance_id

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
        record = Record(
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
        write_json(directory / INSTANCE_FILE, record.to_json())
        write_json(directory / ENV_FILE, env, mode=0o600)  # may hold secrets: owner only
        runner = runner_command(
            directory,
            workdir=Path(spec.working_dir) if spec.working_dir else None,
            startup_seconds=offer.startup_seconds,
            argv=argv,
        )
        try:
            process = start_process(
                f"local-runner {directory.name}",
                runner,
                log_file=directory / RUNNER_LOG_FILE,
                cwd=PACKAGE_ROOT,
            )
        except (OSError, RuntimeError) as exc:
            shutil.rmtree(directory, ignore_errors=True)
            raise Transient(f"cannot start the local runner: {exc}", provider=self.name) from exc
        record = dataclasses.replace(record, process=process)
        write_json(directory / INSTANCE_FILE, record.to_json())
        log.info("started %s for pod %s (pid %d)", directory.name, spec.pod_uid, process.pid)
        instance = self._observe(directory)
        assert instance is not None  # we just wrote it
        return instance

    def _scan(self) -> list[tuple[Record, Instance]]:
        """Every instance in one directory scan; TERMINATED ones are forgotten on the way."""
        found: list[tuple[Record, Instance]] = []
        for directory in sorted(self._state_dir.iterdir()):
            if not INSTANCE_ID.fullmatch(directory.name) or not directory.is_dir():
                continue
            record = read_record(directory)
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
        budget = ByteBudget(options.limit_bytes)
        lines, offset = read_complete_lines(path, 0)
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
            lines, offset = read_complete_lines(path, offset)

    def _enforce_deadline(
        self, directory: Path, record: Record, termination: Termination, now: float
    ) -> None:
        if record.process is None or now < termination.kill_deadline:
            return
        if is_running(record.process):
            log.info("%s: grace period over, sending SIGKILL", directory.name)
            signal_group(record.process, signal.SIGKILL)
            if termination.killed_at is None:
                killed = Termination(termination.requested_at, termination.kill_deadline, now)
                write_json(directory / TERMINATE_FILE, killed.to_json())

    def _observe(self, directory: Path) -> Instance | None:
        """The instance's state from its files and its runner; None if it does not exist.

        Acts as well as reads: a lost instance's processes are killed, an overdue termination
        is escalated to SIGKILL, and a finished runner is reaped.
        """
        record = read_record(directory)
        if record is None:
            return None
        process = record.process
        alive = process is not None and is_running(process)
        if process is not None and not alive:
            reap(process)

        lost_message = read_text(directory / LOST_FILE)
        if lost_message is not None:
            if process is not None and alive:
                signal_group(process, signal.SIGKILL)
            return self._instance(
                record,
                directory,
                InstanceState.LOST,
                message=lost_message or "instance lost",
                finished_at=mtime(directory / LOST_FILE),
            )
        exit_code = read_exit_code(directory)
        finished_at = mtime(directory / EXIT_FILE)
        termination = read_termination(directory)
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
                finished_at=finished_at or instant(termination.killed_at),
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
        record: Record,
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
            started_at=mtime(directory / STARTED_FILE),
            finished_at=finished_at,
            ip="127.0.0.1",
            price_per_hour=record.price_per_hour,
        )
