"""A small SPDY/3.1 *client* for tests: what client-go's SPDY executor puts on the wire.

It opens streams (odd ids), sends data, reads whatever the server sends, and decodes header
blocks with the client's own zlib context, so tests check our server against the protocol
rather than against itself: a reply that the server compressed out of step would not decode.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from dataclasses import dataclass, field

from vk_provider.api.spdy import (
    ControlFrame,
    DataFrame,
    FrameParser,
    FrameType,
    HeaderCompressor,
    HeaderDecompressor,
    encode_control,
    encode_data,
)


@dataclass
class ClientStream:
    id: int
    data: bytearray = field(default_factory=bytearray)
    fin: bool = False
    replied: bool = False
    reset: int | None = None


class SpdyClientCodec:
    """Client-side encoding and decoding; the transport is the caller's."""

    def __init__(self) -> None:
        self._next_id = 1
        self._compressor = HeaderCompressor()
        self._decompressor = HeaderDecompressor()
        self._parser = FrameParser()
        self.streams: dict[int, ClientStream] = {}
        self.pings: list[int] = []
        self.goaway: tuple[int, int] | None = None

    def syn_stream(self, headers: dict[str, str], *, fin: bool = False) -> tuple[int, bytes]:
        stream_id = self._next_id
        self._next_id += 2
        self.streams[stream_id] = ClientStream(stream_id)
        block = self._compressor.encode({k: [v] for k, v in headers.items()})
        payload = struct.pack(">IIBB", stream_id, 0, 0, 0) + block
        return stream_id, encode_control(FrameType.SYN_STREAM, payload, flags=1 if fin else 0)

    @staticmethod
    def data(stream_id: int, data: bytes, *, fin: bool = False) -> bytes:
        return encode_data(stream_id, data, fin=fin)

    @staticmethod
    def ping(ping_id: int) -> bytes:
        return encode_control(FrameType.PING, struct.pack(">I", ping_id))

    @staticmethod
    def rst(stream_id: int, status: int = 5) -> bytes:
        return encode_control(FrameType.RST_STREAM, struct.pack(">II", stream_id, status))

    @staticmethod
    def goaway_frame() -> bytes:
        return encode_control(FrameType.GOAWAY, struct.pack(">II", 0, 0))

    def receive(self, raw: bytes) -> None:
        for frame in self._parser.feed(raw):
            if isinstance(frame, DataFrame):
                stream = self.streams[frame.stream_id]
                assert stream.replied, "data before the reply"
                stream.data += frame.data
                stream.fin = stream.fin or frame.fin
            else:
                self._control(frame)

    def _control(self, frame: ControlFrame) -> None:
        payload = frame.payload
        if frame.kind == FrameType.SYN_REPLY:
            (stream_id,) = struct.unpack_from(">I", payload)
            self._decompressor.decode(payload[4:])
            self.streams[stream_id].replied = True
        elif frame.kind == FrameType.RST_STREAM:
            stream_id, status = struct.unpack(">II", payload)
            self.streams.setdefault(stream_id, ClientStream(stream_id)).reset = status
        elif frame.kind == FrameType.PING:
            self.pings.append(struct.unpack(">I", payload)[0])
        elif frame.kind == FrameType.GOAWAY:
            self.goaway = struct.unpack(">II", payload)


class SpdyClient:
    """The codec over an asyncio connection (TLS in the kubelet API tests)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.codec = SpdyClientCodec()
        self._reader = reader
        self._writer = writer
        self.closed = asyncio.Event()
        self._changed = asyncio.Condition()
        self._pump = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while chunk := await self._reader.read(65536):
                self.codec.receive(chunk)
                async with self._changed:
                    self._changed.notify_all()
        finally:
            self.closed.set()
            async with self._changed:
                self._changed.notify_all()

    async def open(self, headers: dict[str, str]) -> int:
        stream_id, frame = self.codec.syn_stream(headers)
        self._writer.write(frame)
        await self._writer.drain()
        await self.until(lambda: self.codec.streams[stream_id].replied, what="the reply")
        return stream_id

    async def send(self, stream_id: int, data: bytes, *, fin: bool = False) -> None:
        self._writer.write(self.codec.data(stream_id, data, fin=fin))
        await self._writer.drain()

    async def raw(self, frame: bytes) -> None:
        self._writer.write(frame)
        await self._writer.drain()

    async def until(self, condition: object, *, what: str, timeout: float = 20.0) -> None:
        assert callable(condition)
        async with asyncio.timeout(timeout), self._changed:
            while not condition():
                if self.closed.is_set() and not condition():
                    raise AssertionError(f"connection closed before {what}")
                await self._changed.wait()

    def stream(self, stream_id: int) -> ClientStream:
        return self.codec.streams[stream_id]

    async def close(self) -> None:
        self._writer.close()
        self._pump.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await self._pump
