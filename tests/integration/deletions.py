"""When each deleted pod of a node was due to go and when it went, across outages.

``DeletionClock`` keeps a list+watch of its own on the node's pods (re-listing whenever the
watch breaks, as during an API-server restart) and records, per pod, its
``deletionTimestamp`` (the moment its grace period ends: the delete request + the grace) and
the moment it was seen gone (the watch's DELETED, or a re-list that no longer has it; a
re-list after an outage gives an upper bound, which counts against the agent, never for it).

It also records when it could not reach the API server (from its first failed call to its
next completed list): the list that ends such a span is when the API server answered again.

The churn test judges the agent with it: a pod may stay ``margin`` seconds past its grace
period, plus every second of an ``Outage`` (the agent SIGKILLed, the API server down) within
that span, during which nobody could have finished its deletion. ``after_return`` is the
other measure: how long each deletion that was due while the API server was unreachable
took once it was back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from vk_provider.kube.client import KubeClient


@dataclass(frozen=True, slots=True)
class Outage:
    """A span in which no deletion could finish (``what`` names it in the report)."""

    start: datetime
    end: datetime
    what: str


@dataclass(slots=True)
class Deletion:
    name: str
    due: datetime  # the pod's deletionTimestamp: its delete request + its grace period
    seen: datetime  # when this clock first saw the deletionTimestamp
    gone: datetime | None = None


@dataclass(frozen=True, slots=True)
class Overdue:
    """What one deletion used of its budget: ``used`` seconds past its grace period, of which
    ``excused`` fell in outages; ``charged`` is what is held against the agent."""

    name: str
    used: float
    excused: float

    @property
    def charged(self) -> float:
        return self.used - self.excused


def _parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def excused(outages: Iterable[Outage], start: datetime, end: datetime) -> float:
    """Seconds of ``[start, end]`` covered by the outages (overlapping outages count once)."""
    spans = sorted(
        (max(start, o.start), min(end, o.end)) for o in outages if o.end > start and o.start < end
    )
    total, reach = 0.0, start
    for begin, finish in spans:
        begin = max(begin, reach)
        if finish > begin:
            total += (finish - begin).total_seconds()
            reach = finish
    return total


def overdue(deletion: Deletion, outages: Iterable[Outage], *, now: datetime) -> Overdue:
    """How far past its grace period ``deletion`` went (until ``now`` if it has not gone)."""
    end = deletion.gone or now
    used = max(0.0, (end - deletion.due).total_seconds())
    return Overdue(deletion.name, used, excused(outages, deletion.due, end) if used else 0.0)


def after_return(deletions: Iterable[Deletion], outage: Outage) -> dict[str, float]:
    """For each deletion due before the API server was back and not done before it went
    down: seconds from its return (or from the deadline, if that came later) to the pod gone."""
    found: dict[str, float] = {}
    for deletion in deletions:
        if deletion.due > outage.end or deletion.gone is None or deletion.gone < outage.start:
            continue
        found[deletion.name] = max(
            0.0, (deletion.gone - max(outage.end, deletion.due)).total_seconds()
        )
    return found


@dataclass
class DeletionClock:
    api: KubeClient
    node: str
    namespace: str
    deletions: dict[str, Deletion] = field(default_factory=dict)
    # Spans in which this clock could not reach the API server: from its first failed call
    # to its next completed list (retried every 0.2 s).
    unreachable: list[tuple[datetime, datetime]] = field(default_factory=list)
    _failing_since: datetime | None = None

    def pending(self) -> int:
        """Deletions seen and not gone yet."""
        return sum(1 for d in self.deletions.values() if d.gone is None)

    def back_after(self, start: datetime) -> datetime | None:
        """When this clock listed again after its first failed call since ``start``: an
        open watch may outlive a stopping server's listener for seconds, so the failure
        comes late, but the list that ends it is the API server answering again."""
        ends = [back for failed, back in self.unreachable if failed >= start]
        return min(ends) if ends else None

    def _seen(self, pod: dict[str, object], now: datetime) -> None:
        metadata = pod.get("metadata")
        if not isinstance(metadata, dict) or metadata.get("namespace") != self.namespace:
            return
        name, stamp = str(metadata.get("name")), metadata.get("deletionTimestamp")
        if isinstance(stamp, str) and name not in self.deletions:
            self.deletions[name] = Deletion(name, _parse(stamp), now)

    def _gone(self, name: str, now: datetime) -> None:
        deletion = self.deletions.get(name)
        if deletion is not None and deletion.gone is None:
            deletion.gone = now

    async def run(self) -> None:
        """List, watch, and re-list after every break, until cancelled."""
        while True:
            try:
                pods, version = await self.api.list_node_pods(self.node)
                now = datetime.now(UTC)
                if self._failing_since is not None:
                    self.unreachable.append((self._failing_since, now))
                    self._failing_since = None
                listed = {str(p["metadata"]["name"]) for p in pods}
                for name in [n for n, d in self.deletions.items() if d.gone is None]:
                    if name not in listed:
                        self._gone(name, now)
                for pod in pods:
                    self._seen(pod, now)
                while True:
                    async for kind, pod in self.api.watch_node_pods(
                        self.node, version, timeout_seconds=30
                    ):
                        now = datetime.now(UTC)
                        version = str(pod["metadata"].get("resourceVersion") or version)
                        if kind == "DELETED":
                            self._seen(pod, now)  # deleted without a grace period first
                            self._gone(str(pod["metadata"]["name"]), now)
                        elif kind != "BOOKMARK":
                            self._seen(pod, now)
            except Exception:  # the API server restarting, a 410: list again shortly
                if self._failing_since is None:
                    self._failing_since = datetime.now(UTC)
                await asyncio.sleep(0.2)
