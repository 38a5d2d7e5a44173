"""Pod runners forked from one waiting process, instead of one interpreter start per pod.

Starting ``python -m vk_provider_adapters.local.runner`` costs about 0.1 s of CPU (the interpreter
and its imports); with a thousand pods on two cores that start-up was most of the time to Running.
So each local provider keeps one *spawner*: a process that has imported the runner once and forks a
runner per instance (a fork of that small process takes about a millisecond). The agent side is
``Spawner``; the process side is ``serve``.

Protocol, one JSON line each way over a Unix socket pair::

    agent   -> spawner  {"instance": DIR, "start_delay": S, "log": FILE, "cwd": DIR,
                         "netns": PATH (optional: the pod's own network namespace)}
    spawner -> agent    {"pid": N, "start_ticks": T}      or   {"error": "..."}

A forked runner is what ``runner_command`` would have started: a session (and process group)
of its own, stdin from /dev/null, stdout and stderr appended to its ``runner.log``, its
working directory ``cwd``, default signal dispositions; it then runs
``vk_provider_adapters.local.runner.main`` and exits with its code.

Invariants:
- The spawner only imports the standard library and the runner's modules (it is started with
  ``-S``, like a runner), so what a runner sees after the fork is what a fresh one would.
- It lives exactly as long as the agent's end of the socket: on EOF it exits, and the runners
  it forked keep running (each in its own session), as instances outlive the agent.
- The reply is sent once the runner leads a session (and process group) of its own, so a
  signal to its group right after the create reaches it, and before the spawner reaps
  anything, so the start time it reports belongs to the runner even if that exits at once (a
  zombie keeps its ``/proc`` entry); finished runners are reaped within a second after that.
- ``Spawner.start_runner`` never hangs the agent: a spawner that does not answer within
  ``REPLY_TIMEOUT_SECONDS`` is dropped, and a runner that cannot be forked is started the
  old way (``processes.start_process``), so a broken spawner costs speed, never a pod.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from pathlib import Path

from vk_provider_adapters.local.netns import entered, namespace_path
from vk_provider_adapters.local.processes import ProcessRecord, start_process, start_ticks

log = logging.getLogger(__name__)

REPLY_TIMEOUT_SECONDS = 10.0
SPAWNER_LOG = "spawner.log"
# The ``providers`` package's parent directory: put on the spawner's path, so it runs this
# very code, installed or not (``launch.runner_command`` does the same for a runner).
_SOURCE = str(Path(__file__).resolve().parent.parent.parent)


# --- the spawner process --------------------------------------------------------------


def _run_forked(request: dict[str, object], channel: int, ready: int) -> None:
    """In the forked child: become a detached runner and never return."""
    code = 1
    try:
        os.close(channel)
        os.setsid()
        if request.get("netns"):
            try:
                _enter_network(str(request["netns"]))
            except OSError as exc:
                os.write(ready, f"cannot enter the network namespace: {exc}".encode())
                raise
        os.close(ready)  # the spawner answers once we lead a process group of our own
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        log_fd = os.open(str(request["log"]), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(null)
        os.close(log_fd)
        os.chdir(str(request["cwd"]))
        from vk_provider_adapters.local.runner import main

        instance, delay = str(request["instance"]), float(str(request["start_delay"]))
        code = main(["--instance", instance, "--start-delay", str(delay)])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _enter_network(path: str) -> None:
    """Join the network namespace bound at ``path`` (``setns``; Python 3.11 has no
    ``os.setns``): the runner and every container it starts live in it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error), path)
    finally:
        os.close(fd)


_CLONE_NEWNET = 0x40000000


def _reap_children() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _answer(channel: int, request: dict[str, object]) -> dict[str, object]:
    wait, ready = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(wait)
        _run_forked(request, channel, ready)
    os.close(ready)
    # Until the child has its own session, a signal to its process group would reach
    # nobody: wait for it to close its end (it does right after setsid, or by dying); what
    # it wrote first is why it could not run (its network namespace).
    failure = os.read(wait, 4096)
    os.close(wait)
    if failure:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        return {"error": failure.decode(errors="replace")}
    ticks = start_ticks(pid)
    if ticks is None:
        return {"error": f"runner {pid} vanished before its start time could be read"}
    return {"pid": pid, "start_ticks": ticks}


def serve(channel: int) -> int:
    """The spawner's loop: one forked runner per request line on ``channel``, until EOF."""
    import vk_provider_adapters.local.runner  # noqa: F401 - imported once, here, for every fork

    buffered = b""
    while True:
        readable, _, _ = select.select([channel], [], [], 1.0)
        _reap_children()
        if not readable:
            continue
        chunk = os.read(channel, 65536)
        if not chunk:
            return 0  # the agent is gone: the runners stay, the spawner goes
        buffered += chunk
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            try:
                reply = _answer(channel, json.loads(line))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            os.write(channel, json.dumps(reply).encode() + b"\n")


