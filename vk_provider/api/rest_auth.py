"""Who may read the REST API: authentication and, in cluster, authorisation of every route.

Two modes (``rest:`` in the configuration):

- **TokenReview** (in cluster, the default): the bearer token is checked by a Kubernetes
  TokenReview, and every ``/v1/*`` route is then authorised by a SubjectAccessReview on a
  resource of the API group ``vk-provider.io`` — ``list`` or ``get`` of ``providers``,
  ``offers`` (``/v1/offers`` and ``/v1/gpus``), ``pods``, ``spend``, ``overflow``, and
  ``create`` of ``placements`` (the dry run) — and ``/metrics`` (when not open) as the
  non-resource URL ``/metrics``. A token without those rights gets 403: authentication alone
  is not enough. ``deploy/rbac.yaml`` ships the ``vk-provider-viewer`` ClusterRole.
- **Static token** (development): one shared token, compared in constant time, that may read
  everything.

Invariants: tokens are never logged or echoed (only the authenticator's error class is
logged); an authenticator or authoriser that cannot answer (the API server is down) makes the
request 503 with ``Retry-After``, never 200; the cache of reviews is the shared one of
``api.authn`` (a minute).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Protocol

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from vk_provider.api.authn import Authenticator, Authorizer, RequestAttributes, UserInfo

log = logging.getLogger(__name__)

API_GROUP = "vk-provider.io"
# A review that has not answered in this long will not answer usefully; the caller gets a
# 503 and retries rather than holding a connection open.
AUTH_TIMEOUT_SECONDS = 10.0


class RestAuth(Protocol):
    async def authenticate(self, token: str) -> UserInfo | None:
        """Who a bearer token belongs to, or None if it is not valid; raising means "cannot
        tell now" (503)."""
        ...

    async def authorize(self, user: UserInfo, attributes: RequestAttributes) -> bool:
        """Whether ``user`` may do ``attributes``; raising means "cannot tell now" (503)."""
        ...


class StaticTokenAuth:
    """Development: one shared token, compared in constant time; it may read everything."""

    def __init__(self, token: str, *, username: str = "static-token") -> None:
        if not token:
            raise ValueError("the static token must not be empty")
        self._token = token.encode()
        self._user = UserInfo(username=username, groups=())

    async def authenticate(self, token: str) -> UserInfo | None:
        return self._user if hmac.compare_digest(token.encode(), self._token) else None

    async def authorize(self, user: UserInfo, attributes: RequestAttributes) -> bool:
        return user == self._user

    def __repr__(self) -> str:
        return "StaticTokenAuth(<redacted>)"


class TokenReviewAuth:
    """In cluster: TokenReview for who, SubjectAccessReview for may (shared with the kubelet
    API, so both use one cache)."""

    def __init__(self, authenticator: Authenticator, authorizer: Authorizer) -> None:
        self._authenticator = authenticator
        self._authorizer = authorizer

    async def authenticate(self, token: str) -> UserInfo | None:
        return await self._authenticator.authenticate_token(token)

    async def authorize(self, user: UserInfo, attributes: RequestAttributes) -> bool:
        return await self._authorizer.authorize(user, attributes)


def resource(name: str, verb: str) -> RequestAttributes:
    """A REST route as RBAC sees it: ``verb`` on ``name`` in the ``vk-provider.io`` group."""
    return RequestAttributes(verb=verb, resource=name, api_group=API_GROUP)


def non_resource(path: str) -> RequestAttributes:
    return RequestAttributes(verb="get", path=path)


_BEARER = HTTPBearer(
    auto_error=False,
    description="A Kubernetes service-account token (checked by TokenReview, authorised by "
    "SubjectAccessReview), or the static development token.",
)

Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]


async def _answer(call: Awaitable[object], what: str) -> object:
    """The review's answer; 503 when it cannot be had (``what`` cannot be checked now)."""
    try:
        async with asyncio.timeout(AUTH_TIMEOUT_SECONDS):
            return await call
    except Exception as exc:
        # Only the class: a reviewer's message could quote its request (the token).
        log.warning("REST API: %s cannot be checked now (%s)", what, type(exc).__name__)
        raise HTTPException(
            503, f"{what} cannot be checked now; try again later", headers={"Retry-After": "5"}
        ) from None


def access(
    auth: RestAuth, attributes: RequestAttributes
) -> Callable[[Credentials], Awaitable[UserInfo]]:
    """The FastAPI dependency of one route: 401 without a valid token, 403 without the right."""

    async def check(credentials: Credentials) -> UserInfo:
        if credentials is None:
            raise HTTPException(
                401,
                "a bearer token is required (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        user = await _answer(auth.authenticate(credentials.credentials), "the token")
        if not isinstance(user, UserInfo):
            raise HTTPException(
                401,
                "the token was refused",
                headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )
        allowed = await _answer(auth.authorize(user, attributes), "the right to this")
        if allowed is not True:
            what = (
                f"{attributes.verb} {attributes.path}"
                if attributes.path
                else f"{attributes.verb} {attributes.resource}.{attributes.api_group}"
            )
            raise HTTPException(403, f"{user.username} may not {what}")
        return user

    return check
