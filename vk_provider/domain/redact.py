"""Redaction of secrets, in every form a server, a proxy or a library may echo them.

Used by every adapter (its credentials and the secret env values of the spec it creates)
and by the agent itself, which redacts a pod's secret env values from any provider message
it writes into an Event, a log line or the REST API: two layers, so one forgotten path in an
adapter does not leak a pod's secret.

Invariants: pure; ``Redactor`` replaces every non-empty secret's every form with
``<redacted>``, longest form first, and then any run of ``MIN_SECRET_PART`` or more
characters that begins or ends a form (a secret someone cut at any offset, before or after
it reached us);
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
    """``text`` with what is left of a cut secret replaced: a run of ``MIN_SECRET_PART`` or
    more characters that begins a form (the secret cut at its end, at any offset: by a server
    limiting a field, a proxy, a log line shortened before it reached us) or ends one (cut at
    its start). A run from a form's middle is left alone: an ordinary word inside a secret
    is not a secret."""
    spans: list[tuple[int, int]] = []
    for form in forms:
        if len(form) < MIN_SECRET_PART:
            continue
        head, tail = form[:MIN_SECRET_PART], form[-MIN_SECRET_PART:]
        start = text.find(head)
        while start != -1:
            end = start + MIN_SECRET_PART
            while end < len(text) and end - start < len(form) and text[end] == form[end - start]:
                end += 1
            spans.append((start, end))
            start = text.find(head, start + 1)
        end = text.find(tail)
        while end != -1:
            stop = end + MIN_SECRET_PART
            begin = end
            while (
                begin > 0
                and stop - begin < len(form)
                and text[begin - 1] == form[-(stop - begin) - 1]
            ):
                begin -= 1
            spans.append((begin, stop))
            end = text.find(tail, end + 1)
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
