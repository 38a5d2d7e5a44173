"""The Lambda adapter's SSH path end to end, against real OpenSSH servers on 127.0.0.x.

Each fake VM is one real ``sshd -D`` (``tests.openssh``: Debian's package, extracted and
cached) on its own loopback address, all on one port (the adapter's ``ssh_port``), with the
host key the adapter derived for that VM, as cloud-init would install it, and the agent's
public key in its authorized_keys, as Lambda would. On its PATH: a fake ``docker`` that reports
containers and logs from files the test writes, and a pass-through ``sudo``. The Lambda HTTP
API is the respx fake of ``tests.contract.harness_lambda`` (its SSH-key endpoints included).
So asyncssh, the probe script, its parser and the state table all run for real; only Docker
is played. The last test boots a VM for real: it runs the ``run.sh`` of the user_data the
adapter sent, which waits for and receives the secret environment's passphrase over SSH.

Tests wait on conditions, never on fixed sleeps; every sshd and boot script a test starts is
killed when it ends (``FakeVms.stop_all``; sshd also dies with the test process).
"""

from __future__ import annotations

import asyncio
import getpass
import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.contract.harness_lambda import (
    API_KEY,
    FakeClock,
    FakeLambda,
    make_config,
)
from tests.helpers import wait_for
from tests.openssh import Sshd, SshdBinary, SshdUnavailable, ensure_sshd
from tests.unit import canary
from tests.workloads import workload
from vk_provider.domain.containers import ContainerSpec, ContainerState
from vk_provider.domain.errors import NotFound, Transient
from vk_provider.domain.models import EnvVar, Instance, InstanceState, LogOptions, WorkloadSpec
from vk_provider_adapters.boot_script import INSPECT_FORMAT as INSPECT_STATUS
from vk_provider_adapters.docker_run import container_name_for, sandbox_name_for
from vk_provider_adapters.lambda_cloud.adapter import LambdaCloudProvider
from vk_provider_adapters.lambda_cloud.remote import INSPECT_FORMAT
from vk_provider_adapters.transport import RetryPolicy
from vk_provider_dev.cluster.ports import free_port

UID = "5d0c1e2f-3a4b-4c5d-8e9f-0a1b2c3d4e5f"

FAKE_DOCKER = """#!{python}
import json, os, sys, time
vm = os.environ["FAKE_VM"]
args = sys.argv[1:]
with open(os.path.join(vm, "calls"), "a") as calls:
    calls.write(json.dumps(args) + "\\n")
def at(*parts):
    return os.path.join(vm, *parts)
command = args[0] if args else ""
if command == "inspect":
    name = args[-1]
    try:
        inspected = json.load(open(at("containers", name + ".json")))
    except FileNotFoundError:
        print("Error: No such object: " + name, file=sys.stderr)
        sys.exit(1)
    form = args[args.index("--format") + 1] if "--format" in args else ""
    if form == {status_format!r}:  # run.sh's
        print(inspected["State"]["Status"], inspected["State"]["ExitCode"])
    else:  # the probe's format, or none: what the test wrote
        print(json.dumps(inspected))
elif command == "logs":
    name = args[-1]
    stamp = "2026-12-01T10:00:00.000000000Z " if "--timestamps" in args else ""
    log, done = at("logs", name + ".log"), at("logs", name + ".done")
    text = open(log).read() if os.path.exists(log) else ""
    lines = text.splitlines(True)
    if "--tail" in args:
        lines = lines[len(lines) - int(args[args.index("--tail") + 1]):]
    for line in lines:
        sys.stdout.write(stamp + line)
    sys.stdout.flush()
    offset = len(text)
    while "--follow" in args:
        text = open(log).read() if os.path.exists(log) else ""
        if len(text) > offset:
            for line in text[offset:].splitlines(True):
                sys.stdout.write(stamp + line)
            sys.stdout.flush()
            offset = len(text)
        elif os.path.exists(done):
            break
        else:
            time.sleep(0.02)
elif command == "run":
    name = args[args.index("--name") + 1]
    names = [args[i + 1] for i, a in enumerate(args) if a == "--env"]
    files = [args[i + 1] for i, a in enumerate(args) if a == "--env-file"]
    with open(at("run.json"), "w") as out:
        json.dump({{"argv": args, "env": {{n: os.environ.get(n) for n in names}},
                   "env_files": {{f: open(f).read() for f in files}}}}, out)
    os.makedirs(at("containers"), exist_ok=True)
    with open(at("containers", name + ".json"), "w") as out:
        json.dump({{"State": {{"Status": "running", "Running": True, "ExitCode": 0,
                   "Error": "", "StartedAt": "2026-12-01T10:00:00.5Z",
                   "FinishedAt": "0001-01-01T00:00:00Z"}}, "RestartCount": 0}}, out)
    print("0123abcd")
elif command == "info" and "--format" in args:
    print(json.dumps({{"runc": {{}}, "nvidia": {{"path": "nvidia-container-runtime"}}}}))
"""

