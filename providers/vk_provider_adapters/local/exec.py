"""``kubectl exec`` for the local provider: a new process beside the container's program.

A local container is a process on this machine, so an exec is another process started with
the container's own environment (``env.json``) and working directory (``spec.json``, else the
program's current one), as ``runc exec`` joins a container. With a tty it runs on a fresh
pseudo-terminal that becomes its controlling terminal (job control, ``^C`` and window sizes
work); without one it gets pipes, stdout and stderr apart.

The process is started through a tiny launcher (``python -I -S -c``): it asks the kernel to
kill it should the agent die (``PR_SET_PDEATHSIG``), takes the tty as controlling terminal,
then ``exec``s the command, so nothing of the agent runs in it and no ``preexec_fn`` runs in
the (threaded) agent.

Invariants: the container must be running; the command is resolved in the container's
``PATH`` before anything starts (``InvalidSpec`` names it, as runc's "executable file not
found" does); ``close()`` kills the command's whole process group, also what it left running
in the background (unlike in a real container, nothing would ever end it otherwise), and
always releases the pty. The session ends with the command: once it exited, its output is
read for at most ``_DRAIN_AFTER_EXIT`` more, whoever else holds the pipes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import shutil
import signal
import struct
import sys
import termios
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from vk_provider.sdk import InvalidSpec, NotFound
from vk_provider_adapters.local.layout import container_env, container_process, container_spec
from vk_provider_adapters.local.netns import entered
from vk_provider_adapters.local.processes import is_running

_LAUNCHER = (
    "import ctypes,fcntl,os,signal,sys,termios\n"
    "try:\n"
    "    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)\n"  # PR_SET_PDEATHSIG
    "except Exception:\n"
    "    pass\n"
    "if sys.argv[1] == 'tty':\n"
    "    fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)
_READ = 64 * 1024
_EOT = b"\x04"
_DRAIN_AFTER_EXIT = 1.0  # seconds the pipes may still deliver once the command exited
_EXIT_POLL_SECONDS = 0.05
_PIPES_CLOSE_SECONDS = 2.0


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _exit_code(returncode: int) -> int:
    return returncode if returncode >= 0 else 128 - returncode


def _working_dir(instance_dir: Path, container: str, pid: int) -> str:
    spec = container_spec(instance_dir, container) or {}
    cwd = spec.get("cwd")
    if isinstance(cwd, str) and cwd and Path(cwd).is_dir():
        return cwd
    with contextlib.suppress(OSError):
        return str(Path(f"/proc/{pid}/cwd").readlink())
    return str(instance_dir)


async def start_exec(
    instance_dir: Path,
    container: str,
    command: list[str],
    *,
    tty: bool,
    provider: str,
    namespace: str | None = None,
) -> PipeExec | TtyExec:
    """Start ``command`` in ``container`` of the instance at ``instance_dir`` (in the
    provider's network ``namespace``, where its containers run)."""
    process = container_process(instance_dir, container)
    if process is None or not is_running(process):
        raise NotFound(f"container {container!r} is not running", provider=provider)
    if not command:
        raise InvalidSpec("exec needs a command", provider=provider)
    env = container_env(instance_dir, container) or {}
    program = command[0]
    if "/" not in program and shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        raise InvalidSpec(
            f'exec: "{program}": executable file not found in $PATH', provider=provider
        )
    cwd = _working_dir(instance_dir, container, process.pid)
    launcher = [sys.executable, "-I", "-S", "-c", _LAUNCHER, "tty" if tty else "pipes", *command]
    argv = entered(launcher, namespace)
    if tty:
        return await _start_tty(argv, env=env, cwd=cwd)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        raise InvalidSpec(f"exec: cannot start {program!r}: {exc}", provider=provider) from exc
    return PipeExec(proc)


async def _start_tty(argv: list[str], *, env: dict[str, str], cwd: str) -> TtyExec:
    master, slave = os.openpty()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd,
            start_new_session=True,
        )  # fmt: skip
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)  # the child has its own copies; ours would keep the pty open forever
    os.set_blocking(master, False)
    return TtyExec(proc, master)


