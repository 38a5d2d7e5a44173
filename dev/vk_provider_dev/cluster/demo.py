"""`vk-provider demo`: the embedded default run, end to end on this machine.

1. a real local control plane (``vk-demo``);
2. the agent (`vk-provider run` as a child process) with three simulated GPU clouds — the
   ``local`` provider, which runs each container's command as a local process;
3. an example inference Deployment that tolerates the virtual node's taint, so its pods land
   on the virtual node and spread over the clouds cheapest-first as capacity fills.

It prints what to look at, and on Ctrl-C (or SIGTERM) deletes the workload, stops the agent
and the cluster. Invariant: every process it started is stopped before it returns.
"""

from __future__ import annotations

import contextlib
import functools
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from vk_provider.runtime.registry import Registry
from vk_provider.settings.paths import state_root
from vk_provider_adapters.local.adapter import LocalProvider
from vk_provider_adapters.local.config import LocalProviderConfig
from vk_provider_dev.cluster.binaries import Binaries
from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.ports import free_ports, port_is_free

NODE_NAME = "vk-gpu"
DEFAULT_REST_PORT = 8080
NAMESPACE = "default"
DEPLOYMENT = "inference"

# The simulated clouds: prices and capacities chosen so three replicas spread over them.
SIMULATED_PROVIDERS: list[dict[str, Any]] = [
    {
        "name": "sim-runpod",
        "offers": [
            {
                "sku": "a100-80gb",
                "gpu_model": "A100-80GB",
                "gpu_count": 1,
                "gpu_memory_gib": 80,
                "vcpus": 8,
                "memory_gib": 64,
                "price_per_hour": 1.39,
                "capacity": 1,
                "region": "eu-ro-1",
                "startup_seconds": 2,
            },
            {
                "sku": "h100-sxm",
                "gpu_model": "H100-SXM",
                "gpu_count": 1,
                "gpu_memory_gib": 80,
                "vcpus": 16,
                "memory_gib": 128,
                "price_per_hour": 2.69,
                "capacity": 2,
                "region": "eu-ro-1",
                "startup_seconds": 3,
            },
        ],
    },
    {
        "name": "sim-lambda",
        "offers": [
            {
                "sku": "gpu_1x_h100_pcie",
                "gpu_model": "H100-PCIE",
                "gpu_count": 1,
                "gpu_memory_gib": 80,
                "vcpus": 26,
                "memory_gib": 200,
                "price_per_hour": 2.49,
                "capacity": 1,
                "region": "us-east-1",
                "startup_seconds": 4,
            },
        ],
    },
    {
        "name": "sim-modal",
        "offers": [
            {
                "sku": "l40s",
                "gpu_model": "L40S",
                "gpu_count": 1,
                "gpu_memory_gib": 48,
                "vcpus": 8,
                "memory_gib": 32,
                "price_per_hour": 0.99,
                "capacity": 2,
                "region": "us-west",
                "startup_seconds": 1,
            },
        ],
    },
]

WORKLOAD_SCRIPT = """\
import os, time
print(f"model server {os.environ['POD_NAME']} ready on {os.environ['GPU_HINT']}", flush=True)
n = 0
while True:
    n += 1
    print(f"served request {n}", flush=True)
    time.sleep(3)
"""


def demo_config(
    *, kubelet_port: int, rest_port: int, token_file: Path, state_dir: Path, client_ca: Path
) -> dict[str, Any]:
    return {
        "node": {"name": NODE_NAME, "address": "127.0.0.1"},
        # The API server reaches the kubelet API with a client certificate from the cluster CA.
        # Self-signed serving certificate, configured: the dev API server does not verify it.
        "kubelet_api": {
            "listen": f"127.0.0.1:{kubelet_port}",
            "client_ca_file": str(client_ca),
            "serving": {"source": "self-signed"},
        },
        "rest": {"listen": f"127.0.0.1:{rest_port}", "static_token": f"file:{token_file}"},
        "intervals": {"restart_backoff_seconds": 5},
        "providers": [
            {"type": "local", "enabled": True, "state_dir": str(state_dir / p["name"]), **p}
            for p in SIMULATED_PROVIDERS
        ],
    }


