"""SPDY/3.1 framing and the server session (``api/spdy.py``, ``api/spdy_session.py``).

The golden bytes below were written by ``moby/spdystream``'s framer (v0.5.1, the one
client-go's SPDY executor and kubectl use): three SYN_STREAMs whose header blocks share one
zlib context, stdin data with a FIN, a PING and a GOAWAY. Frames our session wrote for
them were decoded by the same Go framer when this test was written; here a client codec with
its own zlib context decodes them, so a compressor out of step with the wire fails.
"""

from __future__ import annotations

import struct
import zlib

import pytest

from tests.unit.spdy_client import SpdyClientCodec
from vk_provider.api.spdy import (
    DICTIONARY,
    ControlFrame,
    DataFrame,
    FrameParser,
    FrameType,
    HeaderCompressor,
    HeaderDecompressor,
    ProtocolError,
    encode_control,
)
from vk_provider.api.spdy_session import READ_HIGH_WATER, SpdySession

GO_FRAMES = bytes.fromhex(
    "80030001000000290000000100000000000078f9e3c6a7c26260606004a7b392a2d4c45c6851c29a0a0a68"
    "00000000ffff800300010000001700000003000000000000c22e555c92929907000000ffff800300010000"
    "002f000000050000000000000225550c295001940829cb8bc0d9c6c2c0c280818181b30812f799a03cc168"
    "00000000ffff000000030000000668656c6c6f0a00000003010000008003000600000004000000018003000"
    "7000000080000000000000000"
)


class Sink:
    def __init__(self) -> None:
        self.out = bytearray()
        self.broken = False

    def write(self, data: bytes) -> None:
        if self.broken:
            raise ConnectionResetError("gone")
        self.out += data

    async def drain(self) -> None:
        return None


def test_the_dictionary_is_spdy3s() -> None:
    assert len(DICTIONARY) == 1423
    assert zlib.adler32(DICTIONARY) == 0xE3C6A7C2  # the dictionary id in every header block


def test_go_frames_parse_whatever_the_chunking() -> None:
    whole = FrameParser().feed(GO_FRAMES)
    parser = FrameParser()
    piecewise = [frame for byte in GO_FRAMES for frame in parser.feed(bytes([byte]))]
    assert piecewise == whole
    kinds = [f.kind if isinstance(f, ControlFrame) else "data" for f in whole]
    assert kinds == [1, 1, 1, "data", "data", FrameType.PING, FrameType.GOAWAY]
    assert whole[3] == DataFrame(3, b"hello\n", fin=False)
    assert whole[4] == DataFrame(3, b"", fin=True)


def test_go_header_blocks_decode_in_order() -> None:
    decompressor = HeaderDecompressor()
    syns = [f for f in FrameParser().feed(GO_FRAMES) if isinstance(f, ControlFrame)][:3]
    headers = [decompressor.decode(f.payload[10:]) for f in syns]
    assert headers == [
        {"streamtype": ["error"]},
        {"streamtype": ["stdin"]},
        {"streamtype": ["data"], "port": ["8080"], "requestid": ["0"]},
    ]


def test_a_header_block_out_of_order_does_not_decode() -> None:
    syns = [f for f in FrameParser().feed(GO_FRAMES) if isinstance(f, ControlFrame)][:3]
    with pytest.raises(ProtocolError):
        HeaderDecompressor().decode(syns[1].payload[10:])  # its dictionary state is missing


def test_headers_round_trip_with_one_context_per_direction() -> None:
    compressor, decompressor = HeaderCompressor(), HeaderDecompressor()
    first = compressor.encode({"streamType": ["stdout"], "Multi": ["a", "b"]})
    second = compressor.encode({"streamType": ["stdout"], "Multi": ["a", "b"]})
    assert len(second) < len(first)  # the context remembers the first block
    assert decompressor.decode(first) == {"streamtype": ["stdout"], "multi": ["a", "b"]}
    assert decompressor.decode(second) == {"streamtype": ["stdout"], "multi": ["a", "b"]}


def test_an_oversized_header_block_is_a_protocol_error() -> None:
    block = struct.pack(">I", 1) + struct.pack(">I", 4) + b"name" + struct.pack(">I", 400_000)
    block += b"x" * 400_000
    compressor = zlib.compressobj(9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, DICTIONARY)
    packed = compressor.compress(block) + compressor.flush(zlib.Z_SYNC_FLUSH)
    with pytest.raises(ProtocolError, match="too large"):
        HeaderDecompressor().decode(packed)


async def test_streams_are_accepted_replied_and_fed() -> None:
    sink, client = Sink(), SpdyClientCodec()
    session = SpdySession(sink)
    error_id, frame = client.syn_stream({"streamType": "error"})
    session.feed(frame)
    stdin_id, frame = client.syn_stream({"streamType": "stdin"})
    session.feed(frame)
    error, stdin = await session.accept(), await session.accept()
    assert error is not None and stdin is not None
    assert (error.id, error.header("streamType")) == (error_id, "error")
    assert (stdin.id, stdin.header("STREAMTYPE")) == (stdin_id, "stdin")
    error.reply()
    stdin.reply()
    client.receive(bytes(sink.out))
    assert client.streams[error_id].replied and client.streams[stdin_id].replied

    session.feed(client.data(stdin_id, b"abc") + client.data(stdin_id, b"", fin=True))
    assert await stdin.read() == b"abc"
    assert await stdin.read() == b""  # FIN: end of input
    sink.out.clear()
    await error.write(b"x" * 70_000)  # split into frames the peer reassembles
    error.close()
    error.close()  # idempotent: one FIN
    client.receive(bytes(sink.out))
    assert client.streams[error_id].data == b"x" * 70_000 and client.streams[error_id].fin
    assert sink.out.count(bytes.fromhex("00000001") + b"\x01\x00\x00\x00") == 1


