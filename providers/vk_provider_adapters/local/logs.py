"""The local provider's container logs: CRI log lines (``<RFC 3339 time> <stream> <tag>
<text>``, as kubelet writes them), as the runner writes ``container.log``.

Invariants: pure except ``read_complete_lines``, which reads only whole lines (a line the runner
is still writing is left for the next read), and ``stream_log``, which follows a file.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from vk_provider.sdk import LogOptions

_FOLLOW_POLL_SECONDS = 0.2


@dataclass(frozen=True, slots=True)
class LogLine:
    """One parsed line of a CRI log file."""

    timestamp: bytes
    epoch_ns: int | None
    stream: bytes
    partial: bool
    content: bytes

    def render(self, *, timestamps: bool) -> bytes:
        """As kubelet serves it: optional timestamp prefix; partial lines get no newline."""
        prefix = self.timestamp + b" " if timestamps else b""
        return prefix + self.content + (b"" if self.partial else b"\n")


def parse_timestamp(value: bytes) -> int | None:
    """RFC3339 UTC (``...Z``, any fraction) to nanoseconds since the epoch; None if not one."""
    try:
        text = value.decode("ascii")
        if not text.endswith("Z"):
            return None
        head, _, fraction = text[:-1].partition(".")
        if fraction and not fraction.isdigit():
            return None
        whole = datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        return None
    return int(whole.timestamp()) * 1_000_000_000 + int(fraction.ljust(9, "0")[:9] or 0)


def parse_cri_line(raw: bytes) -> LogLine | None:
    """``<timestamp> <stdout|stderr> <F|P>[:tags] <content>``; None for anything else."""
    parts = raw.split(b" ", 3)
    if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr") or not parts[2]:
        return None
    return LogLine(
        timestamp=parts[0],
        epoch_ns=parse_timestamp(parts[0]),
        stream=parts[1],
        partial=parts[2].startswith(b"P"),
        content=parts[3] if len(parts) == 4 else b"",
    )


def select_history(
    lines: list[LogLine], *, tail_lines: int | None, since_ns: int | None
) -> list[LogLine]:
    """The existing lines `kubectl logs` asks for: newer than ``since_ns``, then the last N."""
    if since_ns is not None:
        lines = [line for line in lines if line.epoch_ns is None or line.epoch_ns >= since_ns]
    if tail_lines is not None:
        lines = lines[-tail_lines:] if tail_lines > 0 else []
    return lines


def read_complete_lines(path: Path, offset: int) -> tuple[list[LogLine], int]:
    """Parsed complete lines from ``offset`` on, and the offset after the last complete one."""
    try:
        with path.open("rb") as file:
            file.seek(offset)
            data = file.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
    parsed = (parse_cri_line(raw) for raw in data[:end].split(b"\n")[:-1])
    return [line for line in parsed if line is not None], offset + end


class ByteBudget:
    """``limit_bytes``: cuts the output at exactly that many bytes, as kubelet does."""

    def __init__(self, limit: int | None) -> None:
        self._left = limit

    @property
    def spent(self) -> bool:
        return self._left is not None and self._left <= 0

    def take(self, chunk: bytes) -> bytes:
        if self._left is None:
            return chunk
        chunk = chunk[: self._left]
        self._left -= len(chunk)
        return chunk


async def stream_log(
    path: Path, options: LogOptions, *, active: Callable[[], bool]
) -> AsyncIterator[bytes]:
    """What `kubectl logs` asks of one log file; with ``follow``, new lines until ``active``
    says the writer is done (looked at before each read, so the last read holds everything)."""
    since_ns = (
        None
        if options.since_seconds is None
        else time.time_ns() - options.since_seconds * 1_000_000_000
    )
    budget = ByteBudget(options.limit_bytes)
    lines, offset = read_complete_lines(path, 0)
    lines = select_history(lines, tail_lines=options.tail_lines, since_ns=since_ns)
    finished = not options.follow
    while True:
        for line in lines:
            chunk = budget.take(line.render(timestamps=options.timestamps))
            if chunk:
                yield chunk
            if budget.spent:
                return
        if finished:
            return
        finished = not active()
        if not finished:
            await asyncio.sleep(_FOLLOW_POLL_SECONDS)
        lines, offset = read_complete_lines(path, offset)