# run.sh's own format (braces doubled: FAKE_DOCKER is a str.format template).
FAKE_DOCKER = FAKE_DOCKER.replace(
    "{status_format!r}", repr(INSPECT_STATUS).replace("{", "{{").replace("}", "}}")
)

FAKE_SUDO = '#!/bin/sh\n[ "$1" = -n ] && shift\nexec "$@"\n'
FAKE_NVIDIA_SMI = "#!/bin/sh\necho 'GPU 0: NVIDIA A10 (UUID: GPU-0)'\n"

# Distinct loopback addresses for the fake VMs of one test run (all of 127.0.0.0/8 is lo).
_ADDRESSES = (f"127.0.0.{n}" for n in itertools.cycle(range(2, 255)))


@pytest.fixture(scope="session")
def sshd_binary() -> SshdBinary:
    try:
        return ensure_sshd()
    except SshdUnavailable as exc:
        pytest.fail(f"no sshd for the SSH tests: {exc}")


@dataclass
class FakeVm:
    """One fake VM: its sshd, its files (``FAKE_VM``) and its relative boot-script state."""

    instance_id: str
    request_id: str
    root: Path
    sshd: Sshd
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def container(self) -> str:
        """The pod's sandbox (what the probe is given)."""
        return sandbox_name_for(self.request_id)

    def docker_name(self, name: str = "main") -> str:
        return container_name_for(self.request_id, name)

    @property
    def state(self) -> Path:
        return self.root / "state"

    def phase(self, text: str) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        (self.state / "phase").write_text(text + "\n")

    def ended(self, code: int, message: str = "the pod's app containers exited") -> None:
        """What run.sh leaves when the pod has ended."""
        self.phase(f"exited {message} (exit code {code})")
        (self.state / "exit-code").write_text(f"{code}\n")

    def container_state(
        self,
        status: str,
        exit_code: int = 0,
        error: str = "",
        *,
        name: str = "main",
        restarts: int = 0,
    ) -> None:
        """``docker inspect`` of one container, shaped as Docker answers (``.State`` as its
        API's ContainerState, ``RestartCount`` beside it)."""
        (self.root / "containers").mkdir(exist_ok=True)
        ended = status in ("exited", "restarting")
        state = {
            "Status": status,
            "Running": status in ("running", "restarting"),
            "Paused": False,
            "Restarting": status == "restarting",
            "OOMKilled": False,
            "Dead": False,
            "Pid": 4242 if status == "running" else 0,
            "ExitCode": exit_code,
            "Error": error,
            "StartedAt": "2026-12-01T10:00:00.123456789Z",
            "FinishedAt": "2026-12-01T10:05:00.25Z" if ended else "0001-01-01T00:00:00Z",
        }
        inspected = {"State": state, "RestartCount": restarts}
        path = self.root / "containers" / f"{self.docker_name(name)}.json"
        path.write_text(json.dumps(inspected))

    def log(self, *lines: str, name: str = "main") -> None:
        (self.root / "logs").mkdir(exist_ok=True)
        with (self.root / "logs" / f"{self.docker_name(name)}.log").open("a") as out:
            out.write("".join(line + "\n" for line in lines))

    def end_log(self, name: str = "main") -> None:
        (self.root / "logs" / f"{self.docker_name(name)}.done").touch()

    def docker_calls(self) -> list[list[str]]:
        path = self.root / "calls"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class FakeVms:
    """Starts fake VMs for one test and stops every one of them (and their boot scripts)."""

    def __init__(self, binary: SshdBinary, root: Path) -> None:
        self._binary = binary
        self._root = root
        self.port = free_port()
        self.vms: list[FakeVm] = []

    def start(
        self, fake: FakeLambda, provider: LambdaCloudProvider, instance_id: str, *, host_key: str
    ) -> FakeVm:
        instance = fake.instances[instance_id]
        request_id = next(t["value"] for t in instance["tags"] if t["key"].endswith("request-id"))
        address = next(_ADDRESSES)
        instance["ip"] = address
        root = self._root / f"vm-{len(self.vms)}"
        bin_dir = root / "bin"
        bin_dir.mkdir(parents=True)
        for name, text in (
            ("docker", FAKE_DOCKER.format(python=sys.executable)),
            ("sudo", FAKE_SUDO),
            ("nvidia-smi", FAKE_NVIDIA_SMI),
        ):
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
        registered = [key["public_key"] for key in fake.ssh_keys.values()]
        sshd = Sshd(
            self._binary,
            directory=root / "sshd",
            address=address,
            port=self.port,
            host_key=host_key,
            authorized_keys=registered,
            path=[bin_dir],
            env={"FAKE_VM": str(root)},
            workdir=root,  # so the relative state dir "state" is this VM's
        )
        vm = FakeVm(instance_id, request_id, root, sshd)
        self.vms.append(vm)
        sshd.start()
        return vm

    def stop_all(self) -> None:
        for vm in self.vms:
            for process in vm.processes:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
            vm.sshd.stop()
        for vm in self.vms:
            assert not vm.sshd.running
            assert vm.sshd.pid is None or not _alive(vm.sshd.pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in _status(pid)


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return ""


@pytest.fixture
def vms(sshd_binary: SshdBinary, tmp_path: Path) -> Iterator[FakeVms]:
    started = FakeVms(sshd_binary, tmp_path / "vms")
    try:
        yield started
    finally:
        started.stop_all()


@pytest.fixture
def fake() -> FakeLambda:
    return FakeLambda(clock=FakeClock())


def adapter(
    fake: FakeLambda, tmp_path: Path, port: int, *, vm_state_dir: str = "state", **overrides: Any
) -> LambdaCloudProvider:
    key_file = tmp_path / "api-key"
    key_file.write_text(API_KEY + "\n")
    clock = FakeClock()
    settings: dict[str, Any] = {
        "ssh_port": port,
        "ssh_user": getpass.getuser(),
        "ssh_connect_timeout_seconds": 10,
        "ssh_command_timeout_seconds": 20,
        **overrides,
    }
    return LambdaCloudProvider(
        make_config(key_file, **settings),
        transport=fake.transport,
        clock=clock,
        sleep=clock.sleep,
        retry=RetryPolicy(attempts=2, backoff_seconds=0.1),
        state_dir=tmp_path / "agent-state",
        vm_state_dir=vm_state_dir,
    )


@pytest.fixture
async def provider(
    fake: FakeLambda, vms: FakeVms, tmp_path: Path
) -> AsyncIterator[LambdaCloudProvider]:
    made = adapter(fake, tmp_path, vms.port)
    try:
        yield made
    finally:
        await made.close()


def spec(attempt: int = 0, **overrides: Any) -> WorkloadSpec:
    fields: dict[str, Any] = {
        "pod_uid": UID,
        "namespace": "ml",
        "pod_name": "job",
        "container_name": "main",
        "image": "registry.example/job:1",
        "command": ("python", "job.py"),
        "gpu_count": 1,
        "attempt": attempt,
    }
    fields.update(overrides)
    return workload(**fields)


async def launched_vm(
    fake: FakeLambda,
    provider: LambdaCloudProvider,
    vms: FakeVms,
    *,
    attempt: int = 0,
    host_key: str | None = None,
    workload: WorkloadSpec | None = None,
) -> FakeVm:
    """A VM launched through the adapter, active, with its sshd up (as Lambda would)."""
    offer = next(o for o in await provider.offers() if o.sku == "gpu_1x_a10")
    instance = await provider.create(workload or spec(attempt), offer)
    fake.instances[instance.instance_id]["status"] = "active"
    body = fake.launch_bodies[-1]
    user_data = yaml.safe_load(body["user_data"])
    private = user_data["ssh_keys"]["ed25519_private"]
    vm = vms.start(fake, provider, instance.instance_id, host_key=host_key or private)
    for entry in user_data["write_files"]:  # the pod's layout, as cloud-init writes it
        if entry["path"].endswith("/pod.list"):
            vm.state.mkdir(parents=True, exist_ok=True)
            (vm.root / entry["path"]).write_text(entry["content"])
    return vm


# --- states ---------------------------------------------------------------------------------


async def test_a_running_container_is_running(
    fake: FakeLambda, provider: LambdaCloudProvider, vms: FakeVms
) -> None:
    vm = await launched_vm(fake, provider, vms)
    vm.phase("running the container runs")
    vm.container_state("running")
    got = await provider.get(vm.instance_id)
    assert got.state is InstanceState.RUNNING, got.message
    assert got.started_at is not None and got.started_at.isoformat().startswith("2026-12-01T10")
    (listed,) = await provider.list_ours()
    assert listed.state is InstanceState.RUNNING
    inspect = ["inspect", "--type", "container", "--format", INSPECT_FORMAT, vm.docker_name()]
    assert inspect in vm.docker_calls()
    (main,) = got.containers
    assert (main.name, main.state, main.restart_count) == ("main", ContainerState.RUNNING, 0)


@pytest.mark.parametrize("code", [0, 3])
async def test_an_exited_container_is_exited_with_its_code(
    fake: FakeLambda, provider: LambdaCloudProvider, vms: FakeVms, code: int
) -> None:
    vm = await launched_vm(fake, provider, vms)
    vm.phase("running the container runs")
    vm.container_state("running")
    assert (await provider.get(vm.instance_id)).state is InstanceState.RUNNING
    vm.container_state("exited", exit_code=code)
    vm.ended(code)
    got = await provider.get(vm.instance_id)
    assert (got.state, got.exit_code) == (InstanceState.EXITED, code)
    assert got.containers[0].exit_code == code
    assert got.finished_at is not None
    # The exit is final: the VM stopping to answer does not undo it, and the agent's release
    # terminates the VM at once.
    vm.sshd.stop()
    assert (await provider.get(vm.instance_id)).state is InstanceState.EXITED
    await provider.delete(vm.instance_id, grace_seconds=0)
    assert vm.instance_id not in fake.instances


@pytest.mark.parametrize(
    ("phase", "container", "start_error", "state", "code", "message"),
    [
        (
            "failed-start docker run of main exited with 125",
            None,
            "docker: Error response from daemon: pull access denied for registry.example/job",
            InstanceState.EXITED,
            125,
            "pull access denied",
        ),
        (
            "failed-start docker run of main exited with 125",
            ("created", 128, 'could not select device driver "" with capabilities: [[gpu]]'),
            "",
            InstanceState.EXITED,
            125,
            "could not select device driver",
        ),
        (
            "failed-host no NVIDIA GPU is usable on this VM (nvidia-smi fails: no driver?)",
            None,
            "",
            InstanceState.LOST,
            None,
            "no NVIDIA GPU is usable",
        ),
    ],
)
async def test_a_container_that_never_starts_says_why(
    fake: FakeLambda,
    provider: LambdaCloudProvider,
    vms: FakeVms,
    phase: str,
    container: tuple[str, int, str] | None,
    start_error: str,
    state: InstanceState,
    code: int | None,
    message: str,
) -> None:
    vm = await launched_vm(fake, provider, vms)
    vm.phase(phase)
    if start_error:
        (vm.state / "containers" / "main").mkdir(parents=True)
        (vm.state / "containers" / "main" / "start-error").write_text(start_error + "\n")
    if container is not None:
        vm.container_state(container[0], container[1], container[2])
    got = await provider.get(vm.instance_id)
    assert (got.state, got.exit_code) == (state, code), got.message
    assert message in got.message
    if state is InstanceState.EXITED:  # the container that could not start says so
        (main,) = got.containers
        assert (main.state, main.reason) == (ContainerState.TERMINATED, "StartError")
        assert message in main.message


@pytest.mark.parametrize(
    ("phase", "message"),
    [
        (None, "cloud-init is preparing the VM"),
        ("setup installing the NVIDIA container toolkit", "installing the NVIDIA container"),
        ("pulling pulling image registry.example/job:1", "pulling image registry.example/job:1"),
    ],
)
async def test_a_vm_still_booting_is_pending_saying_which_step(
    fake: FakeLambda,
    provider: LambdaCloudProvider,
    vms: FakeVms,
    phase: str | None,
    message: str,
) -> None:
    vm = await launched_vm(fake, provider, vms)
    if phase is not None:
        vm.phase(phase)
    got = await provider.get(vm.instance_id)
    assert got.state is InstanceState.PENDING
    assert message in got.message


async def test_the_passphrase_is_delivered_only_while_the_vm_waits_for_it(
    fake: FakeLambda, provider: LambdaCloudProvider, vms: FakeVms
) -> None:
    vm = await launched_vm(fake, provider, vms)
    vm.phase("setup installing the NVIDIA container toolkit")
    await provider.get(vm.instance_id)
    assert not (vm.state / "keys").exists()  # sent, but the VM does not wait for it yet
    vm.phase("waiting-key waiting for the agent to deliver the secret environment's key")
    got = await provider.get(vm.instance_id)
    assert "secret environment" in got.message
    stored = (vm.state / "keys" / "env.pass").read_text().strip()
    assert len(stored) == 64 and stored in _passphrases(provider, vm)
    assert oct((vm.state / "keys").stat().st_mode & 0o777) == "0o700"
    assert oct((vm.state / "keys" / "env.pass").stat().st_mode & 0o777) == "0o600"
    # Once the boot script is past that, the passphrase is not sent any more.
    (vm.state / "keys" / "env.pass").unlink()
    vm.phase("pulling pulling image")
    await provider.get(vm.instance_id)
    vm.phase("waiting-key back again (a test's fiction)")
    await provider.get(vm.instance_id)
    assert not (vm.state / "keys" / "env.pass").exists()


def _passphrases(provider: LambdaCloudProvider, vm: FakeVm) -> set[str]:
    key = provider._agent_key  # the test checks what the adapter derived
    return {key.env_passphrase(vm.request_id)}


def whole_pod() -> WorkloadSpec:
    """An init container, a native sidecar and two app containers."""
    return spec(
        init_containers=(
            ContainerSpec("fetch", "registry.example/fetch:1"),
            ContainerSpec("proxy", "registry.example/proxy:1", restart_policy="Always"),
        ),
        containers=(
            ContainerSpec("main", "registry.example/job:1", gpu_count=1),
            ContainerSpec("exporter", "registry.example/exporter:1"),
        ),
    )


async def test_every_container_of_a_whole_pod_is_read_in_one_probe(
    fake: FakeLambda, provider: LambdaCloudProvider, vms: FakeVms
) -> None:
    vm = await launched_vm(fake, provider, vms, workload=whole_pod())
    vm.phase("running starting the app containers")
    vm.container_state("exited", 0, name="fetch")
    vm.container_state("running", name="proxy", restarts=2)
    vm.container_state("restarting", 1, name="main", restarts=3)
    # exporter: not created yet
    calls = len(vm.docker_calls())
    logins = vm.sshd.logins()
    got = await provider.get(vm.instance_id)
    assert got.state is InstanceState.RUNNING, got.message
    fetch, proxy = got.init_containers
    assert (fetch.name, fetch.state, fetch.exit_code, fetch.reason) == (
        "fetch",
        ContainerState.TERMINATED,
        0,
        "Completed",
    )
    assert (proxy.name, proxy.state, proxy.restart_count) == ("proxy", ContainerState.RUNNING, 2)
    (main,) = got.containers  # the exporter is not reported: the agent shows it waiting
    assert (main.state, main.reason, main.restart_count) == (
        ContainerState.WAITING,
        "CrashLoopBackOff",
        3,
    )
    assert main.last_termination is not None and main.last_termination.exit_code == 1
    # One SSH round trip: every container inspected by its name, in the pod's order.
    inspected = [c[-1] for c in vm.docker_calls()[calls:] if c[0] == "inspect"]
    names = ("fetch", "proxy", "main", "exporter")
    assert inspected == [vm.docker_name(n) for n in names]
    assert vm.sshd.logins() - logins <= 1


async def test_logs_are_read_per_container(
    fake: FakeLambda, provider: LambdaCloudProvider, vms: FakeVms
) -> None:
    vm = await launched_vm(fake, provider, vms, workload=whole_pod())
    vm.phase("running starting the app containers")
    for name in ("main", "exporter"):
        vm.container_state("running", name=name)
        vm.log(f"hello from {name}", name=name)
        vm.end_log(name=name)
    exporter = LogOptions(container="exporter")
    assert [c async for c in provider.logs(vm.instance_id, exporter)] == [b"hello from exporter\n"]
    # None: the first app container, as kubectl logs without -c on a one-app pod.
    assert [c async for c in provider.logs(vm.instance_id, LogOptions())] == [b"hello from main\n"]
    with pytest.raises(NotFound, match="no container"):
        async for _ in provider.logs(vm.instance_id, LogOptions(container="fetch")):
            pass
    logged = [c[-1] for c in vm.docker_calls() if c[0] == "logs"]
    assert logged == [vm.docker_name("exporter"), vm.docker_name("main")]


# --- logs -------------------------------------------------------------------------------------


async def test_logs_follow_the_container_until_it_ends(
    fake: FakeLambda, provider: LambdaCloudProvider, vms: FakeVms
) -> None:
    vm = await launched_vm(fake, provider, vms)
    vm.phase("running the container runs")
    vm.container_state("running")
    vm.log("epoch 1", "epoch 2", "epoch 3")
    received: list[bytes] = []
    options = LogOptions(tail_lines=2, follow=True, timestamps=True)

    async def read() -> None:
        async for chunk in provider.logs(vm.instance_id, options):
            received.append(chunk)

    reader = asyncio.create_task(read())
    try:

        async def two_lines() -> bool:
            return len(received) >= 2

        await wait_for(two_lines, timeout=30, interval=0.05, what="the tail of the log")
        vm.log("epoch 4 has a 'quote' and a \\ backslash")

        async def three_lines() -> bool:
            return len(received) >= 3

        await wait_for(three_lines, timeout=30, interval=0.05, what="a followed line")
        vm.end_log()
        await asyncio.wait_for(reader, 30)
    finally:
        reader.cancel()
    stamp = b"2026-12-01T10:00:00.000000000Z "
    assert received == [
        stamp + b"epoch 2\n",
        stamp + b"epoch 3\n",
        stamp + b"epoch 4 has a 'quote' and a \\ backslash\n",
    ]
    (call,) = [c for c in vm.docker_calls() if c[0] == "logs"]
    assert call == ["logs", "--tail", "2", "--timestamps", "--follow", vm.docker_name()]


async def test_logs_of_a_vm_without_a_container_yet_are_not_found(
    fake: FakeLambda, provider: LambdaCloudProvider, vms: FakeVms
) -> None:
    vm = await launched_vm(fake, provider, vms)
    vm.phase("pulling pulling image")
    with pytest.raises(NotFound, match="no container yet"):
        async for _ in provider.logs(vm.instance_id, LogOptions(since_seconds=60)):
            pass


# --- connections, host keys, reachability ---------------------------------------------------


async def test_one_connection_per_vm_is_reused_and_closed(
    fake: FakeLambda, provider: LambdaCloudProvider, vms: FakeVms
) -> None:
    vm = await launched_vm(fake, provider, vms)
    vm.phase("running the container runs")
    vm.container_state("running")
    vm.log("hello")
    vm.end_log()
    for _ in range(3):
        await provider.get(vm.instance_id)
        await provider.list_ours()
    assert [c async for c in provider.logs(vm.instance_id, LogOptions())] == [b"hello\n"]
    await asyncio.gather(*(provider.get(vm.instance_id) for _ in range(4)))
    assert vm.sshd.logins() == 1
    await provider.close()

    async def disconnected() -> bool:
        return "Disconnected from user" in vm.sshd.log.read_text(errors="replace")

    await wait_for(disconnected, timeout=30, what="the agent to close its SSH connection")


async def test_a_vm_with_another_host_key_is_never_trusted(
    fake: FakeLambda, provider: LambdaCloudProvider, vms: FakeVms
) -> None:
    impostor = _other_host_key()
    vm = await launched_vm(fake, provider, vms, host_key=impostor)
    vm.phase("running the container runs")
    vm.container_state("running")
    got = await provider.get(vm.instance_id)
    assert got.state is InstanceState.PENDING
    assert "host key is not the one the agent gave the VM" in got.message
    assert vm.docker_calls() == []  # nothing ran there
    assert not (vm.state / "keys").exists()


def _other_host_key() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    return (
        ed25519.Ed25519PrivateKey.generate()
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
        .decode()
    )


async def test_an_unreachable_vm_is_transient_never_not_found(
    fake: FakeLambda, provider: LambdaCloudProvider, vms: FakeVms
) -> None:
    vm = await launched_vm(fake, provider, vms)
    vm.phase("running the container runs")
    vm.container_state("running")
    assert (await provider.get(vm.instance_id)).state is InstanceState.RUNNING
    vm.sshd.stop()
    await provider._watch._shell.forget(vm.instance_id)  # as if the connection dropped
    with pytest.raises(Transient, match="over SSH"):
        await provider.get(vm.instance_id)
    (listed,) = await provider.list_ours()  # the poll keeps the last state, saying why
    assert listed.state is InstanceState.RUNNING
    assert "not reachable over SSH just now" in listed.message


async def test_a_vm_never_reached_is_pending_then_lost(
    fake: FakeLambda, vms: FakeVms, tmp_path: Path
) -> None:
    provider = adapter(fake, tmp_path, vms.port, ssh_unreachable_seconds=60)
    try:
        offer = next(o for o in await provider.offers() if o.sku == "gpu_1x_a10")
        created = await provider.create(spec(), offer)
        fake.instances[created.instance_id]["status"] = "active"
        fake.instances[created.instance_id]["ip"] = next(_ADDRESSES)  # nothing listens there
        got = await provider.get(created.instance_id)
        assert got.state is InstanceState.PENDING
        assert "waiting to reach it over SSH" in got.message
        provider._clock.now += 61  # type: ignore[attr-defined]
        (listed,) = await provider.list_ours()
        assert listed.state is InstanceState.LOST
        assert "is port" in listed.message
    finally:
        await provider.close()


async def test_one_poll_reads_every_vm_with_one_api_call(
    fake: FakeLambda, provider: LambdaCloudProvider, vms: FakeVms
) -> None:
    running = await launched_vm(fake, provider, vms, attempt=0)
    exited = await launched_vm(fake, provider, vms, attempt=1)
    booting = await launched_vm(fake, provider, vms, attempt=2)
    running.phase("running the container runs")
    running.container_state("running")
    exited.container_state("exited", exit_code=7)
    exited.ended(7)
    fake.instances[booting.instance_id]["status"] = "booting"
    lists = len(fake.calls("list"))
    states = {i.instance_id: (i.state, i.exit_code) for i in await provider.list_ours()}
    assert len(fake.calls("list")) == lists + 1
    assert states == {
        running.instance_id: (InstanceState.RUNNING, None),
        exited.instance_id: (InstanceState.EXITED, 7),
        booting.instance_id: (InstanceState.PENDING, None),
    }
    assert booting.sshd.logins() == 0  # a booting VM is not asked


# --- a real boot -----------------------------------------------------------------------------


async def test_a_real_boot_gets_its_secrets_over_ssh_and_runs_the_container(
    fake: FakeLambda, vms: FakeVms, tmp_path: Path
) -> None:
    state_dir = tmp_path / "vm-root" / "var-lib-vk-provider"
    provider = adapter(fake, tmp_path, vms.port, vm_state_dir=str(state_dir))
    try:
        offer = next(o for o in await provider.offers() if o.sku == "gpu_1x_a10")
        workload = spec(env=(EnvVar("HF_TOKEN", canary.SECRET, secret=True), EnvVar("A", "1")))
        created = await provider.create(workload, offer)
        (launch,) = fake.calls("launch")
        body = launch.content.decode()
        assert not canary.leaks(body, [canary.SECRET]), "a secret value is in the launch body"
        assert provider._agent_key.env_passphrase(workload.request_id) not in body
        user_data = yaml.safe_load(json.loads(body)["user_data"])
        vm = vms.start(
            fake,
            provider,
            created.instance_id,
            host_key=user_data["ssh_keys"]["ed25519_private"],
        )
        for entry in user_data["write_files"]:  # cloud-init's write_files
            target = Path(entry["path"])
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(entry["content"])
            target.chmod(int(entry["permissions"], 8))
        bin_dir = vm.root / "bin"
        boot_env = {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "FAKE_VM": str(vm.root),
            "VK_POD_POLL_SECONDS": "0.1",
        }
        vm.processes.append(
            subprocess.Popen(
                ["/bin/bash", user_data["runcmd"][0][-1]],
                env=boot_env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        fake.instances[created.instance_id]["status"] = "active"

        async def running() -> Instance | None:
            got = await provider.get(created.instance_id)
            return got if got.state is InstanceState.RUNNING else None

        await wait_for(running, timeout=60, interval=0.2, what="the booted VM to run the pod")
        run = json.loads((vm.root / "run.json").read_text())
        received: dict[str, str] = {}
        for content in run["env_files"].values():
            for line in content.splitlines():
                if line and not line.startswith("#"):
                    name, _, value = line.partition("=")
                    received[name] = value
        received.update(run["env"])
        assert received == {"A": "1", "HF_TOKEN": canary.SECRET}
        assert not (state_dir / "keys" / "env.pass").exists()
        assert not (state_dir / "containers" / "main" / "secret.env").exists()
        vm.container_state("exited", exit_code=3)

        async def exited() -> Instance | None:
            (got,) = await provider.list_ours()
            return got if got.state is InstanceState.EXITED else None

        ended = await wait_for(exited, timeout=60, interval=0.2, what="the container's exit")
        assert ended.exit_code == 3

        def phase() -> str:
            return (state_dir / "phase").read_text()

        await wait_for(
            _async(lambda: phase().startswith("exited")), timeout=60, what="run.sh to finish"
        )
        assert (state_dir / "exit-code").read_text() == "3\n"
    finally:
        await provider.close()


def _async(predicate: Any) -> Any:
    async def check() -> bool:
        return bool(predicate())

    return check
