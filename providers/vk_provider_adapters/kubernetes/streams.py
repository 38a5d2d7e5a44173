"""WebSockets to B's ``pods/exec``, ``pods/attach`` and ``pods/portforward``.

aiohttp's WebSocket client, with the TLS context and bearer token the kubeconfig loader
produced (``kubeconfig.ClusterAccess``: nothing of the kubeconfig is parsed here); the
channel protocols are ``channels.py``. ``RemoteCommand`` is a ``domain.contract.ExecSession``
(stdin, stdout/stderr, resize, the exit code from the error channel's Status), ``RemotePort``
a ``PortStream`` (one WebSocket per forwarded connection).

A refused handshake is classified by its status as a streaming call of B
(``failures.classify_failure``, ``Call.STREAM``); a connection that cannot be made is
``Transient``. No retries: a command must not run twice.

Invariants: frames are sent one at a time (a lock: stdin, resize and close come from
different tasks); the token travels only in the handshake's header and is never part of a
message; only ``domain.errors`` escape ``connect``, and ``wait`` raises ``Transient`` when B
never said how the command ended (an exit code of 0 is never invented).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
from yarl import URL

from vk_provider.sdk import Redactor, Transient
from vk_provider_adapters.kubernetes.channels import (
    ERROR,
    STDERR,
    STDIN,
    STDOUT,
    PortFrames,
    close_frame,
    command_result,
    frame,
    resize_frame,
    split_frame,
)
from vk_provider_adapters.kubernetes.failures import ApiFailure, Call, classify_failure
from vk_provider_adapters.kubernetes.kubeconfig import ClusterAccess

_ENDED = frozenset({aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED})


class RemoteStreams:
    """Opens WebSockets to B; one aiohttp session for the adapter's life."""

    def __init__(
        self, access: ClusterAccess, *, provider: str, redactor: Redactor, timeout: float
    ) -> None:
        self._access = access
        self._provider = provider
        self._redactor = redactor
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    async def connect(
        self, path_and_query: str, *, protocol: str, what: str
    ) -> aiohttp.ClientWebSocketResponse:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        url = URL(self._access.server + path_and_query, encoded=True)
        tls = self._access.ssl_context() if url.scheme == "https" else None
        try:
            ws = await self._session.ws_connect(
                url,
                protocols=(protocol,),
                headers=self._access.headers(),
                ssl=tls if tls is not None else True,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=self._timeout),
                autoping=True,
                max_msg_size=0,
            )
        except aiohttp.WSServerHandshakeError as exc:
            failure = ApiFailure(exc.status, message=self._redactor(exc.message or ""))
            raise classify_failure(
                failure, provider=self._provider, what=what, call=Call.STREAM
            ) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            detail = self._redactor(str(exc) or type(exc).__name__)
            raise Transient(f"Kubernetes {what}: {detail}", provider=self._provider) from None
        if ws.protocol != protocol:
            await ws.close()
            raise Transient(
                f"Kubernetes {what}: the API server did not speak {protocol}",
                provider=self._provider,
            )
        return ws

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class _Sender:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._lock = asyncio.Lock()

    async def send(self, message: bytes) -> None:
        async with self._lock:
            if self.ws.closed:
                raise ConnectionResetError("the connection to the remote cluster is closed")
            await self.ws.send_bytes(message)


class RemoteCommand:
    """``ExecSession`` of a command in a container of B (exec or attach)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, *, what: str, provider: str) -> None:
        self._sender = _Sender(ws)
        self._what = what
        self._provider = provider
        self._status = bytearray()
        self._ended = asyncio.Event()

    async def write_stdin(self, data: bytes) -> None:
        await self._sender.send(frame(STDIN, data))

    async def close_stdin(self) -> None:
        await self._sender.send(close_frame(STDIN))

    async def resize(self, width: int, height: int) -> None:
        await self._sender.send(resize_frame(width, height))

    async def output(self) -> AsyncIterator[tuple[int, bytes]]:
        try:
            async for message in self._sender.ws:
                if message.type in _ENDED or message.type is aiohttp.WSMsgType.ERROR:
                    break
                if message.type is not aiohttp.WSMsgType.BINARY:
                    continue
                parts = split_frame(message.data)
                if parts is None:
                    continue
                channel, data = parts
                if channel in (STDOUT, STDERR) and data:
                    yield channel, data
                elif channel == ERROR:
                    self._status += data
        finally:
            self._ended.set()

    async def wait(self) -> int:
        if not self._ended.is_set():
            async for _ in self.output():
                pass  # nobody read the output: drain it to reach the Status
        if not self._status:
            raise Transient(
                f"Kubernetes {self._what}: the connection ended before the command's exit status",
                provider=self._provider,
            )
        result = command_result(bytes(self._status))
        if result.exit_code is None:
            raise Transient(f"Kubernetes {self._what}: {result.failure}", provider=self._provider)
        return result.exit_code

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._sender.ws.close()


class RemotePort:
    """``PortStream`` of one TCP connection to a port of a pod of B."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, port: int) -> None:
        self._sender = _Sender(ws)
        self._frames = PortFrames(port)
        self._buffer = bytearray()
        self._error = bytearray()
        self._eof = False

    async def read(self, size: int) -> bytes:
        while not self._buffer and not self._eof:
            message = await self._sender.ws.receive()
            if message.type is not aiohttp.WSMsgType.BINARY:
                self._eof = message.type in _ENDED or message.type is aiohttp.WSMsgType.ERROR
                continue
            try:
                parts = self._frames.feed(message.data)
            except ValueError as exc:
                await self.close()
                raise ConnectionResetError(str(exc)) from None
            if parts is None:
                continue
            channel, data = parts
            if channel == 0:
                self._buffer += data
            else:
                self._error += data
        if not self._buffer:
            if self._error:
                raise ConnectionResetError(self._error.decode("utf-8", "replace"))
            return b""
        chunk = bytes(self._buffer[:size])
        del self._buffer[:size]
        return chunk

    async def write(self, data: bytes) -> None:
        await self._sender.send(frame(0, data))

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._sender.ws.close()
