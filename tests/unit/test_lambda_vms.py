"""The Lambda adapter's view of its VMs, without a network: the state table edge by edge, the
probe's text, the per-VM memory (simulated time), the agent's key and its registration.

SSH itself is ``FakeVms`` here (``tests.contract.harness_lambda``); the same code paths run over
real OpenSSH in ``test_lambda_ssh.py``. The HTTP API is the respx fake validated against the
published OpenAPI document, SSH-key endpoints included.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shlex
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from tests.contract.harness_lambda import (
    API_KEY,
    FAILURES,
    SSH_KEY,
    FakeClock,
    FakeLambda,
    OpenAPIRequest,
    make_provider,
    openapi,
)
from tests.unit import canary
from tests.workloads import workload
from vk_provider.domain.containers import ContainerState as Runtime
from vk_provider.domain.containers import ContainerStatus, Termination
from vk_provider.domain.errors import AuthFailed, Transient
from vk_provider.domain.models import (
    EnvVar,
    InstanceState,
    LogOptions,
    PortEndpoint,
    WorkloadSpec,
)
from vk_provider.settings.secrets import ConfigError, SecretRef
from vk_provider_adapters import sealed_env
from vk_provider_adapters.lambda_cloud.adapter import LambdaCloudProvider
from vk_provider_adapters.lambda_cloud.agentkey import KEY_FILE, AgentKey
from vk_provider_adapters.lambda_cloud.remote import (
    INSPECT_FORMAT,
    PORTS_FORMAT,
    ContainerReport,
    ContainerState,
    MalformedProbe,
    PublishedPort,
    VmReport,
    logs_command,
    parse_docker_time,
    parse_probe,
    probe_command,
)
from vk_provider_adapters.lambda_cloud.ssh import VmTarget
from vk_provider_adapters.lambda_cloud.vmstate import container_status, verdict

UID = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fake(clock: FakeClock) -> FakeLambda:
    return FakeLambda(clock=clock)


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "lambda-key"
    path.write_text(API_KEY + "\n")
    return path


@pytest.fixture
async def provider(fake: FakeLambda, clock: FakeClock, key_file: Path) -> Any:
    adapter = make_provider(fake, clock, key_file, ssh_unreachable_seconds=600)
    try:
        yield adapter
    finally:
        await adapter.close()


def ours(attempt: int = 0) -> list[dict[str, str]]:
    return [
        {"key": "vk-provider:managed", "value": "true"},
        {"key": "vk-provider:provider", "value": "lambda-test"},
        {"key": "vk-provider:pod-uid", "value": UID},
        {"key": "vk-provider:request-id", "value": f"{UID}.{attempt}"},
    ]


def spec(**overrides: Any) -> WorkloadSpec:
    fields: dict[str, Any] = {
        "pod_uid": UID,
        "namespace": "ns",
        "pod_name": "p",
        "container_name": "c",
        "image": "img:1",
        "gpu_count": 1,
    }
    fields.update(overrides)
    return workload(**fields)


def report_of(*containers: ContainerReport, phase: str = "running", **more: Any) -> VmReport:
    return VmReport(phase=phase, containers=containers, **more)


def app(status: str, code: int = 0, *, name: str = "c", **more: Any) -> ContainerReport:
    return ContainerReport("app", name, ContainerState(status, code, **more))


def container(status: str, code: int = 0, **more: Any) -> VmReport:
    """A one-container pod whose container is ``status``; the boot script's phase follows."""
    if status in ("exited", "dead"):
        return report_of(app(status, code, **more), phase="exited", exit_code=str(code))
    return report_of(app(status, code, **more))


T0 = datetime(2026, 12, 1, 10, tzinfo=UTC)
T1 = datetime(2026, 12, 1, 10, 5, tzinfo=UTC)


# --- the state tables, edge by edge ----------------------------------------------------------