def demo_deployment(replicas: int = 3) -> dict[str, Any]:
    labels = {"app": DEPLOYMENT}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    # Any H100 or an 80 GB A100: the L40S offer is cheaper but not allowed.
                    "annotations": {"vk-provider.io/gpu": "H100,A100-80GB"},
                },
                "spec": {
                    "nodeSelector": {"type": "virtual-kubelet"},
                    "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
                    "terminationGracePeriodSeconds": 5,
                    "containers": [
                        {
                            "name": "server",
                            "image": "example.com/inference:1.0",
                            "command": [sys.executable, "-c", WORKLOAD_SCRIPT],
                            "env": [
                                {"name": "GPU_HINT", "value": "a rented GPU"},
                                {
                                    "name": "POD_NAME",
                                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                                },
                            ],
                            "resources": {
                                "limits": {"nvidia.com/gpu": "1"},
                                "requests": {"cpu": "1", "memory": "4Gi"},
                            },
                        }
                    ],
                },
            },
        },
    }


def shell_command(program: str, *args: str) -> str:
    """A command line printed for a person to paste into any shell: ``program`` by the absolute
    path of this interpreter's bin directory (the virtualenv's) when it is there, so it works
    without activating the virtualenv. ``args`` are shell words, written as they are."""
    installed = Path(sys.executable).parent / program
    head = shlex.quote(str(installed)) if installed.is_file() else program
    return " ".join([head, *args])


def _die_with_parent() -> None:
    """In the agent child: get SIGTERM if the demo dies, so no agent is left behind."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _stop_local_instances(config_path: Path) -> None:
    """Safety net: no simulated instance outlives the demo, whatever the agent managed."""
    import asyncio

    async def stop_all() -> None:
        config = Registry.default().load_config(config_path)
        for entry in config.providers:
            if not isinstance(entry, LocalProviderConfig):
                continue
            provider = LocalProvider(entry, state_dir=Path(str(entry.state_dir)))
            for instance in await provider.list_ours():
                await provider.delete(instance.instance_id, grace_seconds=0)

    asyncio.run(stop_all())


def start_agent(
    config_path: Path, kubeconfig: Path, state_dir: Path, log_path: Path
) -> subprocess.Popen[bytes]:
    """``vk-provider run`` as a child that dies with the demo, its output appended to the log."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log_file:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vk_provider",
                "run",
                "--config",
                str(config_path),
                "--kubeconfig",
                str(kubeconfig),
                "--state-dir",
                str(state_dir),
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,  # the demo is single-threaded here
        )


def wait_agent_ready(
    rest_port: int, agent: subprocess.Popen[bytes], log: Path, within: float = 180
) -> None:
    """Wait until the agent's ``/readyz`` says 200 (its node is registered and served).

    The demo says "running" only after this, so whoever reads its output (a person, a test)
    can rely on the node being there. Fails at once when the agent exits."""
    deadline = time.monotonic() + within
    url = f"http://127.0.0.1:{rest_port}/readyz"
    while time.monotonic() < deadline:
        if agent.poll() is not None:
            raise RuntimeError(f"the agent exited at start-up; see {log}")
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass  # not listening yet, or 503 while the node registers
        time.sleep(0.5)
    raise RuntimeError(f"the agent did not become ready within {within:.0f} s; see {log}")


def agent_log_path(name: str) -> Path:
    """Where the demo's agent logs: outside the cluster's directory, so it outlives ``down``."""
    return state_root() / "demo" / name / "agent.log"


def _quietly(console: Console) -> Callable[[str], None]:
    """Print, but never fail: the terminal may be gone (SIGHUP) or the pipe closed (a `tee`
    killed by the same Ctrl-C). Cleanup must not stop at its first line of output."""

    def say(message: str) -> None:
        # rich turns a broken pipe into SystemExit(1): that too must not end the cleanup.
        with contextlib.suppress(OSError, ValueError, SystemExit):
            console.print(message, highlight=False)

    return say


