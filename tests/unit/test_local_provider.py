"""The local provider: real local processes behind the provider contract.

Every test runs real programs (``sys.executable -c ...``) through
``vk_provider_adapters.local.runner``; the ``state_dir`` fixture kills whatever a test left running.
Waits poll with deadlines.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import vk_provider_adapters.local.adapter as adapter_module
from tests.helpers import wait_for
from vk_provider.domain.containers import ContainerSpec
from vk_provider.domain.contract import Provider
from vk_provider.domain.errors import (
    AuthFailed,
    CapacityUnavailable,
    InvalidSpec,
    NotFound,
    RateLimited,
    Transient,
)
from vk_provider.domain.models import (
    EnvVar,
    Instance,
    InstanceState,
    LogOptions,
    Offer,
    Port,
    PortEndpoint,
    WorkloadSpec,
)
from vk_provider_adapters.local.adapter import LocalProvider, LocalProviderDisabled
from vk_provider_adapters.local.config import LocalFaults, LocalProviderConfig
from vk_provider_adapters.local.faults import inject_loss, set_faults
from vk_provider_adapters.local.logs import parse_cri_line, select_history
from vk_provider_adapters.local.processes import ProcessRecord, is_running, stop_process
from vk_provider_adapters.local.records import INSTANCE_FILE
from vk_provider_adapters.simulated import SimulatedOffer

PY = sys.executable
TIMESTAMP = re.compile(rb"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z ")


def make_config(**overrides: object) -> LocalProviderConfig:
    data: dict[str, object] = {
        "type": "local",
        "name": "laptop",
        "enabled": True,
        "offers": [
            SimulatedOffer(sku="cpu", price_per_hour=0.1, capacity=2),
            SimulatedOffer(
                sku="a100",
                gpu_model="A100",
                gpu_count=1,
                gpu_memory_gib=80,
                price_per_hour=1.5,
                capacity=1,
                region="local-east",
                spot=True,
            ),
            SimulatedOffer(sku="slow", price_per_hour=0.2, startup_seconds=0.6),
        ],
    }
    data.update(overrides)
    return LocalProviderConfig.model_validate(data)


def make_spec(
    script: str | None = None,
    *,
    uid: str = "pod-1",
    attempt: int = 0,
    env: tuple[EnvVar, ...] = (),
    working_dir: str | None = None,
    restart_policy: str = "Never",
) -> WorkloadSpec:
    return WorkloadSpec(
        pod_uid=uid,
        namespace="default",
        pod_name=f"p-{uid}",
        containers=(
            ContainerSpec(
                name="main",
                image="ignored:latest",
                command=(PY, "-c") if script is not None else (),
                args=(script,) if script is not None else (),
                env=env,
                working_dir=working_dir,
            ),
        ),
        attempt=attempt,
        restart_policy=restart_policy,
    )


SLEEP = "import time; print('up', flush=True); time.sleep(60)"


def seeded(seed: int) -> random.Random:
    return random.Random(seed)


def _records(state_dir: Path) -> list[ProcessRecord]:
    records = []
    for path in state_dir.glob(f"*/{INSTANCE_FILE}"):
        process = json.loads(path.read_text()).get("process")
        if process:
            records.append(ProcessRecord.from_json(process))
    return records


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """The provider's state directory; every process recorded in it is stopped afterwards."""
    directory = tmp_path / "local"
    yield directory
    for record in _records(directory):
        stop_process(record, timeout=0.2)


@pytest.fixture
async def provider(state_dir: Path) -> AsyncIterator[LocalProvider]:
    local = LocalProvider(make_config(), state_dir=state_dir, rng=seeded(7))
    yield local
    await local.close()


async def offer(provider: LocalProvider, sku: str = "cpu") -> Offer:
    return next(o for o in await provider.offers() if o.sku == sku)


async def wait_state(
    provider: LocalProvider, instance_id: str, *states: InstanceState, timeout: float = 10
) -> Instance:
    async def reached() -> Instance | None:
        instance = await provider.get(instance_id)
        return instance if instance.state in states else None

    found = await wait_for(reached, timeout=timeout, interval=0.05, what=f"{instance_id} {states}")
    assert found is not None
    return found


