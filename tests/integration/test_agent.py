"""The agent against the real control plane: the virtual node and the pod lifecycle.

Every test starts its own agent (`vk-provider run` in a child process) with its own node
name and `local` provider, creates pods pinned to that node, and watches what Kubernetes
sees: node conditions, Lease, pod status, Events, `kubectl logs`.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from tests.helpers import wait_for
from tests.integration.agent_harness import (
    TOLERATION,
    AgentHarness,
    AgentProcess,
    local_providers,
    pod_on,
)
from vk_provider.kube.client import KubeClient
from vk_provider_adapters.local.faults import inject_loss

pytestmark = pytest.mark.integration
PY = sys.executable


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return {}


async def _ready_node(api: KubeClient, agent: AgentProcess) -> dict[str, Any]:
    async def ready() -> dict[str, Any] | None:
        node = await api.get_node(agent.node)
        if node and _condition(node, "Ready").get("status") == "True":
            return node
        if agent.process and agent.process.poll() is not None:
            pytest.fail(
                f"agent exited with {agent.process.returncode}:\n{agent.log_text()[-3000:]}"
            )
        return None

    return await wait_for(ready, timeout=60, what=f"node {agent.node} Ready")


async def _pod(api: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    pod = await api.get_pod(namespace, name)
    assert pod is not None, f"pod {name} vanished"
    return pod


async def _phase(
    api: KubeClient, namespace: str, name: str, phase: str, timeout: float = 60
) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        pod = await api.get_pod(namespace, name)
        return pod if pod and (pod.get("status") or {}).get("phase") == phase else None

    return await wait_for(check, timeout=timeout, what=f"pod {name} {phase}")


async def _events(kube: ApiClient, namespace: str) -> list[Any]:
    return list((await client.CoreV1Api(kube).list_namespaced_event(namespace)).items)


def _kubectl(kubeconfig: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(PY).parent / "kubectl"), "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


# ---------------------------------------------------------------------------- the node


async def test_node_registers_ready_renews_lease_and_goes_not_ready_when_stopped(
    api: KubeClient, agents: AgentHarness
) -> None:
    agent = agents.start(node={"labels": {"team": "inference"}})
    node = await _ready_node(api, agent)
    labels = node["metadata"]["labels"]
    assert labels["type"] == "virtual-kubelet"
    assert labels["kubernetes.io/role"] == "agent"
    assert labels["kubernetes.io/hostname"] == agent.node
    assert labels["team"] == "inference"
    taints = {(t["key"], t.get("value"), t["effect"]) for t in node["spec"]["taints"]}
    assert ("virtual-kubelet.io/provider", "vk-provider", "NoSchedule") in taints
    # Six A100 instances of one GPU each can be had: capacity says 6 GPUs.
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "6"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "6"
    assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] > 0

    first = await api.get_lease(agent.node)
    assert first is not None
    assert first["spec"]["holderIdentity"] == agent.node

    async def renewed() -> bool:
        lease = await api.get_lease(agent.node)
        return bool(lease and lease["spec"]["renewTime"] != first["spec"]["renewTime"])

    await wait_for(renewed, timeout=15, what="the Lease to be renewed")

    assert agent.stop() == 0, agent.log_text()[-2000:]

    async def not_ready() -> bool:
        found = await api.get_node(agent.node)
        return bool(found) and _condition(found, "Ready").get("status") == "Unknown"

    # The node-lifecycle controller (grace 20 s in the local cluster) marks it, not the agent.
    await wait_for(not_ready, timeout=90, interval=1, what="node NotReady (Unknown)")
    found = await api.get_node(agent.node)
    assert found is not None
    assert _condition(found, "Ready")["reason"] == "NodeStatusUnknown"


async def test_a_running_agent_imports_nothing_of_the_dev_tooling(
    api: KubeClient, agents: AgentHarness
) -> None:
    """`vk-provider run` with its node Ready: Python's own import log (PYTHONPROFILEIMPORTTIME)
    names every module the agent loaded, and none is of vk-provider-dev."""
    agent = agents.start(env={"PYTHONPROFILEIMPORTTIME": "1"})
    await _ready_node(api, agent)
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)$", agent.log_text(), re.M))
    assert {
        "vk_provider.runtime.agent",
        "vk_provider_adapters.local.adapter",
    } <= imported  # it sees them
    assert sorted(m for m in imported if m.split(".")[0] == "vk_provider_dev") == []


async def test_unauthenticated_kubelet_api_calls_are_refused(
    api: KubeClient, agents: AgentHarness
) -> None:
    agent = agents.start()
    node = await _ready_node(api, agent)
    port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    async with httpx.AsyncClient(verify=False) as http:  # noqa: S501 - server cert is self-signed
        for path in ("/healthz", "/containerLogs/default/x/y"):
            response = await http.get(f"https://127.0.0.1:{port}{path}")
            assert response.status_code == 401, path
        bad = await http.get(
            f"https://127.0.0.1:{port}/healthz", headers={"Authorization": "Bearer not-a-token"}
        )
        assert bad.status_code == 401


# ---------------------------------------------------------------------------- pods


def _server_deployment(node: str, replicas: int, *, ignore_sigterm: bool = False) -> dict[str, Any]:
    script = (
        "import signal, sys, time\n"
        + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_sigterm else "")
        + "print('hello from the virtual node', flush=True)\n"
        "while True:\n    print('tick', flush=True)\n    time.sleep(0.5)\n"
    )
    labels = {"app": "server"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "server"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "tolerations": [TOLERATION],
                    "terminationGracePeriodSeconds": 3,
                    "containers": [
                        {
                            "name": "server",
                            "image": "example.com/server:1",
                            "command": [PY, "-c", script],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }


async def test_deployment_runs_logs_scales_down_and_deletes(
    api: KubeClient, kube: ApiClient, namespace: str, agents: AgentHarness, kubeconfig: Path
) -> None:
    agent = agents.start()
    await _ready_node(api, agent)
    apps = client.AppsV1Api(kube)
    await apps.create_namespaced_deployment(namespace, _server_deployment(agent.node, 3))

    async def running() -> list[dict[str, Any]] | None:
        pods, _ = await api.list_node_pods(agent.node)
        mine = [p for p in pods if p["metadata"]["namespace"] == namespace]
        ok = [p for p in mine if (p.get("status") or {}).get("phase") == "Running"]
        return ok if len(ok) == 3 else None

    pods = await wait_for(running, timeout=60, what="3 pods Running")
    for pod in pods:
        (status,) = pod["status"]["containerStatuses"]
        assert status["name"] == "server"
        assert status["ready"] is True
        assert "running" in status["state"]
        assert status["containerID"].startswith("vk-provider://")
        assert pod["status"]["hostIP"] == "127.0.0.1"
        assert pod["status"]["startTime"]
        assert _condition(pod, "Ready")["status"] == "True"
        annotations = pod["metadata"]["annotations"]
        assert annotations["vk-provider.io/provider"] == "local-a"
        assert annotations["vk-provider.io/offer"] == "local-a/a100/local"
        assert float(annotations["vk-provider.io/price-per-hour"]) == 1.5

    name = pods[0]["metadata"]["name"]
    logs = _kubectl(kubeconfig, "logs", "-n", namespace, name)
    assert logs.returncode == 0, logs.stderr
    assert "hello from the virtual node" in logs.stdout
    stamped = _kubectl(kubeconfig, "logs", "-n", namespace, name, "--timestamps", "--tail=1")
    assert stamped.returncode == 0, stamped.stderr
    stamp = stamped.stdout.split(" ", 1)[0]
    datetime.fromisoformat(stamp.replace("Z", "+00:00")[:26] + "+00:00")
    # -f streams: new ticks arrive while we read.
    follow = subprocess.Popen(
        [
            str(Path(PY).parent / "kubectl"),
            "--kubeconfig",
            str(kubeconfig),
            "logs",
            "-f",
            "-n",
            namespace,
            name,
            "--tail=0",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert follow.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(follow.stdout.readline), timeout=20)
        assert line.strip() == "tick"
    finally:
        follow.kill()
        follow.wait()

    instance_dirs = {p["metadata"]["uid"]: p for p in pods}
    await apps.patch_namespaced_deployment_scale("server", namespace, {"spec": {"replicas": 1}})

    async def one_left() -> bool:
        current, _ = await api.list_node_pods(agent.node)
        return len([p for p in current if p["metadata"]["namespace"] == namespace]) == 1

    # Grace period 3 s: pods must be gone well within grace + 10 s.
    await wait_for(one_left, timeout=13, what="scale-down to finish within grace + 10 s")
    (provider,) = local_providers(agent)
    live = [i for i in await provider.list_ours() if i.state.value in ("Running", "Pending")]
    assert len(live) == 1
    assert live[0].pod_uid in instance_dirs


async def test_deleting_a_pod_that_ignores_sigterm_completes(
    api: KubeClient, kube: ApiClient, namespace: str, agents: AgentHarness
) -> None:
    agent = agents.start()
    await _ready_node(api, agent)
    script = (
        "import os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print(os.getpid(), flush=True)\ntime.sleep(3600)\n"
    )
    core = client.CoreV1Api(kube)
    await core.create_namespaced_pod(
        namespace, pod_on(agent.node, "stubborn", command=[PY, "-c", script], grace=2)
    )
    await _phase(api, namespace, "stubborn", "Running")
    logs_dir = agent.local_dir()
    pid_line = await wait_for(
        lambda: _first_log_line(logs_dir), timeout=10, what="the process to print its pid"
    )
    pid = int(pid_line.split()[-1])
    assert _alive(pid)
    await core.delete_namespaced_pod("stubborn", namespace)

    async def gone() -> bool:
        return await api.get_pod(namespace, "stubborn") is None

    await wait_for(gone, timeout=12, what="the pod to be deleted within grace + 10 s")
    assert not _alive(pid)


async def _first_log_line(directory: Path) -> str | None:
    for path in directory.rglob("*.log"):
        text = path.read_text(errors="replace").strip()
        if text:
            return text.splitlines()[0]
    return None


async def test_secret_env_reaches_the_process_and_nowhere_else(
    api: KubeClient, kube: ApiClient, namespace: str, agents: AgentHarness
) -> None:
    agent = agents.start()
    await _ready_node(api, agent)
    secret_value = "s3cr3t-" + hashlib.sha1(namespace.encode()).hexdigest()[:12]  # noqa: S324
    core = client.CoreV1Api(kube)
    await core.create_namespaced_secret(
        namespace,
        {"metadata": {"name": "api-key"}, "stringData": {"token": secret_value}},
    )
    script = (
        "import hashlib, os\n"
        "print(hashlib.sha256(os.environ['API_TOKEN'].encode()).hexdigest(), flush=True)\n"
    )
    pod = pod_on(
        agent.node,
        "uses-secret",
        command=[PY, "-c", script],
        restart_policy="Never",
        container={
            "env": [
                {
                    "name": "API_TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": "api-key", "key": "token"}},
                }
            ]
        },
    )
    await core.create_namespaced_pod(namespace, pod)
    await _phase(api, namespace, "uses-secret", "Succeeded")
    logs = await core.read_namespaced_pod_log("uses-secret", namespace)
    assert logs.strip() == hashlib.sha256(secret_value.encode()).hexdigest()
    assert secret_value not in agent.log_text()
    for event in await _events(kube, namespace):
        assert secret_value not in (event.message or "")


async def test_instance_loss_fails_the_pod_and_the_replacement_runs(
    api: KubeClient, kube: ApiClient, namespace: str, agents: AgentHarness
) -> None:
    agent = agents.start(
        providers=[
            {
                "name": "local-a",
                "offers": [
                    {
                        "sku": "a100",
                        "gpu_model": "A100-80GB",
                        "gpu_count": 1,
                        "price_per_hour": 1.0,
                        "capacity": 2,
                    },
                    {
                        "sku": "h100",
                        "gpu_model": "H100-SXM",
                        "gpu_count": 1,
                        "price_per_hour": 2.0,
                        "capacity": 2,
                    },
                ],
            },
        ]
    )
    await _ready_node(api, agent)
    apps = client.AppsV1Api(kube)
    await apps.create_namespaced_deployment(namespace, _server_deployment(agent.node, 1))

    async def one_running() -> dict[str, Any] | None:
        pods, _ = await api.list_node_pods(agent.node)
        ok = [
            p
            for p in pods
            if p["metadata"]["namespace"] == namespace
            and (p.get("status") or {}).get("phase") == "Running"
        ]
        return ok[0] if len(ok) == 1 else None

    first = await wait_for(one_running, timeout=60, what="the first pod Running")
    assert first["metadata"]["annotations"]["vk-provider.io/offer"] == "local-a/a100/local"
    inject_loss(agent.local_dir(), first["metadata"]["annotations"]["vk-provider.io/instance-id"])

    failed = await _phase(api, namespace, first["metadata"]["name"], "Failed")
    assert failed["status"]["reason"] == "InstanceLost"

    async def replacement() -> dict[str, Any] | None:
        pods, _ = await api.list_node_pods(agent.node)
        fresh = [
            p
            for p in pods
            if p["metadata"]["namespace"] == namespace
            and p["metadata"]["uid"] != first["metadata"]["uid"]
            and (p.get("status") or {}).get("phase") == "Running"
        ]
        return fresh[0] if fresh else None

    new = await wait_for(replacement, timeout=60, what="the replacement pod Running")
    # The lost offer is on cool-down: the replacement went to the next one.
    assert new["metadata"]["annotations"]["vk-provider.io/offer"] == "local-a/h100/local"
    reasons = {e.reason for e in await _events(kube, namespace)}
    assert "InstanceLost" in reasons


async def test_restart_policy_always_relaunches_with_backoff_and_never_fails(
    api: KubeClient, kube: ApiClient, namespace: str, agents: AgentHarness
) -> None:
    agent = agents.start()
    await _ready_node(api, agent)
    core = client.CoreV1Api(kube)
    crash = [PY, "-c", "import sys; print('crashing', flush=True); sys.exit(3)"]
    await core.create_namespaced_pod(namespace, pod_on(agent.node, "crashy", command=crash))
    await core.create_namespaced_pod(
        namespace, pod_on(agent.node, "once", command=crash, restart_policy="Never")
    )

    failed = await _phase(api, namespace, "once", "Failed")
    (status,) = failed["status"]["containerStatuses"]
    assert status["state"]["terminated"]["exitCode"] == 3
    assert status["restartCount"] == 0

    seen_backoff = False

    async def restarted_twice() -> bool:
        nonlocal seen_backoff
        pod = await _pod(api, namespace, "crashy")
        (cs,) = pod["status"].get("containerStatuses") or [{}]
        if (cs.get("state") or {}).get("waiting", {}).get("reason") == "CrashLoopBackOff":
            seen_backoff = True
            assert cs["lastState"]["terminated"]["exitCode"] == 3
        return int(cs.get("restartCount") or 0) >= 2

    await wait_for(restarted_twice, timeout=60, interval=0.1, what="restartCount >= 2")
    assert seen_backoff
    pod = await _pod(api, namespace, "crashy")
    assert pod["status"]["phase"] == "Running"
    reasons = {e.reason for e in await _events(kube, namespace)}
    assert "BackOff" in reasons


async def test_unknown_gpu_model_stays_pending_with_an_event_saying_why(
    api: KubeClient, kube: ApiClient, namespace: str, agents: AgentHarness
) -> None:
    agent = agents.start()
    await _ready_node(api, agent)
    core = client.CoreV1Api(kube)
    pod = pod_on(
        agent.node,
        "wants-b200",
        command=[PY, "-c", "print(1)"],
        metadata={"annotations": {"vk-provider.io/gpu": "B200"}},
    )
    await core.create_namespaced_pod(namespace, pod)

    async def no_capacity_event() -> Any:
        for event in await _events(kube, namespace):
            if event.reason == "NoCapacity" and event.involved_object.name == "wants-b200":
                return event
        return None

    event = await wait_for(no_capacity_event, timeout=30, what="a NoCapacity event")
    assert "gpu-model" in event.message
    assert "B200" in event.message
    found = await _pod(api, namespace, "wants-b200")
    assert found["status"]["phase"] == "Pending"
    assert agent.process is not None and agent.process.poll() is None


async def test_sigterm_stops_the_agent_cleanly(api: KubeClient, agents: AgentHarness) -> None:
    agent = agents.start()
    await _ready_node(api, agent)
    assert agent.stop(signal.SIGTERM) == 0
    assert "Traceback" not in agent.log_text()


async def test_a_bad_config_exits_2_naming_the_field(agents: AgentHarness) -> None:
    agent = agents.start(start=False)
    text = agent.config_path.read_text().replace("enabled: true", "enabled: yes-please")
    agent.config_path.write_text(text)
    result = subprocess.run(
        [PY, "-m", "vk_provider", "run", "--config", str(agent.config_path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "providers[0].enabled" in result.stderr
