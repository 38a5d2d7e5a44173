"""An in-memory fake of ``vk_provider_adapters.modal.sandbox.SandboxClient``, behaving as Modal
does.

What it keeps faithful to Modal (``modal/sandbox.py``):
- Names are unique among the app's *running* sandboxes (``SandboxNameTaken``); a finished
  sandbox frees its name. Names and tags follow Modal's rules (``InvalidSpec`` otherwise), and
  environment variable names must be identifiers.
- ``list`` returns running sandboxes carrying at least the given tags; ``from_name`` finds
  running ones only; ``get`` finds any sandbox it ever made.
- ``terminate`` makes a running sandbox exit with 137 and is a no-op on a finished one;
  a sandbox reaching its timeout exits with 124 (``expire``).
- ``logs`` replays a sandbox's output from the start; with ``follow`` it waits for more until
  the sandbox finishes.
- Tunnels (``modal/_tunnel.py``, ``sandbox/_common.py``): a port the request opens gets its
  tunnel when the sandbox starts, not before; ``tunnels`` answers None (what the real client
  makes of ``SandboxTimeoutError``) until then. Every tunnel has a TLS host on 443
  (``<label>.r5.modal.host``, as Modal's guide shows them); an unencrypted port also gets a
  raw TCP endpoint, ``r5.modal.host`` and a port Modal picks. A tunnel keeps its endpoints for
  the sandbox's life.

Knobs for tests: ``fail(operation, error, times=n)`` queues failures per operation,
``start``/``finish``/``expire``/``write`` drive a sandbox, ``add_foreign`` adds a sandbox this
agent did not make, ``auto_start=False`` keeps new sandboxes PENDING, ``hold_tunnels`` keeps a
started sandbox's tunnels back (all, or some ports) and ``release_tunnels`` publishes them.
Every request is kept in ``requests`` (``SandboxRequest``) and every operation in ``calls``
for assertions.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from vk_provider.domain.errors import InvalidSpec, NotFound
from vk_provider_adapters.modal.sandbox import (
    SandboxInfo,
    SandboxNameTaken,
    SandboxRequest,
    SandboxTunnel,
)

_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_TAG = re.compile(r"[A-Za-z0-9._-]{1,63}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
OPERATIONS = frozenset(
    {"create", "get", "list", "from_name", "set_tags", "terminate", "tunnels", "logs", "close"}
)
TUNNEL_DOMAIN = "r5.modal.host"


@dataclass
class FakeSandbox:
    sandbox_id: str
    name: str | None
    tags: dict[str, str]
    request: SandboxRequest | None
    started: bool
    exit_code: int | None = None
    output: list[bytes] = field(default_factory=list)
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    started_at: datetime | None = None
    finished_at: datetime | None = None
    tunnels: dict[int, SandboxTunnel] = field(default_factory=dict)
    held: set[int] = field(default_factory=set)  # ports whose tunnels are kept back

    @property
    def running(self) -> bool:
        return self.exit_code is None


class FakeSandboxClient:
    """The sandboxes of one app, in memory."""

    def __init__(self, *, auto_start: bool = True) -> None:
        self.auto_start = auto_start
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.requests: list[SandboxRequest] = []
        self.calls: list[str] = []
        self.closed = False
        self._failures: dict[str, list[Exception]] = {}
        self._changed = asyncio.Event()
        self._counter = 0
        self._next_tcp_port = 40000

    # --- knobs ---

    def fail(self, operation: str, error: Exception, *, times: int = 1) -> None:
        """The next ``times`` calls of ``operation`` raise ``error``."""
        assert operation in OPERATIONS, operation
        self._failures.setdefault(operation, []).extend([error] * times)

    def clear_failures(self) -> None:
        self._failures.clear()

    def start(self, sandbox_id: str) -> None:
        sandbox = self.sandboxes[sandbox_id]
        sandbox.started = True
        sandbox.started_at = sandbox.started_at or datetime.now(UTC)
        self._open_tunnels(sandbox)
        self._notify()

    def hold_tunnels(self, sandbox_id: str, *ports: int) -> None:
        """Keep the tunnels of ``ports`` (all the sandbox opens, if none given) back."""
        sandbox = self.sandboxes[sandbox_id]
        request = sandbox.request
        opened = (*request.encrypted_ports, *request.unencrypted_ports) if request else ()
        sandbox.held.update(ports or opened)
        for port in ports or opened:
            sandbox.tunnels.pop(port, None)

    def release_tunnels(self, sandbox_id: str) -> None:
        sandbox = self.sandboxes[sandbox_id]
        sandbox.held.clear()
        if sandbox.started:
            self._open_tunnels(sandbox)

    def finish(self, sandbox_id: str, exit_code: int) -> None:
        sandbox = self.sandboxes[sandbox_id]
        sandbox.exit_code = exit_code
        sandbox.finished_at = datetime.now(UTC)
        self._notify()

    def expire(self, sandbox_id: str) -> None:
        """The sandbox reached its timeout."""
        self.finish(sandbox_id, 124)

    def revive(self, sandbox_id: str) -> None:
        """Back to running (for state tables driven on one sandbox)."""
        sandbox = self.sandboxes[sandbox_id]
        sandbox.exit_code = None
        sandbox.finished_at = None
        self.start(sandbox_id)

    def write(self, sandbox_id: str, *lines: bytes) -> None:
        self.sandboxes[sandbox_id].output.extend(lines)
        self._notify()

    def add_foreign(self, *, name: str | None = None, tags: Mapping[str, str] | None = None) -> str:
        """A running sandbox in the same app that this agent did not make."""
        sandbox_id = self._new_id()
        self.sandboxes[sandbox_id] = FakeSandbox(
            sandbox_id, name, dict(tags or {}), None, started=True, started_at=datetime.now(UTC)
        )
        return sandbox_id

    def running(self) -> list[FakeSandbox]:
        return [s for s in self.sandboxes.values() if s.running]

    # --- SandboxClient ---

    async def create_sandbox(self, request: SandboxRequest) -> str:
        self._enter("create")
        if not _NAME.fullmatch(request.name):
            raise InvalidSpec(f"Invalid Sandbox name: {request.name!r}")
        for key, value in request.tags.items():
            if not _TAG.fullmatch(key) or not _TAG.fullmatch(value):
                raise InvalidSpec(f"Invalid tag: {key!r}={value!r}")
        for key in [*request.env, *request.secret_env]:
            if not _ENV_NAME.fullmatch(key):
                raise InvalidSpec(f"Secret key name {key!r} is invalid")
        if any(s.name == request.name for s in self.running()):
            raise SandboxNameTaken(f"Sandbox name {request.name!r} is already in use")
        self.requests.append(request)
        sandbox_id = self._new_id()
        self.sandboxes[sandbox_id] = FakeSandbox(
            sandbox_id, request.name, dict(request.tags), request, started=False
        )
        if self.auto_start:
            self.start(sandbox_id)
        return sandbox_id

    async def get(self, sandbox_id: str) -> SandboxInfo:
        self._enter("get")
        return self._info(self._find(sandbox_id))

    async def list(self, tags: Mapping[str, str]) -> list[SandboxInfo]:
        self._enter("list")
        return [
            self._info(s)
            for s in self.running()
            if all(s.tags.get(key) == value for key, value in tags.items())
        ]

    async def from_name(self, name: str) -> SandboxInfo | None:
        self._enter("from_name")
        for sandbox in self.running():
            if sandbox.name == name:
                return self._info(sandbox)
        return None

    async def set_tags(self, sandbox_id: str, tags: Mapping[str, str]) -> None:
        self._enter("set_tags")
        self._find(sandbox_id).tags = dict(tags)

    async def terminate(self, sandbox_id: str) -> None:
        self._enter("terminate")
        if self._find(sandbox_id).running:
            self.finish(sandbox_id, 137)

    async def tunnels(
        self, sandbox_id: str, *, wait_seconds: int
    ) -> dict[int, SandboxTunnel] | None:
        self._enter("tunnels")
        assert wait_seconds > 0, "the SDK waits this long on Modal's side"
        sandbox = self._find(sandbox_id)
        if not sandbox.started or not sandbox.running:
            return None
        if not sandbox.tunnels and sandbox.held:
            return None  # Modal has not set them up in time
        return dict(sandbox.tunnels)

    async def logs(self, sandbox_id: str, *, follow: bool) -> AsyncIterator[bytes]:
        self._enter("logs")
        sandbox = self._find(sandbox_id)
        sent = 0
        while True:
            self._changed.clear()
            while sent < len(sandbox.output):
                yield sandbox.output[sent]
                sent += 1
            if not follow or not sandbox.running:
                return
            await self._changed.wait()

    async def close(self) -> None:
        self._enter("close")
        self.closed = True

    # --- internals ---

    def _enter(self, operation: str) -> None:
        self.calls.append(operation)
        queued = self._failures.get(operation)
        if queued:
            raise queued.pop(0)

    def _find(self, sandbox_id: str) -> FakeSandbox:
        try:
            return self.sandboxes[sandbox_id]
        except KeyError:
            raise NotFound(f"Sandbox {sandbox_id!r} not found") from None

    def _new_id(self) -> str:
        self._counter += 1
        return f"sb-{self._counter:022d}"

    def _notify(self) -> None:
        self._changed.set()

    def _open_tunnels(self, sandbox: FakeSandbox) -> None:
        """The tunnels of the ports the sandbox's request opens (once each, for its life)."""
        request = sandbox.request
        if request is None:
            return
        opened = [(p, False) for p in request.encrypted_ports]
        opened += [(p, True) for p in request.unencrypted_ports]
        for port, unencrypted in opened:
            if port in sandbox.tunnels or port in sandbox.held:
                continue
            host = f"{sandbox.sandbox_id[-8:]}p{port:05d}".lower() + f".{TUNNEL_DOMAIN}"
            tcp_port = 0
            if unencrypted:
                self._next_tcp_port += 1
                tcp_port = self._next_tcp_port
            sandbox.tunnels[port] = SandboxTunnel(
                host=host,
                port=443,
                unencrypted_host=TUNNEL_DOMAIN if unencrypted else "",
                unencrypted_port=tcp_port,
            )

    @staticmethod
    def _info(sandbox: FakeSandbox) -> SandboxInfo:
        return SandboxInfo(
            sandbox_id=sandbox.sandbox_id,
            tags=dict(sandbox.tags),
            exit_code=sandbox.exit_code,
            name=sandbox.name,
            started=sandbox.started,
            created_at=sandbox.created_at,
            started_at=sandbox.started_at,
            finished_at=sandbox.finished_at,
        )