async def test_data_for_unknown_or_unanswered_streams_is_dropped() -> None:
    sink, client = Sink(), SpdyClientCodec()
    session = SpdySession(sink)
    stream_id, frame = client.syn_stream({"streamtype": "stdin"})
    session.feed(frame + client.data(stream_id, b"early") + client.data(99, b"stray"))
    stream = await session.accept()
    assert stream is not None
    stream.reply()
    session.feed(client.data(stream_id, b"late", fin=True))
    assert await stream.read() == b"late"


def test_pings_from_the_client_are_echoed_ours_are_not() -> None:
    sink, client = Sink(), SpdyClientCodec()
    session = SpdySession(sink)
    session.feed(client.ping(1) + client.ping(2) + client.ping(7))
    client.receive(bytes(sink.out))
    assert client.pings == [1, 7]


async def test_goaway_and_eof_end_the_session_and_its_streams() -> None:
    for ending in ("goaway", "eof"):
        sink, client = Sink(), SpdyClientCodec()
        session = SpdySession(sink)
        _, frame = client.syn_stream({"streamtype": "stdout"})
        session.feed(frame)
        stream = await session.accept()
        assert stream is not None
        stream.reply()
        if ending == "goaway":
            session.feed(client.goaway_frame())
        else:
            session.feed_eof()
        assert session.closed.is_set()
        assert await stream.read() == b""
        assert await session.accept() is None
        assert await session.accept() is None  # and again
        with pytest.raises(ConnectionResetError):
            await stream.write(b"late")


async def test_rst_stream_aborts_one_stream_only() -> None:
    sink, client = Sink(), SpdyClientCodec()
    session = SpdySession(sink)
    first, frame = client.syn_stream({"streamtype": "data"})
    session.feed(frame)
    second, frame = client.syn_stream({"streamtype": "data"})
    session.feed(frame)
    a, b = await session.accept(), await session.accept()
    assert a is not None and b is not None
    a.reply()
    b.reply()
    session.feed(client.rst(first))
    assert a.reset and await a.read() == b""
    session.feed(client.data(second, b"still here"))
    assert await b.read() == b"still here"
    assert not session.closed.is_set()


def test_stream_ids_must_be_odd_and_increasing() -> None:
    sink, client = Sink(), SpdyClientCodec()
    session = SpdySession(sink)
    _, frame = client.syn_stream({"streamtype": "data"})  # id 1
    session.feed(frame)
    client._next_id = 1  # a buggy client: id 1 again
    _, frame = client.syn_stream({"streamtype": "data"})
    session.feed(frame)
    client.receive(bytes(sink.out))
    assert client.streams[1].reset == 1  # PROTOCOL_ERROR
    assert not session.closed.is_set()


def test_garbage_ends_the_session_with_goaway() -> None:
    sink, client = Sink(), SpdyClientCodec()
    session = SpdySession(sink)
    bogus = encode_control(FrameType.SYN_STREAM, struct.pack(">IIBB", 1, 0, 0, 0) + b"nonsense")
    session.feed(bogus)
    client.receive(bytes(sink.out))
    assert session.closed.is_set()
    assert client.goaway == (0, 1)  # PROTOCOL_ERROR


def test_other_versions_are_refused() -> None:
    sink = Sink()
    session = SpdySession(sink)
    frame = bytearray(encode_control(FrameType.PING, struct.pack(">I", 1)))
    frame[1] = 2  # SPDY/2
    session.feed(bytes(frame))
    assert session.closed.is_set()


async def test_unread_data_pauses_the_transport_until_it_is_read() -> None:
    sink, client = Sink(), SpdyClientCodec()
    calls: list[str] = []
    session = SpdySession(
        sink,
        pause_reading=lambda: calls.append("pause"),
        resume_reading=lambda: calls.append("resume"),
    )
    stream_id, frame = client.syn_stream({"streamtype": "stdin"})
    session.feed(frame)
    stream = await session.accept()
    assert stream is not None
    stream.reply()
    chunk = b"y" * 65536
    for _ in range(READ_HIGH_WATER // len(chunk) + 1):
        session.feed(client.data(stream_id, chunk))
    assert calls == ["pause"]
    while stream.buffered:
        await stream.read()
    assert calls == ["pause", "resume"]


async def test_a_broken_transport_ends_the_session() -> None:
    sink, client = Sink(), SpdyClientCodec()
    session = SpdySession(sink)
    _, frame = client.syn_stream({"streamtype": "stdout"})
    session.feed(frame)
    stream = await session.accept()
    assert stream is not None
    sink.broken = True
    stream.reply()  # the write fails: no exception here, the session is over
    assert session.closed.is_set()
    with pytest.raises(ConnectionResetError):
        await stream.write(b"data")
