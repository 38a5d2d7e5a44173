"""Runs one container command for the local provider and records what happened on disk.

Started by ``providers.local.adapter`` as a detached process (a session of its own)::

    python -m providers.local.runner --log FILE --exit-file FILE [--started-file FILE]
        [--env-file FILE] [--cwd DIR] [--start-delay SECONDS] -- PROGRAM [ARGS...]

It waits ``--start-delay`` seconds (simulated launch latency), starts the program with stdout
and stderr piped, and writes every output line to ``--log`` in the CRI log format kubelet
reads (``<RFC3339Nano UTC> <stdout|stderr> F <line>``). When the program ends it writes its
exit code to ``--exit-file`` and exits.

Invariants:
- Only the standard library is imported, so the runner starts fast and never depends on the
  agent's state.
- ``--started-file`` exists once the program has been started (its mtime is the start time).
- ``--exit-file`` appears atomically (temporary file + rename) and only after every output
  line the runner could read has been written to the log. Its content is the exit code; a
  program killed by signal N reports ``128 + N`` like Docker (137 for SIGKILL, 143 for SIGTERM);
  a program that cannot be started reports 127 (not found) or 126 (not executable).
- SIGTERM sent to the runner is forwarded to the program (the program may ignore it);
  SIGTERM during the start delay ends the runner before the program starts.
- Like a container, nothing the program leaves behind outlives it: the program gets SIGKILL if
  the runner dies, and once the exit code is recorded the runner kills its own process group.
- ``--env-file`` (JSON object of strings) is the program's whole environment; the runner deletes
  it after reading, so secret values do not stay on disk.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
# How long to wait for output after the program exited; a background process that inherited
# the pipes could otherwise keep the runner waiting forever.
_DRAIN_TIMEOUT_SECONDS = 2.0
_PR_SET_PDEATHSIG = 1


def format_timestamp(epoch_ns: int) -> bytes:
    """RFC3339 UTC time with nanoseconds, as the CRI log format writes it."""
    seconds, nanos = divmod(epoch_ns, 1_000_000_000)
    head = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{head}.{nanos:09d}Z".encode()


def exit_code_of(returncode: int) -> int:
    """A ``Popen.returncode`` as a container runtime reports it (signals as 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


class CriLogWriter:
    """Appends CRI-format lines to one file; safe to share between the stdout/stderr readers."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("ab", buffering=0)
        self._lock = threading.Lock()

    def write(self, stream: bytes, line: bytes) -> None:
        record = b"%s %s F %s\n" % (format_timestamp(time.time_ns()), stream, line)
        with self._lock:
            # A reader still blocked after the drain timeout may come back after close().
            if not self._file.closed:
                self._file.write(record)

    def close(self) -> None:
        with self._lock:
            self._file.close()


def _copy_lines(pipe: BinaryIO, stream: bytes, writer: CriLogWriter) -> None:
    with pipe:
        for raw in iter(pipe.readline, b""):
            writer.write(stream, raw[:-1] if raw.endswith(b"\n") else raw)


def _write_atomically(path: Path, content: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(content)
    tmp.replace(path)


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: if the runner is killed on its own (OOM, a stray
    # `kill -9`), the program must not live on unobserved. Linux-only; elsewhere a no-op.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class _Runner:
    """The program's life: start, forward SIGTERM, collect output and exit code."""

    def __init__(self, options: argparse.Namespace, command: list[str]) -> None:
        self._options = options
        self._command = command
        self._child: subprocess.Popen[bytes] | None = None
        self._term_pending = False

    def _on_sigterm(self, signum: int, frame: object) -> None:
        # Signal handlers run in the main thread between bytecodes; the pending flag covers a
        # SIGTERM that arrives after the handler is installed but before Popen returned.
        if self._child is None:
            self._term_pending = True
        else:
            with contextlib.suppress(ProcessLookupError):
                self._child.send_signal(signal.SIGTERM)

    def _read_env(self) -> dict[str, str] | None:
        env_file: Path | None = self._options.env_file
        if env_file is None:
            return None
        data = json.loads(env_file.read_text())
        with contextlib.suppress(FileNotFoundError):
            env_file.unlink()
        if not isinstance(data, dict):
            raise ValueError(f"{env_file}: expected a JSON object")
        return {str(k): str(v) for k, v in data.items()}

    def run(self) -> int:
        options = self._options
        env = self._read_env()
        if options.start_delay > 0:
            # SIGTERM keeps its default action here: it ends the runner before the program starts.
            time.sleep(options.start_delay)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        writer = CriLogWriter(options.log)
        try:
            try:
                child = subprocess.Popen(
                    self._command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=options.cwd,
                    env=env,
                    # preexec_fn is safe here: the runner starts no thread before this.
                    preexec_fn=_die_with_parent,
                )
            except OSError as exc:
                writer.write(
                    b"stderr", f"local runner: cannot start {self._command[0]!r}: {exc}".encode()
                )
                code = EXIT_NOT_FOUND if exc.errno == errno.ENOENT else EXIT_NOT_EXECUTABLE
                _write_atomically(options.exit_file, f"{code}\n".encode())
                return code
            self._child = child
            if self._term_pending:
                child.send_signal(signal.SIGTERM)
            if options.started_file is not None:
                _write_atomically(options.started_file, b"")
            assert child.stdout is not None and child.stderr is not None
            readers = [
                threading.Thread(target=_copy_lines, args=(child.stdout, b"stdout", writer)),
                threading.Thread(target=_copy_lines, args=(child.stderr, b"stderr", writer)),
            ]
            for reader in readers:
                reader.daemon = True
                reader.start()
            code = exit_code_of(child.wait())
            drain_deadline = time.monotonic() + _DRAIN_TIMEOUT_SECONDS
            for reader in readers:
                reader.join(max(0.0, drain_deadline - time.monotonic()))
        finally:
            writer.close()
        _write_atomically(options.exit_file, f"{code}\n".encode())
        return code


def _parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m providers.local.runner")
    parser.add_argument("--log", type=Path, required=True, help="CRI log file to append to.")
    parser.add_argument("--exit-file", type=Path, required=True, help="Where the exit code goes.")
    parser.add_argument("--started-file", type=Path, help="Created when the program starts.")
    parser.add_argument("--env-file", type=Path, help="JSON environment; deleted after reading.")
    parser.add_argument("--cwd", type=Path, help="Working directory of the program.")
    parser.add_argument("--start-delay", type=float, default=0.0, help="Seconds to wait first.")
    args = list(argv)
    if "--" not in args:
        parser.error("missing '--' before the program")
    split = args.index("--")
    options = parser.parse_args(args[:split])
    command = args[split + 1 :]
    if not command:
        parser.error("missing the program after '--'")
    return options, command


def main(argv: Sequence[str] | None = None) -> int:
    options, command = _parse(sys.argv[1:] if argv is None else argv)
    code = _Runner(options, command).run()
    if os.getpgrp() == os.getpid():
        # We lead the process group (started in a session of our own): whatever the program
        # left running ends with it, as in a container. This also ends the runner itself.
        sys.stdout.flush()
        os.killpg(os.getpid(), signal.SIGKILL)
    return code


if __name__ == "__main__":
    sys.exit(main())