@pytest.mark.parametrize(
    ("report", "state", "code", "words"),
    [
        (container("running"), InstanceState.RUNNING, None, ""),
        (report_of(ContainerReport("init", "fetch", ContainerState("running", 0)),
                   phase="initializing", phase_message="running init container fetch"),
         InstanceState.RUNNING, None, "init container fetch"),
        (report_of(app("exited", 3), phase="exited", exit_code="3",
                   phase_message="the pod's app containers exited (exit code 3)"),
         InstanceState.EXITED, 3, "exit code 3"),
        (report_of(ContainerReport("init", "fetch", ContainerState("exited", 4)), phase="exited",
                   exit_code="4", phase_message="init container fetch failed with 4"),
         InstanceState.EXITED, 4, "fetch failed with 4"),
        (report_of(app("exited", 0), phase="exited", exit_code="odd"),
         InstanceState.EXITED, 1, ""),
        (report_of(ContainerReport("app", "c", start_error="pull access denied"),
                   phase="failed-start", phase_message="docker run of c exited with 125",
                   exit_code="125"),
         InstanceState.EXITED, 125, "pull access denied"),
        (VmReport(phase="failed-start", phase_message="docker run of the pod sandbox exited with 1",
                  start_error="no such image"),
         InstanceState.EXITED, 1, "no such image"),
        (VmReport(phase="failed-start", phase_message="odd"), InstanceState.EXITED, 125, "odd"),
        (VmReport(phase="failed-host", phase_message="no NVIDIA GPU is usable"),
         InstanceState.LOST, None, "no NVIDIA GPU"),
        (report_of(ContainerReport("app", "c")), InstanceState.LOST, None, "vanished"),
        (report_of(phase="initializing"), InstanceState.LOST, None, "vanished"),
        (report_of(phase="exited"), InstanceState.LOST, None, "vanished"),
        (report_of(ContainerReport("app", "c", docker_error="Cannot connect")),
         None, None, "does not answer"),
        (VmReport(), InstanceState.PENDING, None, "cloud-init"),
        (VmReport(phase="setup", phase_message="installing Docker"),
         InstanceState.PENDING, None, "installing Docker"),
        (VmReport(phase="waiting-key"), InstanceState.PENDING, None, "secret environment"),
        (VmReport(phase="pulling"), InstanceState.PENDING, None, "pulling"),
        (VmReport(phase="starting"), InstanceState.PENDING, None, "sandbox"),
        (report_of(ContainerReport("app", "c", docker_error="Cannot connect"), phase="setup"),
         InstanceState.PENDING, None, "preparing"),
        (VmReport(phase="hibernating", phase_message="zz"), InstanceState.PENDING, None, "zz"),
    ],
)  # fmt: skip
def test_every_edge_of_the_instance_table(
    report: VmReport, state: InstanceState | None, code: int | None, words: str
) -> None:
    found = verdict(report)
    assert (found.state, found.exit_code) == (state, code), found
    assert words in found.message


W, R, X = Runtime.WAITING, Runtime.RUNNING, Runtime.TERMINATED


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        (app("running", started_at=T0, restart_count=2),
         ContainerStatus("c", R, started_at=T0, restart_count=2)),
        (app("paused", started_at=T0), ContainerStatus("c", R, started_at=T0)),
        (app("restarting", 3, started_at=T0, finished_at=T1, restart_count=1),
         ContainerStatus("c", W, "CrashLoopBackOff", "back-off restarting failed container c",
                         restart_count=1,
                         last_termination=Termination(3, "Error", "", T0, T1))),
        (app("exited", 0, started_at=T0, finished_at=T1),
         ContainerStatus("c", X, "Completed", exit_code=0, started_at=T0, finished_at=T1)),
        (app("exited", 3, restart_count=4),
         ContainerStatus("c", X, "Error", exit_code=3, restart_count=4)),
        (app("exited", 137, oom_killed=True),
         ContainerStatus("c", X, "OOMKilled", exit_code=137)),
        (app("dead", 1), ContainerStatus("c", X, "Error", exit_code=1)),
        (app("removing", 2), ContainerStatus("c", X, "Error", exit_code=2)),
        (app("created", 0, error="no gpu driver"),
         ContainerStatus("c", X, "StartError", "no gpu driver", exit_code=128)),
        (app("created", 127, error="exec: not found"),
         ContainerStatus("c", X, "StartError", "exec: not found", exit_code=127)),
        (app("created"), ContainerStatus("c", W, "ContainerCreating")),
        (ContainerReport("app", "c", start_error="pull access denied"),
         ContainerStatus("c", X, "StartError", "pull access denied", exit_code=128)),
        (ContainerReport("app", "c"), None),
    ],
)  # fmt: skip
def test_every_edge_of_the_container_table(
    report: ContainerReport, expected: ContainerStatus | None
) -> None:
    assert container_status(report) == expected


