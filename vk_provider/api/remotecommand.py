"""``kubectl exec`` and ``kubectl attach`` over SPDY: the ``channel.k8s.io`` protocols.

What a kubelet serves (``k8s.io/cri-streaming`` ``remotecommand``), and so what this does:

- Versions, in the server's order: ``v4.channel.k8s.io``, ``v3``, ``v2``, ``channel.k8s.io``;
  the first of the client's ``X-Stream-Protocol-Version`` values the server speaks wins
  (``httpstream.Handshake``). The API server's SPDY executor offers v5 to v1, so gets v4.
- The query says which streams come: ``input``, ``output``, ``error`` (``=1``) and ``tty``;
  with a tty there is no stderr. The client opens an ``error`` stream and one per standard
  stream (``streamtype`` header), plus ``resize`` with a tty from v3 on; the server waits for
  all of them (``stream_creation_timeout``) before it starts the command.
- ``resize`` carries JSON ``{"Width": w, "Height": h}`` objects, one after another.
- At the end stdout and stderr are half-closed after their last byte, the result goes to the
  error stream, and the connection ends. From v4 the result is a JSON ``metav1.Status``:
  ``Success``, or ``Failure`` with reason ``NonZeroExitCode`` and the exit code as an
  ``ExitCode`` cause (what ``kubectl exec`` turns into its own exit code), or an internal
  error; before v4 only failures are written, as plain text.

Invariants: the command is started only once every expected stream is there, and it is
closed (killed if still running) whatever ends the exchange; nothing here knows providers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from vk_provider.api.spdy_session import SpdySession, SpdyStream
from vk_provider.api.tasks import cancel_all
from vk_provider.domain.contract import ExecSession

log = logging.getLogger(__name__)

V4 = "v4.channel.k8s.io"
V3 = "v3.channel.k8s.io"
V2 = "v2.channel.k8s.io"
V1 = "channel.k8s.io"
SERVER_PROTOCOLS = (V4, V3, V2, V1)
STREAM_CREATION_TIMEOUT = 30.0


class StreamSetupError(Exception):
    """The client did not open the streams the request announced."""


def negotiate(client_values: Sequence[str], server: Sequence[str]) -> str | None:
    """The first protocol of the client's (comma-separated, repeated) header values that the
    server speaks; None when there is none. An absent header means ``channel.k8s.io``."""
    offered = [p.strip() for value in client_values for p in value.split(",") if p.strip()]
    return next((p for p in offered if p in server), None)


@dataclass(frozen=True, slots=True)
class StreamOptions:
    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool


def stream_options(query: Mapping[str, str]) -> StreamOptions:
    """The streams an exec or attach request asks for; ValueError if it asks for none."""
    tty = query.get("tty") == "1"
    options = StreamOptions(
        stdin=query.get("input") == "1",
        stdout=query.get("output") == "1",
        stderr=query.get("error") == "1" and not tty,  # a terminal has one output
        tty=tty,
    )
    if not (options.stdin or options.stdout or options.stderr):
        raise ValueError("you must specify at least 1 of stdin, stdout, stderr")
    return options


@dataclass(slots=True)
class Channels:
    protocol: str
    tty: bool = False
    error: SpdyStream | None = None
    stdin: SpdyStream | None = None
    stdout: SpdyStream | None = None
    stderr: SpdyStream | None = None
    resize: SpdyStream | None = None

    def all(self) -> list[SpdyStream]:
        found = (self.error, self.stdin, self.stdout, self.stderr, self.resize)
        return [s for s in found if s is not None]


_KINDS = ("error", "stdin", "stdout", "stderr", "resize")


async def wait_for_streams(
    session: SpdySession,
    options: StreamOptions,
    protocol: str,
    *,
    seconds: float | None = None,
) -> Channels:
    """Accept the client's streams until every one the request announced is there."""
    expected = 1 + options.stdin + options.stdout + options.stderr
    if options.tty and protocol in (V4, V3):
        expected += 1
    channels = Channels(protocol, tty=options.tty)
    received = 0
    try:
        async with asyncio.timeout(STREAM_CREATION_TIMEOUT if seconds is None else seconds):
            while received < expected:
                stream = await session.accept()
                if stream is None:
                    raise StreamSetupError("the connection ended before all streams were opened")
                kind = stream.header("streamtype")
                if kind not in _KINDS or getattr(channels, kind) is not None:
                    log.info("exec: refusing an unexpected %r stream", kind)
                    stream.abort()
                    continue
                setattr(channels, kind, stream)
                stream.reply()
                received += 1
    except TimeoutError:
        raise StreamSetupError("timed out waiting for client to create streams") from None
    if channels.error is None:
        raise StreamSetupError("the client opened no error stream")
    return channels


