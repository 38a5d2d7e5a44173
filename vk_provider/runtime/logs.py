"""The agent's log: one line per decision that changes the world, for people or for machines.

``setup_logging(level, fmt)`` configures the root logger once: ``text`` (the default)
prints ``time LEVEL logger: message`` and then the fields of ``domain.logfields`` a line
carries (``pod=ns/name instance=id provider=name``); ``json`` prints one object per line
with ``time``, ``level``, ``logger``, ``message``, those fields and ``exception``. The
libraries' own request logs (httpx, httpcore: one INFO line per HTTP request, e.g. every
Prometheus query of the flip) and aiohttp's access log show only at ``debug``.

Invariants: the format is chosen once, for every logger; a line is one line in JSON (the
message and traceback are escaped into it); nothing here adds a value the call did not log.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Final, Literal

from vk_provider.domain.logfields import FIELDS

LogFormat = Literal["text", "json"]
LOG_FORMATS: Final = ("text", "json")
# Loggers of dependencies that log every request at INFO: shown only at debug.
CHATTY: Final = ("httpx", "httpcore", "aiohttp.access", "asyncssh", "kubernetes_asyncio")


def _fields(record: logging.LogRecord) -> dict[str, str]:
    return {name: str(getattr(record, name)) for name in FIELDS if hasattr(record, name)}


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _fields(record)
        if not fields:
            return line
        first, newline, rest = line.partition("\n")
        tail = " ".join(f"{k}={v}" for k, v in fields.items())
        return f"{first} {tail}{newline}{rest}"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, str] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def setup_logging(level: str, fmt: LogFormat = "text") -> None:
    """Configure the root logger (stderr) at ``level`` in ``fmt``; see the module docstring."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"--log-format must be one of {', '.join(LOG_FORMATS)}, not {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    quiet = logging.DEBUG if level.lower() == "debug" else logging.WARNING
    for name in CHATTY:
        logging.getLogger(name).setLevel(quiet)
