"""The local provider's exec, usage and port-forward, against real processes.

Each test lays out an instance directory as the pod runner writes it
(``providers/vk_provider_adapters/local/layout.py``): ``containers/order.json`` and, per container,
``env.json``, ``spec.json`` and the ``process.json`` of a real program this test started. Every
process a test starts is killed afterwards (``programs``), and every exec session is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.unit.test_local_provider import (  # noqa: F401 - state_dir is a fixture
    SLEEP,
    collect,
    make_config,
    make_spec,
    offer,
    state_dir,
    wait_state,
)
from vk_provider.domain.containers import ContainerSpec, ContainerUsage
from vk_provider.domain.contract import ExecSession
from vk_provider.domain.envvar import EnvVar, Port
from vk_provider.domain.errors import CapacityUnavailable, InvalidSpec, NotFound, Transient
from vk_provider.domain.models import InstanceState, LogOptions, PortEndpoint, WorkloadSpec
from vk_provider.settings.secrets import ConfigError
from vk_provider_adapters.local import netns as local_netns
from vk_provider_adapters.local import podnet
from vk_provider_adapters.local.adapter import LocalProvider
from vk_provider_adapters.local.exec import LocalExec, start_exec
from vk_provider_adapters.local.portforward import declared_ports, open_local_port
from vk_provider_adapters.local.processes import ProcessRecord, start_ticks
from vk_provider_adapters.local.usage import instance_usage
from vk_provider_dev.cluster import netns


class Programs:
    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL)
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def programs() -> Iterator[Programs]:
    started = Programs()
    try:
        yield started
    finally:
        started.stop_all()


def lay_out(
    instance: Path,
    programs: Programs,
    containers: dict[str, list[str]],
    *,
    env: dict[str, str] | None = None,
    ports: list[int] | None = None,
) -> dict[str, subprocess.Popen[bytes]]:
    """An instance directory whose containers run ``containers[name]``."""
    (instance / "containers").mkdir(parents=True)
    (instance / "containers" / "order.json").write_text(json.dumps(list(containers)))
    running = {}
    for name, argv in containers.items():
        directory = instance / "containers" / name
        directory.mkdir()
        workdir = instance / f"work-{name}"
        workdir.mkdir()
        spec = {"argv": argv, "cwd": str(workdir), "ports": ports or [], "init": False}
        (directory / "spec.json").write_text(json.dumps(spec))
        environment = {"PATH": os.environ["PATH"], "GREETING": f"hello from {name}"}
        (directory / "env.json").write_text(json.dumps({**environment, **(env or {})}))
        proc = programs.start(argv)
        ticks = start_ticks(proc.pid)
        assert ticks is not None
        record = ProcessRecord(name=name, pid=proc.pid, start_ticks=ticks)
        (directory / "process.json").write_text(json.dumps(record.to_json()))
        running[name] = proc
    return running


@pytest.fixture
def instance(tmp_path: Path, programs: Programs) -> Path:
    directory = tmp_path / "local-uid-0"
    lay_out(directory, programs, {"main": ["sleep", "300"], "side": ["sleep", "300"]})
    return directory


@pytest.fixture
async def sessions() -> AsyncIterator[list[LocalExec]]:
    opened: list[LocalExec] = []
    try:
        yield opened
    finally:
        for session in opened:
            await session.close()


async def run(
    instance: Path, sessions: list[LocalExec], command: list[str], *, tty: bool = False
) -> LocalExec:
    session = await start_exec(instance, "main", command, tty=tty, provider="local-a")
    sessions.append(session)
    return session


async def collect_output(session: LocalExec) -> tuple[bytes, bytes, int]:
    out, err = bytearray(), bytearray()
    async with asyncio.timeout(30):
        async for fd, chunk in session.output():
            (out if fd == 1 else err).extend(chunk)
        return bytes(out), bytes(err), await session.wait()


# --------------------------------------------------------------------------- exec


async def test_exec_runs_with_the_containers_env_and_working_dir(
    instance: Path, sessions: list[LocalExec]
) -> None:
    session = await run(
        instance, sessions, ["sh", "-c", 'echo "$GREETING"; pwd; echo oops >&2; exit 3']
    )
    out, err, code = await collect_output(session)
    assert out == f"hello from main\n{instance / 'work-main'}\n".encode()
    assert err == b"oops\n"
    assert code == 3


async def test_exec_stdin_reaches_the_command_until_closed(
    instance: Path, sessions: list[LocalExec]
) -> None:
    session = await run(instance, sessions, ["cat"])
    await session.write_stdin(b"hello ")
    await session.write_stdin(b"world\n")
    await session.close_stdin()
    assert await collect_output(session) == (b"hello world\n", b"", 0)


async def test_exec_on_a_terminal_resizes_and_sees_a_tty(
    instance: Path, sessions: list[LocalExec]
) -> None:
    session = await run(
        instance, sessions, ["sh", "-c", "read line; stty size; tty; echo got:$line"], tty=True
    )
    await session.resize(100, 30)
    await session.write_stdin(b"abc\n")
    out, err, code = await collect_output(session)
    text = out.decode()
    assert "30 100" in text
    assert "/dev/pts/" in text
    assert "got:abc" in text
    assert (err, code) == (b"", 0)


async def test_exec_on_a_terminal_ends_input_with_eof(
    instance: Path, sessions: list[LocalExec]
) -> None:
    session = await run(instance, sessions, ["cat"], tty=True)
    await session.write_stdin(b"line\n")
    await session.close_stdin()
    out, _, code = await collect_output(session)
    assert b"line" in out and code == 0


async def test_a_command_killed_by_a_signal_exits_128_plus_n(
    instance: Path, sessions: list[LocalExec]
) -> None:
    session = await run(instance, sessions, ["sh", "-c", "kill -TERM $$"])
    assert (await collect_output(session))[2] == 128 + signal.SIGTERM


async def test_an_unknown_executable_is_named(instance: Path) -> None:
    with pytest.raises(InvalidSpec, match='exec: "no-such-tool": executable file not found'):
        await start_exec(instance, "main", ["no-such-tool"], tty=False, provider="local-a")


async def test_a_container_that_is_not_running_has_no_exec(
    tmp_path: Path, programs: Programs
) -> None:
    directory = tmp_path / "local-uid-1"
    [proc] = lay_out(directory, programs, {"main": ["sleep", "300"]}).values()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    with pytest.raises(NotFound):
        await start_exec(directory, "main", ["true"], tty=False, provider="local-a")
    with pytest.raises(NotFound):
        await start_exec(directory, "other", ["true"], tty=False, provider="local-a")


async def test_close_kills_the_command_and_its_children(instance: Path) -> None:
    session = await start_exec(
        instance, "main", ["sh", "-c", "sleep 300 & echo $!; wait"], tty=False, provider="x"
    )
    first = b""
    async with asyncio.timeout(30):
        async for _, chunk in session.output():
            first += chunk
            if first.endswith(b"\n"):
                break
    child = int(first)
    await session.close()

    async def child_gone() -> bool:
        return _state(child) in ("gone", "Z")

    await wait_for(child_gone, timeout=30, interval=0.05, what="the background child to end")


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


async def test_a_background_child_does_not_hold_the_session_open(
    instance: Path, sessions: list[LocalExec]
) -> None:
    session = await run(instance, sessions, ["sh", "-c", "sleep 300 & echo started"])
    out, _, code = await collect_output(session)  # ends with the command, not with the sleep
    assert (out, code) == (b"started\n", 0)


# --------------------------------------------------------------------------- usage


async def test_usage_reports_each_running_container_of_the_instance(
    tmp_path: Path, programs: Programs
) -> None:
    directory = tmp_path / "local-uid-2"
    busy = [sys.executable, "-c", "import time\nend=time.time()+300\nwhile time.time()<end: pass"]
    lay_out(directory, programs, {"busy": busy, "idle": ["sh", "-c", "sleep 300 & wait"]})
    first = {u.name: u for u in instance_usage(directory)}

    async def grown() -> dict[str, ContainerUsage] | None:
        now = {u.name: u for u in instance_usage(directory)}
        busy_cpu = now["busy"].cpu_core_nanoseconds
        return now if busy_cpu > first["busy"].cpu_core_nanoseconds else None

    second = await wait_for(grown, timeout=30, interval=0.05, what="the busy container's CPU")
    assert set(second) == {"busy", "idle"}
    assert second["idle"].cpu_core_nanoseconds > 0  # schedstat: even an idle program has some
    # The idle container is a tree (sh and its sleep): both are resident.
    assert second["idle"].memory_working_set_bytes > 0
    assert second["busy"].memory_working_set_bytes > 1_000_000  # a Python interpreter


def test_usage_leaves_out_containers_that_do_not_run(tmp_path: Path, programs: Programs) -> None:
    directory = tmp_path / "local-uid-3"
    running = lay_out(directory, programs, {"gone": ["sleep", "300"], "here": ["sleep", "300"]})
    os.killpg(running["gone"].pid, signal.SIGKILL)
    running["gone"].wait()
    assert [u.name for u in instance_usage(directory)] == ["here"]


# --------------------------------------------------------------------------- port-forward


async def test_a_declared_port_is_forwarded_to_127_0_0_1(
    tmp_path: Path, programs: Programs
) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"reply:" + await reader.read(100))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    directory = tmp_path / "local-uid-4"
    lay_out(directory, programs, {"main": ["sleep", "300"]}, ports=[port, 9])
    assert declared_ports(directory) == {port, 9}
    try:
        stream = await open_local_port(directory, port, provider="local-a")
        await stream.write(b"hi")
        assert await stream.read(100) == b"reply:hi"
        assert await stream.read(100) == b""
        await stream.close()
        with pytest.raises(InvalidSpec, match=rf"declared containerPorts: 9, {port}"):
            await open_local_port(directory, 22, provider="local-a")
        with pytest.raises(Transient, match=r"failed to connect to 127\.0\.0\.1:9"):
            await open_local_port(directory, 9, provider="local-a")
    finally:
        server.close()
        await server.wait_closed()


# --------------------------------------------------------------------------- the real pod runner

SERVE = (
    "import os, socket, time\n"
    "server = socket.create_server(('127.0.0.1', int(os.environ['PORT'])))\n"
    "print('up', flush=True)\n"
    "while True:\n"
    "    connection, _ = server.accept()\n"
    "    connection.sendall(b'hello from ' + os.environ['WHO'].encode())\n"
    "    connection.close()\n"
)


async def test_exec_usage_and_port_forward_of_a_pod_the_runner_runs(
    state_dir: Path,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    provider = LocalProvider(make_config(), state_dir=state_dir)
    assert provider.capabilities.exec and provider.capabilities.port_forward
    assert provider.capabilities.usage
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    workdir = tmp_path / "work"
    workdir.mkdir()
    app = ContainerSpec(
        name="app",
        image="ignored",
        command=(sys.executable, "-c", SERVE),
        env=(EnvVar("PORT", str(port)), EnvVar("WHO", "app")),
        ports=(Port(port),),
        working_dir=str(workdir),
    )
    side = ContainerSpec(name="side", image="ignored", command=("sleep", "300"))
    spec = WorkloadSpec(
        pod_uid="exec-pod", namespace="default", pod_name="p", containers=(app, side)
    )
    created = await provider.create(spec, await offer(provider))
    await wait_state(provider, created.instance_id, InstanceState.RUNNING, timeout=20)

    async def app_up() -> bool:
        logs = await collect(provider.logs(created.instance_id, LogOptions(container="app")))
        return b"up\n" in logs

    await wait_for(app_up, timeout=20, interval=0.05, what="the app to listen")

    session = await provider.exec(
        created.instance_id, "app", ["sh", "-c", "echo $WHO; pwd"], tty=False
    )
    try:
        assert await collect_exec(session) == (f"app\n{workdir}\n".encode(), b"", 0)
    finally:
        await session.close()

    measured = {u.name: u for u in await provider.usage(created.instance_id)}
    assert set(measured) == {"app", "side"}
    assert all(u.cpu_core_nanoseconds > 0 and u.memory_working_set_bytes > 0
               for u in measured.values())  # fmt: skip

    stream = await provider.open_port(created.instance_id, port)
    try:
        assert await stream.read(100) == b"hello from app"
    finally:
        await stream.close()
    with pytest.raises(NotFound):
        await provider.exec("local-nope-0", "app", ["true"], tty=False)
    await provider.delete(created.instance_id, grace_seconds=0)


async def collect_exec(session: ExecSession) -> tuple[bytes, bytes, int]:
    out, err = bytearray(), bytearray()
    async with asyncio.timeout(30):
        async for fd, chunk in session.output():
            (out if fd == 1 else err).extend(chunk)
        return bytes(out), bytes(err), await session.wait()


# --------------------------------------------------------------------------- network namespaces

SERVE_ALL = SERVE.replace("('127.0.0.1',", "('0.0.0.0',")


@pytest.fixture
def two_namespaces() -> Iterator[list[netns.VethNamespace]]:
    """Two network namespaces, each reached from here over a veth pair of its own."""
    made: list[netns.VethNamespace] = []
    try:
        for name, seed in (("locala", 101), ("localb", 202)):
            made.append(netns.create(name, seed=seed))
        yield made
    finally:
        for link in made:
            netns.remove(link)


async def test_providers_in_network_namespaces_of_their_own_serve_the_same_port_apart(
    state_dir: Path,  # noqa: F811 - the fixture
    two_namespaces: list[netns.VethNamespace],
) -> None:
    """Two providers with ``network_namespace``: a pod each, both listening on the same port
    on every address, as pods on two nodes do. Each is reached at its namespace's address
    (the endpoint it reports, the agent's probes' ``ip``), its exec runs in that namespace,
    and a port-forward reaches it there."""
    port = 18311
    providers: list[tuple[LocalProvider, str]] = []  # each provider and its pod's instance
    try:
        for link in two_namespaces:
            config = make_config(
                name=link.namespace, network_namespace=link.namespace, address=link.peer_address
            )
            local = LocalProvider(config, state_dir=state_dir / link.namespace)
            app = ContainerSpec(
                name="app",
                image="ignored",
                command=(sys.executable, "-c", SERVE_ALL),
                env=(EnvVar("PORT", str(port)), EnvVar("WHO", link.namespace)),
                ports=(Port(port),),
            )
            spec = WorkloadSpec(
                pod_uid=f"pod-{link.namespace}", namespace="default", pod_name="p",
                containers=(app,),
            )  # fmt: skip
            created = await local.create(spec, await offer(local))
            providers.append((local, created.instance_id))
            running = await wait_state(local, created.instance_id, InstanceState.RUNNING)
            assert running.ip == link.peer_address
            assert [(e.address, e.port) for e in running.endpoints] == [(link.peer_address, port)]

            async def answers(address: str = link.peer_address) -> bytes | None:
                return await _answer(address, port)

            greeting = await wait_for(answers, timeout=20, interval=0.1, what="the pod")
            assert greeting == f"hello from {link.namespace}".encode()

            session = await local.exec(
                created.instance_id, "app", ["readlink", "/proc/self/ns/net"], tty=False
            )
            try:
                out, _, code = await collect_exec(session)
            finally:
                await session.close()
            inode = local_netns.namespace_path(link.namespace).stat().st_ino
            assert (out.strip(), code) == (f"net:[{inode}]".encode(), 0)

            stream = await local.open_port(created.instance_id, port)
            try:
                assert await stream.read(100) == f"hello from {link.namespace}".encode()
            finally:
                await stream.close()
    finally:
        for local, instance_id in providers:  # instances outlive a provider: stop them
            await local.delete(instance_id, grace_seconds=0)
            await wait_state(local, instance_id, InstanceState.TERMINATED)
            await local.close()


def test_a_network_namespace_needs_an_address_and_must_exist(state_dir: Path) -> None:  # noqa: F811
    with pytest.raises(ValueError, match="network_namespace needs address"):
        make_config(network_namespace="vk-nope")
    config = make_config(network_namespace="vk-nope", address="10.213.9.2")
    with pytest.raises(ConfigError, match="network_namespace 'vk-nope' does not exist"):
        LocalProvider(config, state_dir=state_dir)


# --------------------------------------------------------------------------- a network per pod


def _free_cidr() -> str:
    """A /28 of 10.214.0.0/16 that overlaps no network of this machine."""
    busy = netns.networks_in_use()
    for candidate in ipaddress.IPv4Network("10.214.0.0/16").subnets(new_prefix=28):
        if not any(candidate.overlaps(network) for network in busy):
            return str(candidate)
    raise AssertionError("no free /28 in 10.214.0.0/16")


def _namespaces() -> set[str]:
    listed = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True)
    return {entry["name"] for entry in json.loads(listed.stdout or "[]")}


async def _answer(address: str, port: int) -> bytes | None:
    try:
        reader, writer = await asyncio.open_connection(address, port)
    except OSError:
        return None
    try:
        return await reader.read(100)
    finally:
        writer.close()


async def test_each_pod_of_a_pod_network_listens_at_an_address_of_its_own(
    state_dir: Path,  # noqa: F811 - the fixture
) -> None:
    """``pod_network``: two pods of one provider, both on the same port, each in a network
    namespace of its own at its own /30, reached there (endpoint, probes' ``ip``, exec,
    port-forward); deleting a pod removes its namespace and veth."""
    port = 18321
    local = LocalProvider(make_config(pod_network=_free_cidr()), state_dir=state_dir)
    before = _namespaces()
    try:
        running = []
        for name in ("one", "two"):
            app = ContainerSpec(
                name="app", image="ignored", command=(sys.executable, "-c", SERVE_ALL),
                env=(EnvVar("PORT", str(port)), EnvVar("WHO", name)), ports=(Port(port),),
            )  # fmt: skip
            spec = WorkloadSpec(
                pod_uid=f"pod-{name}", namespace="default", pod_name=name, containers=(app,)
            )
            created = await local.create(spec, await offer(local))
            running.append(await wait_state(local, created.instance_id, InstanceState.RUNNING))
        addresses = [r.ip for r in running]
        assert len(set(addresses)) == 2 and all(a and a.startswith("10.214.") for a in addresses)
        for instance, name in zip(running, ("one", "two"), strict=True):
            assert instance.endpoints == (PortEndpoint(port, "TCP", str(instance.ip), port),)

            async def answers(address: str = str(instance.ip)) -> bytes | None:
                return await _answer(address, port)

            reply = await wait_for(answers, timeout=20, interval=0.1, what=f"pod {name}")
            assert reply == f"hello from {name}".encode()
            command = ["ip", "-4", "-o", "addr"]
            session = await local.exec(instance.instance_id, "app", command, tty=False)
            try:
                out, _, code = await collect_exec(session)
            finally:
                await session.close()
            assert code == 0 and f"inet {instance.ip}/30" in out.decode()
            stream = await local.open_port(instance.instance_id, port)
            try:
                assert await stream.read(100) == f"hello from {name}".encode()
            finally:
                await stream.close()
        assert len(_namespaces() - before) == 2

        for instance in running:
            await local.delete(instance.instance_id, grace_seconds=0)
            await wait_state(local, instance.instance_id, InstanceState.TERMINATED)
            await local.delete(instance.instance_id, grace_seconds=0)  # released: its network goes
        assert _namespaces() == before
    finally:
        await local.close()


async def test_a_full_pod_network_refuses_the_pod_and_a_failed_one_leaves_nothing(
    state_dir: Path,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cidr = _free_cidr().replace("/28", "/30")  # room for one pod
    local = LocalProvider(make_config(pod_network=cidr), state_dir=state_dir)
    before = _namespaces()
    try:
        spec = make_spec(SLEEP, uid="first")
        first = await local.create(spec, await offer(local))
        with pytest.raises(CapacityUnavailable, match="no free /30"):
            await local.create(make_spec(SLEEP, uid="second"), await offer(local))
        await local.delete(first.instance_id, grace_seconds=0)
        await wait_state(local, first.instance_id, InstanceState.TERMINATED)
        await local.delete(first.instance_id, grace_seconds=0)
        assert _namespaces() == before

        monkeypatch.setattr(podnet.shutil, "which", lambda _tool: None)
        with pytest.raises(Transient, match="needs the ip tool"):
            await local.create(make_spec(SLEEP, uid="third"), await offer(local))
        assert not list(state_dir.glob("local-third-*"))
    finally:
        await local.close()


def test_a_pod_network_is_one_cidr_apart_from_address_and_namespace() -> None:
    with pytest.raises(ValueError, match="leave address and network_namespace unset"):
        make_config(pod_network="10.214.0.0/24", address="10.213.0.2")
    with pytest.raises(ValueError, match="at most a /30"):
        make_config(pod_network="10.214.0.0/31")
    with pytest.raises(ValueError, match="not an IPv4 network"):
        make_config(pod_network="10.214.0.1/24")
