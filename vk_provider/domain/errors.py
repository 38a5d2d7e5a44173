"""The error taxonomy every adapter maps its SDK and HTTP errors to, in one place per adapter.

Errors are classified by what the caller should do, not by where they came from:

| class | the agent's reaction |
|---|---|
| ``NotFound`` | the instance does not exist; on delete that means done |
| ``CapacityUnavailable`` | try the next candidate; block this offer for a while |
| ``RateLimited`` | retry the same call later (``retry_after`` seconds if known) |
| ``Transient`` | retry the same call with backoff (5xx, timeouts, connection errors) |
| ``NotSent`` | a ``Transient`` raised before the request left this machine: nothing was made |
| ``InvalidSpec`` | the request can never succeed as is; do not retry until the pod changes |
| ``AuthFailed`` | credentials or billing refused; block the whole provider |

Messages must never contain credentials.
"""

from __future__ import annotations


class ProviderError(Exception):
    """Base of all provider errors."""

    retryable = False

    def __init__(self, message: str, *, provider: str = "") -> None:
        super().__init__(message)
        self.provider = provider


class NotFound(ProviderError):
    pass


class CapacityUnavailable(ProviderError):
    pass


class RateLimited(ProviderError):
    retryable = True

    def __init__(
        self, message: str, *, provider: str = "", retry_after: float | None = None
    ) -> None:
        super().__init__(message, provider=provider)
        self.retry_after = retry_after


class Transient(ProviderError):
    retryable = True


class NotSent(Transient):
    """The call failed before its request was sent (an open circuit, a connection that was
    never made): the provider did nothing, so a create's budget hold can go at once."""


class InvalidSpec(ProviderError):
    """The workload cannot run on this provider; ``field`` names the pod field at fault."""

    def __init__(self, message: str, *, provider: str = "", field: str = "") -> None:
        super().__init__(message, provider=provider)
        self.field = field


class AuthFailed(ProviderError):
    pass
