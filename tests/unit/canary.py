"""Canary secrets for the adapters' redaction tests, in every form a provider may echo them.

A provider that echoes a request back in an error (or a proxy, or a transport library) may
carry a secret raw, JSON-escaped, HTML-escaped, URL-encoded or split over lines; a message
that is cut (at any offset) or whose white space is collapsed may carry part of one. ``echo``
carries all of these, cut ones included; ``leaks`` finds any of them in a text: every form of
every canary, and any run of ``WINDOW`` characters of one.
"""

from __future__ import annotations

import html
import json
import logging
import traceback
import urllib.parse
from collections.abc import Iterable

# ASCII only: it travels in an HTTP header. '/', '+', '=' and '&' differ in each encoding.
KEY = "ck-CANARY-k3y/Zq9+Wv=x&Lm7"
# A secret env value: quotes, backslash, non-ASCII and several lines, each long enough to
# be recognisable on its own.
SECRET = 'sv-CANARY "Qx7" \\ /+&= é\nsecond-line-CANARY2-Pz4\r\nthird-line-CANARY3-Jw8'

WINDOW = 10


def forms(value: str) -> list[str]:
    """``value`` as a provider may echo it."""
    found = [
        value,
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        urllib.parse.quote(value, safe=""),
        urllib.parse.quote(value),
        urllib.parse.quote_plus(value),
        " ".join(value.split()),
        html.escape(value),
        html.escape(value).replace("&#x27;", "&#39;"),
        html.escape(value, quote=False),
    ]
    found += [line.strip() for line in value.splitlines() if len(line.strip()) >= 8]
    return list(dict.fromkeys(found))


def echo(values: Iterable[str] = (KEY, SECRET)) -> str:
    """A text that carries every form of every value (for a server to answer with), and each
    form cut: its first and its last ``CUT`` characters, as a server that limits a field's
    length, or a log line cut short, leaves them."""
    whole = [form for value in values for form in forms(value)]
    cut = [piece for form in whole for piece in (form[:CUT] + "…", "…" + form[-CUT:])]
    return " | ".join(whole + cut)


CUT = 12


def leaks(text: str, values: Iterable[str] = (KEY, SECRET)) -> list[str]:
    """Every form, or ``WINDOW``-character run of a form, of ``values`` found in ``text``."""
    found = []
    for value in values:
        for form in forms(value):
            for start in range(max(1, len(form) - WINDOW + 1)):
                piece = form[start : start + WINDOW]
                if piece.strip() and piece in text:
                    found.append(piece)
                    break
    return found


def assert_clean(
    *,
    error: BaseException | None = None,
    records: Iterable[logging.LogRecord] = (),
    returned: Iterable[object] = (),
    values: Iterable[str] = (KEY, SECRET),
) -> None:
    """No form of a canary in the error (and its causes), in any log record (with its
    traceback), or in the ``repr`` of anything returned."""
    canaries = tuple(values)
    texts: list[str] = []
    cause = error
    while cause is not None:
        texts += [str(cause), repr(cause)]
        cause = cause.__cause__
    for record in records:
        texts.append(record.getMessage())
        if record.exc_info:
            texts.append("".join(traceback.format_exception(*record.exc_info)))
    texts += [repr(value) for value in returned]
    found = [(text[:120], leaks(text, canaries)) for text in texts if leaks(text, canaries)]
    assert not found, f"canary leaked: {found}"
