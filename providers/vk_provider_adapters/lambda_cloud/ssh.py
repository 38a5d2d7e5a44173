"""The one place the Lambda adapter talks SSH (asyncssh): probes and logs of one VM.

``VmShell`` is the seam (as httpx's transport is for HTTP): ``SshVmShell`` speaks SSH to the
VM's address, the unit tests plug in a fake. What ``SshVmShell`` promises:

- **One connection per instance**, opened on first use and reused by every later probe and
  log stream (SSH multiplexes channels); a connection that broke, timed out or now points
  elsewhere is closed and opened again on the next call. ``forget`` closes an instance's
  connection (its VM is gone), ``close`` all of them.
- **The host key is pinned**: the only key accepted is the one the agent derived for that VM
  and gave it through cloud-init (``agentkey``); ed25519 only; no known_hosts file, no
  ``~/.ssh/config``, no ssh-agent, public-key login with the agent's key only.
- **Bounded**: opening a connection takes at most ``connect_timeout`` (TCP, handshake and login),
  a probe at most ``command_timeout`` more; a non-following log stream fails when no byte
  comes for ``command_timeout``, a followed one waits as long as the container is quiet.
- **Errors are data**: every failure is ``Transient`` naming the instance and why (refused,
  timed out, host key mismatch, login refused, sudo refused), never ``NotFound``; only
  ``logs`` of a VM that has no container yet is ``NotFound``.

Invariants: no secret is in a command line or a message (the passphrase travels on standard
input); a log stream's channel is closed when its reader stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final, Protocol

import asyncssh

from vk_provider.sdk import LogOptions, NotFound, Transient
from vk_provider_adapters.lambda_cloud.remote import (
    NO_CONTAINER,
    MalformedProbe,
    VmReport,
    logs_command,
    parse_probe,
    probe_command,
)

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS: Final = 30.0
_CLOSE_SECONDS: Final = 5.0
_READ_BYTES: Final = 65536


@dataclass(frozen=True, slots=True)
class VmTarget:
    """Where and as whom to reach one instance's VM, and what to expect there."""

    instance_id: str
    host: str
    port: int
    user: str
    host_key: str  # the one host key to accept: "ssh-ed25519 AAAA..."
    container: str  # the pod's sandbox container, named for the request id
    state_dir: str  # the boot script's directory


class VmShell(Protocol):
    """What the adapter asks of a VM (``SshVmShell``; a fake in the unit tests)."""

    async def probe(self, target: VmTarget, *, passphrase: str | None) -> VmReport:
        """One probe (``remote.probe_command``); ``passphrase`` goes on its standard input."""
        ...

    def logs(self, target: VmTarget, options: LogOptions) -> AsyncIterator[bytes]:
        """One container's output (``options.container``), line by line."""
        ...

    async def forget(self, instance_id: str) -> None:
        """Close what is open to this instance's VM."""
        ...

    async def close(self) -> None: ...


@dataclass(slots=True)
class _Connection:
    identity: tuple[str, int, str, str]
    connection: asyncssh.SSHClientConnection


