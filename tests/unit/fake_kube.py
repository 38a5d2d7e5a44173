"""An in-memory stand-in for ``vk_provider.kube.client.KubeClient``, for controller unit tests.

It keeps pods, Secrets, ConfigMaps and Events as the API serves them (JSON dicts), bumps a
cluster-wide ``resourceVersion`` on every write, and serves list + watch from an event log,
so the controllers run exactly their production code paths against it. Only the calls the
controllers make exist; the API server's own behaviour that matters to them is modelled:
merge-patch of ``status`` and annotations, UID preconditions (409), graceful deletion
(``deletionTimestamp``), 404 as ``None`` / ``NotFoundError``, and watches that end on their
timeout.

The integration tests run against the real API server; this exists so that the controller's
decisions can be tested on simulated time (looptime) without one.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from vk_provider.kube.client import ApiError, ConflictError, GoneError, NotFoundError

JSON = dict[str, Any]


def _merge(target: JSON, patch: Mapping[str, Any]) -> JSON:
    """RFC 7386 JSON merge patch: objects merge, everything else (lists too) replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


class FakeKube:
    def __init__(self, *, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._now = now
        self._version = itertools.count(1)
        self._uids = itertools.count(1)
        self.pods: dict[tuple[str, str], JSON] = {}
        self.secrets: dict[tuple[str, str], JSON] = {}
        self.config_maps: dict[tuple[str, str], JSON] = {}
        self.events: list[JSON] = []
        self._log: list[tuple[int, str, JSON]] = []
        self._watchers: set[asyncio.Event] = set()  # one per open watch, set on every write
        self.calls: dict[str, int] = {}
        self.oldest_version = 0  # versions below this answer 410 Gone
        self.unreachable = False  # every call fails as against a stopped API server
        self.busy: dict[str, int] = {}  # call name -> 429 answers still to give

    # ------------------------------------------------------------------ test-side helpers

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.unreachable:
            raise ApiError(0, "ClientConnectorError: Connect call failed")
        if self.busy.get(name):
            self.busy[name] -= 1
            raise ApiError(429, "Too many requests, please try again later.")

    def set_unreachable(self, down: bool) -> None:
        """Stop (or start again) answering; open watches break as the server goes."""
        self.unreachable = down
        for changed in self._watchers:
            changed.set()

    async def _record(self, kind: str, pod: JSON) -> None:
        version = next(self._version)
        pod["metadata"]["resourceVersion"] = str(version)
        self._log.append((version, kind, copy.deepcopy(pod)))
        for changed in self._watchers:
            changed.set()

    async def create_pod(self, pod: JSON, *, namespace: str = "ns") -> JSON:
        """As `kubectl create` followed by the scheduler's binding (spec.nodeName is set)."""
        pod = copy.deepcopy(pod)
        metadata = pod.setdefault("metadata", {})
        metadata.setdefault("namespace", namespace)
        metadata.setdefault("uid", f"uid-{next(self._uids)}")
        metadata.setdefault("creationTimestamp", self._now().strftime("%Y-%m-%dT%H:%M:%SZ"))
        pod.setdefault("status", {"phase": "Pending"})
        key = (metadata["namespace"], metadata["name"])
        self.pods[key] = pod
        await self._record("ADDED", pod)
        return copy.deepcopy(pod)

    async def request_deletion(self, namespace: str, name: str, *, grace: float) -> None:
        """A graceful delete (kubectl delete, an eviction): only the deletionTimestamp is set."""
        pod = self.pods[(namespace, name)]
        deadline = self._now() + timedelta(seconds=grace)
        pod["metadata"]["deletionTimestamp"] = deadline.strftime("%Y-%m-%dT%H:%M:%SZ")
        pod["metadata"]["deletionGracePeriodSeconds"] = int(grace)
        await self._record("MODIFIED", pod)

    async def force_delete(self, namespace: str, name: str) -> None:
        """Gone at once, behind the agent's back (kubectl delete --force --grace-period=0)."""
        pod = self.pods.pop((namespace, name))
        await self._record("DELETED", pod)

    def pod(self, namespace: str, name: str) -> JSON | None:
        found = self.pods.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def reasons(self, name: str | None = None) -> list[str]:
        return [
            e["reason"] for e in self.events if name is None or e["involvedObject"]["name"] == name
        ]

    # ------------------------------------------------------------------ pods (KubeClient API)

    async def get_pod(self, namespace: str, name: str) -> JSON | None:
        self._count("get_pod")
        return self.pod(namespace, name)

    async def list_node_pods(self, node_name: str) -> tuple[list[JSON], str]:
        self._count("list_pods")
        pods = [
            copy.deepcopy(p)
            for p in self.pods.values()
            if (p.get("spec") or {}).get("nodeName") == node_name
        ]
        return pods, str(self._log[-1][0] if self._log else 0)

    async def watch_node_pods(
        self, node_name: str, resource_version: str, *, timeout_seconds: int = 60
    ) -> AsyncIterator[tuple[str, JSON]]:
        self._count("watch_pods")
        since = int(resource_version or 0)
        if since < self.oldest_version:
            raise GoneError(410, "too old resource version")
        deadline = asyncio.get_running_loop().time() + timeout_seconds
        changed = asyncio.Event()
        self._watchers.add(changed)
        try:
            while True:
                changed.clear()
                if self.unreachable:
                    raise ApiError(0, "watch broken: Response payload is not completed")
                for version, kind, pod in list(self._log):
                    if version > since and (pod.get("spec") or {}).get("nodeName") == node_name:
                        since = version
                        yield kind, copy.deepcopy(pod)
                since = max(since, self._log[-1][0] if self._log else 0)
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    return
                try:
                    # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a
                    # cancellation that coincides with the event, leaving the watch running.
                    async with asyncio.timeout(remaining):
                        await changed.wait()
                except TimeoutError:
                    return
        finally:
            self._watchers.discard(changed)

    def _existing(self, namespace: str, name: str, uid: str | None = None) -> JSON:
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise NotFoundError(404, f'pods "{name}" not found')
        if uid is not None and pod["metadata"].get("uid") != uid:
            raise ConflictError(409, "Precondition failed: UID in precondition")
        return pod

    async def patch_pod_status(
        self,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> JSON:
        self._count("patch_status")
        uid = (metadata or {}).get("uid")
        pod = self._existing(namespace, name, uid) if uid else self._existing(namespace, name)
        for part in ("annotations", "labels"):
            if metadata and part in metadata:
                _merge(pod["metadata"].setdefault(part, {}), metadata[part])
        _merge(pod.setdefault("status", {}), status)
        await self._record("MODIFIED", pod)
        return copy.deepcopy(pod)

    async def delete_pod_now(self, namespace: str, name: str, *, uid: str) -> None:
        self._count("delete_pod")
        pod = self.pods.get((namespace, name))
        if pod is None or pod["metadata"].get("uid") != uid:
            return
        del self.pods[(namespace, name)]
        await self._record("DELETED", pod)

    # ------------------------------------------------------------------ referenced objects

    async def get_secret(self, namespace: str, name: str) -> JSON | None:
        self._count("get_secret")
        return copy.deepcopy(self.secrets.get((namespace, name)))

    async def get_config_map(self, namespace: str, name: str) -> JSON | None:
        self._count("get_config_map")
        return copy.deepcopy(self.config_maps.get((namespace, name)))

    # ------------------------------------------------------------------ events

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> JSON:
        self._count("create_event")
        created = copy.deepcopy(dict(event))
        created["metadata"]["name"] = f"ev-{len(self.events)}"
        self.events.append(created)
        return copy.deepcopy(created)

    async def patch_event(self, namespace: str, name: str, patch: Mapping[str, Any]) -> JSON:
        self._count("patch_event")
        for event in self.events:
            if event["metadata"]["name"] == name:
                _merge(event, patch)
                return copy.deepcopy(event)
        raise NotFoundError(404, f'events "{name}" not found')
