"""A collection kept current by list and watch (``controllers.reflector``): never back in
time, deletions missed while the watch was down noticed, listed again after a failure."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.helpers import wait_for
from vk_provider.controllers.reflector import Reflector
from vk_provider.kube.client import ApiError, GoneError


def svc(name: str, version: str, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "ml", "name": name, "resourceVersion": version}, **extra}


class Collection:
    """Scripted answers: each list pops ``lists``, each watch pops ``watches`` (its events,
    then how it ends: None for the server's timeout, an exception, or hanging)."""

    def __init__(self) -> None:
        self.lists: list[Any] = []
        self.watches: list[tuple[list[tuple[str, dict[str, Any]]], Any]] = []
        self.watched_from: list[str] = []
        self.hang = asyncio.Event()

    async def list_objects(self, path: str, *, query: Any = None) -> tuple[list[Any], str]:
        answer = self.lists.pop(0) if self.lists else ([], "1")
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]

    async def watch_objects(
        self, path: str, version: str, *, query: Any = None, timeout_seconds: int = 60
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.watched_from.append(version)
        if not self.watches:
            await self.hang.wait()
            return
        events, end = self.watches.pop(0)
        for event in events:
            yield event
        if isinstance(end, Exception):
            raise end


async def _running(reflector: Reflector) -> asyncio.Task[None]:
    return asyncio.create_task(reflector.run())


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_list_then_watch_keeps_the_latest_objects_and_never_goes_back() -> None:
    api = Collection()
    listed = svc("a", "5")
    listed["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    api.lists = [([listed], "7")]
    api.watches = [
        (
            [
                ("ADDED", svc("b", "8")),
                ("MODIFIED", svc("a", "4")),  # older than held: ignored
                ("MODIFIED", svc("a", "9", spec={"v": 2})),
                ("BOOKMARK", {"metadata": {"resourceVersion": "10"}}),
                ("DELETED", svc("b", "11")),
            ],
            None,  # the server ends the watch: resumed from the last version seen
        )
    ]
    changed: list[int] = []
    reflector = Reflector(
        api, "/api/v1/services", what="services", on_change=lambda: changed.append(1)
    )  # type: ignore[arg-type]
    task = await _running(reflector)
    try:
        await wait_for(lambda: _true(len(api.watched_from) == 2), timeout=5, what="resumed")
    finally:
        await _stop(task)
    assert api.watched_from == ["7", "11"]
    assert list(reflector.objects) == [("ml", "a")]
    held = reflector.objects[("ml", "a")]
    assert held["spec"] == {"v": 2} and "managedFields" not in held["metadata"]
    assert reflector.live.is_set() and reflector.changes == len(changed) == 4


async def _true(value: bool) -> bool:
    return value


async def test_a_watch_that_expires_or_breaks_lists_again_and_notices_deletions() -> None:
    api = Collection()
    api.lists = [
        ([svc("a", "5"), svc("b", "5")], "5"),
        ([svc("a", "6")], "6"),  # b was deleted while the watch was down
        ([svc("a", "7")], "7"),
    ]
    api.watches = [([], GoneError(410, "too old")), ([], ApiError(0, "connection reset"))]
    reflector = Reflector(api, "/p", what="services", retry_seconds=0.01)  # type: ignore[arg-type]
    task = await _running(reflector)
    try:
        await wait_for(lambda: _true(len(api.watched_from) == 3), timeout=5, what="re-listed")
    finally:
        await _stop(task)
    assert api.watched_from == ["5", "6", "7"]
    assert reflector.objects == {("ml", "a"): svc("a", "7")}


async def test_a_refused_list_says_which_role_grants_it_and_is_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = Collection()
    api.lists = [ApiError(403, "services is forbidden"), ([svc("a", "1")], "1")]
    reflector = Reflector(
        api,  # type: ignore[arg-type]
        "/api/v1/services",
        what="services",
        forbidden="grant it with deploy/rbac-traffic.yaml",
        retry_seconds=0.01,
    )
    with caplog.at_level(logging.WARNING):
        task = await _running(reflector)
        try:
            await asyncio.wait_for(reflector.live.wait(), 5)
        finally:
            await _stop(task)
    assert "services watch broken" in caplog.text
    assert "grant it with deploy/rbac-traffic.yaml" in caplog.text
    assert reflector.objects == {("ml", "a"): svc("a", "1")}


def test_our_own_writes_are_held_until_their_echo_and_the_echo_changes_nothing() -> None:
    reflector = Reflector(None, "/p", what="slices")  # type: ignore[arg-type]
    reflector.written(svc("a", "3"))
    assert reflector.changes == 1
    reflector._event("MODIFIED", svc("a", "3"))  # the watch's echo of that write
    reflector._event("MODIFIED", svc("a", "2"))  # older
    assert reflector.changes == 1
    reflector.removed(("ml", "a"))
    reflector.removed(("ml", "a"))
    assert reflector.changes == 2 and reflector.objects == {}
