"""The processes a benchmark runs beside it: the real agent (``vk-provider run``) and the raw
baseline (``bench.raw``), with what /proc says about them (CPU-seconds, RSS).

The agent runs with the production defaults (intervals, workers) — only the node, the
listen addresses and the providers are configured — so the figures are the product's.
``stop`` ends the process it started (SIGTERM, then SIGKILL), and ``reap_runners`` every
local-provider runner started under the benchmark's own directory, so a run leaves nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from vk_provider_adapters.local.processes import kill_local_processes

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU-seconds of ``pid`` so far (its own, not its children's)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Child:
    """A child process and its log."""

    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class Agent(Child):
    node: str = ""
    provider_dirs: dict[str, Path] = field(default_factory=dict)

    def rest_url(self) -> str | None:
        found = re.findall(r"REST API on ([\d.]+):(\d+)", self.log_text())
        return f"http://{found[-1][0]}:{found[-1][1]}" if found else None

    def metrics(self) -> dict[str, float]:
        """The agent's /metrics, summed by name and the labels ``provider``/``operation``."""
        url = self.rest_url()
        if url is None:
            return {}
        text = httpx.get(f"{url}/metrics", timeout=10.0, trust_env=False).text
        totals: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            name_labels, _, value = line.rpartition(" ")
            name, _, labels = name_labels.partition("{")
            wanted = sorted(re.findall(r'(provider|operation)="([^"]*)"', labels))
            key = name + "".join(f"[{k}={v}]" for k, v in wanted)
            with contextlib.suppress(ValueError):
                totals[key] = totals.get(key, 0.0) + float(value)
        return totals


def operation_calls(before: dict[str, float], after: dict[str, float], operation: str) -> float:
    """Provider calls of ``operation`` (every provider) between two ``Agent.metrics()``."""
    prefix = "vk_provider_request_duration_seconds_count"
    return sum(
        value - before.get(key, 0.0)
        for key, value in after.items()
        if key.startswith(prefix) and f"[operation={operation}]" in key
    )


def reconcile_cycles(before: dict[str, float], after: dict[str, float]) -> float:
    key = "vk_provider_reconcile_duration_seconds_count"
    return after.get(key, 0.0) - before.get(key, 0.0)


def start_agent(
    root: Path, *, node: str, kubeconfig: Path, ca: Path, providers: list[dict[str, Any]]
) -> Agent:
    """Write the agent's configuration under ``root`` and start it."""
    root.mkdir(parents=True, exist_ok=True)
    token = root / "rest-token"
    token.write_text("bench-token")
    dirs = {p["name"]: root / "instances" / p["name"] for p in providers if p["type"] == "local"}
    config = {
        "node": {"name": node, "address": "127.0.0.1", "max_pods": 10000},
        "kubelet_api": {
            "listen": "127.0.0.1:0",
            "client_ca_file": str(ca),
            "serving": {"source": "self-signed"},  # the bench's API server does not verify it
        },
        "rest": {"listen": "127.0.0.1:0", "static_token": f"file:{token}"},
        "providers": [
            {**p, "state_dir": str(dirs[p["name"]])} if p["name"] in dirs else p for p in providers
        ],
    }
    (root / "agent.yaml").write_text(yaml.safe_dump(config))
    agent = Agent(
        argv=[
            sys.executable,
            "-m",
            "vk_provider",
            "run",
            "--config",
            str(root / "agent.yaml"),
            "--kubeconfig",
            str(kubeconfig),
            "--state-dir",
            str(root / "state"),
            "--log-level",
            "info",
        ],
        log_path=root / "agent.log",
        node=node,
        provider_dirs=dirs,
    )
    agent.start()
    return agent


def wait_until(predicate: Any, *, timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def reap_runners(root: Path) -> int:
    """SIGKILL every local runner (and its programs) started under ``root``; how many."""
    return len(kill_local_processes(root))