class SshVmShell:
    """``VmShell`` over SSH with asyncssh (see the module docstring)."""

    def __init__(
        self,
        *,
        client_key: asyncssh.SSHKey,
        provider: str,
        connect_timeout: float,
        command_timeout: float,
    ) -> None:
        self._key = client_key
        self._provider = provider
        self._connect_timeout = connect_timeout
        self._command_timeout = command_timeout
        self._connections: dict[str, _Connection] = {}
        # One per instance: two callers of one VM (a poll and a get) open one connection.
        self._locks: dict[str, asyncio.Lock] = {}

    def __repr__(self) -> str:
        return f"SshVmShell(provider={self._provider!r}, open={len(self._connections)})"

    async def probe(self, target: VmTarget, *, passphrase: str | None) -> VmReport:
        command = probe_command(
            user=target.user, state_dir=target.state_dir, sandbox=target.container
        )
        connection = await self._connection(target)
        # Always some input: asyncssh closes standard input after it (an empty one would not
        # be sent, and the probe would wait for it).
        stdin = f"{passphrase or ''}\n"
        try:
            result = await asyncio.wait_for(
                connection.run(command, input=stdin, check=False, errors="replace"),
                self._command_timeout,
            )
        except (asyncssh.Error, OSError, TimeoutError) as exc:
            await self.forget(target.instance_id)  # broken or stuck: not reused
            raise self._failure(target, "the probe failed", exc) from exc
        stdout = result.stdout if isinstance(result.stdout, str) else ""
        try:
            return parse_probe(stdout)
        except MalformedProbe as exc:
            stderr = result.stderr if isinstance(result.stderr, str) else ""
            detail = " ".join(stderr.split())[-300:] or f"exit status {result.exit_status}"
            raise Transient(
                f"Lambda VM of {target.instance_id}: the probe answered oddly ({exc}): {detail}",
                provider=self._provider,
            ) from None

    async def logs(self, target: VmTarget, options: LogOptions) -> AsyncIterator[bytes]:
        command = logs_command(
            user=target.user,
            state_dir=target.state_dir,
            sandbox=target.container,
            container=options.container,
            options=options,
        )
        connection = await self._connection(target)
        try:
            process = await asyncio.wait_for(
                connection.create_process(command, encoding=None), self._command_timeout
            )
        except (asyncssh.Error, OSError, TimeoutError) as exc:
            await self.forget(target.instance_id)
            raise self._failure(target, "docker logs did not start", exc) from exc
        try:
            process.stdin.write_eof()
            pending = b""
            while True:
                try:
                    read = process.stdout.read(_READ_BYTES)
                    chunk = await (
                        read if options.follow else asyncio.wait_for(read, self._command_timeout)
                    )
                except (asyncssh.Error, OSError, TimeoutError) as exc:
                    raise self._failure(target, "the log stream broke", exc) from exc
                if not chunk:
                    break
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    yield line + b"\n"
            if pending:
                yield pending + b"\n"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait_closed(), self._command_timeout)
            if process.exit_status == NO_CONTAINER:
                raise NotFound(
                    f"Lambda VM of {target.instance_id} runs no container yet",
                    provider=self._provider,
                )
        finally:
            process.close()

    async def forget(self, instance_id: str) -> None:
        known = self._connections.pop(instance_id, None)
        self._locks.pop(instance_id, None)
        if known is not None:
            await self._close(known.connection)

    async def close(self) -> None:
        known, self._connections = list(self._connections.values()), {}
        self._locks.clear()
        await asyncio.gather(*(self._close(k.connection) for k in known))

    # --- internals ----------------------------------------------------------------------

    async def _connection(self, target: VmTarget) -> asyncssh.SSHClientConnection:
        identity = (target.host, target.port, target.user, target.host_key)
        lock = self._locks.setdefault(target.instance_id, asyncio.Lock())
        async with lock:
            known = self._connections.get(target.instance_id)
            if known is not None:
                if known.identity == identity and not known.connection.is_closed():
                    return known.connection
                del self._connections[target.instance_id]
                await self._close(known.connection)
            try:
                trusted = asyncssh.import_public_key(target.host_key)
                connection = await asyncio.wait_for(
                    asyncssh.connect(
                        target.host,
                        target.port,
                        username=target.user,
                        client_keys=[self._key],
                        known_hosts=([trusted], [], []),
                        server_host_key_algs=["ssh-ed25519"],
                        preferred_auth="publickey",
                        config=None,
                        agent_path=None,
                        connect_timeout=self._connect_timeout,
                        login_timeout=self._connect_timeout,
                        keepalive_interval=KEEPALIVE_SECONDS,
                        keepalive_count_max=3,
                    ),
                    self._connect_timeout,
                )
            except (asyncssh.Error, OSError, TimeoutError, ValueError) as exc:
                raise self._failure(target, "cannot connect", exc) from exc
            self._connections[target.instance_id] = _Connection(identity, connection)
            log.debug("%s: SSH connection to %s open", self._provider, target.instance_id)
            return connection

    async def _close(self, connection: asyncssh.SSHClientConnection) -> None:
        connection.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(connection.wait_closed(), _CLOSE_SECONDS)

    def _failure(self, target: VmTarget, what: str, exc: BaseException) -> Transient:
        if isinstance(exc, TimeoutError):
            why = "timed out"
        elif isinstance(exc, asyncssh.HostKeyNotVerifiable):
            why = "its host key is not the one the agent gave the VM"
        elif isinstance(exc, asyncssh.PermissionDenied):
            why = f"the login as {target.user!r} with the agent's key was refused"
        else:
            why = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200] or 'no detail'}"
        return Transient(
            f"Lambda VM of {target.instance_id} over SSH ({target.host}:{target.port}): "
            f"{what}: {why}",
            provider=self._provider,
        )