async def collect(stream: AsyncIterator[bytes]) -> list[bytes]:
    return [chunk async for chunk in stream]


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


async def program_pid(provider: LocalProvider, instance_id: str) -> int:
    """The pid the program printed as its first line."""

    async def first_line() -> int | None:
        lines = await collect(provider.logs(instance_id, LogOptions()))
        return int(lines[0]) if lines else None

    pid = await wait_for(first_line, timeout=10, interval=0.05, what="the program's pid")
    assert pid is not None
    return pid


# --- configuration ------------------------------------------------------------------------


def test_refuses_to_start_unless_enabled(state_dir: Path) -> None:
    with pytest.raises(LocalProviderDisabled, match="set enabled: true") as caught:
        LocalProvider(make_config(enabled=False), state_dir=state_dir)
    assert isinstance(caught.value, RuntimeError)
    assert "'laptop'" in str(caught.value)


def test_configured_state_dir_wins(tmp_path: Path) -> None:
    local = LocalProvider(make_config(state_dir=tmp_path / "configured"), state_dir=tmp_path / "x")
    assert local.state_dir == tmp_path / "configured"
    assert local.name == "laptop"
    assert local.capabilities.follow_logs and local.capabilities.log_timestamps
    assert isinstance(local, Provider)


# --- offers and create --------------------------------------------------------------------


async def test_offers_come_from_config_and_reflect_capacity(provider: LocalProvider) -> None:
    offers = {o.sku: o for o in await provider.offers()}
    gpu = offers["a100"]
    assert (gpu.provider, gpu.region, gpu.gpu_model, gpu.gpu_count) == (
        "laptop",
        "local-east",
        "A100",
        1,
    )
    assert (gpu.price_per_hour, gpu.spot, gpu.gpu_memory_gib) == (1.5, True, 80)
    assert offers["slow"].startup_seconds == 0.6
    assert offers["cpu"].available == 2

    await provider.create(make_spec(SLEEP, uid="a"), offers["cpu"])
    assert (await offer(provider)).available == 1
    await provider.create(make_spec(SLEEP, uid="b"), offers["cpu"])
    assert (await offer(provider)).available == 0


async def test_create_is_idempotent_by_request_id(provider: LocalProvider, state_dir: Path) -> None:
    cpu = await offer(provider)
    first = await provider.create(make_spec(SLEEP), cpu)
    again = await provider.create(make_spec(SLEEP), cpu)
    assert first.instance_id == again.instance_id == "local-pod-1-0"
    assert (first.pod_uid, first.attempt, first.offer_key) == ("pod-1", 0, "laptop/cpu/local")
    assert first.price_per_hour == 0.1 and first.ip == "127.0.0.1"
    assert len(_records(state_dir)) == 1
    assert [i.instance_id for i in await provider.list_ours()] == ["local-pod-1-0"]
    # The next attempt of the same pod is a different request, hence a second instance.
    retry = await provider.create(make_spec(SLEEP, attempt=1), cpu)
    assert retry.instance_id == "local-pod-1-1"


async def test_full_capacity_is_capacity_unavailable(provider: LocalProvider) -> None:
    gpu = await offer(provider, "a100")
    first = await provider.create(make_spec(SLEEP, uid="a"), gpu)
    with pytest.raises(CapacityUnavailable, match="capacity"):
        await provider.create(make_spec(SLEEP, uid="b"), gpu)
    # Once the first is gone the capacity is free again.
    await provider.delete(first.instance_id, grace_seconds=0)
    await wait_state(provider, first.instance_id, InstanceState.TERMINATED)
    assert (await offer(provider, "a100")).available == 1
    await provider.create(make_spec(SLEEP, uid="b"), gpu)


async def test_a_container_without_command_is_invalid(provider: LocalProvider) -> None:
    with pytest.raises(InvalidSpec, match="needs a command") as caught:
        await provider.create(make_spec(None), await offer(provider))
    assert caught.value.field == "spec.containers[0].command"
    assert await provider.list_ours() == []


