"""The server side of one SPDY/3.1 connection, as spdystream's peer expects it.

What spdystream does (client-go's SPDY executor and kubectl use it), and so what this does:

- The client opens streams (odd ids, increasing) with SYN_STREAM; the server answers each
  with SYN_REPLY (no headers) once it accepts it, or RST_STREAM. spdystream's writers wait for
  the reply, so no data arrives on a stream before it (what does is dropped, as spdystream
  drops it).
- DATA with the FIN flag half-closes a stream; RST_STREAM aborts it.
- A PING from the peer (odd id) is echoed; the API server pings every 5 s.
- GOAWAY ends the session; so does the end of the connection.
- SETTINGS and WINDOW_UPDATE are ignored: spdystream implements no flow control, so the only
  back-pressure is TCP's (``pause_reading`` while too much unread data is buffered).

Invariants:
- A frame is encoded and handed to the transport in one synchronous step, so the header
  compressor's state follows the order of frames on the wire; every received header block is
  decompressed in order, also those of frames that are otherwise ignored.
- ``feed`` never raises and never blocks: malformed input ends the session with GOAWAY
  (PROTOCOL_ERROR), a transport that is gone ends it too; the caller closes the connection
  once ``closed`` is set.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import struct
from collections.abc import Callable
from typing import Protocol

from vk_provider.api.spdy import (
    FLAG_FIN,
    KINDS,
    VERSION,
    ControlFrame,
    DataFrame,
    Frame,
    FrameParser,
    FrameType,
    GoAwayStatus,
    HeaderCompressor,
    HeaderDecompressor,
    ProtocolError,
    RstStatus,
    encode_control,
    encode_data,
)

log = logging.getLogger(__name__)

DATA_CHUNK = 32 * 1024
READ_HIGH_WATER = 1 << 20  # unread bytes buffered before the transport is paused


class FrameSink(Protocol):
    """The connection's write side: ``write`` hands bytes to the transport now (in order),
    ``drain`` waits until its buffer is low again."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...


class SpdyStream:
    """One stream a client opened: its headers, what it sent, and our side of it."""

    def __init__(self, session: SpdySession, stream_id: int, headers: dict[str, list[str]]):
        self.id = stream_id
        self._session = session
        self._headers = headers
        self._chunks: collections.deque[bytes] = collections.deque()
        self._readable = asyncio.Event()
        self.buffered = 0
        self.remote_closed = False
        self.local_closed = False
        self.reset = False
        self.replied = False

    def header(self, name: str) -> str:
        """The header's value ("" when absent); several values are joined with commas."""
        return ",".join(self._headers.get(name.lower(), ()))

    # -- what the peer sent

    def _received(self, data: bytes, *, fin: bool) -> int:
        """Buffer what the peer sent; the number of bytes kept."""
        kept = 0
        if data and not (self.remote_closed or self.reset):
            self._chunks.append(data)
            kept = len(data)
            self.buffered += kept
        if fin:
            self.remote_closed = True
        self._readable.set()
        return kept

    def _aborted(self) -> None:
        self.reset = self.remote_closed = self.local_closed = True
        self._readable.set()

    async def read(self) -> bytes:
        """The next chunk the peer sent; ``b""`` once it closed or reset the stream."""
        while not self._chunks:
            if self.remote_closed or self.reset:
                return b""
            self._readable.clear()
            await self._readable.wait()
        chunk = self._chunks.popleft()
        self.buffered -= len(chunk)
        self._session._consumed(len(chunk))
        return chunk

    async def read_all(self, limit: int = 1 << 20) -> bytes:
        data = bytearray()
        while chunk := await self.read():
            data += chunk
            if len(data) > limit:
                raise ProtocolError(f"stream {self.id} sent more than {limit} bytes")
        return bytes(data)

    # -- our side

    def reply(self) -> None:
        """Accept the stream (SYN_REPLY without headers)."""
        if not self.replied and not self.reset:
            self.replied = True
            block = self._session._compressor.encode({})
            self._session._send(
                encode_control(FrameType.SYN_REPLY, struct.pack(">I", self.id) + block)
            )

    async def write(self, data: bytes) -> None:
        if self.local_closed or self.reset:
            raise ConnectionResetError(f"stream {self.id} is closed")
        for start in range(0, len(data), DATA_CHUNK):
            if not self._session._send(encode_data(self.id, data[start : start + DATA_CHUNK])):
                raise ConnectionResetError("the connection is closed")
        await self._session._sink.drain()

    def close(self) -> None:
        """Half-close our side (an empty DATA frame with FIN); idempotent."""
        if not self.local_closed and not self.reset:
            self.local_closed = True
            self._session._send(encode_data(self.id, b"", fin=True))

    def abort(self, status: RstStatus = RstStatus.CANCEL) -> None:
        """RST_STREAM: both sides end now."""
        if not self.reset:
            self._aborted()
            self._session._send(
                encode_control(FrameType.RST_STREAM, struct.pack(">II", self.id, status))
            )


