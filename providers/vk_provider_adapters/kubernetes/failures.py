"""The one place failures of cluster B become ``domain.errors`` (``classify_failure``).

401 → ``AuthFailed``; 403 → ``CapacityUnavailable`` when a ResourceQuota refused it ("exceeded
quota"), ``Transient`` when the namespace's ServiceAccount is not there yet, else
``AuthFailed``; 404 → ``NotFound``; 400 and 422 → ``InvalidSpec`` naming the field of the
Status ``details.causes`` (but for logs, where 400 means "container not started yet",
``Transient``, and "previous terminated container ... not found" is ``NotFound``: the
container has not restarted, so there is no previous run to show); 429 → ``RateLimited``
(``Retry-After`` or ``details.retryAfterSeconds``); 409 (other than
the AlreadyExists ``create`` handles), 5xx → ``Transient``. Timeouts, connection errors and
malformed answers are ``Transient`` too (``vk_provider_adapters.http``).

Invariants: pure; ``failure.message`` is redacted before it is classified.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass

from vk_provider.sdk import (
    AuthFailed,
    CapacityUnavailable,
    InvalidSpec,
    NotFound,
    ProviderError,
    RateLimited,
    Transient,
)
from vk_provider_adapters.http import Answer
from vk_provider_adapters.payload import text
from vk_provider_adapters.transport import parse_retry_after


class Call(enum.Enum):
    """What kind of request failed; a 400 means different things to different calls."""

    READ = "read"
    WRITE = "write"
    LOGS = "logs"
    STREAM = "stream"  # exec, attach, port-forward: a 400 is the container's state


@dataclass(frozen=True, slots=True)
class ApiFailure:
    """A failed request: HTTP status (None: no usable answer) and the Kubernetes ``Status``."""

    status: int | None
    reason: str = ""
    message: str = ""
    kind: str = ""  # details.kind: what was not found, refused, invalid
    fields: tuple[str, ...] = ()  # details.causes[].field
    retry_after: float | None = None


def api_failure(response: Answer) -> ApiFailure:
    """The ``Status`` of an error answer (or its text when it is not one)."""
    retry_after = parse_retry_after(response.headers.get("Retry-After"))
    try:
        body = json.loads(response.content)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        content = response.content.decode("utf-8", errors="replace")
        message = " ".join(content.split())[:300]
        return ApiFailure(response.status_code, message=message, retry_after=retry_after)
    details = body.get("details")
    details = details if isinstance(details, dict) else {}
    causes = details.get("causes")
    fields = tuple(
        c["field"]
        for c in (causes if isinstance(causes, list) else [])
        if isinstance(c, dict) and isinstance(c.get("field"), str) and c["field"]
    )
    seconds = details.get("retryAfterSeconds")
    if retry_after is None and isinstance(seconds, int) and not isinstance(seconds, bool):
        retry_after = float(max(0, seconds))
    return ApiFailure(
        response.status_code,
        reason=text(body, "reason"),
        message=" ".join(text(body, "message").split())[:500],
        kind=text(details, "kind"),
        fields=fields,
        retry_after=retry_after,
    )


def classify_failure(failure: ApiFailure, *, provider: str, what: str, call: Call) -> ProviderError:
    """The one place failures of cluster B become ``domain.errors`` (module docstring).

    ``failure.message`` must already be redacted."""
    status = failure.status
    head = f"HTTP {status}" + (f" {failure.reason}" if failure.reason else "")
    message = (
        f"Kubernetes {what}: "
        + (f"{head}: " if status is not None else "")
        + (failure.message or failure.reason or "(no message)")
    )
    lowered = failure.message.lower()
    if status is None:
        return Transient(message, provider=provider)
    if status == 401:
        return AuthFailed(message, provider=provider)
    if status == 403:
        if "exceeded quota" in lowered:
            return CapacityUnavailable(message, provider=provider)
        if "service account" in lowered and "not found" in lowered:
            return Transient(message, provider=provider)  # the namespace is brand new
        return AuthFailed(message, provider=provider)
    if status == 404:
        return NotFound(message, provider=provider)
    if status == 429:
        return RateLimited(message, provider=provider, retry_after=failure.retry_after)
    if status in (400, 422):
        if call is Call.LOGS and "previous terminated container" in lowered:
            # kubelet's answer to --previous for a container that has not restarted.
            return NotFound(
                f"Kubernetes {what}: the container has not restarted, so there are no logs of "
                f"a previous run ({head}: {failure.message})",
                provider=provider,
            )
        if call in (Call.LOGS, Call.STREAM):
            return Transient(message, provider=provider)  # "container ... is waiting to start"
        return InvalidSpec(message, provider=provider, field=_pod_field(failure))
    return Transient(message, provider=provider)


NAMESPACE_RIGHTS = (
    "create/get/list/delete pods, get pods/log, create pods/exec, pods/attach and "
    "pods/portforward, get pods.metrics.k8s.io, create/patch/delete secrets (and "
    "create/get/list/patch services with expose: node-port or load-balancer)"
)


def missing_namespace(namespace: str, *, provider: str, what: str) -> CapacityUnavailable:
    """The error of a write into a namespace that does not exist in B.

    ``CapacityUnavailable``: the launcher blocks the offer and tries the next candidate, and it
    does not count against the provider's circuit breaker (the provider answers; it is only
    not set up), so the pods that do run stay readable while the operator fixes it."""
    return CapacityUnavailable(
        f"Kubernetes {what}: namespace {namespace!r} does not exist in the remote cluster; this "
        f"provider never creates namespaces: create {namespace!r} and bind a Role granting "
        f"{NAMESPACE_RIGHTS} to the provider's identity there",
        provider=provider,
    )


def _pod_field(failure: ApiFailure) -> str:
    if failure.fields:
        return failure.fields[0]
    match = re.search(r"is invalid: ([A-Za-z0-9_.\[\]]+):", failure.message)
    return match[1] if match else ""
