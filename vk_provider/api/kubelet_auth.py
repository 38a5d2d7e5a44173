"""What the kubelet API needs from the cluster and the providers, behind its small interfaces.

- ``TokenReviewAuthenticator``: bearer tokens checked by a TokenReview, cached briefly.
- ``SubjectAccessReviewAuthorizer``: each request checked by a SubjectAccessReview, cached.
- ``PodLogSource``: finds the pod's instance from its annotations and streams the provider's logs.

Invariants: tokens are only ever used as cache keys in memory (hashed) and never logged.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator, Callable, Mapping

from vk_provider.api.kubelet import LogsNotFound, LogsUnavailable, RequestAttributes, UserInfo
from vk_provider.domain.contract import Provider
from vk_provider.domain.errors import NotFound
from vk_provider.domain.models import LogOptions
from vk_provider.domain.podview import ANN_INSTANCE, ANN_PROVIDER
from vk_provider.kube.client import KubeClient

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
        spec = {
            "user": user.username,
            "groups": list(user.groups),
            "uid": user.uid,
            "resourceAttributes": {
                "verb": attributes.verb,
                "resource": attributes.resource,
                "subresource": attributes.subresource,
                "name": attributes.name,
                "group": attributes.api_group,
            },
        }
        review = await self._kube.subject_access_review(spec)
        allowed = bool((review.get("status") or {}).get("allowed"))
        if len(self._cache) > 1024:
            self._cache.clear()
        self._cache[key] = (allowed, self._clock())
        return allowed


class PodLogSource:
    def __init__(
        self, kube: KubeClient, providers: Mapping[str, Provider], *, node_name: str
    ) -> None:
        self._kube = kube
        self._providers = dict(providers)
        self._node = node_name

    async def open_logs(
        self, namespace: str, pod: str, container: str, options: LogOptions
    ) -> AsyncIterator[bytes]:
        found = await self._kube.get_pod(namespace, pod)
        if found is None or (found.get("spec") or {}).get("nodeName") != self._node:
            raise LogsNotFound(f"pod {namespace}/{pod} is not on node {self._node}")
        names = [c.get("name") for c in (found.get("spec") or {}).get("containers") or []]
        if container not in names:
            raise LogsNotFound(f"container {container} is not valid for pod {pod}")
        annotations = (found.get("metadata") or {}).get("annotations") or {}
        provider_name = annotations.get(ANN_PROVIDER)
        instance_id = annotations.get(ANN_INSTANCE)
        if not provider_name or not instance_id or provider_name not in self._providers:
            raise LogsUnavailable(f'container "{container}" in pod "{pod}" is waiting to start')
        provider = self._providers[provider_name]
        if not provider.capabilities.logs:
            raise LogsUnavailable(f"provider {provider_name} does not offer container logs")
        return self._stream(provider, instance_id, options)

    @staticmethod
    async def _stream(
        provider: Provider, instance_id: str, options: LogOptions
    ) -> AsyncIterator[bytes]:
        try:
            async for chunk in provider.logs(instance_id, options):
                yield chunk
        except NotFound:
            return
