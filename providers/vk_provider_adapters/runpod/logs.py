"""RunPod logs: the v2 ``GET /pods/{id}/logs?source=container`` query and its Server-Sent
Events, decoded into log lines.

Invariants: pure; every rendered line ends with a newline; events of another source than the
container are dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from vk_provider.sdk import LogOptions

LOG_TAIL_MAX = 5000  # the v2 logs endpoint's maximum ``tail``


@dataclass(frozen=True, slots=True)
class LogEvent:
    ts: str
    line: str

    def render(self, *, timestamps: bool) -> bytes:
        text = self.line.rstrip("\r\n")
        prefix = f"{self.ts} " if timestamps and self.ts else ""
        return f"{prefix}{text}\n".encode()


@dataclass(slots=True)
class SseDecoder:
    """Server-Sent Events, one line at a time, into log events.

    The v2 payload is ``data: {"ts", "source", "line"}`` with the timestamp as ``id``; data
    that is not that JSON is passed through as the line, events of another source dropped.
    """

    _data: list[str] = field(default_factory=list)
    _id: str = ""

    def feed(self, line: str) -> LogEvent | None:
        line = line.rstrip("\r\n")
        if not line:
            return self.flush()
        if line.startswith(":"):
            return None  # a comment (keep-alive)
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        return None

    def flush(self) -> LogEvent | None:
        if not self._data:
            return None
        raw, event_id = "\n".join(self._data), self._id
        self._data, self._id = [], ""
        try:
            payload = json.loads(raw)
        except ValueError:
            return LogEvent(event_id, raw)
        if not isinstance(payload, dict) or not isinstance(payload.get("line"), str):
            return LogEvent(event_id, raw)
        source = payload.get("source")
        if isinstance(source, str) and source != "container":
            return None
        ts = payload.get("ts")
        return LogEvent(ts if isinstance(ts, str) else event_id, payload["line"])


def log_params(options: LogOptions, *, now: datetime) -> dict[str, str]:
    tail = LOG_TAIL_MAX if options.tail_lines is None else options.tail_lines
    params = {"source": "container", "tail": str(max(0, min(LOG_TAIL_MAX, tail)))}
    if options.since_seconds is not None:
        since = now - timedelta(seconds=max(0, options.since_seconds))
        params["since"] = since.strftime("%Y-%m-%dT%H:%M:%SZ")
    return params
