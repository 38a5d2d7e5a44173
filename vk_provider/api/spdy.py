"""SPDY/3.1 as Kubernetes streaming speaks it: frames, header compression, a server session.

The API server reaches a kubelet's ``/exec``, ``/attach`` and ``/portForward`` over SPDY/3.1
(client-go's SPDY round tripper on top of ``moby/spdystream``): after ``101 Switching
Protocols`` the connection carries SPDY frames, and every stream is one channel (stdin,
stdout, stderr, error, resize; or one port-forward data/error stream). This module is the
server side of that wire and knows nothing of what the channels mean.

What spdystream does, and therefore what this session does:

- The client opens streams (odd ids, increasing) with SYN_STREAM; the server answers each
  with SYN_REPLY (no headers) once it accepts it, or RST_STREAM. spdystream's writers wait for
  the reply, so no data arrives on a stream before it.
- DATA with the FIN flag half-closes a stream; RST_STREAM aborts it.
- A PING from the peer (odd id) is echoed; the API server pings every 5 s.
- GOAWAY ends the session; so does the end of the connection.
- SETTINGS and WINDOW_UPDATE are ignored: spdystream implements no flow control, so the only
  back-pressure is TCP's (``pause_reading`` when too much unread data is buffered).
- Header blocks are zlib streams primed with the SPDY/3 dictionary, one compression context
  per direction for the whole connection.

Invariants:
- A frame is encoded and handed to the transport in one synchronous step, so the compressor's
  state follows the order of frames on the wire; every received header block is decompressed
  in order, also those of frames that are otherwise ignored (HEADERS, SYN_REPLY).
- ``feed`` never raises and never blocks: malformed input ends the session with GOAWAY
  (PROTOCOL_ERROR); the caller closes the connection once ``closed`` is set.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

VERSION = 3
FLAG_FIN = 0x01
MAX_FRAME_PAYLOAD = (1 << 24) - 1
MAX_HEADER_BLOCK = 256 * 1024  # decompressed; a stream's headers are a few short strings
DATA_CHUNK = 32 * 1024
READ_HIGH_WATER = 1 << 20  # unread bytes buffered before the transport is paused


class FrameType(enum.IntEnum):
    SYN_STREAM = 1
    SYN_REPLY = 2
    RST_STREAM = 3
    SETTINGS = 4
    PING = 6
    GOAWAY = 7
    HEADERS = 8
    WINDOW_UPDATE = 9


class RstStatus(enum.IntEnum):
    PROTOCOL_ERROR = 1
    REFUSED_STREAM = 3
    CANCEL = 5


class GoAwayStatus(enum.IntEnum):
    OK = 0
    PROTOCOL_ERROR = 1


class ProtocolError(ValueError):
    """The peer broke SPDY/3.1; the session ends."""


def _dictionary() -> bytes:
    # The SPDY/3 header-compression dictionary (draft-mbelshe-httpbis-spdy-00, 2.6.10.1):
    # length-prefixed header names and values, then a run of common strings.
    words = [
        "options",
        "head",
        "post",
        "put",
        "delete",
        "trace",
        "accept",
        "accept-charset",
        "accept-encoding",
        "accept-language",
        "accept-ranges",
        "age",
        "allow",
        "authorization",
        "cache-control",
        "connection",
        "content-base",
        "content-encoding",
        "content-language",
        "content-length",
        "content-location",
        "content-md5",
        "content-range",
        "content-type",
        "date",
        "etag",
        "expect",
        "expires",
        "from",
        "host",
        "if-match",
        "if-modified-since",
        "if-none-match",
        "if-range",
        "if-unmodified-since",
        "last-modified",
        "location",
        "max-forwards",
        "pragma",
        "proxy-authenticate",
        "proxy-authorization",
        "range",
        "referer",
        "retry-after",
        "server",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "vary",
        "via",
        "warning",
        "www-authenticate",
        "method",
        "get",
        "status",
    ]
    words += ["200 OK", "version", "HTTP/1.1", "url", "public", "set-cookie", "keep-alive"]
    words += ["origin"]
    prefixed = b"".join(struct.pack(">I", len(w)) + w.encode() for w in words)
    tail = (
        "100101201202205206300302303304305306307402405406407408409410411412413414415416417"
        "502504505203 Non-Authoritative Information204 No Content301 Moved Permanently"
        "400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error"
        "501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct "
        "Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,"
        "image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,"
        "text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8"
        "charset=iso-8859-1,utf-,*,enq=0."
    )
    return prefixed + tail.encode()


DICTIONARY = _dictionary()


# --------------------------------------------------------------------------- frames


@dataclass(frozen=True, slots=True)
class DataFrame:
    stream_id: int
    data: bytes
    fin: bool


@dataclass(frozen=True, slots=True)
class ControlFrame:
    kind: int
    flags: int
    payload: bytes
    version: int = VERSION


Frame = DataFrame | ControlFrame


class FrameParser:
    """Splits a byte stream into frames; incomplete input waits for the next ``feed``."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer += data
        frames: list[Frame] = []
        while len(self._buffer) >= 8:
            first, second = struct.unpack_from(">II", self._buffer)
            length = second & 0xFFFFFF
            if len(self._buffer) < 8 + length:
                break
            payload = bytes(self._buffer[8 : 8 + length])
            del self._buffer[: 8 + length]
            flags = second >> 24
            if first & 0x80000000:
                version = (first >> 16) & 0x7FFF
                frames.append(ControlFrame(first & 0xFFFF, flags, payload, version))
            else:
                frames.append(DataFrame(first & 0x7FFFFFFF, payload, bool(flags & FLAG_FIN)))
        return frames


