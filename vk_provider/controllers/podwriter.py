"""What the pod controllers write to the API about a pod: status, Events, annotations.

One small class so every write keeps the pod store current with what the API answered
(the next sync reads our own write, not an older watch event) and a status that would not
change anything is not written at all. Where a pod runs (``place``: the annotations, the
provider label, why, the pod-deletion-cost that makes scale-in remove rented replicas first)
is staged and goes out with the status written next, in the same
request to ``/status`` — placing a pod costs one write.

Invariants: status goes through ``/status`` only when it changes or a placement is staged;
placement writes carry the pod's UID as a precondition; a staged placement that could not be
written stays staged for the next try; Events never fail a sync (the recorder swallows API
errors); the first write of phase Running of a pod (by UID) reports its start latency, from its
binding, to the observer — once per pod, not again after a crash loop.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from vk_provider.controllers.observer import NO_OBSERVER, ControllerObserver
from vk_provider.controllers.podwatch import PodStore
from vk_provider.domain import explain
from vk_provider.domain.models import Instance
from vk_provider.domain.podstatus import ContainerView, PodContainers, pod_status, status_changed
from vk_provider.domain.podview import (
    ANN_DELETION_COST,
    ANN_INSTANCE,
    ANN_OFFER,
    ANN_PLACEMENT,
    ANN_PRICE,
    ANN_PROVIDER,
    LABEL_PROVIDER,
    PodView,
    deletion_cost,
)
from vk_provider.kube.client import KubeClient
from vk_provider.kube.events import EventRecorder


class PodWriter:
    def __init__(
        self,
        kube: KubeClient,
        *,
        store: PodStore,
        recorder: EventRecorder,
        host_ip: str,
        now: Callable[[], datetime],
        observer: ControllerObserver = NO_OBSERVER,
        label_pods: bool = True,
    ) -> None:
        self._kube = kube
        # With a node identity NodeRestriction refuses labels written through pod status:
        # then the provider is only the annotation of the same name.
        self._label_pods = label_pods
        self._store = store
        self._events = recorder
        self._host_ip = host_ip
        self._now = now
        self._staged: dict[str, dict[str, object]] = {}  # pod uid -> metadata to write
        self._observer = observer
        self._started: set[str] = set()  # UIDs whose Running was reported (until forgotten)

    async def status(
        self,
        pod: PodView,
        view: ContainerView | PodContainers,
        *,
        pod_ip: str | None = None,
        phase: str | None = None,
        reason: str = "",
        message: str = "",
    ) -> None:
        current = pod.raw.get("status") or {}  # decoded once: a sync's one JSON decode
        wanted = pod_status(
            pod,
            view,
            now=self._now(),
            host_ip=self._host_ip,
            pod_ip=pod_ip,
            phase=phase,
            reason=reason,
            message=message,
            current=current,
        )
        metadata = self._staged.pop(pod.uid, None)
        if metadata is None and not status_changed(current, wanted):
            return
        try:
            updated = await self._kube.patch_pod_status(
                pod.namespace, pod.name, wanted, metadata=metadata
            )
        except BaseException:
            if metadata is not None:
                self._staged.setdefault(pod.uid, metadata)
            raise
        self._store.update(updated)
        if wanted.get("phase") == "Running" and pod.phase != "Running":
            self._first_running(pod, metadata)

    def _first_running(self, pod: PodView, metadata: dict[str, object] | None) -> None:
        if pod.uid in self._started:
            return
        self._started.add(pod.uid)
        bound = pod.bound_at
        if bound is not None:
            self._observer.pod_started(
                _provider_of(pod, metadata), (self._now() - bound).total_seconds()
            )

    async def event(self, pod: PodView, event: explain.Event) -> None:
        reference = {
            "kind": "Pod",
            "metadata": {
                "name": pod.name,
                "namespace": pod.namespace,
                "uid": pod.uid,
                "resourceVersion": pod.resource_version,
            },
        }
        await self._events.record(reference, event.kind, event.reason, event.message)

    def forget_events(self, uid: str) -> None:
        """The pod is gone: forget what was recorded about it (Events, its start)."""
        self._events.forget(uid)
        self._staged.pop(uid, None)
        self._started.discard(uid)

    def place(
        self, pod: PodView, instance: Instance, *, offer_key: str, price: float, explanation: str
    ) -> None:
        """Stage where the pod runs — the annotations, why (kept on the pod, beyond the
        Event's lifetime), the provider as a label (``kubectl get -l/-L``) — for the next
        status write of this pod."""
        annotations = {
            ANN_PROVIDER: instance.provider,
            ANN_INSTANCE: instance.instance_id,
            ANN_OFFER: offer_key,
            ANN_PRICE: f"{price:.4f}",
            # Scale-in removes rented replicas first, the dearest first.
            ANN_DELETION_COST: str(deletion_cost(price)),
        }
        if explanation:
            annotations[ANN_PLACEMENT] = explanation
        staged: dict[str, object] = {"uid": pod.uid, "annotations": annotations}
        if self._label_pods:
            staged["labels"] = {LABEL_PROVIDER: instance.provider}
        self._staged[pod.uid] = staged

    async def delete(self, pod: PodView) -> None:
        """Delete the pod now (grace 0), only if it is still the one with this UID."""
        await self._kube.delete_pod_now(pod.namespace, pod.name, uid=pod.uid)


def _provider_of(pod: PodView, metadata: dict[str, object] | None) -> str:
    """The provider the pod runs on: from a placement written with this status, else the pod's."""
    annotations = (metadata or {}).get("annotations")
    if isinstance(annotations, dict) and isinstance(annotations.get(ANN_PROVIDER), str):
        return str(annotations[ANN_PROVIDER])
    return pod.placed.provider if pod.placed else "unknown"
