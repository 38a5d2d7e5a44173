"""The one place RunPod's failures become ``domain.errors`` (``classify_failure``).

Text saying there is no capacity wins over any status (RunPod v1 reports it as 400 or 500,
GraphQL as HTTP 200 with ``errors``), then 401/403/402 and billing text → ``AuthFailed``, 404 →
``NotFound``, 422 → ``InvalidSpec``, 429 → ``RateLimited`` (``Retry-After`` in seconds or as an
HTTP date), 400 → ``CapacityUnavailable`` on create (RunPod's guidance: try the next candidate)
and ``NotFound`` on a pod id, everything else (5xx) → ``Transient``. Timeouts, connection
errors and malformed answers are ``Transient`` too; ``vk_provider_adapters.http`` makes them.

Invariants: pure; a message names the call and RunPod's reason, redacted by the caller.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from datetime import datetime

from vk_provider.sdk import (
    AuthFailed,
    CapacityUnavailable,
    InvalidSpec,
    NotFound,
    ProviderError,
    RateLimited,
    Redactor,
    Transient,
)
from vk_provider_adapters.http import ErrorAnswer


class Operation(enum.Enum):
    """What was being done; a 400 means different things to different calls."""

    CREATE = "create"  # POST /pods: 400 is a rule violation or no capacity
    POD = "pod"  # a call on one pod id: 400 is an id that cannot exist
    READ = "read"  # offers, list, logs


_CAPACITY_TEXT = re.compile(
    r"no longer any instances available|no (gpu )?instances? (are )?available"
    r"|not enough (free )?(gpus|capacity|machines)|insufficient capacity|out of capacity"
    r"|could not find any (pods|machines)"
)
_BILLING_TEXT = re.compile(
    r"insufficient (balance|funds|credits?)|not enough (funds|credits?|balance)"
    r"|balance (is )?too low"
)
_AUTH_TEXT = re.compile(
    r"unauthori[sz]ed|unauthenticated|not authori[sz]ed|forbidden|permission denied"
    r"|invalid api key|api key|access denied"
)
_RATE_TEXT = re.compile(r"rate limit|too many requests")
# GraphQL error codes that mean "this request can never succeed as written".
_GRAPHQL_INVALID_CODES = frozenset(
    {"GRAPHQL_VALIDATION_FAILED", "GRAPHQL_PARSE_FAILED", "BAD_USER_INPUT"}
)


def classify_failure(
    *,
    provider: str,
    operation: Operation,
    what: str,
    status: int | None,
    detail: str,
    retry_after: float | None = None,
    code: str = "",
) -> ProviderError:
    """The one place RunPod's failures become ``domain.errors``.

    ``status`` is the HTTP status, or None for a GraphQL error delivered with HTTP 200 (then
    ``code`` is its ``extensions.code``). ``detail`` must already be redacted.
    """
    text = detail.lower()
    message = f"RunPod {what}: " + (f"HTTP {status}: " if status is not None else "") + detail
    if _CAPACITY_TEXT.search(text):
        return CapacityUnavailable(message, provider=provider)
    if status == 402 or _BILLING_TEXT.search(text):
        return AuthFailed(message, provider=provider)
    if status in (401, 403) or (status is None and _AUTH_TEXT.search(text)):
        return AuthFailed(message, provider=provider)
    if status == 429 or (status is None and _RATE_TEXT.search(text)):
        return RateLimited(message, provider=provider, retry_after=retry_after)
    if status == 404:
        return NotFound(message, provider=provider)
    if status == 422 or (status is None and code in _GRAPHQL_INVALID_CODES):
        return InvalidSpec(message, provider=provider)
    if status == 400 and operation is Operation.CREATE:
        return CapacityUnavailable(message, provider=provider)
    if status == 400 and operation is Operation.POD:
        return NotFound(message, provider=provider)
    return Transient(message, provider=provider)


def error_detail(body: str, *, limit: int = 300) -> str:
    """A short human-readable reason from an error body: problem+json ``detail``, ``error``,
    ``message``, ``errors``, else the text itself."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    parts: list[str] = []
    if isinstance(data, dict):
        for key in ("title", "detail", "error", "message"):
            value = data.get(key)
            if isinstance(value, str) and value.strip() and value not in parts:
                parts.append(value.strip())
        errors = data.get("errors")
        if isinstance(errors, list):
            for item in errors[:3]:
                text = item.get("message") if isinstance(item, dict) else item
                if isinstance(text, str) and text.strip():
                    parts.append(text.strip())
    return shorten(": ".join(parts) if parts else body, limit=limit)


def shorten(text: str, *, limit: int = 300) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    text = " ".join(text.split()) or "(empty)"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def classify_answer(
    answer: ErrorAnswer, *, provider: str, operation: Operation, now: datetime | None = None
) -> ProviderError:
    """The classify hook of ``vk_provider_adapters.http``: an error answer of REST v1, v2 or
    GraphQL."""
    return classify_failure(
        provider=provider,
        operation=operation,
        what=answer.what,
        status=answer.status_code,
        detail=answer.redact(error_detail(answer.text)),
        retry_after=answer.retry_after(now=now),
    )


def graphql_failure(
    errors: list[Mapping[str, object]], *, provider: str, what: str, redact: Redactor
) -> ProviderError:
    """The error of a GraphQL answer whose ``errors`` is not empty (HTTP 200)."""
    messages = [str(e.get("message", "")) for e in errors]
    extensions = errors[0].get("extensions")
    code = extensions.get("code") if isinstance(extensions, dict) else None
    # Redacted before it is shortened: a cut secret is no longer recognisable.
    detail = shorten(redact("; ".join(m for m in messages[:3] if m)))
    return classify_failure(
        provider=provider,
        operation=Operation.READ,
        what=what,
        status=None,
        detail=detail,
        code=code if isinstance(code, str) else "",
    )
