"""The Kubernetes adapter's WebSockets against servers on loopback: an API server's v5 exec
(a fake speaking the protocol) and the agent's own WebSocket port-forward
(``api/portforward_ws.py``, which is what B's API server passes a port-forward on to), so
both ends of the plain port-forward protocol are ours and meet here."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import WSMsgType, web

from vk_provider.api.portforward_ws import requested_ports, serve_websocket_port_forward
from vk_provider.domain.contract import PortStream
from vk_provider.domain.errors import AuthFailed, Transient
from vk_provider.domain.redact import Redactor
from vk_provider_adapters.kubernetes import channels
from vk_provider_adapters.kubernetes.kubeconfig import ClusterAccess
from vk_provider_adapters.kubernetes.streams import RemoteCommand, RemotePort, RemoteStreams

TOKEN = "t0ken-for-the-test"
POD = "/api/v1/namespaces/work/pods/vk-abc"


async def _exec(request: web.Request) -> web.StreamResponse:
    """B's API server, as far as v5 goes: stdin echoed to stdout (upper-cased to stderr) until
    stdin's half-close, then the Status of exit code ``code`` from the query."""
    if request.headers.get("Authorization") != f"Bearer {TOKEN}":
        return web.Response(status=401)
    ws = web.WebSocketResponse(protocols=(channels.EXEC_PROTOCOL,))
    await ws.prepare(request)
    await ws.send_bytes(b"\x01")  # an empty first frame, as wsstream may send
    code = int(request.query.getall("command")[-1])
    async for message in ws:
        assert message.type is WSMsgType.BINARY
        channel, data = message.data[0], message.data[1:]
        if channel == channels.CLOSE and data == b"\x00":
            break
        if channel == channels.RESIZE:
            await ws.send_bytes(b"\x01" + b"size " + data)
        elif channel == channels.STDIN:
            await ws.send_bytes(b"\x01" + data)
            await ws.send_bytes(b"\x02" + data.upper())
    status = (
        {"status": "Success"}
        if code == 0
        else {
            "status": "Failure",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
        }
    )
    await ws.send_bytes(b"\x03" + json.dumps(status).encode())
    await ws.close()
    return ws


class _Tcp:
    """A PortStream on an asyncio connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    async def read(self, size: int) -> bytes:
        return await self._reader.read(size)

    async def write(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def close(self) -> None:
        self._writer.close()


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(b"echo:" + data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


@pytest.fixture
async def remote(echo_port: int) -> AsyncIterator[RemoteStreams]:
    async def open_port(port: int) -> PortStream:
        if port != echo_port:
            raise ConnectionRefusedError(f"nothing listens on {port}")
        return _Tcp(*await asyncio.open_connection("127.0.0.1", port))

    async def port_forward(request: web.Request) -> web.StreamResponse:
        # As B's API server would: the client's ``ports`` become the kubelet's ``port``.
        query = [("port", v) for k, v in request.query.items() if k == "ports"]
        ports = requested_ports(query)
        return await serve_websocket_port_forward(request, ports, open_port, target="pod p")

    app = web.Application()
    app.router.add_get(f"{POD}/exec", _exec)
    app.router.add_get(f"{POD}/portforward", port_forward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    access = ClusterAccess(server=f"http://127.0.0.1:{port}", token=TOKEN)
    streams = RemoteStreams(access, provider="b", redactor=Redactor((TOKEN,)), timeout=5)
    try:
        yield streams
    finally:
        await streams.close()
        await runner.cleanup()


async def _command(remote: RemoteStreams, code: int) -> RemoteCommand:
    url = channels.exec_url(POD, container="main", command=["x", str(code)], stdin=True, tty=False)
    ws = await remote.connect(url, protocol=channels.EXEC_PROTOCOL, what="exec")
    return RemoteCommand(ws, what="exec", provider="b")


async def test_exec_relays_stdin_output_resize_and_the_exit_code(remote: RemoteStreams) -> None:
    command = await _command(remote, 3)
    await command.write_stdin(b"hello")
    await command.resize(80, 24)
    await command.close_stdin()
    seen = [(fd, data) async for fd, data in command.output()]
    assert (1, b"hello") in seen and (2, b"HELLO") in seen
    assert (1, b'size {"Width": 80, "Height": 24}') in seen
    assert await command.wait() == 3
    await command.close()


async def test_exec_success_is_zero_even_when_nobody_read_the_output(
    remote: RemoteStreams,
) -> None:
    command = await _command(remote, 0)
    await command.close_stdin()
    assert await command.wait() == 0


async def test_a_connection_that_ends_without_a_status_is_no_exit_code() -> None:
    async def hang_up(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(protocols=(channels.EXEC_PROTOCOL,))
        await ws.prepare(request)
        await ws.close()
        return ws

    app = web.Application()
    app.router.add_get(f"{POD}/exec", hang_up)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    access = ClusterAccess(server=f"http://127.0.0.1:{runner.addresses[0][1]}", token=TOKEN)
    streams = RemoteStreams(access, provider="b", redactor=Redactor(()), timeout=5)
    try:
        command = await _command(streams, 0)
        with pytest.raises(Transient, match="before the command's exit status"):
            await command.wait()
    finally:
        await streams.close()
        await runner.cleanup()


async def test_a_refused_handshake_is_classified_and_names_no_token() -> None:
    access = ClusterAccess(server="http://127.0.0.1:1", token=TOKEN)
    streams = RemoteStreams(access, provider="b", redactor=Redactor((TOKEN,)), timeout=5)
    try:
        with pytest.raises(Transient) as refused:
            await streams.connect(f"{POD}/exec?command=x", protocol="p", what="exec")
        assert TOKEN not in str(refused.value)
    finally:
        await streams.close()


async def test_a_wrong_token_is_auth_failed(remote: RemoteStreams) -> None:
    remote._access = ClusterAccess(server=remote._access.server, token="wrong")
    with pytest.raises(AuthFailed):
        await _command(remote, 0)


async def test_port_forward_both_ends_meet(remote: RemoteStreams, echo_port: int) -> None:
    url = channels.port_forward_url(POD, echo_port)
    ws = await remote.connect(url, protocol=channels.PORT_FORWARD_PROTOCOL, what="pf")
    port = RemotePort(ws, echo_port)
    await port.write(b"ping")
    assert await port.read(100) == b"echo:ping"
    await port.write(b"again")
    assert await port.read(100) == b"echo:again"
    await port.close()


async def test_port_forward_to_a_closed_port_says_why(
    remote: RemoteStreams, echo_port: int
) -> None:
    closed = echo_port + 1 if echo_port < 65535 else echo_port - 1
    url = channels.port_forward_url(POD, closed)
    ws = await remote.connect(url, protocol=channels.PORT_FORWARD_PROTOCOL, what="pf")
    port = RemotePort(ws, closed)
    with pytest.raises(ConnectionResetError, match=f"error forwarding port {closed}"):
        await port.read(100)
    await port.close()
