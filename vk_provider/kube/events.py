"""Kubernetes Events about pods (and the virtual node), with the reasons of PRODUCT.md §6.

Repeats of the same (pod, reason, message) within ten minutes bump the existing Event's
``count`` instead of creating a new object, as client-go's recorder does.

Invariants: recording never raises (an Event is best effort and must not fail a sync);
messages are written by our own code and never carry secret values.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from vk_provider.domain.podview import rfc3339
from vk_provider.kube.client import ApiError, KubeClient

log = logging.getLogger(__name__)

COMPONENT = "vk-provider"
_DEDUP_SECONDS = 600.0
_MAX_REMEMBERED = 4096

# Reasons (PRODUCT.md §6).
PROVIDER_SELECTED = "ProviderSelected"
NO_CAPACITY = "NoCapacity"
BUDGET_EXCEEDED = "BudgetExceeded"
INVALID_SPEC = "InvalidSpec"
PROVIDER_CREATE_FAILED = "ProviderCreateFailed"
INSTANCE_LOST = "InstanceLost"
# Kubelet-style reasons for the container's own life.
STARTED = "Started"
BACK_OFF = "BackOff"
KILLING = "Killing"
FAILED_CONFIG = "CreateContainerConfigError"


class EventRecorder:
    def __init__(
        self,
        kube: KubeClient,
        *,
        node_name: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._node = node_name
        self._clock = clock
        self._recent: dict[tuple[str, str, str], tuple[str, int, float]] = {}

    async def record(self, pod: dict[str, Any], kind: str, reason: str, message: str) -> None:
        """Record a ``Normal`` or ``Warning`` event about ``pod`` (or a Node: its Events go to
        the ``default`` namespace, as a kubelet's do)."""
        metadata = pod.get("metadata") or {}
        object_kind = str(pod.get("kind") or "Pod")
        namespace = (
            "default" if object_kind == "Node" else str(metadata.get("namespace", "default"))
        )
        uid = str(metadata.get("uid", ""))
        key = (uid, reason, message)
        now = datetime.now(UTC)
        try:
            remembered = self._recent.get(key)
            if remembered and self._clock() - remembered[2] < _DEDUP_SECONDS:
                name, count, _ = remembered
                await self._kube.patch_event(
                    namespace, name, {"count": count + 1, "lastTimestamp": rfc3339(now)}
                )
                self._recent[key] = (name, count + 1, self._clock())
                return
            event = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {
                    "generateName": f"{metadata.get('name', 'pod')}.",
                    "namespace": namespace,
                },
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": object_kind,
                    "name": metadata.get("name"),
                    "uid": uid,
                    "resourceVersion": metadata.get("resourceVersion"),
                }
                | ({} if object_kind == "Node" else {"namespace": namespace}),
                "reason": reason,
                "message": message,
                "type": kind,
                "count": 1,
                "firstTimestamp": rfc3339(now),
                "lastTimestamp": rfc3339(now),
                "source": {"component": COMPONENT, "host": self._node},
                "reportingComponent": COMPONENT,
                "reportingInstance": self._node,
            }
            created = await self._kube.create_event(namespace, event)
            if len(self._recent) >= _MAX_REMEMBERED:
                self._recent.clear()
            self._recent[key] = (created["metadata"]["name"], 1, self._clock())
        except ApiError as exc:
            # Namespace terminating, event GC'd meanwhile, API hiccup: drop it, never fail.
            self._recent.pop(key, None)
            log.info("event %s for %s/%s not recorded: %s", reason, namespace, uid, exc)

    def forget(self, uid: str) -> None:
        for key in [k for k in self._recent if k[0] == uid]:
            del self._recent[key]
