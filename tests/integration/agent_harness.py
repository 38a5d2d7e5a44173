"""Run the real agent (`vk-provider run`) as a child process against the session's cluster.

Each test gets its own virtual node name and local-provider state directories, so tests do
not share state; ``AgentHarness.replica`` starts a second agent of the same node on the same
provider state, as a second replica of one Deployment. Each agent has a pod name of its own
(``POD_NAME``, its leader-election identity), kept across restarts as a pod's is.
``AgentHarness.stop_all`` stops every agent, terminates every simulated instance and deletes
the test's Node objects, election Leases and roles.

Unless a test brings its own kubeconfig, an agent works with exactly the rights
deploy/rbac.yaml grants, rendered for its node (``shipped_role``), in the namespace a
Deployment of deploy/agent.yaml would give it (``POD_NAMESPACE``): the whole integration
suite runs under the shipped role, and a call it does not allow fails the test that makes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.integration import shipped_role
from vk_provider_adapters.local.adapter import LocalProvider
from vk_provider_adapters.local.config import LocalProviderConfig
from vk_provider_adapters.local.faults import clear_faults
from vk_provider_adapters.local.processes import kill_local_processes
from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.components import AUDITED_NAMESPACE

TOLERATION = {"key": "virtual-kubelet.io/provider", "operator": "Exists"}
REST_TOKEN = "test-rest-token"

DEFAULT_OFFERS: list[dict[str, Any]] = [
    {
        "sku": "a100",
        "gpu_model": "A100-80GB",
        "gpu_count": 1,
        "gpu_memory_gib": 80,
        "vcpus": 8,
        "memory_gib": 64,
        "price_per_hour": 1.5,
        "capacity": 6,
    },
    {
        "sku": "cpu",
        "gpu_count": 0,
        "vcpus": 4,
        "memory_gib": 8,
        "price_per_hour": 0.1,
        "capacity": 10,
    },
]


@dataclass
class AgentProcess:
    node: str
    config_path: Path
    state_dir: Path
    log_path: Path
    kubeconfig: Path
    process: subprocess.Popen[bytes] | None = None
    provider_dirs: dict[str, Path] = field(default_factory=dict)
    provider_entries: list[dict[str, Any]] = field(default_factory=list)
    pod_name: str = ""
    # Extra environment (a Deployment's env, resolved as a kubelet would).
    env: dict[str, str] = field(default_factory=dict)
    log_level: str = "debug"

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vk_provider",
                "run",
                "--config",
                str(self.config_path),
                "--kubeconfig",
                str(self.kubeconfig),
                "--state-dir",
                str(self.state_dir),
                "--log-level",
                self.log_level,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                "POD_NAME": self.pod_name or f"{self.node}-0",
                **self.env,
            },
        )
        log.close()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def rest_url(self) -> str | None:
        """The REST API's address, from the agent's log (it binds a free port in tests)."""
        found = re.findall(r"REST API on ([\d.]+):(\d+)", self.log_text())
        return f"http://{found[-1][0]}:{found[-1][1]}" if found else None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def local_dir(self, provider: str = "local-a") -> Path:
        return self.provider_dirs[provider]


class AgentHarness:
    def __init__(self, cluster: LocalCluster, tmp_path: Path) -> None:
        self._cluster = cluster
        self._tmp = tmp_path
        self.agents: list[AgentProcess] = []
        self._granted: set[str] = set()

    def start(
        self,
        *,
        providers: list[dict[str, Any]] | None = None,
        intervals: dict[str, Any] | None = None,
        node: dict[str, Any] | None = None,
        kubeconfig: Path | None = None,
        placement: dict[str, Any] | None = None,
        budget: dict[str, Any] | None = None,
        overflow: dict[str, Any] | None = None,
        rest_static_token: bool = True,
        start: bool = True,
        leader_election: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        log_level: str = "debug",
        cluster_serving: bool = False,
        endpoint_slices: dict[str, Any] | None = None,
    ) -> AgentProcess:
        node_name = (node or {}).get("name") or f"vk-{uuid.uuid4().hex[:8]}"
        root = self._tmp / node_name
        root.mkdir(parents=True)
        token_file = root / "rest-token"
        token_file.write_text(REST_TOKEN)
        entries = providers or [{"name": "local-a", "offers": DEFAULT_OFFERS}]
        provider_dirs = {p["name"]: root / "instances" / p["name"] for p in entries}
        config = {
            "node": {"name": node_name, "address": "127.0.0.1", **(node or {})},
            "kubelet_api": {
                "listen": "127.0.0.1:0",
                "client_ca_file": str(self._cluster.pki.ca.cert),
            }
            # A serving certificate the cluster signs, the agent approving its own request;
            # else a self-signed one, configured (the session cluster does not verify it).
            | {
                "serving": {"source": "cluster", "self_approve": True}
                if cluster_serving
                else {"source": "self-signed"}
            },
            # Without the static token, REST callers are checked by TokenReview and
            # SubjectAccessReview against the cluster, as in production.
            "rest": {"listen": "127.0.0.1:0"}
            | ({"static_token": f"file:{token_file}"} if rest_static_token else {}),
            "intervals": {
                "lease_seconds": 2,
                "node_status_seconds": 5,
                "pod_status_seconds": 0.5,
                "restart_backoff_seconds": 1,
                "retry_backoff_seconds": 1,
                **(intervals or {}),
            },
            "providers": [
                {"type": "local", "enabled": True, "state_dir": str(provider_dirs[p["name"]]), **p}
                if p.get("type", "local") == "local"
                else p
                for p in entries
            ],
        }
        if placement:
            config["placement"] = placement
        if budget:
            config["budget"] = budget
        if overflow:
            config["overflow"] = overflow
        if leader_election:
            config["leader_election"] = leader_election
        if endpoint_slices:
            config["endpoint_slices"] = endpoint_slices
        provider_entries = list(config["providers"])
        config_path = root / "agent.yaml"
        config_path.write_text(yaml.safe_dump(config))
        if kubeconfig is None:
            handover = any(
                ((overflow or {}).get(part) or {}).get("enabled")
                for part in ("handover", "move_home")
            )
            kubeconfig = shipped_role.grant(
                self._cluster,
                node_name,
                root,
                handover=handover,
                serving=cluster_serving,
                traffic=bool((endpoint_slices or {}).get("enabled")),
            )
            env = {"POD_NAMESPACE": AUDITED_NAMESPACE, **(env or {})}
            self._granted.add(node_name)
        agent = AgentProcess(
            node=node_name,
            config_path=config_path,
            state_dir=root / "state",
            log_path=root / "agent.log",
            kubeconfig=kubeconfig,
            provider_dirs=provider_dirs,
            provider_entries=provider_entries,
            pod_name=f"{node_name}-0",
            env=dict(env or {}),
            log_level=log_level,
        )
        self.agents.append(agent)
        if start:
            agent.start()
        return agent

    def replica(self, of: AgentProcess, *, start: bool = True) -> AgentProcess:
        """Another replica of ``of``: same configuration (node, provider state directories),
        its own pod name, state directory (TLS material) and log."""
        index = sum(1 for a in self.agents if a.node == of.node)
        root = of.config_path.parent / f"replica-{index}"
        root.mkdir()
        agent = AgentProcess(
            node=of.node,
            config_path=of.config_path,
            state_dir=root / "state",
            log_path=root / "agent.log",
            kubeconfig=of.kubeconfig,
            provider_dirs=of.provider_dirs,
            provider_entries=of.provider_entries,
            pod_name=f"{of.node}-{index}",
            env=dict(of.env),
        )
        self.agents.append(agent)
        if start:
            agent.start()
        return agent

    def stop_all(self) -> None:
        """Stop every agent, every instance and every process they started, even when a test
        failed half-way with faults still injected."""
        for agent in self.agents:
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.stop()
            for directory in agent.provider_dirs.values():
                with contextlib.suppress(OSError):
                    clear_faults(directory)  # or the cleanup itself meets the injected faults
            with contextlib.suppress(Exception):
                asyncio.run(terminate_instances(agent))
            subprocess.run(
                [
                    _kubectl(),
                    "--kubeconfig",
                    str(self._cluster.kubeconfig),
                    "delete",
                    "node",
                    agent.node,
                    "--ignore-not-found",
                    "--wait=false",
                ],
                capture_output=True,
                check=False,
                timeout=30,
            )
        for node, namespace in {
            (agent.node, agent.env.get("POD_NAMESPACE") or "kube-node-lease")
            for agent in self.agents
        }:
            subprocess.run(
                [
                    _kubectl(),
                    "--kubeconfig",
                    str(self._cluster.kubeconfig),
                    "delete",
                    "lease",
                    "-n",
                    namespace,
                    f"vk-provider-leader-{node}",
                    "--ignore-not-found",
                    "--wait=false",
                ],
                capture_output=True,
                check=False,
                timeout=30,
            )
        for node in self._granted:
            shipped_role.revoke(self._cluster, node)
        reap_runners(self._tmp)


def reap_runners(root: Path) -> list[int]:
    """SIGKILL every local runner (and its program) started under ``root``; their pids."""
    return kill_local_processes(root)


def _kubectl() -> str:
    return str(Path(sys.executable).parent / "kubectl")


def local_providers(agent: AgentProcess) -> list[LocalProvider]:
    """The agent's local providers, built from the configuration it was started with."""
    providers = []
    for raw in agent.provider_entries:
        if raw.get("type") != "local":
            continue
        entry = LocalProviderConfig.model_validate(raw)
        providers.append(LocalProvider(entry, state_dir=Path(str(entry.state_dir))))
    return providers


async def terminate_instances(agent: AgentProcess) -> None:
    for provider in local_providers(agent):
        for instance in await provider.list_ours():
            for _ in range(5):  # the provider may still fail a call now and then
                try:
                    await provider.delete(instance.instance_id, grace_seconds=0)
                    break
                except Exception:
                    await asyncio.sleep(0.1)


def pod_on(
    node: str, name: str, *, command: list[str], gpus: int = 1, **extra: Any
) -> dict[str, Any]:
    """A pod manifest pinned to the test's virtual node."""
    container: dict[str, Any] = {
        "name": "main",
        "image": "example.com/test:1",
        "command": command,
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {},
    }
    container.update(extra.pop("container", {}))
    spec: dict[str, Any] = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "tolerations": [TOLERATION],
        "terminationGracePeriodSeconds": extra.pop("grace", 5),
        "restartPolicy": extra.pop("restart_policy", "Always"),
        "containers": [container],
    }
    spec.update(extra.pop("spec", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **extra.pop("metadata", {})},
        "spec": spec,
    }