async def test_a_working_dir_that_does_not_exist_is_invalid_before_anything_runs(
    provider: LocalProvider, tmp_path: Path
) -> None:
    missing = tmp_path / "not-here"
    with pytest.raises(InvalidSpec, match="is not a directory on this machine") as caught:
        await provider.create(make_spec(SLEEP, working_dir=str(missing)), await offer(provider))
    assert caught.value.field == "spec.containers[0].workingDir"
    assert await provider.list_ours() == []
    assert not missing.exists()


async def test_args_alone_name_the_program(provider: LocalProvider) -> None:
    spec = WorkloadSpec(
        pod_uid="args",
        namespace="default",
        pod_name="p",
        containers=(ContainerSpec(name="main", image="x", args=(PY, "-c", "print('from args')")),),
        restart_policy="Never",
    )
    created = await provider.create(spec, await offer(provider))
    await wait_state(provider, created.instance_id, InstanceState.EXITED)
    assert await collect(provider.logs(created.instance_id, LogOptions())) == [b"from args\n"]


# --- running ------------------------------------------------------------------------------


async def test_runs_the_command_to_its_exit_code(provider: LocalProvider, tmp_path: Path) -> None:
    go = tmp_path / "go"
    script = (
        "import os, sys, time\n"
        "print('hello', flush=True)\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.02)\n"
        "sys.exit(3)\n"
    )
    created = await provider.create(make_spec(script), await offer(provider))
    assert created.state in (InstanceState.PENDING, InstanceState.RUNNING)
    running = await wait_state(provider, created.instance_id, InstanceState.RUNNING)
    assert running.started_at is not None and running.exit_code is None
    go.touch()
    exited = await wait_state(provider, created.instance_id, InstanceState.EXITED)
    assert exited.exit_code == 3
    assert exited.finished_at is not None and exited.finished_at >= running.started_at
    assert (await offer(provider)).available == 2  # an exited program holds no capacity


async def test_a_program_killed_by_a_signal_reports_128_plus_n(provider: LocalProvider) -> None:
    script = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    created = await provider.create(make_spec(script), await offer(provider))
    exited = await wait_state(provider, created.instance_id, InstanceState.EXITED)
    assert exited.exit_code == 137


async def test_a_missing_program_exits_127(provider: LocalProvider) -> None:
    spec = WorkloadSpec(
        pod_uid="nope",
        namespace="d",
        pod_name="p",
        containers=(ContainerSpec(name="c", image="x", command=("/nonexistent/program",)),),
        restart_policy="Never",
    )
    created = await provider.create(spec, await offer(provider))
    exited = await wait_state(provider, created.instance_id, InstanceState.EXITED)
    assert exited.exit_code == 127
    (line,) = await collect(provider.logs(created.instance_id, LogOptions()))
    assert b"cannot start" in line


async def test_startup_latency_is_pending_then_running(provider: LocalProvider) -> None:
    created = await provider.create(make_spec(SLEEP), await offer(provider, "slow"))
    assert created.state is InstanceState.PENDING
    running = await wait_state(provider, created.instance_id, InstanceState.RUNNING)
    assert running.started_at is not None


