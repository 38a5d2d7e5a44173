"""Lambda's answer envelopes, and the one place Lambda's failures become ``domain.errors``.

A success body is ``{"data": ...}`` (``parse_data``); a failure body is ``{"error": {"code",
"message", "suggestion"?}}`` (``parse_api_error``), and ``classify_failure`` branches on its
``code`` first, its status second:

- ``insufficient-capacity`` and ``quota-exceeded`` → ``CapacityUnavailable`` (a quota is a limit
  on how much this account may run, not refused credentials: other offers or a later try can
  fit, so the offer is blocked, not the provider);
- ``object-does-not-exist`` on launch (unknown SSH key, firewall ruleset, type or region) →
  ``CapacityUnavailable`` (a firewall ruleset exists in one region only, so another offer can
  work); elsewhere → ``NotFound``;
- ``invalid-parameters`` → ``InvalidSpec``; 401/403 (bad key, inactive account, billing
  address) → ``AuthFailed``; 429 → ``RateLimited``; 5xx and ``provider/*`` → ``Transient``.

Transport errors and bodies that are not JSON are ``Transient`` too (``vk_provider_adapters.http``).

Invariants: pure; server-provided text is redacted before it enters a message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

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
from vk_provider_adapters.http import Answer
from vk_provider_adapters.payload import MalformedResponse, obj
from vk_provider_adapters.transport import parse_retry_after

Operation = Literal[
    "list instance types",
    "launch",
    "get instance",
    "list instances",
    "terminate",
    "list ssh keys",
    "add ssh key",
    "list firewall rulesets",
    "create firewall ruleset",
    "update firewall ruleset",
]

_ERROR_TEXT_MAX: Final = 300
_AUTH_CODES: Final = frozenset(
    {"global/invalid-api-key", "global/account-inactive", "global/invalid-address"}
)
_CAPACITY_CODES: Final = frozenset(
    {"instance-operations/launch/insufficient-capacity", "global/quota-exceeded"}
)
_INVALID_CODES: Final = frozenset(
    {"global/invalid-parameters", "instance-operations/launch/file-system-in-wrong-region"}
)
_NOT_FOUND_CODE: Final = "global/object-does-not-exist"
_TRANSIENT_CODES: Final = frozenset({"global/internal-error"})


@dataclass(frozen=True, slots=True)
class ApiError:
    """The ``error`` object of a failed response."""

    code: str
    message: str
    suggestion: str | None = None


def parse_api_error(body: bytes) -> ApiError | None:
    """``{"error": {"code", "message", "suggestion"?}}``, or None if the body is not one."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    error = document.get("error") if isinstance(document, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("code"), str):
        return None
    message, suggestion = error.get("message"), error.get("suggestion")
    return ApiError(
        code=error["code"],
        message=message if isinstance(message, str) else "",
        suggestion=suggestion if isinstance(suggestion, str) else None,
    )


def classify_failure(
    operation: Operation,
    failure: Answer,
    *,
    provider: str,
    redact: Redactor = Redactor(()),
    now: datetime | None = None,
) -> ProviderError:
    """The ``domain.errors`` class of one failed call (a non-2xx answer), with a message for
    people; ``redact`` scrubs server-provided text."""
    what = f"Lambda {operation}"
    status = failure.status_code
    error = parse_api_error(failure.content)
    detail = f"{what}: HTTP {status}"
    if error is not None:
        detail += f" {error.code}: {_scrub(error.message, redact)}"
        if error.suggestion:
            detail += f" ({_scrub(error.suggestion, redact)})"
    code = error.code if error is not None else None

    if status == 429:
        retry_after = parse_retry_after(failure.headers.get("Retry-After"), now=now)
        return RateLimited(detail, provider=provider, retry_after=retry_after)
    if code in _AUTH_CODES:
        return AuthFailed(detail, provider=provider)
    if code in _CAPACITY_CODES:
        return CapacityUnavailable(detail, provider=provider)
    if code in _INVALID_CODES:
        return InvalidSpec(detail, provider=provider)
    if code == _NOT_FOUND_CODE or (code is None and status == 404):
        if operation == "launch":
            # What the launch names (SSH key, firewall ruleset, type, region) is unknown
            # there; another offer, e.g. in another region, can still work.
            return CapacityUnavailable(detail, provider=provider)
        return NotFound(detail, provider=provider)
    if code in _TRANSIENT_CODES or (code is not None and code.startswith("provider/")):
        return Transient(detail, provider=provider)
    # An unknown code, or none: by status.
    if status in (401, 403):
        return AuthFailed(detail, provider=provider)
    if status >= 500:
        return Transient(detail, provider=provider)
    if error is None:
        return Transient(f"{detail} with a body that is not a Lambda error", provider=provider)
    if 400 <= status < 500:
        return InvalidSpec(detail, provider=provider)
    return Transient(detail, provider=provider)


def _scrub(text: str, redact: Redactor) -> str:
    return redact(text)[:_ERROR_TEXT_MAX]


def parse_data(document: object) -> object:
    """The ``data`` of a decoded success body ``{"data": ...}``."""
    body = obj(document, "body")
    if "data" not in body:
        keys = ", ".join(sorted(map(str, body))) or "none"
        raise MalformedResponse(f"body has no 'data' (keys: {keys})")
    return body["data"]
