"""One container of a local pod: its program, its CRI log, its status file, its restarts.

Used by the pod runner (``vk_provider_adapters.local.runner``) only, in the runner's one thread.

Invariants (the runner's, for one container):
- Only the standard library (and ``vk_provider_adapters.local.layout``/``processes``) is imported:
  the runner starts fast.
- The program leads a process group of its own and dies with the runner (PR_SET_PDEATHSIG);
  stopping the container signals the whole group.
- Output goes to ``container.log`` in the CRI log format, line by line, a line cut at 64 KiB;
  the previous run's log is kept as ``previous.log``; ``status.json`` is written atomically.
- A program killed by signal N exits ``128 + N``; one that cannot be started 127 (not found)
  or 126 (not executable), with the reason in its log.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import selectors
import signal
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from vk_provider_adapters.local.layout import (
    CONTAINER_ENV,
    CONTAINER_LOG,
    CONTAINER_PROCESS,
    CONTAINER_RESTART,
    CONTAINER_SPEC,
    CONTAINER_STATUS,
    PREVIOUS_LOG,
    RunStatus,
)
from vk_provider_adapters.local.processes import start_ticks

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
MAX_BACKOFF_SECONDS = 300.0
BACKOFF_RESET_SECONDS = 600.0  # a container that ran this long starts its back-off afresh
SIDECAR_STOP_GRACE_SECONDS = 10.0
# How long to wait for output after a program exited; a background process that inherited
# its pipes could otherwise keep the container "exiting" forever.
_DRAIN_TIMEOUT_SECONDS = 2.0
IDLE_SECONDS = 1.0  # the longest sleep without a signal
_MAX_LINE_BYTES = 64 * 1024
_PR_SET_PDEATHSIG = 1


def format_timestamp(epoch_ns: int) -> bytes:
    """RFC3339 UTC time with nanoseconds, as the CRI log format writes it."""
    seconds, nanos = divmod(epoch_ns, 1_000_000_000)
    head = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{head}.{nanos:09d}Z".encode()


def exit_code_of(returncode: int) -> int:
    """A ``Popen.returncode`` as a container runtime reports it (signals as 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def backoff_delay(base: float, streak: int) -> float:
    """kubelet's crash-loop back-off before restart number ``streak + 1``."""
    return float(min(base * (2 ** max(streak, 0)), MAX_BACKOFF_SECONDS))


def write_atomically(path: Path, content: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as file:
        file.write(content)
    tmp.replace(path)


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: if the runner is killed on its own (OOM, a stray
    # `kill -9`), the program must not live on unobserved. Linux-only; elsewhere a no-op.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class CriLog:
    """One run's ``container.log``: whole lines per stream, in the CRI log format."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("ab", buffering=0)
        self._pending: dict[bytes, bytes] = {b"stdout": b"", b"stderr": b""}

    def line(self, stream: bytes, text: bytes) -> None:
        self._file.write(b"%s %s F %s\n" % (format_timestamp(time.time_ns()), stream, text))

    def feed(self, stream: bytes, data: bytes) -> None:
        buffered = self._pending[stream] + data
        *lines, rest = buffered.split(b"\n")
        for text in lines:
            self.line(stream, text)
        while len(rest) > _MAX_LINE_BYTES:  # a line without end: cut it, as runtimes do
            self.line(stream, rest[:_MAX_LINE_BYTES])
            rest = rest[_MAX_LINE_BYTES:]
        self._pending[stream] = rest

    def close(self) -> None:
        for stream, rest in self._pending.items():
            if rest:
                self.line(stream, rest)
        self._pending = {b"stdout": b"", b"stderr": b""}
        self._file.close()


class Container:
    """One container of the pod: its program's runs, restarts and status."""

    def __init__(self, directory: Path, name: str, *, pod: str, backoff: float) -> None:
        self.name = name
        self.dir = directory
        self.pod = pod
        spec = json.loads((directory / CONTAINER_SPEC).read_text())
        self.argv: list[str] = [str(a) for a in spec["argv"]]
        self.cwd: str | None = spec.get("cwd")
        self.init: bool = bool(spec.get("init"))
        self.sidecar: bool = bool(spec.get("sidecar"))
        self.env: dict[str, str] = {
            str(k): str(v) for k, v in json.loads((directory / CONTAINER_ENV).read_text()).items()
        }
        self._backoff = backoff
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: CriLog | None = None
        self.open_pipes: set[int] = set()
        self.exited_at: float | None = None  # the program ended; output still draining
        self.restart_at: float | None = None  # in back-off until then
        self.kill_at: float | None = None  # SIGKILL then (a restart request's grace)
        self.streak = 0  # restarts since the last long run (the back-off's exponent)
        self.status = RunStatus(state="waiting", reason="PodInitializing")
        self._write_status()

    # --- status -------------------------------------------------------------------------

    def _write_status(self) -> None:
        write_atomically(self.dir / CONTAINER_STATUS, json.dumps(self.status.to_json()).encode())

    def set_status(self, status: RunStatus) -> None:
        self.status = status
        self._write_status()

    @property
    def running(self) -> bool:
        return self.proc is not None

    @property
    def ended(self) -> bool:
        return self.status.state == "terminated" and self.proc is None

    @property
    def succeeded(self) -> bool:
        return self.ended and self.status.exit_code == 0

    # --- runs ---------------------------------------------------------------------------

    def start(self, selector: selectors.BaseSelector) -> bool:
        """Start a run of the program (rotating the previous run's log); False when the program
        could not be started (the run has ended at once, 126 or 127)."""
        log_path = self.dir / CONTAINER_LOG
        if self.status.state == "terminated" or self.status.restart_count:
            with contextlib.suppress(FileNotFoundError):
                log_path.replace(self.dir / PREVIOUS_LOG)
        self.log = CriLog(log_path)
        self.restart_at = None
        now = time.time()
        try:
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=self.cwd,
                env=self.env,
                process_group=0,
                # Safe: the runner has no other thread (see the module docstring).
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            self.log.line(b"stderr", f"local runner: cannot start {self.argv[0]!r}: {exc}".encode())
            self.log.close()
            self.log = None
            code = EXIT_NOT_FOUND if exc.errno == errno.ENOENT else EXIT_NOT_EXECUTABLE
            self._finished(
                code, started=now, finished=now, reason="ContainerCannotRun", message=str(exc)
            )
            return False
        self.proc = proc
        ticks = start_ticks(proc.pid)
        record = {"name": self.name, "pid": proc.pid, "start_ticks": ticks or 0}
        write_atomically(self.dir / CONTAINER_PROCESS, json.dumps(record).encode())
        assert proc.stdout is not None and proc.stderr is not None
        for pipe, stream in ((proc.stdout, b"stdout"), (proc.stderr, b"stderr")):
            os.set_blocking(pipe.fileno(), False)
            selector.register(pipe, selectors.EVENT_READ, (self, stream))
            self.open_pipes.add(pipe.fileno())
        self.set_status(
            RunStatus(
                state="running",
                started_at=now,
                restart_count=self.status.restart_count,
                **self._last(),  # type: ignore[arg-type]
            )
        )
        return True

    def next_deadline(self) -> float | None:
        """When this container next needs the runner's attention without a signal."""
        times = [t for t in (self.restart_at, self.kill_at) if t is not None]
        if self.exited_at is not None:
            times.append(self.exited_at + _DRAIN_TIMEOUT_SECONDS)
        return min(times) if times else None

    def _last(self) -> dict[str, object]:
        s = self.status
        return {
            "last_exit_code": s.last_exit_code,
            "last_reason": s.last_reason,
            "last_started_at": s.last_started_at,
            "last_finished_at": s.last_finished_at,
        }

    def read(self, selector: selectors.BaseSelector, pipe: IO[bytes], stream: bytes) -> None:
        try:
            data = os.read(pipe.fileno(), 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            assert self.log is not None
            self.log.feed(stream, data)
            return
        self._close_pipe(selector, pipe)

    def _close_pipe(self, selector: selectors.BaseSelector, pipe: IO[bytes]) -> None:
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(pipe)
        self.open_pipes.discard(pipe.fileno())
        pipe.close()

    def poll(self, selector: selectors.BaseSelector, now: float) -> bool:
        """Collect a finished run (after its output drained); True when the run ended now."""
        proc = self.proc
        if proc is None:
            return False
        if self.kill_at is not None and now >= self.kill_at:
            _signal_group(proc.pid, signal.SIGKILL)
            self.kill_at = None
        if self.exited_at is None:
            if proc.poll() is None:
                return False
            self.exited_at = now
        if self.open_pipes and now - self.exited_at < _DRAIN_TIMEOUT_SECONDS:
            return False
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None and not pipe.closed:
                self._close_pipe(selector, pipe)
        assert self.log is not None and proc.returncode is not None
        self.log.close()
        self.log = None
        # Whatever the program left in its group goes with it, as in a container.
        _signal_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(FileNotFoundError):
            (self.dir / CONTAINER_PROCESS).unlink()
        self.proc = None
        self.exited_at = None
        self.kill_at = None
        code = exit_code_of(proc.returncode)
        started = self.status.started_at or now
        if now - started >= BACKOFF_RESET_SECONDS:
            self.streak = 0
        self._finished(code, started=started, finished=now)
        return True

    def _finished(
        self, code: int, *, started: float, finished: float, reason: str = "", message: str = ""
    ) -> None:
        self.set_status(
            RunStatus(
                state="terminated",
                reason=reason or ("Completed" if code == 0 else "Error"),
                message=message,
                exit_code=code,
                started_at=started,
                finished_at=finished,
                restart_count=self.status.restart_count,
                **self._last(),  # type: ignore[arg-type]
            )
        )

    def schedule_restart(self, now: float) -> None:
        """Back-off, then a new run: the terminated run becomes the last state."""
        s = self.status
        delay = backoff_delay(self._backoff, self.streak)
        self.streak += 1
        self.restart_at = now + delay
        self.set_status(
            RunStatus(
                state="waiting",
                reason="CrashLoopBackOff",
                message=(
                    f"back-off {delay:.0f}s restarting failed container={self.name} pod={self.pod}"
                ),
                restart_count=s.restart_count + 1,
                last_exit_code=s.exit_code,
                last_reason=s.reason,
                last_started_at=s.started_at,
                last_finished_at=s.finished_at,
            )
        )

    def stop(self, grace: float | None = None) -> None:
        """SIGTERM the program's group; SIGKILL after ``grace`` seconds if given."""
        if self.proc is None:
            return
        _signal_group(self.proc.pid, signal.SIGTERM)
        if grace is not None:
            deadline = time.time() + grace
            self.kill_at = deadline if self.kill_at is None else min(self.kill_at, deadline)

    def restart_requested(self) -> float | None:
        """A pending restart request's grace (seconds), consumed; None when there is none."""
        path = self.dir / CONTAINER_RESTART
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        path.unlink(missing_ok=True)
        grace = data.get("grace_seconds") if isinstance(data, dict) else None
        return float(grace) if isinstance(grace, int | float) else 0.0

    def kill(self) -> None:
        if self.proc is not None:
            _signal_group(self.proc.pid, signal.SIGKILL)
