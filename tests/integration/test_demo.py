"""`vk-provider demo` runs the real thing and leaves nothing behind."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import wait_for
from vk_provider.kube.client import KubeClient
from vk_provider_dev.cluster.cluster import LocalCluster

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


async def test_demo_places_the_workload_cheapest_first_and_cleans_up(tmp_path: Path) -> None:
    env = {**os.environ, "VK_PROVIDER_STATE_DIR": str(tmp_path / "state")}
    name = f"vkt-demo-{os.getpid()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "vk_provider", "demo", "--short", "--name", name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    cluster = LocalCluster(name, root=tmp_path / "state")
    process_pids: list[int] = []
    try:
        assert proc.stdout is not None
        seen = []
        while True:
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout=240)
            assert line, "demo ended early: " + "".join(seen)
            seen.append(line)
            if "Press Ctrl-C" in line:
                break
        text = "".join(seen)
        assert "kubectl logs -f deployment/inference" in text
        kubeconfig = Path(re.search(r"export KUBECONFIG=(\S+)", text).group(1))  # type: ignore[union-attr]
        process_pids = cluster.pids()
        api = await KubeClient.connect(kubeconfig)
        try:

            async def three_running() -> list[dict[str, Any]] | None:
                pods, _ = await api.list_node_pods("vk-gpu")
                ok = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
                return ok if len(ok) == 3 else None

            pods = await wait_for(three_running, timeout=90, what="3 demo pods Running")
        finally:
            await api.close()
        prices = sorted(
            float(p["metadata"]["annotations"]["vk-provider.io/price-per-hour"]) for p in pods
        )
        # Cheapest allowed offers first, spilling over as each fills (L40S is not allowed).
        assert prices == [1.39, 2.49, 2.69]
        kubectl = str(Path(sys.executable).parent / "kubectl")
        logs = subprocess.run(
            [kubectl, "--kubeconfig", str(kubeconfig), "logs", pods[0]["metadata"]["name"]],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert "model server" in logs.stdout, logs.stderr
        # The operator CLI against the running demo, with the address and token it printed.
        url = re.search(r"export VK_PROVIDER_URL=(\S+)", text).group(1)  # type: ignore[union-attr]
        token_file = re.search(r"VK_PROVIDER_TOKEN=\$\(cat (\S+)\)", text).group(1)  # type: ignore[union-attr]
        table = subprocess.run(
            [
                sys.executable,
                "-m",
                "vk_provider",
                "providers",
                "--url",
                url,
                "--token-file",
                token_file,
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert table.returncode == 0, table.stderr
        for provider in ("sim-runpod", "sim-lambda", "sim-modal"):
            assert provider in table.stdout
        header = table.stdout.splitlines()[0] if table.stdout else ""
        assert "NAME" in header.upper() or "PROVIDER" in header.upper(), table.stdout
        instance_dir = cluster.directory / "agent"
        assert instance_dir.exists()
        proc.send_signal(signal.SIGINT)
        assert await asyncio.to_thread(proc.wait, 90) == 0
    finally:
        if proc.poll() is None:
            # Let the demo clean up after itself even when an assertion failed above.
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        cluster.down()
    assert [pid for pid in process_pids if _alive(pid)] == []
    assert not cluster.directory.exists()
    leftovers = subprocess.run(
        ["pgrep", "-af", "vk_provider_adapters.local.(runner|spawner)"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert str(tmp_path) not in leftovers.stdout


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren, ...), from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            parents[int(entry.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        children = [p for p, parent in parents.items() if parent == current]
        found.extend(children)
        frontier.extend(children)
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""


async def _start_demo(tmp_path: Path, name: str) -> tuple[subprocess.Popen[str], LocalCluster]:
    env = {**os.environ, "VK_PROVIDER_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "vk_provider", "demo", "--short", "--name", name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    seen = []
    while True:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout=240)
        assert line, "demo ended early: " + "".join(seen)
        seen.append(line)
        if "Press Ctrl-C" in line:
            return proc, LocalCluster(name, root=tmp_path / "state")


def _stop(proc: subprocess.Popen[str], cluster: LocalCluster) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    cluster.down()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP, signal.SIGTERM])
async def test_demo_cleans_up_on_a_signal_even_when_its_output_is_gone(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """`make demo | tee log` then Ctrl-C kills tee too; a closed terminal sends SIGHUP: the
    demo's cleanup must not stop at its first failed line of output."""
    proc, cluster = await _start_demo(tmp_path, f"vkt-sig-{os.getpid()}-{sig.value}")
    try:
        started = cluster.pids() + _descendants(proc.pid)
        assert started
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader is gone: every later write is a broken pipe
        proc.stderr.close()
        proc.send_signal(sig)
        await asyncio.to_thread(proc.wait, 120)

        async def all_gone() -> bool:
            return not [pid for pid in started if _alive(pid)]

        await wait_for(all_gone, timeout=30, what="every process the demo started to stop")
        assert not cluster.directory.exists()
    finally:
        _stop(proc, cluster)


async def test_demo_keeps_the_agent_log_when_the_agent_dies(tmp_path: Path) -> None:
    name = f"vkt-agentdies-{os.getpid()}"
    proc, cluster = await _start_demo(tmp_path, name)
    try:
        agents = [p for p in _descendants(proc.pid) if " vk_provider run " in _cmdline(p)]
        assert len(agents) == 1, [_cmdline(p) for p in _descendants(proc.pid)]
        os.kill(agents[0], signal.SIGKILL)
        code = await asyncio.to_thread(proc.wait, 120)
        assert code == 1
        assert proc.stderr is not None
        error = proc.stderr.read()
        kept = re.search(r"its log is kept at (\S+)", error)
        assert kept, error
        log = Path(kept.group(1))
        assert log.exists(), error
        assert "node vk-gpu registered" in log.read_text()
        assert not cluster.directory.exists()  # the cluster went, the log stayed
    finally:
        _stop(proc, cluster)