def success_status() -> dict[str, object]:
    return {"metadata": {}, "status": "Success"}


def exit_status(code: int) -> dict[str, object]:
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: exit status {code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


def internal_error(message: str) -> dict[str, object]:
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"Internal error occurred: {message}",
        "reason": "InternalError",
        "code": 500,
    }


async def write_status(channels: Channels, status: Mapping[str, object]) -> None:
    """The result on the error stream, as the negotiated version writes it."""
    stream = channels.error
    if stream is None:
        return
    with contextlib.suppress(ConnectionError):
        if channels.protocol == V4:
            await stream.write(json.dumps(status, separators=(",", ":")).encode())
        elif status.get("status") != "Success":
            await stream.write(str(status.get("message", "")).encode())
        stream.close()


class ResizeDecoder:
    """Terminal sizes out of the resize stream's concatenated JSON objects."""

    def __init__(self) -> None:
        self._buffer = ""
        self._json = json.JSONDecoder()

    def feed(self, data: bytes) -> list[tuple[int, int]]:
        self._buffer += data.decode("utf-8", "replace")
        sizes: list[tuple[int, int]] = []
        while True:
            text = self._buffer.lstrip()
            if not text:
                self._buffer = ""
                return sizes
            try:
                value, end = self._json.raw_decode(text)
            except ValueError:
                self._buffer = text  # an object split across frames: wait for the rest
                return sizes
            self._buffer = text[end:]
            if isinstance(value, dict):
                width, height = value.get("Width"), value.get("Height")
                if isinstance(width, int) and isinstance(height, int):
                    sizes.append((width, height))


Starter = Callable[[], Awaitable[ExecSession]]


async def serve_command(channels: Channels, start: Starter) -> None:
    """Start the command, connect it to the channels until it ends, report its result."""
    try:
        command = await start()
    except Exception as exc:
        await write_status(channels, internal_error(_describe(exc)))
        return
    try:
        status = await _run(channels, command)
    except Exception as exc:
        log.warning("exec: the command's streams failed: %s", _describe(exc))
        status = internal_error(_describe(exc))
    finally:
        with contextlib.suppress(Exception):
            await command.close()
    await write_status(channels, status)


async def _run(channels: Channels, command: ExecSession) -> dict[str, object]:
    pumps = [
        asyncio.create_task(
            _copy_stdin(channels.stdin, command, tty=channels.tty), name="exec-stdin"
        )
    ]
    if channels.resize is not None:
        pumps.append(asyncio.create_task(_resizes(channels.resize, command), name="exec-resize"))
    try:
        async for fd, chunk in command.output():
            # A terminal has one output; without one, stderr nobody asked for is dropped, as
            # the runtime is handed no stderr then.
            target = channels.stdout if fd == 1 or channels.tty else channels.stderr
            if target is not None and not target.local_closed:
                with contextlib.suppress(ConnectionError):
                    await target.write(chunk)
        code = await command.wait()
    finally:
        await cancel_all(pumps)
    for stream in (channels.stdout, channels.stderr):
        if stream is not None:
            stream.close()
    return success_status() if code == 0 else exit_status(code)


async def _copy_stdin(stream: SpdyStream | None, command: ExecSession, *, tty: bool) -> None:
    if stream is None:
        # No stdin was asked for: the command's is at its end (a runtime hands it none), so a
        # provider that relays stdin further (a remote cluster's exec) passes the end on. A
        # terminal has no end of input, only an EOF character, which would be typed input.
        if not tty:
            await command.close_stdin()
        return
    while data := await stream.read():
        await command.write_stdin(data)
    # The client closed its stdin (EOF): so does the command's; we close ours of the stream too,
    # which is what client-go waits for before it lets go of the stdin stream.
    await command.close_stdin()
    stream.close()


async def _resizes(stream: SpdyStream, command: ExecSession) -> None:
    decoder = ResizeDecoder()
    while data := await stream.read():
        for width, height in decoder.feed(data):
            await command.resize(width, height)


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
