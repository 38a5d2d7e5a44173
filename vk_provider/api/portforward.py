"""``kubectl port-forward`` over SPDY: the ``portforward.k8s.io`` protocol a kubelet serves.

For every connection it forwards, the client opens two streams on the one SPDY session, each
with headers ``streamtype`` (``error`` or ``data``), ``port`` and ``requestid`` (old clients
send none: the error stream's id, or the data stream's id minus 2, stands in). Once both of a
request are there the server connects to the port and copies bytes both ways over the data
stream; a failure is written as text to the error stream and both streams are reset. When one
direction ends, the other has ``LINGER_SECONDS`` to finish (as containerd's port-forward), then
the connection and both streams are closed. Streams whose headers are wrong are refused with
RST_STREAM, and a pair that stays incomplete for ``stream_creation_timeout`` gets an error
message.

Invariants: every forwarding task ends with the session (cancelled), and every port stream
it opened is closed; one request's failure never ends the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from vk_provider.api.spdy_session import SpdySession, SpdyStream
from vk_provider.api.tasks import cancel_all
from vk_provider.domain.contract import PortStream

log = logging.getLogger(__name__)

PROTOCOL = "portforward.k8s.io"
STREAM_CREATION_TIMEOUT = 30.0
LINGER_SECONDS = 1.0  # after one direction of a connection ends, before both are closed
_CHUNK = 32 * 1024

PortOpener = Callable[[int], Awaitable[PortStream]]


def stream_port(stream: SpdyStream) -> int | None:
    """The port a stream asks for, or None when its headers are not a valid request."""
    text = stream.header("port")
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        return None
    if stream.header("streamtype") not in ("data", "error"):
        return None
    return int(text)


def request_id(stream: SpdyStream) -> str:
    given = stream.header("requestid")
    if given:
        return given
    return str(stream.id if stream.header("streamtype") == "error" else stream.id - 2)


@dataclass(slots=True)
class _Pair:
    data: SpdyStream | None = None
    error: SpdyStream | None = None
    complete: asyncio.Event = field(default_factory=asyncio.Event)


async def serve_port_forward(
    session: SpdySession,
    open_port: PortOpener,
    *,
    target: str,
    stream_creation_timeout: float | None = None,
) -> None:
    """Serve the session's port-forward requests until it ends. ``target`` names the pod in
    error messages (``pod x, uid y``)."""
    pairs: dict[str, _Pair] = {}
    tasks: set[asyncio.Task[None]] = set()

    def spawn(coroutine: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(coroutine)
        task.set_name(name)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    try:
        while (stream := await session.accept()) is not None:
            if stream_port(stream) is None:
                stream.abort()
                continue
            stream.reply()
            key = request_id(stream)
            pair = pairs.get(key)
            if pair is None:
                pair = pairs[key] = _Pair()
                wait = (
                    STREAM_CREATION_TIMEOUT
                    if stream_creation_timeout is None
                    else (stream_creation_timeout)
                )
                spawn(_expire(pairs, key, pair, wait), f"pf-wait-{key}")
            kind = stream.header("streamtype")
            if getattr(pair, kind) is not None:
                await _print(
                    pair,
                    f"error processing stream for request {key}: {kind} stream already assigned",
                )
                stream.abort()
                continue
            setattr(pair, kind, stream)
            if pair.data is not None and pair.error is not None:
                pair.complete.set()
                pairs.pop(key, None)
                spawn(_forward(pair.data, pair.error, open_port, target), f"pf-{key}")
    finally:
        await cancel_all(tasks)


async def _expire(pairs: dict[str, _Pair], key: str, pair: _Pair, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await pair.complete.wait()
            return
    pairs.pop(key, None)
    await _print(pair, f"timed out waiting for streams of request {key}")


async def _print(pair: _Pair, message: str) -> None:
    if pair.error is not None and not pair.error.local_closed:
        with contextlib.suppress(ConnectionError):
            await pair.error.write(message.encode())


async def _forward(data: SpdyStream, error: SpdyStream, open_port: PortOpener, target: str) -> None:
    port = stream_port(data)
    assert port is not None  # checked when the stream came
    try:
        connection = await open_port(port)
    except Exception as exc:
        message = f"error forwarding port {port} to {target}: {exc}"
        log.info("port-forward: %s", message)
        with contextlib.suppress(ConnectionError):
            await error.write(message.encode())
        data.abort()
        error.abort()
        return
    upstream = asyncio.create_task(_to_port(data, connection), name=f"pf-up-{port}")
    downstream = asyncio.create_task(_from_port(connection, data), name=f"pf-down-{port}")
    try:
        await asyncio.wait({upstream, downstream}, return_when=asyncio.FIRST_COMPLETED)
        # One direction ended (the client closed its side, or the port did): the other gets a
        # moment to finish, as containerd's port-forward (and socat) give it, then both close.
        await asyncio.wait({upstream, downstream}, timeout=LINGER_SECONDS)
    finally:
        await cancel_all((upstream, downstream))
        with contextlib.suppress(Exception):
            await connection.close()
        data.close()
        error.close()


async def _from_port(connection: PortStream, data: SpdyStream) -> None:
    try:
        while chunk := await connection.read(_CHUNK):
            await data.write(chunk)
    except ConnectionError as exc:
        log.debug("port-forward: the port's side ended: %s", exc)


async def _to_port(data: SpdyStream, connection: PortStream) -> None:
    with contextlib.suppress(ConnectionError):
        while chunk := await data.read():
            await connection.write(chunk)
