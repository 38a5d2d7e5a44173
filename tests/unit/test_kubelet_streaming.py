"""``/exec``, ``/attach`` and ``/portForward`` of the kubelet API, over real TLS and real SPDY.

The client here speaks what the API server speaks to a kubelet (client-go's SPDY executor
and kubectl's port-forward): an HTTP upgrade with ``X-Stream-Protocol-Version``s, then SPDY
streams typed by their ``streamtype`` header. The commands are fakes; the local provider's
real processes are ``test_local_exec.py``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from tests.unit.kubelet_harness import StartServer, client_context, pki, start_server
from tests.unit.spdy_client import SpdyClient
from vk_provider.api import portforward, remotecommand
from vk_provider.api.kubelet import KubeletSources
from vk_provider.api.streaming import ContainerRef, StreamingRefused
from vk_provider.domain.contract import ExecSession, PortStream
from vk_provider.domain.errors import InvalidSpec
from vk_provider_dev.cluster.pki import ClusterPKI

__all__ = ["pki", "start_server"]

V4 = "v4.channel.k8s.io"
OFFERED = ["v5.channel.k8s.io", V4, "v3.channel.k8s.io", "v2.channel.k8s.io", "channel.k8s.io"]


# --------------------------------------------------------------------------- fakes


class FakeExec:
    """``["echo", code]`` upper-cases stdin to stdout, says "err" on stderr, exits ``code``;
    ``["sleep"]`` runs until closed."""

    def __init__(self, command: list[str]) -> None:
        self.command = command
        self.stdin: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.sizes: list[tuple[int, int]] = []
        self.closed = asyncio.Event()
        self.started = asyncio.Event()

    async def write_stdin(self, data: bytes) -> None:
        await self.stdin.put(data)

    async def close_stdin(self) -> None:
        await self.stdin.put(None)

    async def output(self) -> AsyncIterator[tuple[int, bytes]]:
        self.started.set()
        if self.command[0] == "sleep":
            await asyncio.Event().wait()
        yield 2, b"err"
        if "stdin" in self.command:
            while (data := await self.stdin.get()) is not None:
                yield 1, data.upper()
        else:
            yield 1, b"HELLO\n"

    async def resize(self, width: int, height: int) -> None:
        self.sizes.append((width, height))

    async def wait(self) -> int:
        return int(self.command[1])

    async def close(self) -> None:
        self.closed.set()


@dataclass
class FakeStreams:
    execs: list[FakeExec] = field(default_factory=list)
    refusal: StreamingRefused | None = None
    start_error: Exception | None = None
    refs: list[ContainerRef] = field(default_factory=list)
    echo_port: int = 0
    created: asyncio.Event = field(default_factory=asyncio.Event)

    def _check(self, ref: ContainerRef) -> None:
        self.refs.append(ref)
        if self.refusal is not None:
            raise self.refusal

    async def exec_starter(
        self, ref: ContainerRef, command: list[str], *, tty: bool
    ) -> remotecommand.Starter:
        self._check(ref)

        async def start() -> ExecSession:
            if self.start_error is not None:
                raise self.start_error
            session = FakeExec(command)
            self.execs.append(session)
            self.created.set()
            return session

        return start

    async def attach_starter(
        self, ref: ContainerRef, *, stdin: bool, tty: bool
    ) -> remotecommand.Starter:
        return await self.exec_starter(ref, ["attached", "0"], tty=tty)

    async def port_opener(self, ref: ContainerRef) -> portforward.PortOpener:
        self._check(ref)

        async def open_port(port: int) -> PortStream:
            if port == 1:
                raise InvalidSpec("nothing listens on port 1")
            reader, writer = await asyncio.open_connection("127.0.0.1", self.echo_port)
            return Connection(reader, writer)

        return open_port


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    async def read(self, size: int) -> bytes:
        return await self._reader.read(size)

    async def write(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def close(self) -> None:
        self._writer.close()


@dataclass
class Upgrade:
    status: int
    headers: dict[str, list[str]]
    body: bytes
    client: SpdyClient | None


async def upgrade(
    port: int,
    pki: ClusterPKI,
    path: str,
    protocols: list[str],
    *,
    extra: str = "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n",
) -> Upgrade:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=client_context(pki.ca.cert, pki.kubelet_client)
    )
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Length: 0"]
    lines += [f"X-Stream-Protocol-Version: {p}" for p in protocols]
    writer.write(("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode())
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    status = int(head.split()[1])
    headers: dict[str, list[str]] = {}
    for line in head.split("\r\n")[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers.setdefault(name.strip().lower(), []).append(value.strip())
    if status != 101:
        body = await reader.readexactly(int(headers["content-length"][0]))
        writer.close()
        return Upgrade(status, headers, body, None)
    return Upgrade(status, headers, b"", SpdyClient(reader, writer))


@pytest.fixture
async def echo_server() -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(b"echo:" + data)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


async def streaming_api(start_server: StartServer, streams: FakeStreams) -> int:
    api = await start_server(sources=KubeletSources(streams=streams))
    return api.server.port


def status_of(data: bytes) -> dict[str, object]:
    value = json.loads(data)
    assert isinstance(value, dict)
    return value


# --------------------------------------------------------------------------- exec


async def test_a_one_shot_exec_returns_output_and_exit_code(
    start_server: StartServer, pki: ClusterPKI
) -> None:
    streams = FakeStreams()
    port = await streaming_api(start_server, streams)
    up = await upgrade(port, pki, "/exec/ns/pod/main?command=echo&command=3&output=1&error=1",
                       OFFERED)  # fmt: skip
    assert up.status == 101 and up.client is not None
    assert up.headers["x-stream-protocol-version"] == [V4]
    assert up.headers["upgrade"] == ["SPDY/3.1"]
    client = up.client
    error = await client.open({"streamType": "error"})
    stdout = await client.open({"streamType": "stdout"})
    stderr = await client.open({"streamType": "stderr"})
    await client.until(lambda: client.stream(error).fin, what="the status")
    assert client.stream(stdout).data == b"HELLO\n" and client.stream(stdout).fin
    assert client.stream(stderr).data == b"err" and client.stream(stderr).fin
    status = status_of(bytes(client.stream(error).data))
    assert status["status"] == "Failure" and status["reason"] == "NonZeroExitCode"
    assert status["details"] == {"causes": [{"reason": "ExitCode", "message": "3"}]}
    await client.until(lambda: client.closed.is_set(), what="the end of the connection")
    assert client.codec.goaway is not None
    [session] = streams.execs
    assert session.command == ["echo", "3"] and session.closed.is_set()
    assert streams.refs == [ContainerRef("ns", "pod", "", "main")]
    await client.close()


async def test_an_interactive_exec_reads_stdin_until_the_client_closes_it(
    start_server: StartServer, pki: ClusterPKI
) -> None:
    port = await streaming_api(start_server, FakeStreams())
    up = await upgrade(
        port, pki, "/exec/ns/pod/uid-1/main?command=stdin&command=0&input=1&output=1", OFFERED
    )
    assert up.client is not None
    client = up.client
    error = await client.open({"streamType": "error"})
    stdin = await client.open({"streamType": "stdin"})
    stdout = await client.open({"streamType": "stdout"})
    await client.send(stdin, b"hello ")
    await client.until(lambda: client.stream(stdout).data == b"HELLO ", what="the echo")
    await client.send(stdin, b"world", fin=True)
    await client.until(lambda: client.stream(error).fin, what="the status")
    assert client.stream(stdout).data == b"HELLO WORLD"
    assert status_of(bytes(client.stream(error).data)) == {"metadata": {}, "status": "Success"}
    # client-go waits for the server to close stdin as well.
    assert client.stream(stdin).fin
    await client.close()


async def test_a_tty_gets_resizes_and_no_stderr(start_server: StartServer, pki: ClusterPKI) -> None:
    streams = FakeStreams()
    port = await streaming_api(start_server, streams)
    up = await upgrade(
        port,
        pki,
        "/exec/ns/pod/main?command=stdin&command=0&input=1&output=1&error=1&tty=1",
        OFFERED,
    )
    assert up.client is not None
    client = up.client
    error = await client.open({"streamType": "error"})
    stdin = await client.open({"streamType": "stdin"})
    stdout = await client.open({"streamType": "stdout"})
    resize = await client.open({"streamType": "resize"})  # the fourth: no stderr with a tty
    await client.send(resize, b'{"Width":80,"Height":24}\n{"Wid')
    await client.send(resize, b'th":120,"Height":40}\n')
    await client.send(stdin, b"x", fin=True)
    await client.until(lambda: client.stream(error).fin, what="the status")
    [session] = streams.execs
    assert session.sizes == [(80, 24), (120, 40)]
    assert client.stream(stdout).data == b"errX"  # one terminal: stderr goes to stdout
    await client.close()


async def test_before_v4_only_failures_are_written_as_text(
    start_server: StartServer, pki: ClusterPKI
) -> None:
    port = await streaming_api(start_server, FakeStreams())
    up = await upgrade(port, pki, "/exec/ns/pod/main?command=echo&command=2&output=1",
                       ["v2.channel.k8s.io"])  # fmt: skip
    assert up.client is not None and up.headers["x-stream-protocol-version"] == [
        "v2.channel.k8s.io"
    ]
    client = up.client
    error = await client.open({"streamType": "error"})
    await client.open({"streamType": "stdout"})
    await client.until(lambda: client.stream(error).fin, what="the status")
    assert bytes(client.stream(error).data).startswith(b"command terminated with non-zero exit")
    await client.close()


async def test_a_command_that_cannot_start_is_an_internal_error_status(
    start_server: StartServer, pki: ClusterPKI
) -> None:
    error_text = 'exec: "nope": executable file not found in $PATH'
    port = await streaming_api(start_server, FakeStreams(start_error=InvalidSpec(error_text)))
    up = await upgrade(port, pki, "/exec/ns/pod/main?command=nope&output=1", OFFERED)
    assert up.client is not None
    client = up.client
    error = await client.open({"streamType": "error"})
    await client.open({"streamType": "stdout"})
    await client.until(lambda: client.stream(error).fin, what="the status")
    status = status_of(bytes(client.stream(error).data))
    assert status["reason"] == "InternalError"
    assert status["message"] == f"Internal error occurred: {error_text}"
    await client.close()


async def test_a_client_that_goes_away_ends_the_command(
    start_server: StartServer, pki: ClusterPKI
) -> None:
    streams = FakeStreams()
    port = await streaming_api(start_server, streams)
    up = await upgrade(port, pki, "/exec/ns/pod/main?command=sleep&output=1", OFFERED)
    assert up.client is not None
    await up.client.open({"streamType": "error"})
    await up.client.open({"streamType": "stdout"})
    async with asyncio.timeout(10):
        await streams.created.wait()
        await streams.execs[0].started.wait()
    await up.client.close()
    async with asyncio.timeout(10):
        await streams.execs[0].closed.wait()


async def test_a_server_stop_ends_open_sessions(start_server: StartServer, pki: ClusterPKI) -> None:
    streams = FakeStreams()
    api = await start_server(sources=KubeletSources(streams=streams))
    up = await upgrade(api.server.port, pki, "/exec/ns/pod/main?command=sleep&output=1", OFFERED)
    assert up.client is not None
    await up.client.open({"streamType": "error"})
    await up.client.open({"streamType": "stdout"})
    async with asyncio.timeout(10):
        await streams.created.wait()
    async with asyncio.timeout(10):
        await api.server.stop()
        await streams.execs[0].closed.wait()
    await up.client.close()


async def test_streams_that_never_come_end_the_request(
    start_server: StartServer, pki: ClusterPKI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remotecommand, "STREAM_CREATION_TIMEOUT", 0.2)
    streams = FakeStreams()
    port = await streaming_api(start_server, streams)
    up = await upgrade(port, pki, "/exec/ns/pod/main?command=echo&command=0&output=1", OFFERED)
    assert up.client is not None
    await up.client.open({"streamType": "error"})  # and no stdout
    await up.client.until(lambda: up.client is not None and up.client.closed.is_set(),
                          what="the connection to end")  # fmt: skip
    assert streams.execs == []  # never started
    await up.client.close()


async def test_attach_uses_the_same_channels(start_server: StartServer, pki: ClusterPKI) -> None:
    streams = FakeStreams()
    port = await streaming_api(start_server, streams)
    up = await upgrade(port, pki, "/attach/ns/pod/main?output=1", OFFERED)
    assert up.client is not None
    client = up.client
    error = await client.open({"streamType": "error"})
    stdout = await client.open({"streamType": "stdout"})
    await client.until(lambda: client.stream(error).fin, what="the status")
    assert client.stream(stdout).data == b"HELLO\n"  # no stderr asked for: none sent
    await client.close()


@pytest.mark.parametrize(
    ("path", "protocols", "extra", "status", "message"),
    [
        ("/exec/ns/pod/main?command=ls", OFFERED, None, 400, "at least 1 of stdin"),
        ("/exec/ns/pod/main?output=1", OFFERED, None, 400, "at least one command"),
        ("/exec/ns/pod/main?command=ls&output=1", OFFERED, "", 400, "missing upgrade headers"),
        ("/exec/ns/pod/main?command=ls&output=1", [], None, 400, "X-Stream-Protocol-Version"),
        ("/exec/ns/pod/main?command=ls&output=1", ["v9.channel.k8s.io"], None, 403, "negotiate"),
        ("/portForward/ns/pod", ["v4.channel.k8s.io"], None, 403, "negotiate"),
        (
            "/exec/ns/pod/main?command=ls&output=1",
            OFFERED,
            "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
            400,
            "SPDY/3.1 only",
        ),
    ],
)
async def test_bad_requests_are_refused_before_the_upgrade(
    start_server: StartServer,
    pki: ClusterPKI,
    path: str,
    protocols: list[str],
    extra: str | None,
    status: int,
    message: str,
) -> None:
    streams = FakeStreams()
    port = await streaming_api(start_server, streams)
    kwargs = {} if extra is None else {"extra": extra}
    up = await upgrade(port, pki, path, protocols, **kwargs)
    assert up.status == status
    body = status_of(up.body)
    assert body["kind"] == "Status" and message in str(body["message"])
    if status == 403:
        assert up.headers["x-accepted-stream-protocol-versions"]
    assert streams.execs == []


async def test_a_provider_without_the_operation_is_refused_with_its_reason(
    start_server: StartServer, pki: ClusterPKI
) -> None:
    reason = "exec is not supported by provider runpod-a, which runs pod ns/pod"
    port = await streaming_api(start_server, FakeStreams(refusal=StreamingRefused(501, reason)))
    up = await upgrade(port, pki, "/exec/ns/pod/main?command=ls&output=1", OFFERED)
    assert up.status == 501
    assert status_of(up.body)["message"] == reason


# --------------------------------------------------------------------------- port-forward


async def test_port_forward_carries_several_requests_on_one_session(
    start_server: StartServer, pki: ClusterPKI, echo_server: int
) -> None:
    port = await streaming_api(start_server, FakeStreams(echo_port=echo_server))
    up = await upgrade(port, pki, "/portForward/ns/pod", ["portforward.k8s.io"])
    assert up.client is not None and up.headers["x-stream-protocol-version"] == [
        "portforward.k8s.io"
    ]
    client = up.client
    pairs = []
    for request in ("0", "1"):
        error = await client.open({"streamType": "error", "port": "8080", "requestID": request})
        data = await client.open({"streamType": "data", "port": "8080", "requestID": request})
        pairs.append((error, data))
    for index, (_, data) in enumerate(pairs):
        await client.send(data, f"ping {index}".encode())
    for index, (_, data) in enumerate(pairs):
        await client.until(
            lambda d=data, i=index: client.stream(d).data == f"echo:ping {i}".encode(),
            what="the echo",
        )
    # The client closes its side; the port's side closes in turn and so do our streams.
    error, data = pairs[0]
    await client.send(data, b"", fin=True)
    await client.until(lambda: client.stream(data).fin and client.stream(error).fin,
                       what="the request to end")  # fmt: skip
    assert client.stream(error).data == b""  # no error
    await client.close()


async def test_port_forward_without_request_ids_pairs_by_stream_id(
    start_server: StartServer, pki: ClusterPKI, echo_server: int
) -> None:
    port = await streaming_api(start_server, FakeStreams(echo_port=echo_server))
    up = await upgrade(port, pki, "/portForward/ns/pod/uid-1", ["portforward.k8s.io"])
    assert up.client is not None
    client = up.client
    await client.open({"streamType": "error", "port": "80"})  # id 1
    data = await client.open({"streamType": "data", "port": "80"})  # id 3: request "1"
    await client.send(data, b"x")
    await client.until(lambda: client.stream(data).data == b"echo:x", what="the echo")
    await client.close()


async def test_a_port_that_cannot_be_reached_says_why_on_the_error_stream(
    start_server: StartServer, pki: ClusterPKI
) -> None:
    port = await streaming_api(start_server, FakeStreams())
    up = await upgrade(port, pki, "/portForward/ns/pod", ["portforward.k8s.io"])
    assert up.client is not None
    client = up.client
    error = await client.open({"streamType": "error", "port": "1", "requestID": "0"})
    data = await client.open({"streamType": "data", "port": "1", "requestID": "0"})
    await client.until(lambda: client.stream(data).reset is not None, what="the reset")
    message = bytes(client.stream(error).data).decode()
    assert message == "error forwarding port 1 to pod pod, uid : nothing listens on port 1"
    await client.close()


async def test_a_stream_without_a_valid_port_is_refused(
    start_server: StartServer, pki: ClusterPKI
) -> None:
    port = await streaming_api(start_server, FakeStreams())
    up = await upgrade(port, pki, "/portForward/ns/pod", ["portforward.k8s.io"])
    assert up.client is not None
    client = up.client
    stream_id, frame = client.codec.syn_stream({"streamType": "data", "port": "http"})
    await client.raw(frame)
    await client.until(lambda: client.stream(stream_id).reset is not None, what="the refusal")
    await client.close()
