"""``/portForward`` over a plain WebSocket: the ``v4.channel.k8s.io`` protocol a kubelet serves.

The API server passes a port-forward WebSocket that does not tunnel SPDY (clients such as
the Python Kubernetes clients, and this project's Kubernetes adapter reaching a cluster whose
node is ours) to the kubelet as it is (``PortForwardREST``: only the
``SPDY/3.1+portforward.k8s.io`` tunnel is unwrapped), so a kubelet serves it itself, as
kubelet's ``portforward/websocket.go`` does:

- the ``port`` query (repeated or comma-separated: the API server turns the client's
  ``ports`` into the kubelet's ``port``, ``PortHeader``) names the ports; port ``i`` gets data
  channel ``2i`` and error channel ``2i + 1``; every message is a channel byte and data;
- the server first writes each port, 2 bytes little-endian, on both of its channels;
- one TCP connection per port; bytes of the data channel go to it and its bytes come back;
  a failure is written as text on the error channel;
- the WebSocket ends once every port's connection has ended (there is no half-close).

Only the binary protocol (``v4.channel.k8s.io``, or no subprotocol) is offered.

Invariants: a bad ``port`` query is refused before the upgrade, naming the parameter; every
port connection opened is closed and every task ended when the exchange ends, whichever side
ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Awaitable, Callable, Mapping, Sequence

from aiohttp import WSMsgType, web

from vk_provider.api.portforward import PortOpener
from vk_provider.api.tasks import cancel_all
from vk_provider.domain.contract import PortStream

log = logging.getLogger(__name__)

PROTOCOL = "v4.channel.k8s.io"
PORT_PARAMETER = "port"  # what the API server sends a kubelet (core/v1 PortHeader)
_CHUNK = 32 * 1024

_Send = Callable[[int, bytes], Awaitable[None]]


def requested_ports(query: Mapping[str, str] | Sequence[tuple[str, str]]) -> list[int]:
    """The ports of the ``port`` query; ValueError naming the parameter when it is bad."""
    pairs = query.items() if isinstance(query, Mapping) else query
    values = [value for key, value in pairs if key == PORT_PARAMETER]
    if not values:
        raise ValueError(f"query parameter {PORT_PARAMETER!r} is required")
    ports = []
    for value in values:
        if not value:
            raise ValueError(f"query parameter {PORT_PARAMETER!r} cannot be empty")
        for part in value.split(","):
            if not part.isdigit() or not 1 <= int(part) <= 65535:
                raise ValueError(f"query parameter {PORT_PARAMETER!r}: {part!r} is not a port")
            ports.append(int(part))
    return ports


def port_prefix(port: int) -> bytes:
    return struct.pack("<H", port)


async def serve_websocket_port_forward(
    request: web.Request, ports: list[int], open_port: PortOpener, *, target: str
) -> web.WebSocketResponse:
    """Upgrade and forward ``ports`` until every connection ended or the client went away."""
    ws = web.WebSocketResponse(protocols=(PROTOCOL,), max_msg_size=0)
    await ws.prepare(request)
    lock = asyncio.Lock()

    async def send(channel: int, data: bytes) -> None:
        async with lock:
            if not ws.closed:
                await ws.send_bytes(bytes((channel,)) + data)

    connections: dict[int, PortStream] = {}
    pumps: list[asyncio.Task[None]] = []
    try:
        for index, port in enumerate(ports):
            await send(2 * index, port_prefix(port))
            await send(2 * index + 1, port_prefix(port))
        for index, port in enumerate(ports):
            try:
                connections[index] = await open_port(port)
            except Exception as exc:
                message = f"error forwarding port {port} to {target}: {exc}"
                log.info("port-forward: %s", message)
                await send(2 * index + 1, message.encode())
                continue
            pumps.append(
                asyncio.create_task(
                    _from_port(connections[index], index, send), name=f"pf-ws-down-{port}"
                )
            )
        if pumps:
            reader = asyncio.create_task(_to_ports(ws, connections), name="pf-ws-up")
            everything_sent = asyncio.ensure_future(asyncio.wait(pumps))
            try:
                await asyncio.wait({reader, everything_sent}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                await cancel_all((reader, everything_sent))
    finally:
        await cancel_all(pumps)
        for connection in connections.values():
            with contextlib.suppress(Exception):
                await connection.close()
        await ws.close()
    return ws


async def _from_port(connection: PortStream, index: int, send: _Send) -> None:
    with contextlib.suppress(ConnectionError):
        while chunk := await connection.read(_CHUNK):
            await send(2 * index, chunk)


async def _to_ports(ws: web.WebSocketResponse, connections: Mapping[int, PortStream]) -> None:
    async for message in ws:
        if message.type is not WSMsgType.BINARY or not message.data:
            continue
        channel, data = message.data[0], message.data[1:]
        connection = connections.get(channel // 2) if channel % 2 == 0 else None
        if connection is not None and data:
            with contextlib.suppress(ConnectionError):
                await connection.write(data)
