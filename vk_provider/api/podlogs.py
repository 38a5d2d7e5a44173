"""Container logs for the kubelet API: from a pod's annotations to its provider's log stream.

``PodLogSource`` finds the instance a pod on this node names and streams what its provider
gives; a pod that is not here, or a container it does not have, is ``LogsNotFound``; one that
has not started, or whose provider keeps no logs, is ``LogsUnavailable``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from vk_provider.api.kubelet import LogsNotFound, LogsUnavailable
from vk_provider.domain.contract import Provider
from vk_provider.domain.errors import NotFound
from vk_provider.domain.models import LogOptions
from vk_provider.domain.podview import ANN_INSTANCE, ANN_PROVIDER
from vk_provider.kube.client import KubeClient


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
