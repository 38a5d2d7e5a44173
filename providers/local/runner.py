"""The local provider's pod runner: runs every container of one pod as a kubelet would.

Started by ``providers.local.adapter`` as a detached process (a session of its own)::

    python -m providers.local.runner --instance DIR [--start-delay SECONDS]

It reads the pod's plan (``DIR/pod.json``, ``layout.py``), waits ``--start-delay`` seconds
(simulated launch latency), then:

1. runs the init containers in order: a plain one to completion (a failure is retried with
   back-off, or under restartPolicy Never ends the pod failed); a native sidecar
   (``restartPolicy: Always``) is started and kept running beside everything after it;
2. starts every app container; an app container that exits is restarted as the pod's
   restartPolicy says (Always; OnFailure if it failed; Never not), after kubelet's crash-loop
   back-off (the plan's ``backoff_seconds``, doubled per restart up to five minutes, reset
   after ten minutes of running); a sidecar is always restarted;
3. when no app container runs or will restart, stops the sidecars (SIGTERM, in reverse order)
   and writes the pod's exit code to ``DIR/exit`` (0 when every app container succeeded).

Each container's program leads a process group of its own; its output goes to its
``container.log`` in the CRI log format (``<RFC3339Nano UTC> <stdout|stderr> F <line>``), the
previous run's to ``previous.log``; ``status.json`` says what it is doing. A
``restart.json`` request (a failed liveness probe) stops the container (SIGTERM, SIGKILL
after the grace it names), and the restart policy decides what follows.

Invariants:
- Only the standard library (and ``providers.local.layout``/``processes``, which use only it)
  is imported, so the runner starts fast and never depends on the agent's state.
- One thread: output is read with a selector, so ``preexec_fn`` runs in a process that has no
  other thread (PR_SET_PDEATHSIG: a program dies with the runner).
- ``DIR/started`` exists once the first container was started (its mtime is the time);
  ``DIR/exit`` appears atomically, after every output line the runner could read was written.
- SIGTERM stops the pod: app and init containers get SIGTERM, then the sidecars once the
  apps are gone; nothing restarts any more. Like a pod sandbox, nothing a program leaves
  behind outlives the runner: it kills every container's process group, then its own.
- A program killed by signal N exits ``128 + N`` (137 for SIGKILL); one that cannot be started
  127 (not found) or 126 (not executable), with the reason in its log.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from providers.local.layout import (
    CONTAINER_ENV,
    CONTAINER_LOG,
    CONTAINER_PROCESS,
    CONTAINER_RESTART,
    CONTAINER_SPEC,
    CONTAINER_STATUS,
    POD_PLAN,
    PREVIOUS_LOG,
    RunStatus,
    container_dir,
)
from providers.local.processes import start_ticks

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
MAX_BACKOFF_SECONDS = 300.0
BACKOFF_RESET_SECONDS = 600.0  # a container that ran this long starts its back-off afresh
SIDECAR_STOP_GRACE_SECONDS = 10.0
# How long to wait for output after a program exited; a background process that inherited
# its pipes could otherwise keep the container "exiting" forever.
_DRAIN_TIMEOUT_SECONDS = 2.0
_IDLE_SECONDS = 1.0  # the longest sleep without a signal
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


def _write_atomically(path: Path, content: bytes, mode: int = 0o644) -> None:
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
        _write_atomically(self.dir / CONTAINER_STATUS, json.dumps(self.status.to_json()).encode())

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
        _write_atomically(self.dir / CONTAINER_PROCESS, json.dumps(record).encode())
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


class PodRunner:
    """The pod's life: init containers, sidecars, app containers, restarts, the end."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        plan = json.loads((directory / POD_PLAN).read_text())
        self.policy: str = plan.get("restart_policy", "Always")
        backoff = float(plan.get("backoff_seconds", 10.0))
        pod = str(plan.get("pod", ""))

        def container(name: str) -> Container:
            return Container(container_dir(directory, name), name, pod=pod, backoff=backoff)

        self.inits = [container(str(n)) for n in plan.get("init", [])]
        self.apps = [container(str(n)) for n in plan.get("apps", [])]
        self.selector = selectors.DefaultSelector()
        self.next_init = 0
        self.stopping = False
        self.failed_init: Container | None = None
        self._term = False
        self._requested = True  # look at restart requests once at the start, then on SIGUSR1
        self._started_marked = False

    def on_sigterm(self, signum: int, frame: object) -> None:
        self._term = True

    def on_sigusr1(self, signum: int, frame: object) -> None:
        self._requested = True

    @property
    def sidecars(self) -> list[Container]:
        return [c for c in self.inits if c.sidecar]

    def _start(self, container: Container, now: float) -> None:
        if not self._started_marked:
            _write_atomically(self.dir / "started", b"")
            self._started_marked = True
        if not container.start(self.selector):
            self._ended(container, now)  # could not run: as a run that failed at once

    def _ended(self, container: Container, now: float) -> None:
        """A run of ``container`` ended: restart it, or not, as the policy says."""
        if self.stopping:
            return
        if self._wants_restart(container):
            container.schedule_restart(now)
        elif container.init and not container.sidecar and not container.succeeded:
            self.failed_init = container  # restartPolicy Never: the pod has failed

    def _wants_restart(self, container: Container) -> bool:
        code = container.status.exit_code
        if container.sidecar:
            return True
        if container.init:  # a plain init container: until it succeeds, unless Never
            return code != 0 and self.policy != "Never"
        return self.policy == "Always" or (self.policy == "OnFailure" and code != 0)

    def _step_init(self, now: float) -> None:
        """Advance the init sequence: one plain init container at a time, sidecars kept."""
        while self.next_init < len(self.inits):
            current = self.inits[self.next_init]
            if current.sidecar:
                if not current.running and current.restart_at is None and not current.ended:
                    self._start(current, now)
                if not current.running:
                    return  # not started (yet): what follows waits
                self.next_init += 1
                continue
            if current.succeeded:
                self.next_init += 1
                continue
            if not current.running and current.restart_at is None and not current.ended:
                self._start(current, now)
            return
        if self.next_init == len(self.inits):
            self.next_init += 1  # initialized: every app container starts now
            for app in self.apps:
                self._start(app, now)

    def _collect(self, now: float) -> None:
        for container in (*self.inits, *self.apps):
            if container.poll(self.selector, now):
                self._ended(container, now)
        for container in (*self.inits, *self.apps):
            if (
                not self.stopping
                and container.restart_at is not None
                and now >= container.restart_at
                and (not container.init or container.sidecar or self._is_current(container))
            ):
                self._start(container, now)

    def _is_current(self, container: Container) -> bool:
        return self.next_init < len(self.inits) and self.inits[self.next_init] is container

    def _requests(self) -> None:
        for container in (*self.inits, *self.apps):
            grace = container.restart_requested()
            if grace is not None and container.running:
                container.stop(grace)

    def _apps_done(self) -> bool:
        """No app container runs or will restart (and they had their chance to start)."""
        if self.failed_init is not None:
            return True
        if self.next_init <= len(self.inits):
            return False
        return all(not a.running and a.restart_at is None for a in self.apps)

    def _stop_all(self) -> None:
        """SIGTERM app and init containers now; sidecars once the others are gone."""
        for container in (*self.apps, *(c for c in self.inits if not c.sidecar)):
            container.stop()
        for container in (*self.inits, *self.apps):
            if container.restart_at is not None:
                container.restart_at = None

    def _stop_sidecars(self) -> None:
        others_running = any(c.running for c in (*self.apps, *self.inits) if not c.sidecar)
        if others_running:
            return
        for sidecar in reversed(self.sidecars):
            if sidecar.running and sidecar.kill_at is None:
                sidecar.stop(SIDECAR_STOP_GRACE_SECONDS)

    def exit_code(self) -> int:
        if self.failed_init is not None:
            return self.failed_init.status.exit_code or 1
        for app in self.apps:
            code = app.status.exit_code
            if app.status.state != "terminated" or code is None:
                return 1 if not self._term else 143
            if code != 0:
                return code
        return 0

    def _timeout(self, now: float) -> float:
        """Sleep until a signal (SIGCHLD, SIGTERM, SIGUSR1) or the next timer, at most 1 s."""
        times = [t for c in (*self.inits, *self.apps) if (t := c.next_deadline()) is not None]
        return max(0.0, min([now + _IDLE_SECONDS, *times]) - now)

    def run(self, start_delay: float) -> int:
        if start_delay > 0:
            # SIGTERM keeps its default action here: it ends the runner before anything runs.
            time.sleep(start_delay)
        # Signals wake the loop: a program ended (SIGCHLD), stop the pod (SIGTERM), look at
        # the restart requests (SIGUSR1, sent by the provider after writing one).
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGTERM, self.on_sigterm)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGUSR1, self.on_sigusr1)
        self.selector.register(wake_read, selectors.EVENT_READ, None)
        while True:
            now = time.time()
            if self._term and not self.stopping:
                self.stopping = True
                self._stop_all()
            if not self.stopping:
                if self._requested:
                    self._requested = False
                    self._requests()
                self._step_init(now)
            self._collect(now)
            if not self.stopping and self._apps_done():
                self.stopping = True
                self._stop_all()
            if self.stopping:
                self._stop_sidecars()
                if not any(c.running for c in (*self.inits, *self.apps)):
                    break
            for key, _ in self.selector.select(timeout=self._timeout(time.time())):
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_read, 4096)
                    continue
                owner, stream = key.data
                owner.read(self.selector, key.fileobj, stream)
        code = self.exit_code()
        _write_atomically(self.dir / "exit", f"{code}\n".encode())
        return code

    def kill_everything(self) -> None:
        for container in (*self.inits, *self.apps):
            container.kill()


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m providers.local.runner")
    parser.add_argument("--instance", type=Path, required=True, help="The instance directory.")
    parser.add_argument("--start-delay", type=float, default=0.0, help="Seconds to wait first.")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    options = _parse(sys.argv[1:] if argv is None else argv)
    runner = PodRunner(options.instance)
    try:
        code = runner.run(options.start_delay)
    finally:
        runner.kill_everything()
    if os.getpgrp() == os.getpid():
        # We lead the process group (started in a session of our own): whatever is left ends
        # with it, as in a pod sandbox. This also ends the runner itself.
        sys.stdout.flush()
        os.killpg(os.getpid(), signal.SIGKILL)
    return code


if __name__ == "__main__":
    sys.exit(main())
