"""The agent's prober against real servers on 127.0.0.1: HTTP, TCP and gRPC health probes,
through the production controllers (``controller_harness.Core``) on a whole-pod memory
provider whose capabilities say the agent probes (as the local provider's do).

Real time (probes have a one-second period at least), generous deadlines; every server is
closed by its fixture. The verdict arithmetic itself is tested without time at the end.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from aiohttp import web

from tests.unit.controller_harness import Core, gpu_offer, memory_provider, pod_manifest
from vk_provider.controllers.probeactions import exec_probe
from vk_provider.domain.containers import Probe
from vk_provider.domain.models import Capabilities
from vk_provider.domain.probing import ProbeCounter

pytestmark = pytest.mark.timeout(120)


@dataclass
class Health:
    """An HTTP server on 127.0.0.1 whose /health answers ``status``."""

    port: int = 0
    status: int = 503
    hits: int = 0
    headers: list[dict[str, str]] = field(default_factory=list)


@pytest.fixture
async def health() -> AsyncIterator[Health]:
    state = Health()

    async def handle(request: web.Request) -> web.Response:
        state.hits += 1
        state.headers.append(dict(request.headers))
        return web.Response(status=state.status, text="not yet" if state.status >= 400 else "ok")

    app = web.Application()
    app.router.add_get("/health", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield state
    await runner.cleanup()


@pytest.fixture
def free_port() -> Iterator[int]:
    """A port nothing listens on (bound and released: connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield port


def probed_pod(name: str, **probes: dict[str, Any]) -> dict[str, Any]:
    pod = pod_manifest(name)
    pod["spec"]["containers"][0].update(probes)
    return pod


def agent_core() -> tuple[Core, Any]:
    provider = memory_provider("local", gpu_offer(), whole_pods=True, probes="agent")
    return Core(provider), provider


def events(core: Core, reason: str) -> list[dict[str, Any]]:
    return [e for e in core.kube.events if e["reason"] == reason]


async def test_readiness_follows_an_http_probe(health: Health) -> None:
    core, _ = agent_core()
    probe = {
        "httpGet": {
            "port": health.port,
            "path": "/health",
            "httpHeaders": [{"name": "X-Probe", "value": "yes"}],
        },
        "periodSeconds": 1,
        "failureThreshold": 1,
    }
    async with core.running():
        await core.kube.create_pod(probed_pod("web", readinessProbe=probe))
        await core.until(lambda: core.phase("web") == "Running", what="Running", step=0.1)
        await core.until(lambda: health.hits >= 2, within=30, what="probed", step=0.1)
        # Running, but not Ready while the probe fails.
        assert core.condition("web", "Ready") == "False"
        assert core.container_status("web")["ready"] is False
        assert core.container_status("web")["started"] is True
        await core.until(lambda: events(core, "Unhealthy"), within=30, what="Unhealthy")
        health.status = 200
        await core.until(
            lambda: core.condition("web", "Ready") == "True", within=30, what="Ready", step=0.1
        )
        assert core.container_status("web")["ready"] is True
        health.status = 500
        await core.until(
            lambda: core.condition("web", "Ready") == "False", within=30, what="not Ready again"
        )
    unhealthy = events(core, "Unhealthy")[0]
    assert unhealthy["type"] == "Warning" and unhealthy["count"] >= 1
    assert unhealthy["message"].startswith("[main] Readiness probe failed: HTTP probe failed")
    assert health.headers[0]["X-Probe"] == "yes"
    assert health.headers[0]["User-Agent"].startswith("kube-probe/")
    # No keep-alive between probes, as a kubelet's prober: every probe its own connection.
    assert all(h.get("Connection") == "close" for h in health.headers)


async def test_a_failing_liveness_probe_restarts_the_container(free_port: int) -> None:
    core, provider = agent_core()
    probe = {"tcpSocket": {"port": free_port}, "periodSeconds": 1, "failureThreshold": 2}
    async with core.running():
        await core.kube.create_pod(probed_pod("live", livenessProbe=probe))
        await core.until(lambda: core.phase("live") == "Running", what="Running", step=0.1)
        await core.until(
            lambda: core.container_status("live").get("restartCount", 0) >= 1,
            within=30,
            what="restarted",
            step=0.1,
        )
        status = core.container_status("live")
        assert status["lastState"]["terminated"]["exitCode"] == 137
        # The new run is probed afresh: it fails again, and is restarted again.
        await core.until(
            lambda: core.container_status("live").get("restartCount", 0) >= 2,
            within=30,
            what="restarted twice",
            step=0.1,
        )
    killing = events(core, "Killing")
    assert (
        killing
        and killing[0]["message"] == "Container main failed liveness probe, will be restarted"
    )
    assert provider.calls["restart_container"] >= 2
    assert "Liveness probe failed: dial tcp" in events(core, "Unhealthy")[0]["message"]
    assert provider.calls["create"] == 1  # restarted in place, never relaunched


async def test_a_pod_the_agent_stops_is_probed_as_terminating_with_no_warning(
    health: Health,
) -> None:
    """A pod being deleted whose server stops answering on its way out: readiness follows it
    (Ready goes False) but no Unhealthy Warning is recorded and liveness restarts nothing,
    as a kubelet probes a terminating pod."""
    core, provider = agent_core()
    probe = {"httpGet": {"port": health.port, "path": "/health"}, "periodSeconds": 1}
    health.status = 200
    provider.terminate_seconds = 6.0  # the container runs on while it stops
    async with core.running():
        await core.kube.create_pod(
            probed_pod(
                "leaving",
                readinessProbe={**probe, "failureThreshold": 1},
                livenessProbe={**probe, "failureThreshold": 1},
            )
        )
        await core.until(
            lambda: core.condition("leaving", "Ready") == "True", within=30, what="Ready"
        )
        await core.kube.request_deletion("ns", "leaving", grace=30)
        await core.until(lambda: "Killing" in core.kube.reasons("leaving"), what="stopping")
        health.status = 503  # the server shuts down with its container
        hits = health.hits
        await core.until(lambda: health.hits >= hits + 2, within=30, what="probed meanwhile")
        await core.until(
            lambda: core.kube.pod("ns", "leaving") is None, within=60, what="pod deleted"
        )
    assert not events(core, "Unhealthy"), events(core, "Unhealthy")
    assert provider.calls.get("restart_container", 0) == 0


async def test_a_startup_probe_holds_readiness_until_it_passes(health: Health) -> None:
    core, _ = agent_core()
    startup = {
        "httpGet": {"port": health.port, "path": "/health"},
        "periodSeconds": 1,
        "failureThreshold": 30,
    }
    readiness = {"tcpSocket": {"port": health.port}, "periodSeconds": 1}
    async with core.running():
        await core.kube.create_pod(
            probed_pod("slow", startupProbe=startup, readinessProbe=readiness)
        )
        await core.until(lambda: health.hits >= 2, within=30, what="startup probed", step=0.1)
        status = core.container_status("slow")
        assert (status["started"], status["ready"]) == (False, False)
        health.status = 200
        await core.until(
            lambda: core.condition("slow", "Ready") == "True", within=30, what="Ready", step=0.1
        )
        assert core.container_status("slow")["started"] is True


@pytest.fixture
async def grpc_health() -> AsyncIterator[tuple[int, dict[str, int]]]:
    """A gRPC server implementing grpc.health.v1.Health/Check with raw protobuf bytes."""
    statuses: dict[str, int] = {"": 2}  # NOT_SERVING

    async def check(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        service = request[2:].decode() if request else ""
        return bytes([0x08, statuses.get(service, 0)])

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "grpc.health.v1.Health", {"Check": grpc.unary_unary_rpc_method_handler(check)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield port, statuses
    await server.stop(0)


async def test_a_grpc_health_probe(grpc_health: tuple[int, dict[str, int]]) -> None:
    port, statuses = grpc_health
    core, _ = agent_core()
    probe = {"grpc": {"port": port, "service": "model"}, "periodSeconds": 1}
    async with core.running():
        await core.kube.create_pod(probed_pod("grpc", readinessProbe=probe))
        await core.until(lambda: events(core, "Unhealthy"), within=30, what="Unhealthy")
        assert core.condition("grpc", "Ready") == "False"
        statuses["model"] = 1  # SERVING
        await core.until(
            lambda: core.condition("grpc", "Ready") == "True", within=30, what="Ready", step=0.1
        )
    assert "service unhealthy (responded with status 0)" in events(core, "Unhealthy")[0]["message"]


class _Session:
    """An exec session running a real local command (what a provider's exec returns)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    async def write_stdin(self, data: bytes) -> None:
        raise AssertionError("a probe writes nothing")

    async def close_stdin(self) -> None:
        return None

    async def output(self) -> AsyncIterator[tuple[int, bytes]]:
        assert self._process.stdout is not None
        while chunk := await self._process.stdout.read(4096):
            yield 1, chunk

    async def resize(self, width: int, height: int) -> None:
        return None

    async def wait(self) -> int:
        return await self._process.wait()

    async def close(self) -> None:
        if self._process.returncode is None:
            self._process.kill()
            await self._process.wait()


class _ExecProvider:
    name = "exec"
    capabilities = Capabilities(exec=True)

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, list[str]]] = []

    async def exec(
        self, instance_id: str, container: str, command: list[str], *, tty: bool
    ) -> _Session:
        self.calls.append((instance_id, container, command))
        process = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL
        )
        return _Session(process)


async def test_exec_probes_run_the_command_in_the_container() -> None:
    provider = _ExecProvider()
    ok = Probe(kind="exec", command=("true",))
    outcome = await exec_probe(ok, provider, "i-1", "main")  # type: ignore[arg-type]
    assert outcome.ok and provider.calls == [("i-1", "main", ["true"])]
    failing = Probe(kind="exec", command=("sh", "-c", "echo not ready; exit 3"))
    outcome = await exec_probe(failing, provider, "i-1", "main")  # type: ignore[arg-type]
    assert not outcome.ok and "exited with 3: not ready" in outcome.message
    slow = Probe(kind="exec", command=("sleep", "30"), timeout_seconds=1)
    outcome = await exec_probe(slow, provider, "i-1", "main")  # type: ignore[arg-type]
    assert not outcome.ok and "timed out after 1s" in outcome.message


async def test_an_exec_probe_on_a_provider_without_exec_fails_saying_why() -> None:
    provider = memory_provider("plain", gpu_offer())
    outcome = await exec_probe(Probe(kind="exec", command=("true",)), provider, "i", "main")
    assert not outcome.ok and "cannot exec" in outcome.message


# --- verdicts (no time) ---------------------------------------------------------------------


def test_readiness_needs_success_threshold_in_a_row_and_failure_threshold_to_drop() -> None:
    counter = ProbeCounter.readiness(Probe(kind="tcp", success_threshold=2, failure_threshold=3))
    assert counter.verdict is False
    assert [counter.observe(ok) for ok in (True, False, True, True)] == [
        False,
        False,
        False,
        True,
    ]
    assert counter.verdict is True
    assert [counter.observe(ok) for ok in (False, False, True, False, False, False)] == [
        False,
        False,
        False,
        False,
        False,
        True,
    ]
    assert counter.verdict is False


def test_liveness_starts_alive_and_startup_unknown() -> None:
    probe = Probe(kind="tcp", failure_threshold=1)
    live = ProbeCounter.liveness(probe)
    assert live.verdict is True and live.observe(False) and live.verdict is False
    startup = ProbeCounter.startup(probe)
    assert startup.verdict is None and startup.observe(True) and startup.verdict is True