async def test_the_program_gets_spec_env_and_a_minimal_base(
    provider: LocalProvider, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AGENT_ONLY_SECRET", "do-not-leak")
    script = (
        "import os; print(os.environ['GREETING'], os.environ['TOKEN'], "
        "os.environ.get('AGENT_ONLY_SECRET'), 'PATH' in os.environ, os.getcwd())"
    )
    env = (EnvVar("GREETING", "hi there"), EnvVar("TOKEN", "s3cret", secret=True))
    spec = make_spec(script, env=env, working_dir=str(tmp_path))
    created = await provider.create(spec, await offer(provider))
    await wait_state(provider, created.instance_id, InstanceState.EXITED)
    lines = await collect(provider.logs(created.instance_id, LogOptions()))
    assert lines == [f"hi there s3cret None True {tmp_path}\n".encode()]
    # The environment file holds the secret (kubectl exec gets the container's environment):
    # readable by the agent's user only, and gone with the instance.
    env_file = provider.state_dir / created.instance_id / "containers" / "main" / "env.json"
    assert json.loads(env_file.read_text())["TOKEN"] == "s3cret"
    assert env_file.stat().st_mode & 0o077 == 0
    await provider.delete(created.instance_id, grace_seconds=0)
    assert not env_file.exists()


# --- logs ---------------------------------------------------------------------------------


def test_cri_lines_parse_and_select() -> None:
    line = parse_cri_line(b"2026-11-29T12:00:00.123456789Z stderr F a b  c")
    assert line is not None
    assert (line.stream, line.content, line.partial) == (b"stderr", b"a b  c", False)
    assert line.epoch_ns == 1_795_953_600_123_456_789
    assert line.render(timestamps=True) == b"2026-11-29T12:00:00.123456789Z a b  c\n"
    assert parse_cri_line(b"garbage") is None
    empty = parse_cri_line(b"2026-11-29T12:00:01Z stdout F ")
    assert empty is not None and empty.content == b"" and empty.epoch_ns == 1_795_953_601 * 10**9
    lines = [line, empty]
    assert select_history(lines, tail_lines=1, since_ns=None) == [empty]
    assert select_history(lines, tail_lines=0, since_ns=None) == []
    assert select_history(lines, tail_lines=None, since_ns=line.epoch_ns + 1) == [empty]


async def test_logs_honour_tail_timestamps_and_limit(provider: LocalProvider) -> None:
    script = "import sys\nprint('oops', file=sys.stderr)\nfor i in range(5): print(f'line {i}')"
    created = await provider.create(make_spec(script), await offer(provider))
    await wait_state(provider, created.instance_id, InstanceState.EXITED)
    iid = created.instance_id

    everything = await collect(provider.logs(iid, LogOptions()))
    # stdout and stderr are separate pipes: order within a stream is kept, not across them.
    assert [line for line in everything if line != b"oops\n"] == [
        f"line {i}\n".encode() for i in range(5)
    ]
    assert everything.count(b"oops\n") == 1
    stdout_last = everything[-1] if everything[-1] != b"oops\n" else everything[-2]
    assert stdout_last == b"line 4\n"
    assert await collect(provider.logs(iid, LogOptions(tail_lines=2))) == everything[-2:]
    stamped = await collect(provider.logs(iid, LogOptions(tail_lines=1, timestamps=True)))
    assert len(stamped) == 1 and TIMESTAMP.match(stamped[0])
    assert stamped[0].endswith(b" " + everything[-1])
    limited = b"".join(await collect(provider.logs(iid, LogOptions(limit_bytes=10))))
    assert limited == b"".join(everything)[:10]
    assert len(await collect(provider.logs(iid, LogOptions(since_seconds=3600)))) == 6


async def test_logs_of_a_missing_instance_are_not_found(provider: LocalProvider) -> None:
    with pytest.raises(NotFound):
        await collect(provider.logs("local-nobody-0", LogOptions()))
    with pytest.raises(NotFound):
        await collect(provider.logs("../../etc", LogOptions()))


async def test_follow_streams_lines_as_written_and_stops_at_exit(
    provider: LocalProvider, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    script = (
        "import os, time\n"
        "print('first', flush=True)\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.02)\n"
        "print('second', flush=True)\n"
    )
    created = await provider.create(make_spec(script), await offer(provider))
    stream = provider.logs(created.instance_id, LogOptions(follow=True))
    async with asyncio.timeout(10):
        assert await anext(stream) == b"first\n"
        # The program is blocked until `go` exists: the second line cannot be there yet.
        go.touch()
        assert await anext(stream) == b"second\n"
        with pytest.raises(StopAsyncIteration):
            await anext(stream)
    assert (await provider.get(created.instance_id)).state is InstanceState.EXITED


# --- delete -------------------------------------------------------------------------------


async def test_delete_escalates_to_sigkill_after_the_grace_period(
    provider: LocalProvider,
) -> None:
    script = (
        "import os, signal, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: print('got SIGTERM', flush=True))\n"
        "print(os.getpid(), flush=True)\n"
        "while True: time.sleep(1)\n"
    )
    created = await provider.create(make_spec(script), await offer(provider))
    pid = await program_pid(provider, created.instance_id)
    started = time.monotonic()
    await provider.delete(created.instance_id, grace_seconds=1)
    assert (await provider.get(created.instance_id)).state is InstanceState.TERMINATING
    done = await wait_state(provider, created.instance_id, InstanceState.TERMINATED)
    assert time.monotonic() - started >= 1
    assert done.finished_at is not None
    assert not pid_alive(pid)
    logs = await collect(provider.logs(created.instance_id, LogOptions()))
    assert logs.count(b"got SIGTERM\n") == 1  # forwarded once, to the program


async def test_the_kill_deadline_survives_an_agent_restart(state_dir: Path) -> None:
    script = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)"
    before = LocalProvider(make_config(), state_dir=state_dir)
    created = await before.create(make_spec(script), await offer(before))
    await wait_state(before, created.instance_id, InstanceState.RUNNING)
    await before.delete(created.instance_id, grace_seconds=1)

    after = LocalProvider(make_config(), state_dir=state_dir)  # the agent restarted
    assert (await after.get(created.instance_id)).state is InstanceState.TERMINATING
    await wait_state(after, created.instance_id, InstanceState.TERMINATED)
    assert not any(is_running(record) for record in _records(state_dir))


async def test_delete_of_a_cooperative_program_is_prompt(provider: LocalProvider) -> None:
    created = await provider.create(make_spec(SLEEP), await offer(provider))
    await wait_state(provider, created.instance_id, InstanceState.RUNNING)
    await provider.delete(created.instance_id, grace_seconds=30)
    done = await wait_state(provider, created.instance_id, InstanceState.TERMINATED, timeout=5)
    assert done.exit_code == 143  # SIGTERM's default action, as Docker reports it


async def test_delete_twice_then_missing_is_fine(provider: LocalProvider) -> None:
    created = await provider.create(make_spec(SLEEP), await offer(provider))
    await provider.delete(created.instance_id, grace_seconds=0)
    await provider.delete(created.instance_id, grace_seconds=0)  # terminating or gone: both fine

    async def released() -> bool:
        # Deleting an instance that no longer runs releases it; then it is not found.
        await provider.delete(created.instance_id, grace_seconds=0)
        try:
            await provider.get(created.instance_id)
        except NotFound:
            return True
        return False

    await wait_for(released, timeout=5, interval=0.05, what="the instance to be released")
    await provider.delete(created.instance_id, grace_seconds=0)
    await provider.delete("local-never-existed-0", grace_seconds=30)
    await provider.delete("../not-an-id", grace_seconds=30)


async def test_delete_releases_an_exited_instance(provider: LocalProvider) -> None:
    created = await provider.create(make_spec("print('x')"), await offer(provider))
    await wait_state(provider, created.instance_id, InstanceState.EXITED)
    await provider.delete(created.instance_id, grace_seconds=30)
    with pytest.raises(NotFound):
        await provider.get(created.instance_id)
    # The log outlives the release (kubectl logs of a completed pod) ...
    lines = await collect(provider.logs(created.instance_id, LogOptions(follow=True)))
    assert lines == [b"x\n"]
    # ... until the instance is deleted once more, which the agent does when the pod goes.
    await provider.delete(created.instance_id, grace_seconds=0)
    with pytest.raises(NotFound):
        await collect(provider.logs(created.instance_id, LogOptions()))


async def test_list_ours_forgets_terminated_instances(provider: LocalProvider) -> None:
    cpu = await offer(provider)
    keep = await provider.create(make_spec(SLEEP, uid="keep"), cpu)
    gone = await provider.create(make_spec(SLEEP, uid="gone"), cpu)
    await provider.delete(gone.instance_id, grace_seconds=0)
    await wait_state(provider, gone.instance_id, InstanceState.TERMINATED)
    assert [i.instance_id for i in await provider.list_ours()] == [keep.instance_id]
    with pytest.raises(NotFound):
        await provider.get(gone.instance_id)


# --- faults and restarts ------------------------------------------------------------------


async def test_injected_loss_is_lost_and_kills_the_process(
    provider: LocalProvider, state_dir: Path
) -> None:
    script = "import os, time; print(os.getpid(), flush=True); time.sleep(60)"
    created = await provider.create(make_spec(script), await offer(provider))
    pid = await program_pid(provider, created.instance_id)
    inject_loss(state_dir, created.instance_id, "spot instance reclaimed")
    lost = await provider.get(created.instance_id)
    assert lost.state is InstanceState.LOST and lost.message == "spot instance reclaimed"

    async def gone() -> bool:
        return not pid_alive(pid)

    await wait_for(gone, timeout=5, interval=0.05, what="the lost program to die")
    assert (await offer(provider)).available == 2
    with pytest.raises(FileNotFoundError):
        inject_loss(state_dir, "local-nobody-0")


async def test_a_vanished_runner_is_lost(provider: LocalProvider, state_dir: Path) -> None:
    created = await provider.create(make_spec(SLEEP), await offer(provider))
    await wait_state(provider, created.instance_id, InstanceState.RUNNING)
    (record,) = _records(state_dir)
    os.kill(record.pid, signal.SIGKILL)  # the runner only, not its group
    lost = await wait_state(provider, created.instance_id, InstanceState.LOST)
    assert lost.message == "process vanished"


async def test_fail_creates_fails_the_next_n_creates(
    provider: LocalProvider, state_dir: Path
) -> None:
    cpu = await offer(provider)
    set_faults(state_dir, fail_creates=2)
    for _ in range(2):
        with pytest.raises(CapacityUnavailable, match="injected"):
            await provider.create(make_spec(SLEEP), cpu)
    assert json.loads((state_dir / "faults.json").read_text())["fail_creates"] == 0
    assert (await provider.create(make_spec(SLEEP), cpu)).instance_id == "local-pod-1-0"


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("capacity", CapacityUnavailable),
        ("transient", Transient),
        ("rate_limited", RateLimited),
        ("auth", AuthFailed),
    ],
)
async def test_injected_create_failures_take_the_chosen_class(
    provider: LocalProvider, state_dir: Path, kind: str, error: type[Exception]
) -> None:
    set_faults(state_dir, fail_creates=1, create_error=kind)
    with pytest.raises(error, match="injected"):
        await provider.create(make_spec(SLEEP), await offer(provider))
    with pytest.raises(ValueError, match="create_error"):
        set_faults(state_dir, create_error="meteor")


