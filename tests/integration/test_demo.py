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
from vk_provider.cluster.cluster import LocalCluster
from vk_provider.kube.client import KubeClient

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
        [sys.executable, "-m", "vk_provider", "demo", "--name", name],
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
        ["pgrep", "-af", "providers.local.runner"], capture_output=True, text=True, check=False
    )
    assert str(tmp_path) not in leftovers.stdout