def test_each_container_is_reported_in_its_place() -> None:
    report = report_of(
        ContainerReport("init", "fetch", ContainerState("exited", 0, started_at=T0)),
        ContainerReport("sidecar", "proxy", ContainerState("running", 0, started_at=T1)),
        app("running", name="model", started_at=T1),
        ContainerReport("app", "exporter"),  # not created yet: not reported
    )
    found = verdict(report)
    assert [c.name for c in found.init_containers] == ["fetch", "proxy"]
    assert [c.name for c in found.containers] == ["model"]
    assert found.started_at == T0 and found.finished_at is None


# --- the endpoints: the ports the sandbox publishes, at the VM's address -----------------------

VM_IP = "198.51.100.2"
WEB = PublishedPort(8080, "tcp", 8080)
DNS = PublishedPort(5353, "udp", 5353)
SIGNAL = PublishedPort(9999, "sctp", 9999)


def published(*ports: PublishedPort, phase: str = "running") -> VmReport:
    return report_of(app("running"), phase=phase, published=ports)


@pytest.mark.parametrize(
    ("report", "ip", "expected"),
    [
        (published(WEB, DNS), VM_IP,
         (PortEndpoint(8080, "TCP", VM_IP, 8080), PortEndpoint(5353, "UDP", VM_IP, 5353))),
        # While init containers run the sandbox already publishes: RUNNING, listed.
        (published(WEB, phase="initializing"), VM_IP, (PortEndpoint(8080, "TCP", VM_IP, 8080),)),
        (published(SIGNAL, WEB), VM_IP, (PortEndpoint(8080, "TCP", VM_IP, 8080),)),  # no SCTP
        (published(WEB, DNS), None, ()),  # no public address (yet)
        (published(), VM_IP, ()),  # the sandbox publishes nothing (not running)
        (VmReport(phase="pulling", published=(WEB,)), VM_IP, ()),  # PENDING
        (report_of(app("exited", 0), phase="exited", exit_code="0", published=(WEB,)),
         VM_IP, ()),  # EXITED
        (VmReport(phase="failed-host", published=(WEB,)), VM_IP, ()),  # LOST
    ],
)  # fmt: skip
def test_only_a_running_pod_with_an_address_lists_its_published_tcp_and_udp_ports(
    report: VmReport, ip: str | None, expected: tuple[PortEndpoint, ...]
) -> None:
    assert verdict(report, ip=ip).endpoints == expected


# --- the probe's text ------------------------------------------------------------------------


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# ``docker inspect --format INSPECT_FORMAT`` of real containers: ``.State`` as Docker's API
# documents ContainerState (a running one: zero FinishedAt), and ``RestartCount``.
RUNNING_STATE = {
    "Status": "running", "Running": True, "Paused": False, "Restarting": False,
    "OOMKilled": False, "Dead": False, "Pid": 12680, "ExitCode": 0, "Error": "",
    "StartedAt": "2019-03-07T03:59:12.405871518Z", "FinishedAt": "0001-01-01T00:00:00Z",
}  # fmt: skip
EXITED_STATE = {
    "Status": "exited", "Running": False, "Paused": False, "Restarting": False,
    "OOMKilled": False, "Dead": False, "Pid": 0, "ExitCode": 3, "Error": "",
    "StartedAt": "2026-12-01T09:59:00.5Z", "FinishedAt": "2026-12-01T10:00:00.123456789+02:00",
}  # fmt: skip


def _inspect(state: object, restarts: object = 0) -> str:
    return json.dumps({"State": state, "RestartCount": restarts})


def _line(kind: str, name: str, rc: int, out: str, error: str = "-") -> str:
    return f"container {kind} {name} {rc} {_b64(out) if out else '-'} {error}\n"


