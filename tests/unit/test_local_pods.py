"""The local provider runs whole pods: init containers in order, sidecars, restarts per the
restart policy with back-off, liveness restarts, per-container logs and statuses.

Real programs (``sys.executable -c ...``) under the real pod runner; the ``state_dir``
fixture of ``test_local_provider`` kills whatever a test left running. Waits poll with
deadlines; the crash-loop back-off is configured short (0.2 s doubling) so restarts are quick.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.unit.test_local_provider import (  # noqa: F401 - state_dir is a fixture
    collect,
    make_config,
    offer,
    state_dir,
    wait_state,
)
from vk_provider.domain.containers import ContainerSpec, ContainerState, ContainerStatus
from vk_provider.domain.errors import CapacityUnavailable, NotFound
from vk_provider.domain.models import Instance, InstanceState, LogOptions, WorkloadSpec
from vk_provider_adapters.local.adapter import LocalProvider

PY = sys.executable


@pytest.fixture
async def provider(state_dir: Path) -> AsyncIterator[LocalProvider]:  # noqa: F811
    local = LocalProvider(make_config(restart_backoff_seconds=0.2), state_dir=state_dir)
    yield local
    await local.close()


def c(name: str, script: str, *, sidecar: bool = False) -> ContainerSpec:
    return ContainerSpec(
        name=name,
        image="ignored",
        command=(PY, "-c", script),
        restart_policy="Always" if sidecar else None,
    )


def pod(
    apps: list[ContainerSpec],
    inits: list[ContainerSpec] | None = None,
    *,
    policy: str = "Never",
    uid: str = "pod-1",
) -> WorkloadSpec:
    return WorkloadSpec(
        pod_uid=uid,
        namespace="default",
        pod_name=f"p-{uid}",
        containers=tuple(apps),
        init_containers=tuple(inits or ()),
        restart_policy=policy,
    )


def named(statuses: tuple[ContainerStatus, ...]) -> dict[str, ContainerStatus]:
    return {s.name: s for s in statuses}


async def until(provider: LocalProvider, instance_id: str, check: object, what: str) -> Instance:
    async def look() -> Instance | None:
        instance = await provider.get(instance_id)
        return instance if check(instance) else None  # type: ignore[operator]

    found = await wait_for(look, timeout=20, interval=0.05, what=what)
    assert found is not None
    return found


async def up(provider: LocalProvider, instance_id: str, container: str) -> None:
    """Until ``container`` printed 'up' (its SIGTERM handler is in place by then)."""

    async def printed() -> bool:
        options = LogOptions(container=container)
        return b"up\n" in await collect(provider.logs(instance_id, options))

    await wait_for(printed, timeout=20, interval=0.05, what=f"{container} up")


def append(path: Path, text: str) -> str:
    return f"open({str(path)!r}, 'a').write({text!r} + '\\n')"


WAIT_FOR_TERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "print('up', flush=True)\n"
    "while True: time.sleep(0.05)\n"
)


async def test_init_containers_run_in_order_before_the_app(
    provider: LocalProvider, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    spec = pod(
        [c("app", f"{append(trace, 'app')}; print(open({str(trace)!r}).read(), end='')")],
        [c("first", append(trace, "first")), c("second", append(trace, "second"))],
    )
    created = await provider.create(spec, await offer(provider))
    done = await wait_state(provider, created.instance_id, InstanceState.EXITED, timeout=20)
    assert done.exit_code == 0
    assert trace.read_text().split() == ["first", "second", "app"]
    inits = named(done.init_containers)
    assert [s.name for s in done.init_containers] == ["first", "second"]
    assert all(s.state is ContainerState.TERMINATED and s.exit_code == 0 for s in inits.values())
    (app,) = done.containers
    assert (app.name, app.state, app.exit_code, app.reason) == (
        "app",
        ContainerState.TERMINATED,
        0,
        "Completed",
    )
    logs = await collect(provider.logs(created.instance_id, LogOptions()))
    assert logs == [b"first\n", b"second\n", b"app\n"]
    first = await collect(provider.logs(created.instance_id, LogOptions(container="first")))
    assert first == []


async def test_a_sidecar_runs_beside_the_app_and_is_stopped_after_it(
    provider: LocalProvider, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    sidecar = (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *_: ({append(trace, 'sidecar stopped')}, "
        "sys.exit(0)))\n"
        f"{append(trace, 'sidecar up')}\n"
        "while True: time.sleep(0.05)\n"
    )
    app = f"import os, time; time.sleep(0.3); {append(trace, 'app done')}"
    spec = pod([c("app", app)], [c("proxy", sidecar, sidecar=True)])
    created = await provider.create(spec, await offer(provider))
    running = await until(
        provider,
        created.instance_id,
        lambda i: any(s.state is ContainerState.RUNNING for s in i.init_containers),
        "the sidecar running",
    )
    assert running.state is InstanceState.RUNNING
    done = await wait_state(provider, created.instance_id, InstanceState.EXITED, timeout=20)
    assert done.exit_code == 0
    assert trace.read_text().split("\n")[:3] == ["sidecar up", "app done", "sidecar stopped"]
    (proxy,) = done.init_containers
    assert proxy.state is ContainerState.TERMINATED


async def test_always_restarts_a_failing_container_with_back_off_and_keeps_its_previous_log(
    provider: LocalProvider, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    script = (
        "import os, sys\n"
        f"n = len(open({str(runs)!r}).read()) if os.path.exists({str(runs)!r}) else 0\n"
        f"open({str(runs)!r}, 'a').write('x')\n"
        "print('run', n, flush=True)\n"
        "sys.exit(3)\n"
    )
    spec = pod([c("app", script)], policy="Always")
    created = await provider.create(spec, await offer(provider))
    restarted = await until(
        provider,
        created.instance_id,
        lambda i: i.containers and i.containers[0].restart_count >= 2,
        "two restarts",
    )
    assert restarted.state is InstanceState.RUNNING  # a restarting pod has not ended
    app = restarted.containers[0]
    assert app.last_termination is not None and app.last_termination.exit_code == 3
    assert app.last_termination.reason == "Error"
    waiting = await until(
        provider,
        created.instance_id,
        lambda i: i.containers[0].state is ContainerState.WAITING,
        "back-off",
    )
    assert waiting.containers[0].reason == "CrashLoopBackOff"
    assert "restarting failed container=app pod=p-pod-1" in waiting.containers[0].message
    previous = await collect(provider.logs(created.instance_id, LogOptions(previous=True)))
    current = await collect(provider.logs(created.instance_id, LogOptions()))
    assert len(previous) == 1 and previous[0].startswith(b"run ")
    assert current and int(current[0].split()[1]) == int(previous[0].split()[1]) + 1
    await provider.delete(created.instance_id, grace_seconds=1)
    await wait_state(provider, created.instance_id, InstanceState.TERMINATED)


@pytest.mark.parametrize(("code", "restarts"), [(0, False), (2, True)])
async def test_on_failure_restarts_only_a_failed_container(
    provider: LocalProvider, tmp_path: Path, code: int, restarts: bool
) -> None:
    marker = tmp_path / "ran-once"
    script = (
        "import os, sys\n"
        f"first = not os.path.exists({str(marker)!r})\n"
        f"open({str(marker)!r}, 'w').close()\n"
        f"sys.exit({code} if first else 0)\n"
    )
    created = await provider.create(
        pod([c("app", script)], policy="OnFailure"), await offer(provider)
    )
    done = await wait_state(provider, created.instance_id, InstanceState.EXITED, timeout=20)
    assert done.exit_code == 0
    assert done.containers[0].restart_count == (1 if restarts else 0)


async def test_a_failed_init_container_fails_the_pod_under_never(provider: LocalProvider) -> None:
    spec = pod([c("app", "print('never')")], [c("fetch", "import sys; sys.exit(4)")])
    created = await provider.create(spec, await offer(provider))
    done = await wait_state(provider, created.instance_id, InstanceState.EXITED, timeout=20)
    assert done.exit_code == 4
    (fetch,) = done.init_containers
    assert (fetch.state, fetch.exit_code) == (ContainerState.TERMINATED, 4)
    (app,) = done.containers
    assert (app.state, app.reason) == (ContainerState.WAITING, "PodInitializing")


async def test_a_failed_init_container_is_retried_under_always_until_it_succeeds(
    provider: LocalProvider, tmp_path: Path
) -> None:
    marker = tmp_path / "tried"
    fetch = (
        "import os, sys\n"
        f"if not os.path.exists({str(marker)!r}):\n"
        f"    open({str(marker)!r}, 'w').close(); sys.exit(1)\n"
    )
    spec = pod([c("app", WAIT_FOR_TERM)], [c("fetch", fetch)], policy="Always")
    created = await provider.create(spec, await offer(provider))
    running = await until(
        provider,
        created.instance_id,
        lambda i: i.containers and i.containers[0].state is ContainerState.RUNNING,
        "the app running after the retried init container",
    )
    (init,) = running.init_containers
    assert (init.state, init.exit_code, init.restart_count) == (ContainerState.TERMINATED, 0, 1)
    await up(provider, created.instance_id, "app")
    await provider.delete(created.instance_id, grace_seconds=5)
    done = await wait_state(provider, created.instance_id, InstanceState.TERMINATED)
    assert done.containers[0].exit_code == 0  # it left on SIGTERM


async def test_restart_container_stops_it_and_the_policy_restarts_it(
    provider: LocalProvider,
) -> None:
    spec = pod([c("app", WAIT_FOR_TERM), c("other", WAIT_FOR_TERM)], policy="Always")
    created = await provider.create(spec, await offer(provider))
    await until(
        provider,
        created.instance_id,
        lambda i: all(s.state is ContainerState.RUNNING for s in i.containers),
        "both running",
    )
    await up(provider, created.instance_id, "app")
    await provider.restart_container(created.instance_id, "app")
    again = await until(
        provider,
        created.instance_id,
        lambda i: (
            named(i.containers)["app"].restart_count == 1
            and named(i.containers)["app"].state is ContainerState.RUNNING
        ),
        "app restarted",
    )
    app, other = named(again.containers)["app"], named(again.containers)["other"]
    assert app.last_termination is not None and app.last_termination.exit_code == 0
    assert other.restart_count == 0 and other.state is ContainerState.RUNNING
    with pytest.raises(NotFound):
        await provider.restart_container(created.instance_id, "nope")
    await provider.delete(created.instance_id, grace_seconds=5)
    await wait_state(provider, created.instance_id, InstanceState.TERMINATED)


async def test_a_container_that_cannot_start_crash_loops_under_always(
    provider: LocalProvider,
) -> None:
    broken = ContainerSpec(name="broken", image="x", command=("/nonexistent/program",))
    spec = pod([c("app", WAIT_FOR_TERM), broken], policy="Always")
    created = await provider.create(spec, await offer(provider))
    looping = await until(
        provider,
        created.instance_id,
        lambda i: named(i.containers)["broken"].restart_count >= 1,
        "the broken container retried",
    )
    broken_status = named(looping.containers)["broken"]
    assert broken_status.last_termination is not None
    assert broken_status.last_termination.exit_code == 127
    assert broken_status.last_termination.reason == "ContainerCannotRun"
    await provider.delete(created.instance_id, grace_seconds=5)
    await wait_state(provider, created.instance_id, InstanceState.TERMINATED)


async def test_logs_name_a_container_and_refuse_unknown_ones(provider: LocalProvider) -> None:
    spec = pod([c("app", "print('a')"), c("side", "print('s')")])
    created = await provider.create(spec, await offer(provider))
    await wait_state(provider, created.instance_id, InstanceState.EXITED, timeout=20)
    side = await collect(provider.logs(created.instance_id, LogOptions(container="side")))
    assert side == [b"s\n"]
    with pytest.raises(NotFound, match="not valid"):
        await collect(provider.logs(created.instance_id, LogOptions(container="ghost")))
    with pytest.raises(NotFound, match="previous terminated container"):
        await collect(provider.logs(created.instance_id, LogOptions(previous=True)))
    # Released, the logs of each container stay until the instance is deleted once more.
    await provider.delete(created.instance_id, grace_seconds=0)
    kept = await collect(provider.logs(created.instance_id, LogOptions(container="side")))
    assert kept == [b"s\n"]
    await provider.delete(created.instance_id, grace_seconds=0)
    with pytest.raises(NotFound):
        await collect(provider.logs(created.instance_id, LogOptions(container="side")))


async def test_delete_stops_app_containers_before_sidecars(
    provider: LocalProvider, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"

    def stopper(label: str, delay: float) -> str:
        return (
            "import signal, sys, time\n"
            f"def stop(*_):\n    time.sleep({delay}); {append(trace, label)}; sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, stop)\n"
            "print('up', flush=True)\n"
            "while True: time.sleep(0.05)\n"
        )

    spec = pod([c("app", stopper("app", 0.5))], [c("proxy", stopper("proxy", 0.0), sidecar=True)])
    created = await provider.create(spec, await offer(provider))
    await up(provider, created.instance_id, "app")
    await up(provider, created.instance_id, "proxy")
    await provider.delete(created.instance_id, grace_seconds=10)
    await wait_state(provider, created.instance_id, InstanceState.TERMINATED)
    assert trace.read_text().split() == ["app", "proxy"]


async def test_the_plan_is_on_disk_for_exec_and_usage(
    provider: LocalProvider,
    state_dir: Path,  # noqa: F811
) -> None:
    spec = pod([c("app", WAIT_FOR_TERM)], [c("init", "pass")])
    created = await provider.create(spec, await offer(provider))
    directory = state_dir / created.instance_id
    order = json.loads((directory / "containers" / "order.json").read_text())
    assert order == ["init", "app"]
    plan = json.loads((directory / "pod.json").read_text())
    assert (plan["init"], plan["apps"], plan["restart_policy"]) == (["init"], ["app"], "Never")
    await until(
        provider,
        created.instance_id,
        lambda i: i.containers and i.containers[0].state is ContainerState.RUNNING,
        "app running",
    )
    process = json.loads((directory / "containers" / "app" / "process.json").read_text())
    assert Path(f"/proc/{process['pid']}").exists()
    await provider.delete(created.instance_id, grace_seconds=5)
    await wait_state(provider, created.instance_id, InstanceState.TERMINATED)
    assert not Path(f"/proc/{process['pid']}/stat").exists() or (
        Path(f"/proc/{process['pid']}/stat").read_text().split(") ")[1][0] == "Z"
    )


def test_capabilities_say_whole_pods_and_agent_probes(state_dir: Path) -> None:  # noqa: F811
    caps = LocalProvider(make_config(), state_dir=state_dir).capabilities
    assert caps.multi_container and caps.init_containers and caps.sidecars
    assert caps.probes == "agent" and caps.previous_logs


async def test_a_create_looks_only_at_its_offers_instances(
    state_dir: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import vk_provider_adapters.local.adapter as adapter

    local = LocalProvider(make_config(), state_dir=state_dir)
    cpu = await offer(local, "cpu")
    sleeper = [c("app", "import time; time.sleep(60)")]
    for uid in ("a", "b"):
        await local.create(pod(sleeper, uid=uid), cpu)
    looked: list[str] = []
    real = adapter.observe

    def counting(directory: Path, *, provider: str, ip: str) -> Instance | None:
        looked.append(directory.name)
        return real(directory, provider=provider, ip=ip)

    monkeypatch.setattr(adapter, "observe", counting)
    gpu = await offer(local, "a100")
    looked.clear()
    await local.create(pod(sleeper, uid="gpu"), gpu)
    # Its own directory (twice: the idempotency look and the answer), no other instance.
    assert set(looked) == {"local-gpu-0"}
    looked.clear()
    with pytest.raises(CapacityUnavailable):  # the cpu offer's two slots are taken
        await local.create(pod(sleeper, uid="c"), cpu)
    assert set(looked) == {"local-c-0", "local-a-0", "local-b-0"}  # not the GPU instance