class SpdySession:
    """The server side of one SPDY/3.1 connection: ``feed`` it bytes, ``accept`` streams."""

    def __init__(
        self,
        sink: FrameSink,
        *,
        pause_reading: Callable[[], None] | None = None,
        resume_reading: Callable[[], None] | None = None,
    ) -> None:
        self._sink = sink
        self._parser = FrameParser()
        self._compressor = HeaderCompressor()
        self._decompressor = HeaderDecompressor()
        self._streams: dict[int, SpdyStream] = {}
        self._incoming: asyncio.Queue[SpdyStream | None] = asyncio.Queue()
        self._last_stream_id = 0
        self._buffered = 0
        self._paused = False
        self._pause = pause_reading
        self._resume = resume_reading
        self.closed = asyncio.Event()

    async def accept(self) -> SpdyStream | None:
        """The next stream the client opened, or None once the session ended."""
        if self.closed.is_set() and self._incoming.empty():
            return None
        stream = await self._incoming.get()
        if stream is None:
            self._incoming.put_nowait(None)  # every later accept() sees the end as well
        return stream

    def feed(self, data: bytes) -> None:
        if self.closed.is_set():
            return
        try:
            for frame in self._parser.feed(data):
                self._handle(frame)
        except ProtocolError as exc:
            log.info("SPDY: protocol error from the peer: %s", exc)
            self.close(GoAwayStatus.PROTOCOL_ERROR)

    def feed_eof(self) -> None:
        self._end()

    def close(self, status: GoAwayStatus = GoAwayStatus.OK) -> None:
        """Send GOAWAY and end the session (the caller then closes the connection)."""
        if self.closed.is_set():
            return
        payload = struct.pack(">II", self._last_stream_id, status)
        self._send(encode_control(FrameType.GOAWAY, payload))
        self._end()

    # -- internals

    def _send(self, frame: bytes) -> bool:
        """Hand one encoded frame to the transport; False (and the session ends) if it is gone."""
        try:
            self._sink.write(frame)
        except ConnectionError:
            self._end()
            return False
        return True

    def _end(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            for stream in self._streams.values():
                stream._aborted()
            self._streams.clear()
            self._incoming.put_nowait(None)
            self._resume_if_paused()

    def _consumed(self, size: int) -> None:
        self._buffered -= size
        if self._buffered < READ_HIGH_WATER // 2:
            self._resume_if_paused()

    def _resume_if_paused(self) -> None:
        if self._paused and self._resume is not None:
            self._paused = False
            self._resume()

    def _handle(self, frame: Frame) -> None:
        if isinstance(frame, DataFrame):
            stream = self._streams.get(frame.stream_id)
            if stream is None or not stream.replied:
                return  # as spdystream: data for an unknown or unanswered stream is dropped
            self._buffered += stream._received(frame.data, fin=frame.fin)
            if self._buffered > READ_HIGH_WATER and not self._paused and self._pause:
                self._paused = True
                self._pause()
            self._forget_if_done(stream)
            return
        if frame.version != VERSION:
            raise ProtocolError(f"unsupported SPDY version {frame.version}")
        handler = _CONTROL_HANDLERS.get(FrameType(frame.kind)) if frame.kind in KINDS else None
        if handler is not None:
            handler(self, frame)

    def _forget_if_done(self, stream: SpdyStream) -> None:
        if stream.remote_closed and stream.local_closed:
            self._streams.pop(stream.id, None)

    def _syn_stream(self, frame: ControlFrame) -> None:
        if len(frame.payload) < 10:
            raise ProtocolError("short SYN_STREAM")
        stream_id = struct.unpack_from(">I", frame.payload)[0] & 0x7FFFFFFF
        headers = self._decompressor.decode(frame.payload[10:])
        if stream_id % 2 == 0 or stream_id <= self._last_stream_id:
            # The client's ids are odd and increasing; refuse this one, keep the session.
            self._send(
                encode_control(
                    FrameType.RST_STREAM, struct.pack(">II", stream_id, RstStatus.PROTOCOL_ERROR)
                )
            )
            return
        self._last_stream_id = stream_id
        stream = SpdyStream(self, stream_id, headers)
        if frame.flags & FLAG_FIN:
            stream.remote_closed = True
        self._streams[stream_id] = stream
        self._incoming.put_nowait(stream)

    def _rst_stream(self, frame: ControlFrame) -> None:
        if len(frame.payload) != 8:
            raise ProtocolError("RST_STREAM of wrong length")
        stream = self._streams.pop(struct.unpack_from(">I", frame.payload)[0] & 0x7FFFFFFF, None)
        if stream is not None:
            self._buffered -= stream.buffered
            stream._aborted()

    def _ping(self, frame: ControlFrame) -> None:
        if len(frame.payload) != 4:
            raise ProtocolError("PING of wrong length")
        if struct.unpack(">I", frame.payload)[0] % 2 == 1:  # the client's: echo it
            self._send(encode_control(FrameType.PING, frame.payload))

    def _goaway(self, frame: ControlFrame) -> None:
        self._end()

    def _headers_block(self, frame: ControlFrame) -> None:
        # Nothing we use, but the block must go through the decompressor to keep it in step.
        if len(frame.payload) < 4:
            raise ProtocolError("short header frame")
        self._decompressor.decode(frame.payload[4:])


_CONTROL_HANDLERS: dict[FrameType, Callable[[SpdySession, ControlFrame], None]] = {
    FrameType.SYN_STREAM: SpdySession._syn_stream,
    FrameType.SYN_REPLY: SpdySession._headers_block,
    FrameType.RST_STREAM: SpdySession._rst_stream,
    FrameType.PING: SpdySession._ping,
    FrameType.GOAWAY: SpdySession._goaway,
    FrameType.HEADERS: SpdySession._headers_block,
}
