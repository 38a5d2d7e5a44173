"""The WebSocket channel protocols of B's ``pods/exec``, ``pods/attach`` and ``pods/portforward``.

Pure: URLs, frames and Status parsing; ``streams.py`` does the I/O.

Exec and attach speak ``v5.channel.k8s.io`` (``k8s.io/streaming`` ``wsstream``): every binary
message starts with a channel byte — 0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize — and
the rest is that channel's data; ``[255, n]`` half-closes channel ``n`` (what v5 adds over v4:
stdin's end reaches the command). The API server translates a v5 WebSocket into the SPDY a
kubelet speaks (``StreamTranslatorHandler``), so this works whatever B's kubelet is; v4 would
be passed to the kubelet untranslated, and has no half-close, so it is not offered. The error
channel carries one JSON ``metav1.Status`` when the command ends: ``Success``, or ``Failure``
with reason ``NonZeroExitCode`` and the exit code as the ``ExitCode`` cause; any other failure
is an error of the exchange, not an exit code. Resizes are JSON ``{"Width": w, "Height": h}``.

Port-forward speaks ``v4.channel.k8s.io`` (kubelet's ``portforward/websocket.go``): the
``ports`` query names the ports; port ``i`` has data channel ``2i`` and error channel
``2i + 1``, and the first message of each starts with the port, 2 bytes little-endian, which
is not data. One WebSocket is one TCP connection per port; there is no half-close, so the
connection ends when the WebSocket does.

Invariants: a frame never carries a channel byte above 255; a Status the caller cannot read
is an error naming what it was, never an exit code of 0.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlencode

EXEC_PROTOCOL = "v5.channel.k8s.io"
PORT_FORWARD_PROTOCOL = "v4.channel.k8s.io"

STDIN, STDOUT, STDERR, ERROR, RESIZE = 0, 1, 2, 3, 4
CLOSE = 255


def exec_url(
    pod_path: str, *, container: str, command: Sequence[str], stdin: bool, tty: bool
) -> str:
    """The path and query of ``pods/exec`` (``pod_path`` is ``/api/v1/namespaces/N/pods/P``).
    With a terminal there is one output, so stderr is not asked for (as kubectl does)."""
    query: list[tuple[str, str]] = [("command", part) for part in command]
    query += _stream_query(container=container, stdin=stdin, tty=tty)
    return f"{pod_path}/exec?{urlencode(query)}"


def attach_url(pod_path: str, *, container: str, stdin: bool, tty: bool) -> str:
    query = _stream_query(container=container, stdin=stdin, tty=tty)
    return f"{pod_path}/attach?{urlencode(query)}"


def port_forward_url(pod_path: str, port: int) -> str:
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port} is not a TCP port")
    return f"{pod_path}/portforward?{urlencode({'ports': str(port)})}"


def _stream_query(*, container: str, stdin: bool, tty: bool) -> list[tuple[str, str]]:
    query = [("container", container), ("stdout", "true")]
    if not tty:
        query.append(("stderr", "true"))
    if stdin:
        query.append(("stdin", "true"))
    if tty:
        query.append(("tty", "true"))
    return query


def frame(channel: int, data: bytes = b"") -> bytes:
    """One message of ``channel``."""
    if not 0 <= channel <= 255:
        raise ValueError(f"channel {channel} is not a byte")
    return bytes((channel,)) + data


def close_frame(channel: int) -> bytes:
    """v5's half-close of ``channel`` (stdin's end of file)."""
    return frame(CLOSE, bytes((channel,)))


def resize_frame(width: int, height: int) -> bytes:
    return frame(RESIZE, json.dumps({"Width": width, "Height": height}).encode())


def split_frame(message: bytes) -> tuple[int, bytes] | None:
    """``(channel, data)`` of a received message; None for an empty one (a keep-alive)."""
    if not message:
        return None
    return message[0], message[1:]


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What the error channel said: the exit code, or why the exchange failed."""

    exit_code: int | None
    failure: str = ""


def command_result(status: bytes) -> CommandResult:
    """The exit code in a ``metav1.Status`` of the error channel (see the module docstring)."""
    try:
        body = json.loads(status.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        text = status.decode("utf-8", "replace").strip()
        return CommandResult(None, text or "the error channel said nothing readable")
    if not isinstance(body, dict):
        return CommandResult(None, "the error channel's Status is not an object")
    if body.get("status") == "Success":
        return CommandResult(0)
    message = str(body.get("message") or "the command failed")
    if body.get("reason") == "NonZeroExitCode":
        details = body.get("details")
        causes = details.get("causes") if isinstance(details, dict) else None
        for cause in causes if isinstance(causes, list) else ():
            if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
                code = str(cause.get("message", ""))
                if code.isdigit():
                    return CommandResult(int(code))
    return CommandResult(None, message)


@dataclass(slots=True)
class PortFrames:
    """The messages of one port's channels (0 data, 1 error) with the port prefixes taken
    off: each channel's first 2 bytes are the port, not data (possibly split over
    messages)."""

    port: int
    _prefix_left: dict[int, int] | None = None

    def __post_init__(self) -> None:
        self._prefix_left = {0: 2, 1: 2}

    def feed(self, message: bytes) -> tuple[int, bytes] | None:
        """``(0, data)`` or ``(1, error text)``; None when nothing is left to deliver.
        Raises ValueError for a channel of another port or a prefix naming another port."""
        parts = split_frame(message)
        if parts is None:
            return None
        channel, data = parts
        left = self._prefix_left
        assert left is not None
        if channel not in left:
            raise ValueError(f"a message on channel {channel}, which no port of ours has")
        if left[channel]:
            taken, data = data[: left[channel]], data[left[channel] :]
            expected = struct.pack("<H", self.port)[2 - left[channel] :][: len(taken)]
            if taken != expected:
                raise ValueError(f"channel {channel} is for another port than {self.port}")
            left[channel] -= len(taken)
        return (channel, data) if data else None