def encode_data(stream_id: int, data: bytes, *, fin: bool = False) -> bytes:
    flags = FLAG_FIN if fin else 0
    return struct.pack(">II", stream_id & 0x7FFFFFFF, flags << 24 | len(data)) + data


def encode_control(kind: int, payload: bytes, *, flags: int = 0) -> bytes:
    if len(payload) > MAX_FRAME_PAYLOAD:
        raise ValueError("control frame too long")
    return struct.pack(">HHI", 0x8000 | VERSION, kind, flags << 24 | len(payload)) + payload


Headers = Mapping[str, Sequence[str]]


class HeaderCompressor:
    """Encodes header blocks: one zlib stream for the whole connection, sync-flushed per block."""

    def __init__(self) -> None:
        self._zlib = zlib.compressobj(9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, DICTIONARY)

    def encode(self, headers: Headers) -> bytes:
        block = bytearray(struct.pack(">I", len(headers)))
        for name, values in headers.items():
            raw_name, raw_value = name.lower().encode(), "\0".join(values).encode()
            block += struct.pack(">I", len(raw_name)) + raw_name
            block += struct.pack(">I", len(raw_value)) + raw_value
        return self._zlib.compress(bytes(block)) + self._zlib.flush(zlib.Z_SYNC_FLUSH)


class HeaderDecompressor:
    """Decodes header blocks in the order they arrive (the zlib context is shared)."""

    def __init__(self) -> None:
        self._zlib = zlib.decompressobj(zdict=DICTIONARY)

    def decode(self, compressed: bytes) -> dict[str, list[str]]:
        try:
            block = self._zlib.decompress(compressed, MAX_HEADER_BLOCK)
        except zlib.error as exc:
            raise ProtocolError(f"header block does not decompress: {exc}") from exc
        if self._zlib.unconsumed_tail:
            raise ProtocolError("header block too large")
        return _parse_header_block(block)


def _parse_header_block(block: bytes) -> dict[str, list[str]]:
    try:
        (count,) = struct.unpack_from(">I", block)
        offset = 4
        headers: dict[str, list[str]] = {}
        for _ in range(count):
            fields = []
            for _field in range(2):
                (length,) = struct.unpack_from(">I", block, offset)
                value = block[offset + 4 : offset + 4 + length]
                if len(value) != length:
                    raise ProtocolError("truncated header block")
                fields.append(value.decode("utf-8", "replace"))
                offset += 4 + length
            # Names are case-insensitive (spdystream lowercases them); a value may hold several.
            headers.setdefault(fields[0].lower(), []).extend(fields[1].split("\0"))
    except struct.error as exc:
        raise ProtocolError("truncated header block") from exc
    if offset != len(block):
        raise ProtocolError("trailing bytes after the header block")
    return headers


# --------------------------------------------------------------------------- the session


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
        handler = _CONTROL_HANDLERS.get(FrameType(frame.kind)) if frame.kind in _KINDS else None
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
_KINDS = frozenset(int(kind) for kind in FrameType)