async def test_create_failure_rate_uses_the_injected_random(state_dir: Path) -> None:
    config = make_config(faults=LocalFaults(create_failure_rate=0.5))
    local = LocalProvider(config, state_dir=state_dir, rng=seeded(1))
    cpu = await offer(local)
    succeeded = []
    for n in range(6):
        try:
            created = await local.create(make_spec("pass", uid=f"r{n}"), cpu)
        except CapacityUnavailable as exc:
            assert "injected" in str(exc)
            succeeded.append(False)
        else:
            succeeded.append(True)
            await wait_state(local, created.instance_id, InstanceState.EXITED)
    expected = seeded(1)
    assert succeeded == [expected.random() >= 0.5 for _ in range(6)]
    # The faults file overrides the configuration, and is read on every call.
    set_faults(state_dir, create_failure_rate=1.0)
    with pytest.raises(CapacityUnavailable):
        await local.create(make_spec("pass", uid="x"), cpu)
    set_faults(state_dir, create_failure_rate=0)
    await local.create(make_spec("pass", uid="x"), cpu)


async def test_api_latency_delays_calls(provider: LocalProvider, state_dir: Path) -> None:
    set_faults(state_dir, api_latency_seconds=0.3)
    started = time.monotonic()
    await provider.offers()
    assert time.monotonic() - started >= 0.3
    set_faults(state_dir, api_latency_seconds=0)
    with pytest.raises(ValueError, match="between 0 and 1"):
        set_faults(state_dir, create_failure_rate=2)