def test_the_probe_output_is_parsed() -> None:
    output = (
        f"phase {_b64('running starting the app containers')}\n"
        f"exit-code -\nsandbox-error -\n"
        + _line("init", "fetch", 0, _inspect(EXITED_STATE))
        + _line("sidecar", "proxy", 0, _inspect(RUNNING_STATE, 5))
        + _line("app", "model", 1, "Error: No such object: vk-x.model", _b64("pull denied"))
        + _line("app", "exporter", 1, "Cannot connect to the Docker daemon")
        + "end\n"
    )
    report = parse_probe(output)
    assert (report.phase, report.phase_message) == ("running", "starting the app containers")
    fetch, proxy, model, exporter = report.containers
    assert fetch == ContainerReport(
        "init",
        "fetch",
        ContainerState(
            "exited",
            3,
            started_at=datetime(2026, 12, 1, 9, 59, 0, 500000, tzinfo=UTC),
            finished_at=datetime(2026, 12, 1, 8, 0, 0, 123456, tzinfo=UTC),
        ),
    )
    assert proxy.state == ContainerState(
        "running",
        0,
        started_at=datetime(2019, 3, 7, 3, 59, 12, 405871, tzinfo=UTC),
        restart_count=5,
    )
    assert (model.state, model.start_error, model.docker_error) == (None, "pull denied", "")
    assert exporter.state is None and "Cannot connect" in exporter.docker_error
    assert "Cannot connect" in report.docker_error and report.created


@pytest.mark.parametrize(
    ("inspected", "field"),
    [
        ("not json", "containers[c]: docker inspect printed no JSON"),
        ("[1]", "containers[c]: docker inspect printed no object"),
        (json.dumps({"RestartCount": 0}), "containers[c].State is missing"),
        (_inspect({**RUNNING_STATE, "Status": "sleeping"}), "containers[c].State.Status"),
        (_inspect({**RUNNING_STATE, "Status": None}), "containers[c].State.Status"),
        (_inspect({**RUNNING_STATE, "ExitCode": "0"}), "containers[c].State.ExitCode"),
        (_inspect({**RUNNING_STATE, "ExitCode": True}), "containers[c].State.ExitCode"),
        (_inspect(RUNNING_STATE, -1), "containers[c].RestartCount"),
        (_inspect(RUNNING_STATE, "2"), "containers[c].RestartCount"),
        (_inspect({**RUNNING_STATE, "Error": 5}), "containers[c].State.Error"),
        (_inspect({**RUNNING_STATE, "StartedAt": 5}), "containers[c].State.StartedAt"),
        (_inspect({**RUNNING_STATE, "FinishedAt": "yesterday"}), "containers[c].State.FinishedAt"),
    ],
)
def test_a_malformed_inspect_answer_names_the_field(inspected: str, field: str) -> None:
    output = f"phase -\n{_line('app', 'c', 0, inspected)}end\n"
    with pytest.raises(MalformedProbe, match=re.escape(field)):
        parse_probe(output)


@pytest.mark.parametrize(
    "output",
    ["", "sudo: a password is required", "phase -\n", "phase %%%\nend",
     "phase -\ncontainer app c x - -\nend", "phase -\ncontainer pod c 0 - -\nend",
     "phase -\ncontainer app c 0 -\nend", "phase -\ncontainer app c 0 %%% -\nend"],
)  # fmt: skip
def test_odd_probe_output_is_malformed(output: str) -> None:
    with pytest.raises(MalformedProbe):
        parse_probe(output)


def _ports_line(port_map: object) -> str:
    return f"sandbox-ports {_b64(json.dumps(port_map))}\n"


# ``docker container inspect --format PORTS_FORMAT`` of a running sandbox published as
# ``--publish 8080:8080/tcp --publish 5353:5353/udp ...``: Docker's PortMap, IPv4 and IPv6.
ANY_IPV4 = "0.0.0.0"  # noqa: S104 -- Docker's HostIp of a port bound on every IPv4 address
PORT_MAP = {
    "8080/tcp": [{"HostIp": ANY_IPV4, "HostPort": "8080"}, {"HostIp": "::", "HostPort": "8080"}],
    "5353/udp": [{"HostIp": "::", "HostPort": "5353"}, {"HostIp": ANY_IPV4, "HostPort": "5353"}],
    "9999/sctp": [{"HostIp": "", "HostPort": "9999"}],
    "9000/tcp": None,  # exposed by the image, not published
    "7000/tcp": [{"HostIp": "::", "HostPort": "7000"}],  # IPv6 only
    "6000/tcp": [{"HostIp": "127.0.0.1", "HostPort": "6000"}],  # one address, not the public one
}


def test_the_sandboxs_published_ports_are_read_from_dockers_port_map() -> None:
    output = f"phase {_b64('running')}\n{_ports_line(PORT_MAP)}end\n"
    assert parse_probe(output).published == (DNS, WEB, SIGNAL)


