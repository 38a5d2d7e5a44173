"""The EndpointSlices of the Services that select pods on the virtual node (leader only).

Each tick (``resync_seconds``) reads the cluster's Services and this node's slices (labelled
``endpointslice.kubernetes.io/managed-by: vk-provider.io`` and ``vk-provider.io/node``), builds
what every Service should have from the pods of the node and their instances' reported
endpoints (``domain.endpointslices``), and writes only the difference: create, replace
(with the resourceVersion read), delete. The cluster's own EndpointSlice controller and
kube-proxy, Cilium, ingress controllers and gateways then route to where the provider
exposes each replica.

Invariants: only slices carrying both labels for this node are ever written or deleted, so
another Service's, another node's or the cluster's own slices are never touched; while the
agent is down nothing is written, so the slices stay as they were (the replicas keep
serving); after a start nothing is written until every provider holding one of the node's
pods has been listed, then the slices are corrected (adoption: a replica not known yet is
never dropped); a pod's endpoints are its instance's last report while the pod lives (a
terminating replica stays listed, terminating, until it is gone); a pod that is gone leaves
its slices at the next tick. A write that fails (a conflict, a Service deleted meanwhile) is
retried at the next tick, which reads everything again. A ready pod a Service selects but
cannot reach on some port gets one ``PortNotExposed`` Warning per port, never a crash.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from vk_provider.controllers.instances import InstanceTracker
from vk_provider.controllers.podwatch import PodStore
from vk_provider.controllers.ticker import every
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
from vk_provider.domain.podview import ANN_INSTANCE, ANN_PROVIDER
from vk_provider.kube.client import JSON, ApiError, KubeClient
from vk_provider.kube.events import EventRecorder

log = logging.getLogger(__name__)

SLICES = "/apis/discovery.k8s.io/v1"
PORT_NOT_EXPOSED = "PortNotExposed"  # a Warning: a Service selects the pod, a port misses it
ServiceKey = tuple[str, str]  # namespace, name
_REACHABLE = (InstanceState.RUNNING, InstanceState.TERMINATING)


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

    async def run(self) -> None:
        await every(lambda: self._resync, self.tick, log=log, what="endpoint slices")

    def _endpoints(self, pod: Mapping[str, Any]) -> tuple[PortEndpoint, ...] | None:
        """Where the pod's instance is reached; None while that is not known yet."""
        metadata = pod.get("metadata") or {}
        uid = str(metadata.get("uid") or "")
        annotations = metadata.get("annotations") or {}
        provider, instance_id = annotations.get(ANN_PROVIDER), annotations.get(ANN_INSTANCE)
        if not provider or not instance_id:
            return ()
        instance = self._tracker.get(provider, instance_id)
        if instance is not None:
            # Reached while it runs (and while it stops); not before, not once it ended.
            reached = instance.endpoints if instance.state in _REACHABLE else ()
            self._known[uid] = reached
            return reached
        # Between two listings (a stop asked for drops it from the tracker) the last answer
        # stands; after a start, nothing is known until the provider has been listed.
        if uid in self._known:
            return self._known[uid]
        return () if self._tracker.fresh(provider) else None

    def pods(self) -> list[ExposedPod] | None:
        """The node's pods as the slices see them; None while one of them is not known."""
        found = []
        for pod in self._store.values():
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue  # a pod that has ended serves nothing, as the cluster's controller has it
            endpoints = self._endpoints(pod)
            if endpoints is None:
                return None
            found.append(exposed_pod(pod, endpoints))
        live = {p.uid for p in found}
        for uid in [u for u in self._known if u not in live]:
            del self._known[uid]
        self._warned = {w for w in self._warned if w[0] in live}
        return found

    async def tick(self) -> None:
        pods = self.pods()
        if pods is None:
            # Just started (adoption): writing now would drop replicas that serve. Wait for
            # the providers' first listing; the slices stay as they are meanwhile.
            log.debug("endpoint slices: waiting for the providers' first listing")
            return
        services = await self._items("/api/v1/services")
        selector = f"{MANAGED_BY_LABEL}={MANAGED_BY},{NODE_LABEL}={self._node}"
        existing = await self._items(f"{SLICES}/endpointslices", {"labelSelector": selector})
        wanted: dict[ServiceKey, list[JSON]] = {}
        if pods:
            for service in services:
                built = slices_for(service, pods, node=self._node)
                if built:
                    meta = service.get("metadata") or {}
                    wanted[(str(meta.get("namespace")), str(meta.get("name")))] = built
                await self._warn(service, pods)
        have: dict[ServiceKey, list[JSON]] = {}
        for slice_ in existing:
            meta = slice_.get("metadata") or {}
            key = (str(meta.get("namespace")), str((meta.get("labels") or {}).get(SERVICE_LABEL)))
            have.setdefault(key, []).append(slice_)
        written = 0
        for key in sorted(set(wanted) | set(have)):
            written += await self._apply(key, wanted.get(key, []), have.get(key, []))
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
            await self._kube.request(method, path, body=body)
        except ApiError as exc:
            if method == "DELETE" and exc.status == 404:
                return  # gone already (its Service was deleted: garbage collection)
            # A conflict or a Service deleted meanwhile: the next tick reads it all again.
            log.info("service %s/%s: writing an endpoint slice: %s", *key, exc)

    async def _items(self, path: str, query: Mapping[str, str] | None = None) -> Iterable[JSON]:
        body = await self._kube.request("GET", path, query=query)
        return list(body.get("items") or [])
