"""A collection of the cluster kept current, as an informer's reflector keeps it: list, then
watch; the latest objects by (namespace, name).

``Reflector.run`` lists the collection at ``path`` (with ``query``: a label selector), then
watches from the list's resource version and keeps ``objects`` current, calling ``on_change``
after every change; on 410 Gone, a broken connection or a refusal it lists again (after
``retry_seconds``, doubling up to a minute while it keeps failing). Used for what the pod
watch does not cover: the Services and this node's EndpointSlices.

Invariants:
- ``objects`` never goes back in time: an object replaces the stored one only if its
  ``resourceVersion`` is not older (integers compared as integers); our own writes' answers
  go in through ``written``/``removed`` so the next read sees them before their watch event.
- After a list, objects gone from it are removed, so a deletion missed while the watch was
  down is noticed.
- ``live`` is set while ``objects`` reflects a completed list; readers skip work without it.
- ``changes`` counts the changes seen: a reader that remembers it knows whether anything
  moved since (an idle collection costs nothing to look at).
- ``managedFields`` are dropped (nothing reads them; a large part of every object).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Final

from vk_provider.kube.client import JSON, ApiError, GoneError, KubeClient

log = logging.getLogger(__name__)

Key = tuple[str, str]  # namespace, name
MAX_RETRY_SECONDS: Final = 60.0


def key_of(obj: Mapping[str, object]) -> Key:
    metadata = obj.get("metadata")
    meta = metadata if isinstance(metadata, Mapping) else {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _version(obj: Mapping[str, object]) -> str:
    metadata = obj.get("metadata")
    return str((metadata if isinstance(metadata, Mapping) else {}).get("resourceVersion") or "")


def _newer_or_same(candidate: str, stored: str) -> bool:
    if candidate.isdigit() and stored.isdigit():
        return int(candidate) >= int(stored)
    return True  # not comparable: the newcomer wins, as a plain informer has it


def _lean(obj: JSON) -> JSON:
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and "managedFields" in metadata:
        return {**obj, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}
    return obj


class Reflector:
    def __init__(
        self,
        kube: KubeClient,
        path: str,
        *,
        what: str,
        query: Mapping[str, str] | None = None,
        on_change: Callable[[], None] = lambda: None,
        forbidden: str = "",
        timeout_seconds: int = 300,
        retry_seconds: float = 1.0,
    ) -> None:
        self._kube = kube
        self._path = path
        self._what = what  # for the log: "services", "endpoint slices"
        self._forbidden = forbidden  # what the log says of a 403: which role grants it
        self._query = dict(query or {})
        self._on_change = on_change
        self._timeout = timeout_seconds
        self._retry = retry_seconds
        self.objects: dict[Key, JSON] = {}
        self.changes = 0
        self.live = asyncio.Event()

    def _changed(self) -> None:
        self.changes += 1
        self._on_change()

    def _store(self, obj: JSON) -> bool:
        key = key_of(obj)
        stored = self.objects.get(key)
        if stored is not None and not _newer_or_same(_version(obj), _version(stored)):
            return False
        if stored is not None and _version(stored) == _version(obj) and _version(obj):
            return False  # the very object we hold (the echo of our own write)
        self.objects[key] = _lean(obj)
        return True

    def written(self, obj: JSON) -> None:
        """Our own write's answer: held at once, so the next read does not write it again."""
        if self._store(obj):
            self._changed()

    def removed(self, key: Key) -> None:
        """Our own deletion (or a 404 for it)."""
        if self.objects.pop(key, None) is not None:
            self._changed()

    def _listed(self, items: list[JSON]) -> None:
        listed = {key_of(item) for item in items}
        for key in [k for k in self.objects if k not in listed]:
            del self.objects[key]
        for item in items:
            self._store(item)
        self._changed()

    def _event(self, kind: str, obj: JSON) -> None:
        if kind == "BOOKMARK":
            return
        if kind == "DELETED":
            self.removed(key_of(obj))
        elif self._store(obj):
            self._changed()

    async def run(self) -> None:
        """List, then watch from the list's version; list again on 410 or a failure."""
        delay = self._retry
        while True:
            try:
                items, version = await self._kube.list_objects(self._path, query=self._query)
                self._listed(items)
                self.live.set()
                delay = self._retry
                while True:
                    async for kind, obj in self._kube.watch_objects(
                        self._path, version, query=self._query, timeout_seconds=self._timeout
                    ):
                        version = _version(obj) or version
                        self._event(kind, obj)
            except GoneError:
                log.info("%s watch expired (410); listing again", self._what)
                continue
            except ApiError as exc:
                self.live.clear()
                forbidden = exc.status == 403 and self._forbidden
                log.warning(
                    "%s watch broken (%s)%s; listing again in %.0fs",
                    self._what,
                    exc,
                    f" ({self._forbidden})" if forbidden else "",
                    delay,
                )
            except (OSError, TimeoutError, ValueError) as exc:
                self.live.clear()
                log.warning("%s watch broken (%s); listing again in %.0fs", self._what, exc, delay)
            except Exception as exc:  # aiohttp's own errors: every transport hiccup alike
                self.live.clear()
                log.warning(
                    "%s watch failed (%s: %s); listing again in %.0fs",
                    self._what,
                    type(exc).__name__,
                    exc,
                    delay,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RETRY_SECONDS)