async def test_a_fresh_provider_finds_running_instances(state_dir: Path) -> None:
    before = LocalProvider(make_config(), state_dir=state_dir)
    cpu = await offer(before)
    running = await before.create(make_spec(SLEEP, uid="a"), cpu)
    exited = await before.create(make_spec("print('done')", uid="b"), cpu)
    await wait_state(before, running.instance_id, InstanceState.RUNNING)
    await wait_state(before, exited.instance_id, InstanceState.EXITED)
    await before.close()

    after = LocalProvider(make_config(), state_dir=state_dir)  # the agent restarted
    found = {i.instance_id: i.state for i in await after.list_ours()}
    assert found == {
        running.instance_id: InstanceState.RUNNING,
        exited.instance_id: InstanceState.EXITED,
    }
    assert (await offer(after)).available == 1
    # Idempotency survives the restart too.
    again = await after.create(make_spec(SLEEP, uid="a"), cpu)
    assert again.instance_id == running.instance_id and len(_records(state_dir)) == 2
    await after.delete(running.instance_id, grace_seconds=0)
    await wait_state(after, running.instance_id, InstanceState.TERMINATED)
    assert not any(is_running(record) for record in _records(state_dir))


async def test_create_get_and_offers_read_no_other_instance(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 14: a create used to observe every instance of its sku (quadratic in a burst of
    creates); now create, get and offers read only the instance they are about."""
    local = LocalProvider(
        make_config(offers=[SimulatedOffer(sku="cpu", price_per_hour=0.1, capacity=50)]),
        state_dir=state_dir,
    )
    cpu = await offer(local)
    for i in range(8):
        await local.create(make_spec(SLEEP, uid=f"busy-{i}"), cpu)
    looked: list[str] = []
    real = adapter_module.observe

    def counting(directory: Path, *, provider: str, ip: str) -> Instance | None:
        looked.append(directory.name)
        return real(directory, provider=provider, ip=ip)

    monkeypatch.setattr(adapter_module, "observe", counting)
    created = await local.create(make_spec(SLEEP, uid="new"), cpu)
    await local.get(created.instance_id)
    assert (await offer(local)).available == 50 - 9
    assert set(looked) == {created.instance_id}, looked


async def test_declared_ports_are_exposed_at_the_configured_address_while_running(
    state_dir: Path,
) -> None:
    """With ``address`` the declared ports are reported where the cluster reaches them (the
    process runs on this machine, on its own port numbers); only while it runs."""
    local = LocalProvider(make_config(address="10.213.0.1"), state_dir=state_dir, rng=seeded(7))
    try:
        spec = make_spec(SLEEP)
        app = dataclasses.replace(
            spec.containers[0], ports=(Port(8000, name="http"), Port(9000, "UDP"))
        )
        sidecar = ContainerSpec(
            name="proxy", image="x", command=(PY, "-c", SLEEP), restart_policy="Always",
            ports=(Port(15001),),
        )  # fmt: skip
        spec = dataclasses.replace(spec, containers=(app,), init_containers=(sidecar,))
        created = await local.create(spec, await offer(local))
        running = await wait_state(local, created.instance_id, InstanceState.RUNNING)
        assert running.endpoints == (
            PortEndpoint(15001, "TCP", "10.213.0.1", 15001),
            PortEndpoint(8000, "TCP", "10.213.0.1", 8000),
            PortEndpoint(9000, "UDP", "10.213.0.1", 9000),
        )
        await local.delete(created.instance_id, grace_seconds=0)
        gone = await wait_state(local, created.instance_id, InstanceState.TERMINATED)
        assert gone.endpoints == ()
    finally:
        await local.close()


async def test_without_an_address_no_port_is_exposed(provider: LocalProvider) -> None:
    spec = make_spec(SLEEP)
    app = dataclasses.replace(spec.containers[0], ports=(Port(8000),))
    created = await provider.create(
        dataclasses.replace(spec, containers=(app,)), await offer(provider)
    )
    running = await wait_state(provider, created.instance_id, InstanceState.RUNNING)
    assert running.endpoints == ()


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "169.254.1.1",
        "0.0.0.0",  # noqa: S104
        "::1",
        "my-host",
    ],
)
def test_an_address_the_cluster_cannot_reach_is_refused(address: str) -> None:
    with pytest.raises(ValueError, match="address"):
        make_config(address=address)
