"""Redaction of secrets, in every form a server, a proxy or a library may echo them.

Used by every adapter (its credentials and the secret env values of the spec it creates)
and by the agent itself, which redacts a pod's secret env values from any provider message
it writes into an Event, a log line or the REST API: two layers, so one forgotten path in an
adapter does not leak a pod's secret.

Invariants: pure; ``Redactor`` replaces every non-empty secret's every form with
``<redacted>``, longest form first, and then any run of ``MIN_SECRET_PART`` or more
characters of a form (a secret someone cut at any offset, before or after it reached us);
it changes nothing else, and its ``repr`` never shows the secrets. It is still applied
before anything of ours cuts or collapses a text.
"""

from __future__ import annotations

import base64
import html
import json
import re
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

REDACTED: Final = "<redacted>"


# Parts of a multi-line secret (one line of a PEM key, say) shorter than this are not
# redacted on their own: a short line is as likely to be an ordinary word.
MIN_SECRET_PART = 8


def secret_forms(secret: str) -> tuple[str, ...]:
    """``secret`` as a server, a proxy or a library may echo it: raw, JSON-escaped (ASCII and
    not), HTML-escaped (quotes as ``&quot;``/``&#x27;`` or ``&#39;``, or left alone),
    URL-encoded (``quote`` with and without ``/`` safe, ``quote_plus``; either hex case),
    base64, and for a multi-line one each line, CRLF and LF spellings and the line-joined
    form a whitespace collapse makes. Longest first, so that no shorter form breaks a longer
    one before it is matched."""
    if not secret:
        return ()
    variants = {secret, secret.replace("\r\n", "\n"), secret.replace("\n", "\r\n")}
    collapsed = " ".join(secret.split())
    if collapsed != secret and len(collapsed) >= MIN_SECRET_PART:
        variants.add(collapsed)
    variants.update(
        line.strip() for line in secret.splitlines() if len(line.strip()) >= MIN_SECRET_PART
    )
    forms: set[str] = set()
    for variant in variants:
        escaped = json.dumps(variant)[1:-1]
        forms.update({variant, escaped, json.dumps(variant, ensure_ascii=False)[1:-1]})
        forms.add(escaped.replace("/", "\\/"))  # some servers escape the solidus too
        markup = html.escape(variant)
        forms.update({markup, markup.replace("&#x27;", "&#39;"), html.escape(variant, quote=False)})
        for quoted in (
            urllib.parse.quote(variant, safe=""),
            urllib.parse.quote(variant),
            urllib.parse.quote_plus(variant),
        ):
            forms.update({quoted, _PERCENT.sub(lambda m: m.group(0).lower(), quoted)})
    # base64 as Kubernetes ``-data`` fields and Secrets carry it, with and without the final
    # newline a PEM file has.
    if len(secret) >= MIN_SECRET_PART:  # a short one's base64 is an ordinary short word
        for encoded in (secret, secret.rstrip("\n") + "\n"):
            forms.add(base64.b64encode(encoded.encode()).decode())
    return tuple(sorted((f for f in forms if f), key=lambda f: (-len(f), f)))


_PERCENT = re.compile(r"%[0-9A-F]{2}")


@dataclass(frozen=True, slots=True)
class Redactor:
    """Replaces secrets (API keys, tokens, secret env values) in text meant for logs or
    errors: every form of each (``secret_forms``), before anything shortens the text."""

    secrets: tuple[str, ...] = field(repr=False)
    _forms: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        forms = {form for secret in self.secrets for form in secret_forms(secret)}
        object.__setattr__(self, "_forms", tuple(sorted(forms, key=lambda f: (-len(f), f))))

    def __call__(self, text: str) -> str:
        for form in self._forms:
            if form in text:
                text = text.replace(form, REDACTED)
        return _without_pieces(text, self._forms)

    def __repr__(self) -> str:
        return f"Redactor(<{len(self.secrets)} secret(s)>)"

    def with_secrets(self, more: Iterable[str]) -> Redactor:
        return Redactor((*self.secrets, *(s for s in more if s)))


def _without_pieces(text: str, forms: tuple[str, ...]) -> str:
    """``text`` with every run of ``MIN_SECRET_PART`` or more characters of a form replaced:
    what is left of a secret that was cut (by a server limiting a field, a proxy, a log line
    truncated before it reached us) at any offset."""
    spans: list[tuple[int, int]] = []
    for form in forms:
        for offset in range(len(form) - MIN_SECRET_PART + 1):
            window = form[offset : offset + MIN_SECRET_PART]
            start = text.find(window)
            while start != -1:
                spans.append(_widest(text, form, start, offset))
                start = text.find(window, start + 1)
    if not spans:
        return text
    merged: list[tuple[int, int]] = []
    for begin, end in sorted(spans):
        if merged and begin <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((begin, end))
    pieces, last = [], 0
    for begin, end in merged:
        pieces += [text[last:begin], REDACTED]
        last = end
    return "".join([*pieces, text[last:]])


def _widest(text: str, form: str, start: int, offset: int) -> tuple[int, int]:
    """The span of ``text`` around ``start`` that matches ``form`` around ``offset``."""
    before = 0
    while before < min(start, offset) and text[start - before - 1] == form[offset - before - 1]:
        before += 1
    after = MIN_SECRET_PART
    while (
        start + after < len(text)
        and offset + after < len(form)
        and text[start + after] == form[offset + after]
    ):
        after += 1
    return start - before, start + after
