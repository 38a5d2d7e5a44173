"""SPDY/3.1 as Kubernetes streaming speaks it: frames and header compression.

The API server reaches a kubelet's ``/exec``, ``/attach`` and ``/portForward`` over SPDY/3.1
(client-go's SPDY round tripper on top of ``moby/spdystream``): after ``101 Switching
Protocols`` the connection carries SPDY frames, and every stream is one channel. This module
is the wire format (pure: no I/O); ``api/spdy_session.py`` is the server session on top.

- Control frames carry version 3; data frames a 31-bit stream id; both a 24-bit length and
  8 bits of flags (FIN).
- Header blocks (SYN_STREAM, SYN_REPLY, HEADERS) are zlib streams primed with the SPDY/3
  dictionary, one compression context per direction for the whole connection, each block
  sync-flushed; names are lowercase, several values of a name are joined by NUL.

Invariants: a decoder is fed every header block of its direction, in order (a skipped block
leaves the context out of step); a decompressed block is bounded (``MAX_HEADER_BLOCK``).
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

VERSION = 3
FLAG_FIN = 0x01
MAX_FRAME_PAYLOAD = (1 << 24) - 1
MAX_HEADER_BLOCK = 256 * 1024  # decompressed; a stream's headers are a few short strings


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


KINDS = frozenset(int(kind) for kind in FrameType)
