"""The EndpointSlices of the Services that select pods on the virtual node (leader only).

It watches the cluster's Services and this node's slices (labelled
``endpointslice.kubernetes.io/managed-by: vk-provider.io`` and ``vk-provider.io/node``) with a
``Reflector`` each, and, when a Service, a slice, a pod of the node or an instance's reported
endpoints changed (looked at every ``resync_seconds``, woken at once by the watches), builds
what every Service should have (``domain.endpointslices``) and writes only the difference:
create, replace (with the resourceVersion held), delete. Nothing changed: nothing is
computed, read or written (a pod's part is worked out once per resourceVersion). The
cluster's own EndpointSlice controller and kube-proxy, Cilium, ingress controllers and
gateways then route to where the provider exposes each replica.

Invariants: only slices carrying both labels for this node are ever written or deleted, so
another Service's, another node's or the cluster's own slices are never touched; while the
agent is down nothing is written, so the slices stay as they were (the replicas keep
serving); after a start nothing is written until every provider holding one of the node's
pods has been listed, then the slices are corrected (adoption: a replica not known yet is
never dropped); a pod's endpoints are its instance's last report while the pod lives (a
terminating replica stays listed, terminating, until it is gone); a pod that is gone leaves
its slices at the next tick. A write that fails (a conflict, a Service deleted meanwhile) is
retried at the next tick, with what the watches have brought meanwhile. A ready pod a
Service selects but cannot reach on some port gets one ``PortNotExposed`` Warning per port,
never a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from vk_provider.controllers.instances import InstanceTracker
from vk_provider.controllers.podwatch import PodStore
from vk_provider.controllers.reflector import Reflector
from vk_provider.controllers.ticker import once
from vk_provider.domain.endpointslices import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NODE_LABEL,
    SERVICE_LABEL,
    ExposedPod,
    changes,
    exposed_pod,
    selects,
    slices_for,
    unreached,
)
from vk_provider.domain.explain import WARNING
from vk_provider.domain.logfields import about
from vk_provider.domain.models import InstanceState, PortEndpoint
from vk_provider.domain.podview import ANN_INSTANCE, ANN_PROVIDER, PodKey
from vk_provider.kube.client import JSON, ApiError, KubeClient
from vk_provider.kube.events import EventRecorder

log = logging.getLogger(__name__)

SLICES = "/apis/discovery.k8s.io/v1"
PORT_NOT_EXPOSED = "PortNotExposed"  # a Warning: a Service selects the pod, a port misses it
ServiceKey = tuple[str, str]  # namespace, name
_REACHABLE = (InstanceState.RUNNING, InstanceState.TERMINATING)


@dataclass(frozen=True, slots=True)
class _Part:
    """One pod of the node as read at ``version``: its instance, and its part in the slices
    (``exposed`` without endpoints; None once it ended)."""

    version: str
    uid: str
    provider: str
    instance_id: str
    exposed: ExposedPod | None


class EndpointSliceController:
    def __init__(
        self,
        kube: KubeClient,
        store: PodStore,
        tracker: InstanceTracker,
        *,
        node: str,
        resync_seconds: float,
        events: EventRecorder | None = None,
    ) -> None:
        self._kube = kube
        self._store = store
        self._tracker = tracker
        self._node = node
        self._resync = resync_seconds
        self._events = events
        # pod UID -> the endpoints its instance last reported (kept while the pod lives).
        self._known: dict[str, tuple[PortEndpoint, ...]] = {}
        # (pod UID, namespace, Service, port) already warned about: one Event each.
        self._warned: set[tuple[str, str, str, str]] = set()
        # Pod key -> what the slices need of it, for the resourceVersion it was read at.
        self._parts: dict[PodKey, _Part] = {}
        # What the last complete pass computed from (nothing changed since: nothing to do).
        self._synced: object = None
        self._observed: tuple[object, ...] = ()
        self._wake = asyncio.Event()
        forbidden = "the agent's role lacks it: deploy/rbac-traffic.yaml"
        self.services = Reflector(
            kube, "/api/v1/services", what="services", on_change=self._wake.set,
            forbidden=forbidden,
        )  # fmt: skip
        ours = f"{MANAGED_BY_LABEL}={MANAGED_BY},{NODE_LABEL}={node}"
        self.slices = Reflector(
            kube, f"{SLICES}/endpointslices", what="endpoint slices",
            query={"labelSelector": ours}, on_change=self._wake.set, forbidden=forbidden,
        )  # fmt: skip

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self.services.run(), name="services-watch")
            tasks.create_task(self.slices.run(), name="endpoint-slices-watch")
            while True:
                await once(self.tick, log=log, what="endpoint slices")
                await self._pause()

    async def _pause(self) -> None:
        """Until the next look: ``resync_seconds``, or sooner when a watch saw a change."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), self._resync)
        self._wake.clear()

    def _endpoints(self, part: _Part) -> tuple[PortEndpoint, ...] | None:
        """Where the pod's instance is reached; None while that is not known yet."""
        if not part.provider or not part.instance_id:
            return ()
        instance = self._tracker.get(part.provider, part.instance_id)
        if instance is not None:
            # Reached while it runs (and while it stops); not before, not once it ended.
            reached = instance.endpoints if instance.state in _REACHABLE else ()
            self._known[part.uid] = reached
            return reached
        # Between two listings (a stop asked for drops it from the tracker) the last answer
        # stands; after a start, nothing is known until the provider has been listed.
        if part.uid in self._known:
            return self._known[part.uid]
        return () if self._tracker.fresh(part.provider) else None

    def _part(self, key: PodKey) -> _Part | None:
        """What the slices need of the pod at ``key``, decoded once per resourceVersion."""
        version = self._store.resource_version(key) or ""
        cached = self._parts.get(key)
        if cached is not None and cached.version == version:
            return cached
        pod = self._store.get(key)
        if pod is None:
            return None  # gone between keys() and get()
        metadata = pod.get("metadata") or {}
        annotations = metadata.get("annotations") or {}
        ended = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        return _Part(
            version=version,
            uid=str(metadata.get("uid") or ""),
            provider=str(annotations.get(ANN_PROVIDER) or ""),
            instance_id=str(annotations.get(ANN_INSTANCE) or ""),
            # A pod that has ended serves nothing, as the cluster's controller has it.
            exposed=None if ended else exposed_pod(pod, ()),
        )

    def pods(self) -> list[ExposedPod] | None:
        """The node's pods as the slices see them; None while one of them is not known."""
        found: list[ExposedPod] = []
        parts: dict[PodKey, _Part] = {}
        for key in self._store.keys():  # noqa: SIM118 - a list: the store is not a dict
            part = self._part(key)
            if part is None:
                continue
            parts[key] = part
            if part.exposed is None:
                continue
            endpoints = self._endpoints(part)
            if endpoints is None:
                return None
            exposed = part.exposed
            found.append(
                exposed if exposed.exposed == endpoints else replace(exposed, exposed=endpoints)
            )
        self._parts = parts
        self._observed = tuple((p.version, p.uid, self._known.get(p.uid)) for p in parts.values())
        live = {p.uid for p in found}
        for uid in [u for u in self._known if u not in live]:
            del self._known[uid]
        self._warned = {w for w in self._warned if w[0] in live}
        return found

    async def tick(self) -> None:
        if not (self.services.live.is_set() and self.slices.live.is_set()):
            log.debug("endpoint slices: waiting for the Services and slices to be listed")
            return
        pods = self.pods()
        if pods is None:
            # Just started (adoption): writing now would drop replicas that serve. Wait for
            # the providers' first listing; the slices stay as they are meanwhile.
            log.debug("endpoint slices: waiting for the providers' first listing")
            return
        observed = (self.services.changes, self.slices.changes, self._observed)
        if observed == self._synced:
            log.debug("endpoint slices: nothing changed")
            return
        wanted: dict[ServiceKey, list[JSON]] = {}
        if pods:
            for service in list(self.services.objects.values()):
                built = slices_for(service, pods, node=self._node)
                if built:
                    meta = service.get("metadata") or {}
                    wanted[(str(meta.get("namespace")), str(meta.get("name")))] = built
                await self._warn(service, pods)
        have: dict[ServiceKey, list[JSON]] = {}
        for slice_ in list(self.slices.objects.values()):
            meta = slice_.get("metadata") or {}
            key = (str(meta.get("namespace")), str((meta.get("labels") or {}).get(SERVICE_LABEL)))
            have.setdefault(key, []).append(slice_)
        written = 0
        for key in sorted(set(wanted) | set(have)):
            written += await self._apply(key, wanted.get(key, []), have.get(key, []))
        # Written: the next look compares again (with the answers held), to see it settled.
        self._synced = observed if written == 0 else None
        log.debug(
            "endpoint slices: %d services over the node's pods, %d written", len(wanted), written
        )

    async def _warn(self, service: Mapping[str, Any], pods: list[ExposedPod]) -> None:
        """A Warning on each ready pod a Service selects but cannot reach on some port: the
        pod runs on, its Service just leaves it out of that port (once per pod and port; a
        pod still starting is not warned about, its provider has not exposed anything yet)."""
        if self._events is None:
            return
        meta = service.get("metadata") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        for pod in pods:
            if not pod.ready or pod.terminating or not selects(service, pod):
                continue
            for port, why in unreached(service, pod):
                key = (pod.uid, namespace, name, port)
                if key in self._warned:
                    continue
                self._warned.add(key)
                message = f"Service {name} port {port} will not reach this replica: {why}"
                reference = {
                    "kind": "Pod",
                    "metadata": {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid},
                }
                await self._events.record(reference, WARNING, PORT_NOT_EXPOSED, message)
                log.warning("%s", message, extra=about((pod.namespace, pod.name)))

    async def _apply(self, key: ServiceKey, wanted: list[JSON], have: list[JSON]) -> int:
        """Write what differs for one Service; how many slices were written."""
        namespace, service = key
        base = f"{SLICES}/namespaces/{namespace}/endpointslices"
        versions = {s["metadata"]["name"]: s["metadata"].get("resourceVersion") for s in have}
        diff = changes(wanted, have)
        for slice_ in diff.create:
            await self._write("POST", base, slice_, key)
        for slice_ in diff.replace:
            name = slice_["metadata"]["name"]
            body = {**slice_, "metadata": {**slice_["metadata"], "resourceVersion": versions[name]}}
            await self._write("PUT", f"{base}/{name}", body, key)
        for name in diff.delete:
            await self._write("DELETE", f"{base}/{name}", None, key)
        written = len(diff.create) + len(diff.replace) + len(diff.delete)
        if written:
            ready = sum(
                1
                for s in wanted
                for e in s.get("endpoints") or []
                if (e.get("conditions") or {}).get("ready")
            )
            log.info(
                "service %s/%s: endpoint slices written (%d created, %d replaced, %d deleted; "
                "%d ready endpoints on this node)",
                namespace,
                service,
                len(diff.create),
                len(diff.replace),
                len(diff.delete),
                ready,
            )
        return written

    async def _write(self, method: str, path: str, body: JSON | None, key: ServiceKey) -> None:
        try:
            answer = await self._kube.request(method, path, body=body)
        except ApiError as exc:
            if method == "DELETE" and exc.status == 404:
                self.slices.removed((key[0], path.rsplit("/", 1)[1]))
                return  # gone already (its Service was deleted: garbage collection)
            # A conflict or a Service deleted meanwhile: the next tick tries again, with what
            # the watches brought meanwhile.
            log.info("service %s/%s: writing an endpoint slice: %s", *key, exc)
            return
        if method == "DELETE":
            self.slices.removed((key[0], path.rsplit("/", 1)[1]))
        else:
            self.slices.written(answer)