def run_demo(
    *, name: str, binaries: Binaries, stop: threading.Event, console: Console, out: Console
) -> None:
    cluster = LocalCluster(name)
    agent: subprocess.Popen[bytes] | None = None
    config_path = cluster.directory / "demo-agent.yaml"
    say = _quietly(console)
    try:
        kubeconfig = cluster.up(binaries, say=lambda m: say(f"  {m}"))
        state_dir = cluster.directory / "agent"
        kubelet_port, spare = free_ports(2)
        # The CLI's default REST address is :8080; use it when it is free.
        rest_port = DEFAULT_REST_PORT if port_is_free(DEFAULT_REST_PORT) else spare
        token = secrets.token_urlsafe(24)
        token_file = cluster.directory / "rest-token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        config = demo_config(
            kubelet_port=kubelet_port,
            rest_port=rest_port,
            token_file=token_file,
            state_dir=state_dir,
            client_ca=cluster.pki.ca.cert,
        )
        config_path.write_text(yaml.safe_dump(config))
        log_path = agent_log_path(name)
        say(f"  starting the agent (log: {log_path})")
        agent = start_agent(config_path, kubeconfig, state_dir, log_path)
        wait_agent_ready(rest_port, agent, log_path)
        cluster.create_object(
            f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", demo_deployment()
        )
        status = cluster.status()
        out.print(f"\n[bold]vk-provider demo[/] is running on local control plane {name!r}.")
        out.print(f"  API server   {status.server}")
        out.print(f"  virtual node {NODE_NAME}, kubelet API https://127.0.0.1:{kubelet_port}")
        out.print(f"  providers    {', '.join(p['name'] for p in SIMULATED_PROVIDERS)} (simulated)")
        out.print(f"  agent log    {log_path}")
        out.print("\nLook at it from another terminal (commands by their full path in .venv):")
        kubectl = functools.partial(shell_command, "kubectl")
        vk = functools.partial(shell_command, "vk-provider")
        out.print(f"  export KUBECONFIG={kubeconfig}", highlight=False)
        out.print(f"  {kubectl('get nodes -o wide')}", highlight=False)
        out.print(f"  {kubectl('get pods -o wide -L vk-provider.io/provider')}", highlight=False)
        out.print(
            "  "
            + kubectl(
                "get pods -o custom-columns=NAME:.metadata.name,"
                "PROVIDER:.metadata.annotations.vk-provider\\.io/provider,"
                "PRICE:.metadata.annotations.vk-provider\\.io/price-per-hour"
            ),
            highlight=False,
        )
        out.print(f"  {kubectl(f'logs -f deployment/{DEPLOYMENT}')}", highlight=False)
        out.print(
            f"  {kubectl(f'describe pod -l app={DEPLOYMENT}')}   # ProviderSelected events",
            highlight=False,
        )
        out.print(f"  {kubectl(f'scale deployment/{DEPLOYMENT} --replicas=5')}", highlight=False)
        out.print("\nAnd the agent's REST API (provider status, offers, pods, spend):")
        out.print(f"  export VK_PROVIDER_URL=http://127.0.0.1:{rest_port}", highlight=False)
        out.print(f"  export VK_PROVIDER_TOKEN=$(cat {token_file})", highlight=False)
        out.print(f"  {vk('providers')}; {vk('offers --gpu H100')}; {vk('pods')}", highlight=False)
        out.print(f"  curl http://127.0.0.1:{rest_port}/metrics", highlight=False)
        first = SIMULATED_PROVIDERS[0]["name"]
        out.print("\nBreak a simulated cloud by hand (the agent sees it at once):")
        out.print(f"  {vk(f'local instances {state_dir / first}')}", highlight=False)
        out.print(
            f"  {vk(f'local lose {state_dir / first} <instance-id>')}"
            "   # the pod fails, its ReplicaSet replaces it elsewhere",
            highlight=False,
        )
        out.print(
            f"  {vk(f'local faults {state_dir / first} --call-failure-rate 0.5')}"
            "   # --clear to end it",
            highlight=False,
        )
        out.print("  (docs/operating.md: restarting the agent, reading its log, every Event)")
        out.print("\nPress Ctrl-C to stop everything.")
        while not stop.is_set():
            if agent.poll() is not None:
                raise RuntimeError(
                    f"the agent exited with code {agent.returncode}; its log is kept at {log_path}"
                )
            stop.wait(1.0)
    finally:
        say("\nstopping the demo")
        if agent is not None and agent.poll() is None:
            agent.terminate()
            try:
                agent.wait(timeout=20)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
        if config_path.exists():
            with contextlib.suppress(Exception):  # the cluster must go down regardless
                _stop_local_instances(config_path)
        cluster.down(say=lambda m: say(f"  {m}"))
