"""Container logs for the kubelet API: from a pod's annotations to its provider's log stream.

``PodLogSource`` finds the instance a pod on this node names and streams what its provider
gives for the container asked for (``LogOptions.container``); a pod that is not here, or a
container it does not have, is ``LogsNotFound``; one that has not started, or whose provider
keeps no logs, is ``LogsUnavailable``.

``kubectl logs --previous`` asks for the previous run of the container:

- a provider that restarts containers itself (``Capabilities.previous_logs``: the local
  provider keeps ``previous.log``) gets ``previous=True`` and the container name;
- for a single-container provider a restart is a new instance (a new attempt), so the
  previous run is the previous attempt's instance: :class:`AttemptHistory` remembers which
  instances a pod's annotations named, and the instance tracker still lists older attempts
  that were not released yet; its provider is asked for that instance's logs;
- when neither has it (the previous instance is gone at its provider, or the agent restarted
  since), the answer is 400 "previous terminated container ... not found", as kubelet's.

Invariants: the previous run's logs are never followed (the run is over); the current
instance's logs are never served for ``--previous``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping

from vk_provider.api.kubelet import LogsNotFound, LogsUnavailable
from vk_provider.domain.contract import Provider
from vk_provider.domain.errors import NotFound
from vk_provider.domain.models import Instance, LogOptions
from vk_provider.domain.podview import ANN_INSTANCE, ANN_PROVIDER, PodView
from vk_provider.kube.client import KubeClient

Placement = tuple[str, str]  # (provider, instance id)
_KEPT_ATTEMPTS = 4
_KEPT_PODS = 4096  # the oldest pods are forgotten first (a deleted pod is never asked again)


class AttemptHistory:
    """The instances a pod's annotations have named, oldest first (a few per pod UID)."""

    def __init__(self) -> None:
        self._seen: dict[str, list[Placement]] = {}

    def observe(self, pod: PodView | None) -> None:
        if pod is None or not pod.uid or pod.placed is None:
            return
        uid = pod.uid
        placement = (pod.placed.provider, pod.placed.instance_id)
        if uid not in self._seen and len(self._seen) >= _KEPT_PODS:
            del self._seen[next(iter(self._seen))]
        seen = self._seen.setdefault(uid, [])
        if placement not in seen:
            seen.append(placement)
            del seen[:-_KEPT_ATTEMPTS]

    def forget(self, uid: str) -> None:
        self._seen.pop(uid, None)

    def before(self, uid: str, current: Placement) -> Placement | None:
        seen = self._seen.get(uid, [])
        if current in seen:
            index = seen.index(current)
            return seen[index - 1] if index > 0 else None
        return seen[-1] if seen else None


async def _primed(chunks: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
    """Read the first chunk now, so that "not there" is an HTTP error and not a 200 whose
    body says so; the iterator returned yields it and the rest."""
    try:
        first = await anext(chunks)
    except StopAsyncIteration:
        first = b""
    except BaseException:
        await chunks.aclose()
        raise

    async def rest() -> AsyncIterator[bytes]:
        try:
            if first:
                yield first
            async for chunk in chunks:
                yield chunk
        finally:
            await chunks.aclose()

    return rest()


def _not_found(container: str, pod: str) -> LogsUnavailable:
    return LogsUnavailable(f'previous terminated container "{container}" in pod "{pod}" not found')


class PodLogSource:
    def __init__(
        self,
        kube: KubeClient,
        providers: Mapping[str, Provider],
        *,
        node_name: str,
        history: AttemptHistory | None = None,
        instances: Callable[[str], list[Instance]] = lambda _uid: [],
    ) -> None:
        self._kube = kube
        self._providers = dict(providers)
        self._node = node_name
        self._history = history or AttemptHistory()
        self._instances = instances  # the tracker's instances of a pod UID

    async def open_logs(
        self, namespace: str, pod: str, container: str, options: LogOptions
    ) -> AsyncIterator[bytes]:
        found = await self._kube.get_pod(namespace, pod)
        if found is None or (found.get("spec") or {}).get("nodeName") != self._node:
            raise LogsNotFound(f"pod {namespace}/{pod} is not on node {self._node}")
        spec = found.get("spec") or {}
        names = [
            c.get("name") for key in ("containers", "initContainers") for c in spec.get(key) or []
        ]
        if container not in names:
            raise LogsNotFound(f"container {container} is not valid for pod {pod}")
        metadata = found.get("metadata") or {}
        annotations = metadata.get("annotations") or {}
        provider_name = annotations.get(ANN_PROVIDER)
        instance_id = annotations.get(ANN_INSTANCE)
        if not provider_name or not instance_id or provider_name not in self._providers:
            if options.previous:
                raise _not_found(container, pod)
            raise LogsUnavailable(f'container "{container}" in pod "{pod}" is waiting to start')
        provider = self._providers[provider_name]
        if not provider.capabilities.logs:
            raise LogsUnavailable(f"provider {provider_name} does not offer container logs")
        options = dataclasses.replace(options, container=container)
        if not options.previous:
            return self._stream(provider, instance_id, options, missing=None)
        finished = dataclasses.replace(options, follow=False)
        missing = _not_found(container, pod)
        if provider.capabilities.previous_logs:
            return await _primed(self._stream(provider, instance_id, finished, missing=missing))
        uid = str(metadata.get("uid") or "")
        earlier = self._previous_instance(uid, (provider_name, instance_id))
        if earlier is None or earlier[0] not in self._providers:
            raise missing
        chunks = self._stream(
            self._providers[earlier[0]],
            earlier[1],
            dataclasses.replace(finished, previous=False),
            missing=missing,
        )
        return await _primed(chunks)

    def _previous_instance(self, uid: str, current: Placement) -> Placement | None:
        remembered = self._history.before(uid, current)
        if remembered is not None:
            return remembered
        # After an agent restart the history is empty: an older attempt still listed will do.
        listed = self._instances(uid)
        now = next((i for i in listed if (i.provider, i.instance_id) == current), None)
        older = [i for i in listed if now is None or i.attempt < now.attempt]
        older = [i for i in older if (i.provider, i.instance_id) != current]
        if not older:
            return None
        latest = max(older, key=lambda i: i.attempt)
        return latest.provider, latest.instance_id

    @staticmethod
    async def _stream(
        provider: Provider,
        instance_id: str,
        options: LogOptions,
        *,
        missing: LogsUnavailable | None,
    ) -> AsyncGenerator[bytes, None]:
        try:
            async for chunk in provider.logs(instance_id, options):
                yield chunk
        except NotFound:
            # Gone at the provider: the current run's stream just ends; a previous run's
            # logs that are gone are an error the caller sees (the status is sent already,
            # so the kubelet API writes the message into the body, as kubelet does).
            if missing is not None:
                raise missing from None
            return