@pytest.mark.parametrize(
    "line",
    ["", "sandbox-ports -\n", f"sandbox-ports {_b64(chr(10))}\n", _ports_line(None),
     _ports_line({})],
)  # fmt: skip
def test_no_sandbox_or_a_stopped_one_publishes_nothing(line: str) -> None:
    assert parse_probe(f"phase -\n{line}end\n").published == ()


@pytest.mark.parametrize(
    ("port_map", "field"),
    [
        ("Error: no such container", "sandbox.NetworkSettings.Ports: docker printed no JSON"),
        ([], "sandbox.NetworkSettings.Ports is not an object"),
        ({"http": []}, "key 'http' is not <port>/<proto>"),
        ({"70000/tcp": []}, "key '70000/tcp'"),
        ({"80/tcp": "0.0.0.0:80"}, "Ports[80/tcp] is not a list"),
        ({"80/tcp": ["0.0.0.0:80"]}, "Ports[80/tcp] holds a binding that is not an object"),
        ({"80/tcp": [{"HostIp": 0, "HostPort": "80"}]}, "Ports[80/tcp].HostIp"),
        ({"80/tcp": [{"HostIp": ANY_IPV4, "HostPort": 80}]}, "Ports[80/tcp].HostPort"),
    ],
)
def test_a_malformed_port_map_names_the_field(port_map: object, field: str) -> None:
    text = port_map if isinstance(port_map, str) else json.dumps(port_map)
    with pytest.raises(MalformedProbe, match=re.escape(field)):
        parse_probe(f"phase -\nsandbox-ports {_b64(text)}\nend\n")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-01T10:00:00Z", datetime(2026, 12, 1, 10, tzinfo=UTC)),
        ("2026-12-01T10:00:00.5Z", datetime(2026, 12, 1, 10, 0, 0, 500000, tzinfo=UTC)),
        ("0001-01-01T00:00:00Z", None),
        ("yesterday", None),
        (None, None),
    ],
)
def test_docker_times(text: object, expected: datetime | None) -> None:
    assert parse_docker_time(text) == expected


def test_commands_quote_everything_and_carry_no_secret() -> None:
    probe = probe_command(user="ubuntu", state_dir="/var/lib/it's", sandbox="vk-a.0")
    argv = shlex.split(probe)
    assert argv[:4] == ["sudo", "-n", "sh", "-c"]
    assert argv[-2:] == ["/var/lib/it's", "vk-a.0"]
    assert INSPECT_FORMAT in argv[4] and "Config" not in argv[4]  # never the env's values
    # The sandbox's ports, by ``docker container inspect`` ("inspect" stays the containers').
    assert f"docker container inspect --format '{PORTS_FORMAT}' \"$sandbox\"" in argv[4]
    assert probe_command(user="root", state_dir="/s", sandbox="c").startswith("sh -c")
    options = LogOptions(tail_lines=10, since_seconds=60, timestamps=True, follow=True)
    logs = shlex.split(
        logs_command(user="root", state_dir="/s", sandbox="vk-a.0", container="web",
                     options=options)
    )  # fmt: skip
    assert logs[3:] == ["vk-logs", "/s", "vk-a.0", "web", "--tail", "10", "--since", "60s",
                        "--timestamps", "--follow"]  # fmt: skip
    plain = shlex.split(
        logs_command(user="root", state_dir="/s", sandbox="c", container=None,
                     options=LogOptions())
    )  # fmt: skip
    assert plain[3:] == ["vk-logs", "/s", "c", ""]


# --- the per-VM memory -----------------------------------------------------------------------


async def active(fake: FakeLambda, attempt: int = 0) -> str:
    return fake.add_instance(tags=ours(attempt), status="active")


async def test_a_vm_never_reached_is_pending_until_the_deadline_then_lost(
    fake: FakeLambda, clock: FakeClock, provider: LambdaCloudProvider
) -> None:
    instance_id = await active(fake)
    fake.vms.report(instance_id, Transient("connection refused"))
    got = await provider.get(instance_id)  # never reached: no verdict to keep, so PENDING
    assert got.state is InstanceState.PENDING and "waiting to reach it over SSH" in got.message
    clock.now += 601
    (listed,) = await provider.list_ours()
    assert listed.state is InstanceState.LOST and "is port 22 open" in listed.message
    fake.vms.report(instance_id, container("running"))
    assert (await provider.get(instance_id)).state is InstanceState.LOST  # final


