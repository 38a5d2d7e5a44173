"""One helper program run as a child process: its own log file, health-checked, stopped whole.

``ChildProcess.start`` launches the program in a new session (so it is its own process group
leader), appends its stdout and stderr to a log file, and waits until a health check passes;
``stop`` signals the whole group (SIGTERM, then SIGKILL after a grace period) and reaps it.
It is a context manager, so ``with start_x(...) as x:`` cannot leak the process.

Invariants:
- A child never outlives the ``ChildProcess`` that started it when ``stop`` runs (tests call
  it from ``finally``), and, on Linux, not even its parent's death: when started from the
  main thread, the kernel kills it when the parent dies (``PR_SET_PDEATHSIG``). The death
  signal is tied to the *thread* that forked, which is why it is only set from the main
  thread: a child started from a worker thread (``asyncio.to_thread``) would otherwise be
  killed when that thread ends.
- A start that fails (the program exits, or stays unhealthy past the deadline) stops what it
  started and raises ``ClusterError`` with the log's last lines.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, Self

import httpx

from vk_provider_dev.cluster.errors import ClusterError

_PR_SET_PDEATHSIG: Final = 1
HealthCheck = Callable[[], bool]


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def http_ok(url: str, *, timeout: float = 2.0) -> HealthCheck:
    """A health check that passes when ``GET url`` answers 200."""

    def check() -> bool:
        try:
            return httpx.get(url, timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    return check


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class ChildProcess:
    """A started helper program (see the module docstring)."""

    def __init__(self, name: str, process: subprocess.Popen[bytes], log_file: Path) -> None:
        self.name = name
        self.log_file = log_file
        self._process: subprocess.Popen[bytes] | None = process
        self.pid = process.pid

    @classmethod
    def start(
        cls,
        name: str,
        argv: Sequence[str],
        *,
        log_file: Path,
        health: HealthCheck,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 60.0,
    ) -> ChildProcess:
        """Start ``argv`` and return once ``health()`` passes (module docstring)."""
        log_file.parent.mkdir(parents=True, exist_ok=True)
        on_main_thread = threading.current_thread() is threading.main_thread()
        with log_file.open("ab") as log:
            process = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=None if env is None else dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent if on_main_thread and sys.platform == "linux" else None,
            )
        child = cls(name, process, log_file)
        try:
            child.wait_healthy(health, timeout=timeout)
        except BaseException:
            child.stop()
            raise
        return child

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self._process is None else self._process.poll()

    def wait_healthy(self, health: HealthCheck, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if health():
                return
            if not self.running:
                raise ClusterError(
                    f"{self.name} exited during start-up (code {self.returncode}); last lines "
                    f"of {self.log_file}:\n{log_tail(self.log_file)}"
                )
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{self.name} was not healthy after {timeout:.0f}s; last lines of "
                    f"{self.log_file}:\n{log_tail(self.log_file)}"
                )
            time.sleep(0.2)

    def stop(self, *, grace: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds; reap. Idempotent."""
        process, self._process = self._process, None
        if process is None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)
            try:
                process.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            # The leader is gone; make sure nothing it forked stays in the group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            return
        raise ClusterError(f"{self.name} (pid {process.pid}) did not stop after SIGKILL")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<{type(self).__name__} {self.name} pid={self.pid} {state} log={self.log_file}>"


class RunningComponent:
    """What every running flip component offers: its process, log, ``stop`` and ``with``.

    Subclasses are dataclasses with a ``child`` field and their own addresses.
    """

    child: ChildProcess

    @property
    def log_file(self) -> Path:
        return self.child.log_file

    @property
    def running(self) -> bool:
        return self.child.running

    def stop(self) -> None:
        self.child.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        self.stop()
