"""The local provider's runner spawner: runners forked from one waiting process, detached
from it, replaced when it dies, and started the old way when it cannot answer.

Real processes throughout: the spawner, the runners it forks and their programs.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.unit.test_local_provider import (
    SLEEP,
    make_config,
    make_spec,
    offer,
    pid_alive,
    seeded,
    state_dir,  # noqa: F401 - the fixture (stops every recorded process afterwards)
    wait_state,
)
from vk_provider.domain.models import Instance, InstanceState
from vk_provider_adapters.local.adapter import LocalProvider
from vk_provider_adapters.local.records import read_record


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def session_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])


def runner_pid(directory: Path, instance_id: str) -> int:
    record = read_record(directory / instance_id)
    assert record is not None and record.process is not None
    return record.process.pid


@pytest.fixture
async def local(state_dir: Path) -> AsyncIterator[LocalProvider]:  # noqa: F811
    provider = LocalProvider(make_config(), state_dir=state_dir, rng=seeded(3))
    yield provider
    await provider.close()


def spawner_process(provider: LocalProvider) -> int:
    process = provider._spawner._process
    assert process is not None and process.poll() is None
    return process.pid


async def test_runners_are_forked_by_one_spawner_in_sessions_of_their_own(
    local: LocalProvider,
    state_dir: Path,  # noqa: F811
) -> None:
    cpu = await offer(local)
    first = await local.create(make_spec(SLEEP, uid="a"), cpu)
    second = await local.create(make_spec(SLEEP, uid="b"), cpu)
    spawner = spawner_process(local)
    pids = [runner_pid(state_dir, i.instance_id) for i in (first, second)]
    assert [parent_of(pid) for pid in pids] == [spawner, spawner]
    assert [session_of(pid) for pid in pids] == pids  # each leads a session of its own
    for instance in (first, second):
        running = await wait_state(local, instance.instance_id, InstanceState.RUNNING)
        assert running.instance_id == instance.instance_id
    # The runner ran the pod's program: its output reached the container's log.
    log = state_dir / first.instance_id / "containers" / "main" / "container.log"

    async def printed() -> bool:
        return "up" in log.read_text()

    await wait_for(printed, timeout=10, interval=0.05, what="the program's output")


async def test_runners_outlive_the_spawner_and_a_dead_spawner_is_replaced(
    local: LocalProvider,
    state_dir: Path,  # noqa: F811
) -> None:
    cpu = await offer(local)
    first = await local.create(make_spec(SLEEP, uid="a"), cpu)
    spawner = spawner_process(local)
    os.kill(spawner, signal.SIGKILL)

    async def gone() -> bool:
        return not pid_alive(spawner)

    await wait_for(gone, timeout=10, interval=0.05, what="the spawner's end")
    second = await local.create(make_spec(SLEEP, uid="b"), cpu)
    replacement = spawner_process(local)
    assert replacement != spawner
    assert parent_of(runner_pid(state_dir, second.instance_id)) == replacement
    # The first runner lost its parent, not its pod.
    assert pid_alive(runner_pid(state_dir, first.instance_id))
    running = await wait_state(local, first.instance_id, InstanceState.RUNNING)
    assert running.state is InstanceState.RUNNING
    await wait_state(local, second.instance_id, InstanceState.RUNNING)


async def test_close_lets_the_spawner_go_and_the_instances_keep_running(
    state_dir: Path,  # noqa: F811
) -> None:
    provider = LocalProvider(make_config(), state_dir=state_dir, rng=seeded(3))
    instance = await provider.create(make_spec(SLEEP, uid="a"), await offer(provider))
    spawner = spawner_process(provider)
    await provider.close()
    assert not pid_alive(spawner)
    assert pid_alive(runner_pid(state_dir, instance.instance_id))
    # A fresh provider (an agent restart) finds the instance still running.
    again = LocalProvider(make_config(), state_dir=state_dir, rng=seeded(3))
    try:
        found = await wait_state(again, instance.instance_id, InstanceState.RUNNING)
        assert found.instance_id == instance.instance_id
    finally:
        await again.close()


async def test_a_spawner_that_cannot_start_costs_speed_not_the_pod(
    local: LocalProvider,
    state_dir: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every spawner this provider starts fails (its interpreter is not there).
    monkeypatch.setattr(
        "vk_provider_adapters.local.spawner.spawner_command",
        lambda _dir, _fd: ["/nonexistent/python-for-the-spawner"],
    )
    instance = await local.create(make_spec(SLEEP, uid="a"), await offer(local))
    pid = runner_pid(state_dir, instance.instance_id)
    assert parent_of(pid) == os.getpid()  # started directly, by this process
    assert local._spawner._process is None
    await wait_state(local, instance.instance_id, InstanceState.RUNNING)


async def test_creates_under_way_hold_their_room_and_answer_a_repeat_once(
    local: LocalProvider,
    state_dir: Path,  # noqa: F811
) -> None:
    cpu = await offer(local)  # capacity 2
    results = await asyncio.gather(
        local.create(make_spec(SLEEP, uid="a"), cpu),
        local.create(make_spec(SLEEP, uid="a"), cpu),  # the same request, at the same time
        local.create(make_spec(SLEEP, uid="b"), cpu),
        local.create(make_spec(SLEEP, uid="c"), cpu),
        local.list_ours(),  # a scan while the creates write their files
        return_exceptions=True,
    )
    first, repeat, *others, listed = results
    assert isinstance(first, Instance) and isinstance(repeat, Instance)
    assert repeat.instance_id == first.instance_id
    assert sorted(type(r).__name__ for r in others) == ["CapacityUnavailable", "Instance"]
    # The scan listed no half-written instance (none LOST for want of its process).
    assert isinstance(listed, list) and all(i.state is not InstanceState.LOST for i in listed)
    # One runner per instance: the repeat started nothing.
    created = [r for r in (first, *others) if isinstance(r, Instance)]
    assert sorted(d.name for d in state_dir.iterdir() if d.name.startswith("local-")) == sorted(
        i.instance_id for i in created
    )
    assert len({runner_pid(state_dir, i.instance_id) for i in created}) == 2
    after = await local.list_ours()
    assert sorted(i.instance_id for i in after) == sorted(i.instance_id for i in created)


async def test_a_caller_that_gives_up_does_not_stop_the_create_half_way(
    local: LocalProvider,
    state_dir: Path,  # noqa: F811
) -> None:
    cpu = await offer(local)
    caller = asyncio.ensure_future(local.create(make_spec(SLEEP, uid="a"), cpu))

    async def under_way() -> bool:
        return bool(local._creating)

    await wait_for(under_way, timeout=10, interval=0.001, what="the create under way")
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    # The retry finds the instance the abandoned create finished: running, one runner.
    again = await local.create(make_spec(SLEEP, uid="a"), cpu)
    running = await wait_state(local, again.instance_id, InstanceState.RUNNING)
    assert running.instance_id == "local-a-0"
    assert [d.name for d in state_dir.iterdir() if d.name.startswith("local-")] == ["local-a-0"]
    assert pid_alive(runner_pid(state_dir, "local-a-0"))
    assert local._creating == {} and local._claims == {}
