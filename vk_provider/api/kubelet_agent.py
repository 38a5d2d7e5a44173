"""The kubelet API's sources in the agent: pods from the store, instances from the tracker.

:class:`AgentPods` answers ``/pods`` and ``/runningpods/``; :class:`AgentStreams` finds the
instance behind ``/exec``, ``/attach`` and ``/portForward`` and asks its provider (through the
guarded provider, so the breaker sees the call) for an exec session, an attachment (its own,
``SupportsAttach``, else a log follower) or a port.
Usage (``/stats``) is ``api/nodestats.py``; logs are ``api/podlogs.py``.

A pod is found in the pod store (what the watch delivered: the pods bound to this node), its
instance by the ``vk-provider.io/provider`` and ``vk-provider.io/instance-id`` annotations.

Invariants: every refusal names its reason; a provider whose capabilities lack the operation
is refused with 501 before anything is upgraded or started, never with a bare 404; nothing
here imports an adapter.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from vk_provider.api import portforward, remotecommand
from vk_provider.api.kubelet_pods import JSON, RunningPod
from vk_provider.api.streaming import ContainerRef, StreamingRefused
from vk_provider.controllers.instances import InstanceTracker
from vk_provider.controllers.podwatch import PodStore
from vk_provider.domain.containers import ContainerState
from vk_provider.domain.contract import (
    ExecSession,
    PortStream,
    Provider,
    SupportsAttach,
    SupportsExec,
    SupportsPortForward,
)
from vk_provider.domain.models import InstanceState, LogOptions
from vk_provider.domain.podview import ANN_INSTANCE, ANN_PROVIDER

_LIVE = frozenset({InstanceState.RUNNING, InstanceState.TERMINATING})


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


def _spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("spec") or {}


def container_images(pod: Mapping[str, Any]) -> dict[str, str]:
    """Every container of the pod (init containers too) and its image."""
    spec = _spec(pod)
    return {
        str(c.get("name", "")): str(c.get("image", ""))
        for key in ("initContainers", "containers")
        for c in spec.get(key) or ()
    }


def app_containers(pod: Mapping[str, Any]) -> list[str]:
    return [str(c.get("name", "")) for c in _spec(pod).get("containers") or ()]


class AgentPods:
    """``NodePods`` of the agent."""

    def __init__(self, store: PodStore, tracker: InstanceTracker) -> None:
        self._store = store
        self._tracker = tracker

    def bound_pods(self) -> list[JSON]:
        return list(self._store.values())

    def running_pods(self) -> list[RunningPod]:
        running = []
        for instance in self._tracker.all():
            if instance.state not in _LIVE:
                continue
            key = self._store.key_of(instance.pod_uid)
            pod = self._store.get(key) if key is not None else None
            if pod is None:
                continue  # an orphan: reconciliation ends it; it has no pod to name
            images = container_images(pod)
            if instance.containers or instance.init_containers:
                names = [
                    c.name
                    for c in (*instance.init_containers, *instance.containers)
                    if c.state is ContainerState.RUNNING
                ]
            else:
                names = app_containers(pod)[:1]  # a single-container instance is its container
            running.append(
                RunningPod(
                    namespace=str(_meta(pod).get("namespace", "")),
                    name=str(_meta(pod).get("name", "")),
                    uid=instance.pod_uid,
                    containers=tuple((name, images.get(name, "")) for name in names),
                )
            )
        return running


@dataclass(frozen=True, slots=True)
class Located:
    pod: JSON
    provider: Provider
    instance_id: str


class AgentStreams:
    """``ContainerStreams`` of the agent."""

    def __init__(self, store: PodStore, providers: Mapping[str, Provider], *, node_name: str):
        self._store = store
        self._providers = dict(providers)
        self._node = node_name

    def locate(self, ref: ContainerRef, operation: str) -> Located:
        pod = self._store.get((ref.namespace, ref.pod))
        if pod is None or _spec(pod).get("nodeName") != self._node:
            raise StreamingRefused(404, "pod does not exist")
        if ref.uid and _meta(pod).get("uid") != ref.uid:
            raise StreamingRefused(404, "pod not found")
        if ref.container and ref.container not in container_images(pod):
            raise StreamingRefused(404, f"container {ref.container} is not valid for pod {ref.pod}")
        annotations = _meta(pod).get("annotations") or {}
        name, instance_id = annotations.get(ANN_PROVIDER), annotations.get(ANN_INSTANCE)
        provider = self._providers.get(str(name)) if name else None
        if provider is None or not instance_id:
            raise StreamingRefused(400, f"pod {ref.pod} has not started on a provider yet")
        capabilities = provider.capabilities
        offered = {
            "exec": capabilities.exec,
            "attach": capabilities.attach or capabilities.follow_logs,
            "port-forward": capabilities.port_forward,
        }[operation]
        if not offered:
            raise StreamingRefused(
                501,
                f"{operation} is not supported by provider {provider.name}, which runs pod "
                f"{ref.namespace}/{ref.pod}",
            )
        return Located(pod, provider, str(instance_id))

    async def exec_starter(
        self, ref: ContainerRef, command: list[str], *, tty: bool
    ) -> remotecommand.Starter:
        found = self.locate(ref, "exec")
        provider, instance_id = found.provider, found.instance_id
        if not isinstance(provider, SupportsExec):
            raise StreamingRefused(501, f"provider {provider.name} has no exec operation")

        async def start() -> ExecSession:
            return await provider.exec(instance_id, ref.container, command, tty=tty)

        return start

    async def attach_starter(
        self, ref: ContainerRef, *, stdin: bool, tty: bool
    ) -> remotecommand.Starter:
        found = self.locate(ref, "attach")
        provider, instance_id = found.provider, found.instance_id
        options = LogOptions(follow=True, tail_lines=0, container=ref.container)

        async def start() -> ExecSession:
            if provider.capabilities.attach and isinstance(provider, SupportsAttach):
                # The provider has a console of its own (a remote cluster's attach).
                return await provider.attach(instance_id, ref.container, stdin=stdin, tty=tty)
            return LogAttachment(provider.logs(instance_id, options))

        return start

    async def port_opener(self, ref: ContainerRef) -> portforward.PortOpener:
        found = self.locate(ref, "port-forward")
        provider, instance_id = found.provider, found.instance_id
        if not isinstance(provider, SupportsPortForward):
            raise StreamingRefused(501, f"provider {provider.name} has no port-forward operation")

        async def open_port(port: int) -> PortStream:
            return await provider.open_port(instance_id, port)

        return open_port


class LogAttachment:
    """``kubectl attach`` where the provider has no console: the container's output from now
    on (its log, followed), until the container ends. Input is read and dropped: these
    containers were started without a stdin (``stdin: true`` is not offered)."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._chunks = chunks

    async def write_stdin(self, data: bytes) -> None:
        return None

    async def close_stdin(self) -> None:
        return None

    async def output(self) -> AsyncIterator[tuple[int, bytes]]:
        async for chunk in self._chunks:
            yield 1, chunk

    async def resize(self, width: int, height: int) -> None:
        return None

    async def wait(self) -> int:
        return 0

    async def close(self) -> None:
        aclose = getattr(self._chunks, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