class LocalExec:
    """What both kinds share: the process, its exit code, and killing it on close."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc

    async def resize(self, width: int, height: int) -> None:
        return None

    async def wait(self) -> int:
        return _exit_code(await self._returned())

    async def _returned(self) -> int:
        # Not ``Process.wait()``: on Python 3.11 it also waits for the pipes to close, which a
        # background child may never do. ``returncode`` is set as soon as the child is reaped.
        while self._proc.returncode is None:  # noqa: ASYNC110 - nothing to await but the reaper
            await asyncio.sleep(_EXIT_POLL_SECONDS)
        return self._proc.returncode

    async def _kill(self) -> None:
        # The whole group, also when the command itself is done: what it left running in the
        # background would outlive everything here (no container holds it), so it ends too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        await self._returned()


class PipeExec(LocalExec):
    """An exec without a terminal: stdin, stdout and stderr are pipes."""

    async def write_stdin(self, data: bytes) -> None:
        stdin = self._proc.stdin
        if stdin is None or stdin.is_closing():
            return
        with contextlib.suppress(ConnectionError):
            stdin.write(data)
            await stdin.drain()

    async def close_stdin(self) -> None:
        if self._proc.stdin is not None and not self._proc.stdin.is_closing():
            self._proc.stdin.close()

    async def output(self) -> AsyncIterator[tuple[int, bytes]]:
        queue: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()

        async def pump(fd: int, reader: asyncio.StreamReader | None) -> None:
            if reader is not None:
                while chunk := await reader.read(_READ):
                    await queue.put((fd, chunk))
            await queue.put((fd, b""))

        pumps = [
            asyncio.create_task(pump(1, self._proc.stdout)),
            asyncio.create_task(pump(2, self._proc.stderr)),
        ]
        exited: asyncio.Future[int] = asyncio.ensure_future(self._returned())
        deadline: float | None = None
        try:
            open_streams = 2
            while open_streams:
                if deadline is None and exited.done():
                    # A background child may hold the pipes open forever; what the command
                    # wrote is read, then the session ends with the command, as runc's does.
                    deadline = asyncio.get_running_loop().time() + _DRAIN_AFTER_EXIT
                try:
                    async with asyncio.timeout_at(deadline):
                        fd, chunk = await _next_or_exit(queue, exited)
                except TimeoutError:
                    return
                if fd == 0:
                    continue  # the command exited: start the drain deadline
                if chunk:
                    yield fd, chunk
                else:
                    open_streams -= 1
        finally:
            exited.cancel()
            for task in pumps:
                task.cancel()

    async def close(self) -> None:
        await self.close_stdin()
        await self._kill()
        # Read the pipes to their end (the group is gone, so it comes at once): the transport
        # is released only when every pipe is, and must be before the loop goes away.
        for reader in (self._proc.stdout, self._proc.stderr):
            if reader is not None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_PIPES_CLOSE_SECONDS):
                        while await reader.read(_READ):
                            pass
        await asyncio.sleep(0)  # the transport's last callback runs on the next turn


async def _first_of(*futures: asyncio.Future[Any]) -> None:
    await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)


async def _next_or_exit(
    queue: asyncio.Queue[tuple[int, bytes]], exited: asyncio.Future[int]
) -> tuple[int, bytes]:
    """The next output chunk, or ``(0, b"")`` when the command exits first."""
    if exited.done():
        return await queue.get()
    getter: asyncio.Future[tuple[int, bytes]] = asyncio.ensure_future(queue.get())
    try:
        await _first_of(getter, exited)
    finally:
        if not getter.done():
            getter.cancel()
    if getter.done() and not getter.cancelled():
        return getter.result()
    return 0, b""


class TtyExec(LocalExec):
    """An exec on a pseudo-terminal: one output stream, resizable, ``^D`` ends its input."""

    def __init__(self, proc: asyncio.subprocess.Process, master: int) -> None:
        super().__init__(proc)
        self._master: int | None = master

    async def write_stdin(self, data: bytes) -> None:
        while data and self._master is not None:
            try:
                written = os.write(self._master, data)
            except BlockingIOError:
                await asyncio.sleep(0.01)  # the terminal's input queue is full; it drains
                continue
            except OSError:
                return  # the terminal is gone: the command ended
            data = data[written:]

    async def close_stdin(self) -> None:
        # A terminal has no end of input, only the EOF character its line discipline knows.
        await self.write_stdin(_EOT)

    async def resize(self, width: int, height: int) -> None:
        if self._master is not None:
            with contextlib.suppress(OSError):
                size = struct.pack("HHHH", height, width, 0, 0)
                fcntl.ioctl(self._master, termios.TIOCSWINSZ, size)

    async def output(self) -> AsyncIterator[tuple[int, bytes]]:
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[int] = asyncio.ensure_future(self._returned())
        try:
            while self._master is not None:
                if not exited.done():
                    readable: asyncio.Future[None] = loop.create_future()
                    loop.add_reader(self._master, _resolve, readable)
                    try:
                        await _first_of(readable, exited)
                    finally:
                        loop.remove_reader(self._master)
                        readable.cancel()
                try:
                    chunk = os.read(self._master, _READ)
                except BlockingIOError:
                    if exited.done():
                        return  # all the command wrote is read; a background child may hold on
                    continue
                except OSError as exc:
                    if exc.errno == errno.EIO:  # every holder of the terminal closed it
                        return
                    raise
                if not chunk:
                    return
                yield 1, chunk
        finally:
            exited.cancel()

    async def close(self) -> None:
        await self._kill()
        master, self._master = self._master, None
        if master is not None:
            os.close(master)