async def test_a_vm_reached_before_keeps_its_state_in_polls_and_get_is_transient(
    fake: FakeLambda, clock: FakeClock, provider: LambdaCloudProvider
) -> None:
    instance_id = await active(fake)
    assert (await provider.get(instance_id)).state is InstanceState.RUNNING
    fake.vms.report(instance_id, Transient("timed out"))
    with pytest.raises(Transient, match="timed out"):
        await provider.get(instance_id)
    (listed,) = await provider.list_ours()
    assert listed.state is InstanceState.RUNNING
    assert "not reachable over SSH just now" in listed.message
    clock.now += 601
    assert (await provider.get(instance_id)).state is InstanceState.LOST


async def test_an_exit_is_final_and_release_terminates_at_once(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    instance_id = await active(fake)
    fake.vms.report(instance_id, container("exited", 3))
    assert (await provider.get(instance_id)).exit_code == 3
    fake.vms.report(instance_id, Transient("gone quiet"))
    (listed,) = await provider.list_ours()
    assert (listed.state, listed.exit_code) == (InstanceState.EXITED, 3)
    probes = len(fake.vms.probes)
    await provider.get(instance_id)
    assert len(fake.vms.probes) == probes  # no more SSH for a finished container
    await provider.delete(instance_id, grace_seconds=0)  # the agent's release
    assert instance_id not in fake.instances
    assert instance_id in fake.vms.forgotten


async def test_the_passphrase_rides_only_the_probes_that_may_need_it(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    instance_id = await active(fake)
    fake.vms.report(instance_id, VmReport(phase="waiting-key"))
    await provider.get(instance_id)
    fake.vms.report(instance_id, container("running"))
    await provider.get(instance_id)
    await provider.get(instance_id)
    sent = [passphrase for target, passphrase in fake.vms.probes]
    assert sent[0] is not None and len(sent[0]) == 64
    assert sent[1] == sent[0]  # still due: the last probe saw the VM waiting
    assert sent[2] is None  # the container exists: never again


async def test_booting_terminating_and_gone_vms_are_not_probed(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    booting = fake.add_instance(tags=ours(0), status="booting")
    terminating = fake.add_instance(tags=ours(1), status="terminating")
    preempted = fake.add_instance(tags=ours(2), status="preempted")
    states = {i.instance_id: i.state for i in await provider.list_ours()}
    assert states == {
        booting: InstanceState.PENDING,
        terminating: InstanceState.TERMINATING,
        preempted: InstanceState.LOST,
    }
    assert fake.vms.probes == []
    assert {terminating, preempted} <= set(fake.vms.forgotten)


async def test_a_poll_probes_concurrently_and_bounded(
    fake: FakeLambda, clock: FakeClock, key_file: Path
) -> None:
    adapter = make_provider(fake, clock, key_file, ssh_concurrency=2)
    ids = [await active(fake, attempt) for attempt in range(5)]
    inside, most = 0, 0
    release, two_inside = asyncio.Event(), asyncio.Event()
    real_probe = fake.vms.probe

    async def slow_probe(target: VmTarget, *, passphrase: str | None) -> VmReport:
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        if inside == 2:
            two_inside.set()
        await release.wait()
        inside -= 1
        return await real_probe(target, passphrase=passphrase)

    fake.vms.probe = slow_probe  # type: ignore[method-assign]
    try:
        poll = asyncio.create_task(adapter.list_ours())
        await asyncio.wait_for(two_inside.wait(), 10)
        await asyncio.sleep(0.05)  # a third probe, were it allowed, would start now
        release.set()
        listed = await poll
    finally:
        await adapter.close()
    assert most == 2
    assert sorted(i.instance_id for i in listed) == sorted(ids)
    assert len(fake.calls("list")) == 1


async def test_get_and_list_report_the_published_ports_at_the_vms_public_ip(
    fake: FakeLambda, clock: FakeClock, provider: LambdaCloudProvider
) -> None:
    instance_id = await active(fake)
    ip = fake.instances[instance_id]["ip"]  # Instance.ip: the public IPv4 address
    fake.vms.report(instance_id, published())  # the sandbox is not up yet
    assert (await provider.get(instance_id)).endpoints == ()
    fake.vms.report(instance_id, published(WEB, DNS))
    expected = (PortEndpoint(8080, "TCP", ip, 8080), PortEndpoint(5353, "UDP", ip, 5353))
    got = await provider.get(instance_id)
    assert (got.state, got.ip, got.endpoints) == (InstanceState.RUNNING, ip, expected)
    (listed,) = await provider.list_ours()
    assert listed.endpoints == expected
    # Unreachable for a while: its last view stands, the ports with it.
    fake.vms.report(instance_id, Transient("timed out"))
    (listed,) = await provider.list_ours()
    assert (listed.state, listed.endpoints) == (InstanceState.RUNNING, expected)
    # Ended: nothing is reached any more.
    fake.vms.report(instance_id, container("exited", 0))
    assert (await provider.get(instance_id)).endpoints == ()


async def test_a_vm_without_an_ip_or_not_active_lists_no_endpoint(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    booting = fake.add_instance(tags=ours(0), status="booting")
    no_ip = await active(fake, attempt=1)
    del fake.instances[no_ip]["ip"]  # Instance.ip is optional in the spec
    fake.vms.default = published(WEB)
    listed = {i.instance_id: i for i in await provider.list_ours()}
    assert listed[booting].endpoints == () and listed[booting].state is InstanceState.PENDING
    assert listed[no_ip].endpoints == ()
    assert fake.vms.probes == []  # neither is probed: nothing to reach


async def test_close_closes_the_vm_connections(
    fake: FakeLambda, clock: FakeClock, key_file: Path
) -> None:
    adapter = make_provider(fake, clock, key_file)
    await adapter.close()
    assert fake.vms.closed


# --- the agent's key ------------------------------------------------------------------------


def test_a_generated_key_is_kept_and_reused(tmp_path: Path) -> None:
    first = AgentKey.load(reference=None, state_dir=tmp_path, provider="p")
    second = AgentKey.load(reference=None, state_dir=tmp_path, provider="p")
    assert first.public == second.public
    assert (tmp_path / KEY_FILE).stat().st_mode & 0o777 == 0o600
    assert (tmp_path / KEY_FILE).parent.stat().st_mode & 0o777 == 0o700
    assert first.host_key("u.0").public == second.host_key("u.0").public
    assert first.env_passphrase("u.0") == second.env_passphrase("u.0")
    assert first.env_passphrase("u.0") != first.env_passphrase("u.1")
    assert first.host_key("u.0").public != first.host_key("u.1").public
    other = AgentKey.load(reference=None, state_dir=tmp_path, provider="q")
    assert other.env_passphrase("u.0") != first.env_passphrase("u.0")  # per provider, too
    text = (tmp_path / KEY_FILE).read_text()
    assert text not in repr(first) and "PRIVATE" not in repr(first)
    assert first.host_key("u.0").private_openssh not in repr(first.host_key("u.0"))


@pytest.mark.parametrize("kind", ["openssh-ed25519", "pem-rsa"])
def test_a_configured_key_is_used(tmp_path: Path, kind: str) -> None:
    if kind == "openssh-ed25519":
        key: Any = ed25519.Ed25519PrivateKey.generate()
        text = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    else:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        text = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    path = tmp_path / "agent-key"
    path.write_bytes(text)
    reference = SecretRef.model_validate(f"file:{path}")
    loaded = AgentKey.load(reference=reference, state_dir=None, provider="p")
    expected = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    assert loaded.public == expected.decode()
    assert not (tmp_path / "ssh").exists()


def test_a_bad_key_names_its_reference_not_its_content(tmp_path: Path) -> None:
    path = tmp_path / "agent-key"
    path.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-key-CANARY\n")
    with pytest.raises(ConfigError) as raised:
        reference = SecretRef.model_validate(f"file:{path}")
        AgentKey.load(reference=reference, state_dir=None, provider="p")
    assert f"file:{path}" in str(raised.value) and "CANARY" not in str(raised.value)
    with pytest.raises(ConfigError, match="no state directory"):
        AgentKey.load(reference=None, state_dir=None, provider="p")
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"cannot (create|read) it"):
        AgentKey.load(reference=None, state_dir=blocker, provider="p")


# --- registration through the SSH-key API ---------------------------------------------------


async def test_the_agents_key_is_registered_once_and_launches_name_it(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    offer = next(o for o in await provider.offers() if o.sku == "gpu_1x_a10")
    await provider.create(spec(), offer)
    await provider.create(spec(attempt=1), offer)
    (added,) = fake.calls("add-ssh-key")
    body = json.loads(added.content)
    assert body["name"] == SSH_KEY
    assert body["public_key"].startswith("ssh-ed25519 ") and "PRIVATE" not in body["public_key"]
    assert len(fake.calls("ssh-keys")) == 1  # once per process
    assert [b["ssh_key_names"] for b in fake.launch_bodies] == [[SSH_KEY], [SSH_KEY]]
    document = openapi()
    assert document is not None
    for request in fake.requests:
        document.validate_request(OpenAPIRequest(request))


async def test_a_key_of_that_name_with_our_public_key_is_used_as_it_is(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    public = provider._agent_key.public
    fake.add_ssh_key(SSH_KEY, f"{public} someone@laptop")  # same key, another comment
    offer = next(o for o in await provider.offers() if o.sku == "gpu_1x_a10")
    await provider.create(spec(), offer)
    assert fake.calls("add-ssh-key") == []


async def test_a_key_of_that_name_with_another_public_key_blocks_the_provider(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    fake.add_ssh_key(SSH_KEY, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtherKeyOtherKeyOtherKey ops")
    offer = next(o for o in await provider.offers() if o.sku == "gpu_1x_a10")
    with pytest.raises(AuthFailed, match="another public key than the agent's") as raised:
        await provider.create(spec(), offer)
    assert "ssh_private_key" in str(raised.value)
    assert "AAAA" not in str(raised.value)
    assert fake.calls("launch") == []


async def test_a_refused_add_looks_again_before_giving_up(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    offer = next(o for o in await provider.offers() if o.sku == "gpu_1x_a10")
    fake.fail("add-ssh-key", *FAILURES["invalid"][:2])
    with pytest.raises(AuthFailed, match="refused the agent's SSH key"):
        await provider.create(spec(), offer)
    assert len(fake.calls("ssh-keys")) == 2
    # Someone (another agent process) added our key between our look and our add: fine.
    fake.add_ssh_key(SSH_KEY, provider._agent_key.public)
    fake.fail("ssh-keys", 200, {"data": []})  # the first look does not see it yet
    await provider.create(spec(), offer)
    assert fake.calls("add-ssh-key")[-1:] and len(fake.calls("launch")) == 1


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [(401, FAILURES["auth"][1], AuthFailed), (503, FAILURES["transient"][1], Transient)],
)
async def test_ssh_key_api_errors_land_in_their_class(
    fake: FakeLambda, provider: LambdaCloudProvider, status: int, body: Any, error: type
) -> None:
    offer = next(o for o in await provider.offers() if o.sku == "gpu_1x_a10")
    fake.fail("ssh-keys", status, body, times=None)
    with pytest.raises(error):
        await provider.create(spec(), offer)
    assert fake.calls("launch") == []


# --- secrets ---------------------------------------------------------------------------------


async def test_no_secret_in_any_form_is_in_the_launch_request(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    offer = next(o for o in await provider.offers() if o.sku == "gpu_1x_a10")
    workload = spec(
        env=(EnvVar("HF_TOKEN", canary.SECRET, secret=True), EnvVar("KEY", canary.KEY, True))
    )
    await provider.create(workload, offer)
    (launch,) = fake.calls("launch")
    raw = launch.content.decode()
    user_data = json.loads(raw)["user_data"]
    for text in (raw, user_data):
        assert not canary.leaks(text, [canary.SECRET, canary.KEY])
        for value in (canary.SECRET, canary.KEY):
            for form in (value, value + "\n"):
                assert base64.b64encode(form.encode()).decode() not in text
    passphrase = provider._agent_key.env_passphrase(workload.request_id)
    assert passphrase not in raw
    # ...but the VM can open it with the passphrase it gets over SSH.
    sealed = [line for line in user_data.splitlines() if line.strip().startswith("U2FsdGVkX1")]
    assert sealed, "no sealed file in user_data"


def test_sealing_is_deterministic_and_never_reuses_a_key_stream() -> None:
    one = sealed_env.seal(b"A=1\n", "p" * 64)
    assert one == sealed_env.seal(b"A=1\n", "p" * 64)
    two = sealed_env.seal(b"A=2\n", "p" * 64)
    assert one[8:16] != two[8:16]  # another salt: another key and IV
    assert sealed_env.unseal(two, "p" * 64) == b"A=2\n"
    with pytest.raises(ValueError, match="passphrase"):
        sealed_env.seal(b"x", "")