# --- the agent's end ------------------------------------------------------------------


class Spawner:
    """The agent's end: one spawner process, started on first use, restarted if it died."""

    def __init__(self, state_dir: Path, *, namespace: str | None = None) -> None:
        self._state_dir = state_dir
        self._namespace = namespace  # the network namespace the runners run in, if any
        self._lock = threading.Lock()  # creates run in worker threads: one request at a time
        self._process: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None
        self._replies = b""

    def start_runner(
        self,
        directory: Path,
        *,
        startup_seconds: float,
        log_file: Path,
        cwd: Path,
        namespace: str | None = None,
    ) -> ProcessRecord:
        """Fork the runner of the instance in ``directory`` (which exists), in the network
        ``namespace`` of its pod if it has one of its own; start it directly if the spawner
        cannot (it never came up, died, or answered nonsense). Safe to call from several
        threads: requests go one at a time."""
        name = f"local-runner {directory.name}"
        request: dict[str, object] = {
            "instance": str(directory),
            "start_delay": startup_seconds,
            "log": str(log_file),
            "cwd": str(cwd),
        }
        if namespace is not None:
            request["netns"] = str(namespace_path(namespace))
        for _ in range(2):  # a spawner that died since the last call is replaced once
            try:
                with self._lock:
                    reply = self._ask(request)
            except (OSError, ValueError) as exc:
                log.warning("local runner spawner failed (%s); replacing it", exc)
                with self._lock:
                    self.close(kill=True)
                continue
            if "pid" in reply:
                return ProcessRecord(name, int(str(reply["pid"])), int(str(reply["start_ticks"])))
            if namespace is not None and "network namespace" in str(reply.get("error")):
                raise RuntimeError(str(reply.get("error")))  # not the spawner's fault
            log.warning("local runner spawner could not fork: %s", reply.get("error"))
            break
        from vk_provider_adapters.local.launch import runner_command

        return start_process(
            name,
            entered(
                runner_command(directory, startup_seconds=startup_seconds),
                namespace if namespace is not None else self._namespace,
            ),
            log_file=log_file,
            cwd=cwd,
        )

    def _ask(self, request: dict[str, object]) -> dict[str, object]:
        channel = self._channel()
        channel.sendall(json.dumps(request).encode() + b"\n")
        while b"\n" not in self._replies:
            chunk = channel.recv(65536)
            if not chunk:
                raise ConnectionError("the spawner closed its end")
            self._replies += chunk
        line, self._replies = self._replies.split(b"\n", 1)
        reply = json.loads(line)
        if not isinstance(reply, dict):
            raise ValueError(f"unexpected spawner reply {line[:200]!r}")
        return reply

    def _channel(self) -> socket.socket:
        if self._socket is not None and self._process is not None:
            if self._process.poll() is None:
                return self._socket
            self.close(kill=True)
        ours, theirs = socket.socketpair()
        ours.settimeout(REPLY_TIMEOUT_SECONDS)
        self._state_dir.mkdir(parents=True, exist_ok=True)
        try:
            with (self._state_dir / SPAWNER_LOG).open("ab") as out:
                self._process = subprocess.Popen(
                    entered(spawner_command(self._state_dir, theirs.fileno()), self._namespace),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    pass_fds=(theirs.fileno(),),
                    start_new_session=True,  # Ctrl-C at the agent's terminal is not for it
                )
        finally:
            theirs.close()
        self._socket, self._replies = ours, b""
        return ours

    def close(self, *, kill: bool = False) -> None:
        """Let the spawner go (it exits on EOF; with ``kill``, at once); the runners it
        forked keep running."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        if self._process is not None:
            if kill:
                self._process.kill()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None


def spawner_command(state_dir: Path, channel: int) -> list[str]:
    """The spawner for the provider whose instances live in ``state_dir``.

    ``state_dir`` is on the command line only so that whoever looks for this provider's
    processes (a test, an operator with ``pgrep -f``) finds the spawner as well as its
    runners: a forked runner carries the spawner's command line.
    """
    bootstrap = (
        f"import sys; sys.path.insert(0, {_SOURCE!r}); "
        "from vk_provider_adapters.local.spawner import serve; sys.exit(serve(int(sys.argv[1])))"
    )
    return [sys.executable, "-S", "-c", bootstrap, str(channel), "--state-dir", str(state_dir)]
