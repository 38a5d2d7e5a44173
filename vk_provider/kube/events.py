"""Kubernetes Events about pods (and the virtual node), with the reasons of
docs/reference.md#events.

Every Event goes through client-go's correlation first (``domain.eventcorrelator``): a spam
filter per object (25 at once, then one per five minutes), aggregation of similar Events
(same reason, ten different messages), and deduplication — repeats of the same (pod,
reason, message) within ten minutes bump the existing Event's ``count`` instead of creating
a new object. So an Event costs one write when it is news and none when it is spam.

While ``run()`` runs (the agent supervises it), ``record`` only queues the Event (at most
``QUEUED_EVENTS``, as client-go's broadcaster does; more are dropped with a warning) and a few
senders write them: a pod's sync never waits for its Events. A queued Event holds only the
object's reference (``involved``), never the object: 10,000 queued Events would otherwise
keep 10,000 pods alive. Without ``run()`` (tools, tests of the recorder itself) ``record``
writes at once.

Writes (creates and bumps, not what the correlator drops) pass ``limit`` if one is given: a
token bucket of the agent's ``events.qps`` / ``events.burst`` (a kubelet's ``eventRecordQPS``
50 / ``eventBurst`` 100), so a burst of pod starts writes its Events after its statuses
instead of beside them; the queue still bounds what waits.

Invariants: recording never raises (an Event is best effort and must not fail a sync);
messages are written by our own code and never carry secret values.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from vk_provider.domain.eventcorrelator import Action, EventCorrelator
from vk_provider.domain.podview import rfc3339
from vk_provider.domain.tokenbucket import TokenBucket
from vk_provider.kube.client import ApiError, KubeClient

log = logging.getLogger(__name__)

COMPONENT = "vk-provider"
QUEUED_EVENTS = 10_000  # client-go queues 1,000 per broadcaster; a node of ours has more pods
SENDERS = 8

# The reasons and their wording are the domain's (domain/explain.py), spelled there only.


def involved(obj: dict[str, Any]) -> dict[str, Any]:
    """The part of ``obj`` (a pod, a Node, a Kueue Workload) an Event refers to: API version,
    kind, name, namespace, UID and resource version."""
    metadata = obj.get("metadata") or {}
    return {
        "apiVersion": obj.get("apiVersion") or "v1",
        "kind": obj.get("kind") or "Pod",
        "metadata": {
            key: metadata[key]
            for key in ("name", "namespace", "uid", "resourceVersion")
            if key in metadata
        },
    }


class EventRecorder:
    def __init__(
        self,
        kube: KubeClient,
        *,
        node_name: str,
        clock: Callable[[], float] = time.monotonic,
        correlator: EventCorrelator | None = None,
        limit: TokenBucket | None = None,
    ) -> None:
        self._kube = kube
        self._node = node_name
        self._clock = clock
        self._correlator = correlator or EventCorrelator()
        self._limit = limit  # shared by every sender: the writes' rate, not each sender's
        self._outbox: asyncio.Queue[tuple[dict[str, Any], str, str, str]] | None = None
        self._dropped = 0

    async def run(self, *, senders: int = SENDERS) -> None:
        """Send queued Events until cancelled; ``record`` queues while this runs."""
        outbox: asyncio.Queue[tuple[dict[str, Any], str, str, str]] = asyncio.Queue(QUEUED_EVENTS)

        async def send() -> None:
            while True:
                item = await outbox.get()
                try:
                    await self._write(*item)
                except Exception:  # a sender must not die of one Event
                    log.exception("writing event %s failed", item[2])
                finally:
                    outbox.task_done()

        self._outbox = outbox
        try:
            await asyncio.gather(*(send() for _ in range(senders)))
        finally:
            self._outbox = None

    async def flush(self) -> None:
        """Wait until every queued Event was written (or dropped)."""
        if self._outbox is not None:
            await self._outbox.join()

    async def record(self, pod: dict[str, Any], kind: str, reason: str, message: str) -> None:
        """Record a ``Normal`` or ``Warning`` event about ``pod`` (or a Node: its Events go to
        the ``default`` namespace, as a kubelet's do)."""
        reference = involved(pod)  # all an Event names: a queued event holds no whole object
        if self._outbox is None:
            await self._write(reference, kind, reason, message)
            return
        try:
            self._outbox.put_nowait((reference, kind, reason, message))
        except asyncio.QueueFull:
            self._dropped += 1
            if self._dropped in (1, 10, 100) or self._dropped % 1000 == 0:
                log.warning("%d events dropped: more than %d waiting", self._dropped, QUEUED_EVENTS)

    async def _write(self, pod: dict[str, Any], kind: str, reason: str, message: str) -> None:
        metadata = pod.get("metadata") or {}
        object_kind = str(pod.get("kind") or "Pod")
        namespace = (
            "default" if object_kind == "Node" else str(metadata.get("namespace", "default"))
        )
        uid = str(metadata.get("uid", ""))
        verdict = self._correlator.correlate(uid, kind, reason, message, self._clock())
        if verdict.action is Action.DROP:
            log.debug("event %s for %s/%s dropped by the spam filter", reason, namespace, uid)
            return
        if self._limit is not None and (wait := self._limit.reserve(self._clock())) > 0:
            await asyncio.sleep(wait)  # past the burst: the Event waits its turn
        now = datetime.now(UTC)
        try:
            if verdict.action is Action.BUMP:
                await self._kube.patch_event(
                    namespace,
                    verdict.name,
                    {"count": verdict.count, "lastTimestamp": rfc3339(now)}
                    | ({"message": verdict.message} if verdict.message != message else {}),
                )
                self._correlator.created(verdict, verdict.name, self._clock())
                return
            event = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {
                    "generateName": f"{metadata.get('name', 'pod')}.",
                    "namespace": namespace,
                },
                "involvedObject": {
                    "apiVersion": str(pod.get("apiVersion") or "v1"),
                    "kind": object_kind,
                    "name": metadata.get("name"),
                    "uid": uid,
                    "resourceVersion": metadata.get("resourceVersion"),
                }
                | ({} if object_kind == "Node" else {"namespace": namespace}),
                "reason": reason,
                "message": verdict.message,
                "type": kind,
                "count": 1,
                "firstTimestamp": rfc3339(now),
                "lastTimestamp": rfc3339(now),
                "source": {"component": COMPONENT, "host": self._node},
                "reportingComponent": COMPONENT,
                "reportingInstance": self._node,
            }
            created = await self._kube.create_event(namespace, event)
            self._correlator.created(verdict, str(created["metadata"]["name"]), self._clock())
        except ApiError as exc:
            # Namespace terminating, event GC'd meanwhile, API hiccup: drop it, never fail.
            self._correlator.failed(verdict)
            log.info("event %s for %s/%s not recorded: %s", reason, namespace, uid, exc)

    def forget(self, uid: str) -> None:
        self._correlator.forget(uid)
