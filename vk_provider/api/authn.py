"""Who is calling, and may they: authentication and authorisation as a kubelet does them.

Shared by the kubelet API and the REST API. A caller is identified by a client certificate
verified against the cluster CA (CN is the user, each O a group) or by a bearer token checked
with a TokenReview; every request is then authorised with a SubjectAccessReview.

Invariants: tokens are only ever used as cache keys in memory (hashed) and never logged;
answers are cached briefly (a minute), bounded in number; every authenticated user also
belongs to ``system:authenticated``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from cryptography import x509
from cryptography.x509.oid import NameOID

from vk_provider.kube.client import KubeClient

AUTHENTICATED_GROUP = "system:authenticated"


# Path prefixes kubelet maps to their own subresource of ``nodes``; everything else is "proxy".
_SUBRESOURCE_PREFIXES = (
    ("/stats", "stats"),
    ("/metrics", "metrics"),
    ("/logs", "log"),
    ("/spec", "spec"),
    ("/checkpoint", "checkpoint"),
)


_VERBS = {
    "GET": "get",
    "HEAD": "get",
    "POST": "create",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}


@dataclass(frozen=True, slots=True)
class UserInfo:
    """Who made a request, as a Kubernetes authenticator reports it."""

    username: str
    groups: tuple[str, ...]
    uid: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestAttributes:
    """What a request does, in SubjectAccessReview terms: ``resourceAttributes``, or
    ``nonResourceAttributes`` when ``path`` is set."""

    verb: str
    resource: str = "nodes"
    subresource: str = ""
    name: str = ""
    api_group: str = ""
    path: str = ""


class Authenticator(Protocol):
    async def authenticate_token(self, token: str) -> UserInfo | None:
        """The user a bearer token belongs to, or None if the token is not valid.

        Raising means "could not tell" (the API server is unreachable); the request is
        refused with 401 either way.
        """
        ...


class Authorizer(Protocol):
    async def authorize(self, user: UserInfo, attributes: RequestAttributes) -> bool:
        """Whether ``user`` may do ``attributes``; raising answers 500, like kubelet."""
        ...


def request_attributes(method: str, path: str, node_name: str) -> RequestAttributes:
    """The SubjectAccessReview attributes kubelet derives from a request (``auth.go``)."""
    subresource = "proxy"
    for prefix, candidate in _SUBRESOURCE_PREFIXES:
        if path == prefix or path.startswith(prefix + "/"):
            subresource = candidate
            break
    return RequestAttributes(
        verb=_VERBS.get(method.upper(), ""), subresource=subresource, name=node_name
    )


def user_from_certificate(der: bytes) -> UserInfo | None:
    """The user a verified client certificate names: CN is the user, each O a group.

    A certificate without a common name identifies nobody (kubelet falls through to the next
    authenticator, and so do we).
    """
    try:
        certificate = x509.load_der_x509_certificate(der)
    except ValueError:
        return None
    common_names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    username = _attribute_text(common_names[0].value) if common_names else ""
    if not username:
        return None
    groups = tuple(
        _attribute_text(a.value)
        for a in certificate.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    )
    return UserInfo(username=username, groups=groups)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, as kubelet parses it."""
    if not authorization:
        return None
    parts = authorization.strip().split(" ")
    if len(parts) < 2 or parts[0].lower() != "bearer" or not parts[1]:
        return None
    return parts[1]


def _attribute_text(value: str | bytes) -> str:
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


_CACHE_SECONDS = 60.0


class TokenReviewAuthenticator:
    def __init__(self, kube: KubeClient, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._kube = kube
        self._clock = clock
        self._cache: dict[str, tuple[UserInfo | None, float]] = {}

    async def authenticate_token(self, token: str) -> UserInfo | None:
        digest = hashlib.sha256(token.encode()).hexdigest()
        cached = self._cache.get(digest)
        if cached and self._clock() - cached[1] < _CACHE_SECONDS:
            return cached[0]
        review = await self._kube.token_review(token)
        status = review.get("status") or {}
        user: UserInfo | None = None
        if status.get("authenticated"):
            info = status.get("user") or {}
            user = UserInfo(
                username=str(info.get("username", "")),
                groups=tuple(info.get("groups") or ()),
                uid=str(info.get("uid", "")),
            )
        if len(self._cache) > 1024:
            self._cache.clear()
        self._cache[digest] = (user, self._clock())
        return user


class SubjectAccessReviewAuthorizer:
    def __init__(self, kube: KubeClient, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._kube = kube
        self._clock = clock
        self._cache: dict[tuple[object, ...], tuple[bool, float]] = {}

    async def authorize(self, user: UserInfo, attributes: RequestAttributes) -> bool:
        key = (user.username, user.groups, user.uid, attributes)
        cached = self._cache.get(key)
        if cached and self._clock() - cached[1] < _CACHE_SECONDS:
            return cached[0]
        spec: dict[str, object] = {
            "user": user.username,
            "groups": list(user.groups),
            "uid": user.uid,
        }
        if attributes.path:
            spec["nonResourceAttributes"] = {"path": attributes.path, "verb": attributes.verb}
        else:
            spec["resourceAttributes"] = {
                "verb": attributes.verb,
                "resource": attributes.resource,
                "subresource": attributes.subresource,
                "name": attributes.name,
                "group": attributes.api_group,
            }
        review = await self._kube.subject_access_review(spec)
        allowed = bool((review.get("status") or {}).get("allowed"))
        if len(self._cache) > 1024:
            self._cache.clear()
        self._cache[key] = (allowed, self._clock())
        return allowed
