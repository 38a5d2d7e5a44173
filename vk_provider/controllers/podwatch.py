"""The node's pods, as an informer keeps them: list, then watch; a store of the latest objects.

``PodWatch.run`` lists the pods with ``spec.nodeName=<node>``, then watches from the list's
resource version, and keeps ``PodStore`` current; every key whose object changed (or left)
is handed to ``on_change``. On 410 Gone or a broken connection it re-lists; a watch the server
ends on its timeout resumes from the last version seen.

``PodStore`` is what the pod controller reads instead of GETting a pod: the latest object the
watch delivered or one of our own writes returned, whichever is newer. It also keeps each
object parsed (``view``): a pod is parsed once per change, not once per sync, reconcile
cycle and node-status refresh (with 10,000 pods, that parsing was most of a cycle). The
object itself is kept compact (see ``PodStore``): 10,000 pods take about 45 MB.

Invariants:
- The store never goes back in time: an object replaces the stored one only if its
  ``resourceVersion`` is not older (versions are compared as integers when both are, which
  the API server's are; otherwise the newcomer wins, as a plain informer would).
- After a re-list, keys that are gone from the list are removed and reported, so a pod
  deleted while the watch was down is noticed.
- ``live`` is set while the store reflects a completed list (reconciliation waits for it).
- ``on_listed`` is called after every completed list, once its keys are handed to
  ``on_change``: the API server answers (again), which is news to work that failed against it.
- A watch event that brings nothing new — the echo of our own write (the store holds that
  very ``resourceVersion`` already, from the write's answer) or an older object — changes
  nothing and queues nothing: a pod is not synced again just to find its own status.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator

from vk_provider.domain.podview import JSON, PodKey, PodView, pod_key
from vk_provider.domain.workload import Held, held_resources
from vk_provider.kube.client import ApiError, GoneError, KubeClient

log = logging.getLogger(__name__)


def _version(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _lean(pod: JSON) -> JSON:
    """``pod`` without ``metadata.managedFields`` (nothing here reads them; about 40% of a
    pod's JSON)."""
    metadata = pod.get("metadata")
    if isinstance(metadata, dict) and "managedFields" in metadata:
        return {**pod, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}
    return pod


class PodStore:
    """Latest pod objects by key, parsed, and the key of each pod UID.

    A pod is kept as its ``PodView`` alone, the object inside it as compact JSON without
    ``managedFields`` (``PodView.encoded``): about 3 KB a pod where the decoded dicts took
    about 29 KB. ``get`` and ``values`` decode, so every caller gets a copy of its own. What
    each pod requests (``held``) is worked out once per stored object, as its view is, so the
    node's capacity and the flip's GPU count decode nothing.
    """

    def __init__(self) -> None:
        self._views: dict[PodKey, PodView] = {}
        self._held: dict[PodKey, Held] = {}
        self._by_uid: dict[str, PodKey] = {}

    def __len__(self) -> int:
        return len(self._views)

    def get(self, key: PodKey) -> JSON | None:
        found = self._views.get(key)
        return found.raw if found is not None else None

    def resource_version(self, key: PodKey) -> str | None:
        found = self._views.get(key)
        return found.resource_version if found is not None else None

    def key_of(self, uid: str) -> PodKey | None:
        return self._by_uid.get(uid)

    def keys(self) -> list[PodKey]:
        """A copy: callers may change the store while they walk it."""
        return list(self._views)

    def values(self) -> Iterator[JSON]:
        """Every stored pod object, decoded (a copy: callers may change the store)."""
        return iter([view.raw for view in list(self._views.values())])

    def held(self, key: PodKey) -> Held:
        """What the stored pod requests (nothing when it is not stored)."""
        return self._held.get(key, Held())

    def view(self, key: PodKey) -> PodView | None:
        """The stored pod, parsed (once per stored object)."""
        return self._views.get(key)

    def views(self) -> Iterator[PodView]:
        """Every stored pod, parsed; a copy, as ``values``."""
        return iter(list(self._views.values()))

    def update(self, pod: JSON) -> bool:
        """Keep ``pod`` unless the stored object is newer; True when it was kept."""
        key = pod_key(pod)
        current = self._views.get(key)
        if current is not None:
            new = _version(str((pod.get("metadata") or {}).get("resourceVersion") or ""))
            old = _version(current.resource_version)
            if old is not None and new is not None and new < old:
                return False
            self._by_uid.pop(current.uid, None)
        lean = _lean(pod)
        view = self._views[key] = PodView.parse(lean)
        self._held[key] = held_resources(lean)
        if view.uid:
            self._by_uid[view.uid] = key
        return True

    def remove(self, key: PodKey) -> JSON | None:
        view = self._views.pop(key, None)
        self._held.pop(key, None)
        if view is None:
            return None
        self._by_uid.pop(view.uid, None)
        return view.raw


class PodWatch:
    def __init__(
        self,
        kube: KubeClient,
        *,
        node_name: str,
        store: PodStore,
        on_change: Callable[[PodKey], None],
        on_listed: Callable[[], None] = lambda: None,
        timeout_seconds: int = 60,
        retry_seconds: float = 1.0,
    ) -> None:
        self._kube = kube
        self._node = node_name
        self._store = store
        self._on_change = on_change
        self._on_listed = on_listed
        self._timeout = timeout_seconds
        self._retry = retry_seconds
        self.live = asyncio.Event()
        self._primed: str | None = None  # the version of prime()'s list, for run() to use

    async def prime(self) -> None:
        """List once before the node reports its first status, so the pods already placed
        (adopted after a restart) are known, and counted in its capacity, from the start;
        ``run`` then watches on from this list's version instead of listing again."""
        pods, version = await self._kube.list_node_pods(self._node)
        self._relisted(pods)
        self._primed = version
        self.live.set()

    def _relisted(self, pods: list[JSON]) -> None:
        listed = {pod_key(p) for p in pods}
        for key in self._store.keys():  # noqa: SIM118 - a copy, the loop removes keys
            if key not in listed:
                self._store.remove(key)
                self._on_change(key)
        for pod in pods:
            self._store.update(pod)
            self._on_change(pod_key(pod))

    def _event(self, kind: str, pod: JSON) -> None:
        if kind == "BOOKMARK":
            return
        key = pod_key(pod)
        if kind == "DELETED":
            self._store.remove(key)
        else:
            stored = self._store.resource_version(key)
            version = str((pod.get("metadata") or {}).get("resourceVersion") or "")
            if stored is not None and version and stored == version:
                return  # the echo of our own write: the store has this very object already
            if not self._store.update(pod):
                return  # older than what we hold: nothing new to sync
        self._on_change(key)

    async def run(self) -> None:
        """List, then watch from the list's version; re-list on 410 or a dropped watch."""
        while True:
            try:
                if self._primed is not None:
                    version, self._primed = self._primed, None
                else:
                    pods, version = await self._kube.list_node_pods(self._node)
                    self._relisted(pods)
                self.live.set()
                self._on_listed()
                while True:
                    async for kind, pod in self._kube.watch_node_pods(
                        self._node, version, timeout_seconds=self._timeout
                    ):
                        version = str((pod.get("metadata") or {}).get("resourceVersion") or version)
                        self._event(kind, pod)
            except GoneError:
                log.info("pod watch expired (410); re-listing")
            except (ApiError, OSError, TimeoutError, ValueError) as exc:
                self.live.clear()
                log.warning("pod watch broken (%s); re-listing in %.0fs", exc, self._retry)
                await asyncio.sleep(self._retry)
            except Exception as exc:  # aiohttp's own errors: every transport hiccup alike
                self.live.clear()
                log.warning("pod watch failed (%s: %s); re-listing", type(exc).__name__, exc)
                await asyncio.sleep(self._retry)
