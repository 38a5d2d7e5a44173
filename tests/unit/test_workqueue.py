"""The keyed work queue: one worker per key, dirty re-queues, timers, per-key back-off.

On simulated loop time (looptime): delays are exact and nothing sleeps for real.
"""

from __future__ import annotations

import asyncio

import pytest

from vk_provider.controllers.workqueue import Backoff, QueueClosed, WorkQueue

pytestmark = pytest.mark.looptime


async def test_duplicates_collapse_and_a_key_is_never_handed_out_twice_at_once() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    queue.add("a")
    queue.add("b")
    assert len(queue) == 2
    first = await queue.get()
    queue.add(first)  # changed while being processed: dirty, not queued
    second = await queue.get()
    assert {first, second} == {"a", "b"}
    assert len(queue) == 0
    queue.done(first)
    assert await queue.get() == first  # handed out again after done()


async def test_urgent_keys_are_handed_out_first_in_their_order_and_others_in_theirs() -> None:
    deleting: set[str] = {"u1", "u2"}
    queue: WorkQueue[str] = WorkQueue(urgent=lambda key: key in deleting)
    for key in ["r1", "u1", "r2", "u2", "r3"]:
        queue.add(key)
    deleting.add("r3")  # its pod is being deleted now, while it waits
    queue.add("r3")  # the watch reports that change: it moves ahead, once
    assert len(queue) == 5
    handed = [await queue.get() for _ in range(5)]
    assert handed == ["u1", "u2", "r3", "r1", "r2"]
    assert len(queue) == 0
    for key in handed:
        queue.done(key)
    queue.add("r1")  # the stale routine entry of r3 hands out nothing
    assert await queue.get() == "r1"
    assert len(queue) == 0


async def test_add_after_waits_and_an_earlier_add_supersedes_it() -> None:
    loop = asyncio.get_running_loop()
    queue: WorkQueue[str] = WorkQueue()
    start = loop.time()
    queue.add_after("a", 30)
    assert await queue.get() == "a"
    assert loop.time() - start == pytest.approx(30)
    queue.done("a")
    queue.add_after("a", 30)
    queue.add("a")
    assert await queue.get() == "a"
    assert loop.time() - start == pytest.approx(30)  # at once, not 30 s later


async def test_rate_limited_back_off_doubles_per_key_up_to_the_cap_and_forget_resets() -> None:
    queue: WorkQueue[str] = WorkQueue(Backoff(base=5, cap=60))
    delays = [queue.add_rate_limited("a") for _ in range(6)]
    assert delays == [5, 10, 20, 40, 60, 60]
    assert queue.failures("a") == 6
    assert queue.add_rate_limited("b") == 5  # per key
    queue.forget("a")
    assert queue.failures("a") == 0
    assert queue.add_rate_limited("a") == 5


async def test_retry_after_and_a_cap_per_call() -> None:
    queue: WorkQueue[str] = WorkQueue(Backoff(base=5, cap=300))
    assert queue.add_rate_limited("a", at_least=42) == 42  # a server's Retry-After wins
    assert queue.add_rate_limited("a", cap=7) == 7  # 10 by the back-off, capped at 7


async def test_a_rate_limited_key_is_held_until_its_back_off_ends() -> None:
    loop = asyncio.get_running_loop()
    queue: WorkQueue[str] = WorkQueue(Backoff(base=5, cap=60))
    start = loop.time()
    queue.add_rate_limited("a")
    queue.add_rate_limited("a")  # 10 s now
    assert queue.held_for("a") == pytest.approx(10)
    queue.add("a")  # a watch event: the key is synced early, but still held
    assert await queue.get() == "a"
    assert queue.held_for("a") == pytest.approx(10)
    queue.done("a")
    await asyncio.sleep(10)
    assert queue.held_for("a") == 0.0
    assert loop.time() - start == pytest.approx(10)
    queue.add_rate_limited("b")
    queue.forget("b")
    assert queue.held_for("b") == 0.0  # forgetting ends the hold


async def test_drop_cancels_timers_and_close_wakes_workers() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add_after("a", 5)
    queue.drop("a")
    waiter = asyncio.create_task(queue.get())
    await asyncio.sleep(10)
    assert not waiter.done()  # the dropped timer never fired
    queue.close()
    with pytest.raises(QueueClosed):
        await waiter


class Recorder:
    """A ``QueueObserver`` that writes down what the queue reports."""

    def __init__(self) -> None:
        self.adds = 0
        self.depths: list[int] = []
        self.waits: list[float] = []
        self.work: list[float] = []
        self.retries = 0

    def added(self) -> None:
        self.adds += 1

    def depth(self, keys: int) -> None:
        self.depths.append(keys)

    def waited(self, seconds: float) -> None:
        self.waits.append(seconds)

    def worked(self, seconds: float) -> None:
        self.work.append(seconds)

    def retried(self) -> None:
        self.retries += 1


async def test_the_observer_sees_adds_depth_waits_work_and_retries_as_client_go_counts() -> None:
    recorder = Recorder()
    queue: WorkQueue[str] = WorkQueue(Backoff(base=5, cap=60), observer=recorder)
    queue.add("a")
    queue.add("a")  # already waiting: not another add
    queue.add("b")
    assert (recorder.adds, recorder.depths) == (2, [1, 2])
    await asyncio.sleep(3)
    key = await queue.get()
    assert recorder.waits == [3.0] and recorder.depths[-1] == 1
    queue.add(key)  # changed while processed: one add, waiting from now
    queue.add(key)
    assert recorder.adds == 3
    await asyncio.sleep(2)
    queue.done(key)
    assert recorder.work == [2.0]
    other = await queue.get()
    assert other != key and recorder.waits[-1] == 5.0
    queue.done(other)
    again = await queue.get()
    assert again == key and recorder.waits[-1] == 2.0  # since it was marked, not since done()
    queue.done(again)
    assert queue.add_rate_limited(key) == 5
    assert recorder.retries == 1
    assert await queue.get() == key  # after its back-off
    assert recorder.waits[-1] == 0.0  # the back-off is not time spent waiting in the queue
    queue.done(key)
    assert recorder.adds == 4
    assert len(recorder.work) == 4
