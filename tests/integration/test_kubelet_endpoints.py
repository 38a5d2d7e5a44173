"""The kubelet API through the real API server: node proxy, exec, logs --previous,
port-forward and kubectl top.

Each test starts its own agent whose kubelet API listens on the session's veth address
(``kubelet_node.node_link``), which it advertises as the node's InternalIP: the API server
refuses to proxy ``nodes/<node>/proxy`` to loopback, and test traffic must stay on this
machine's loopback and the veth pair the tests made. ``kubectl`` is the real client; the API
server translates its WebSocket streams into SPDY for the kubelet API, which is the point.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from tests.helpers import wait_for
from tests.integration.agent_harness import DEFAULT_OFFERS, AgentHarness, AgentProcess, pod_on
from tests.integration.kubelet_node import Commands, assert_port_forward, start_agent_on
from tests.integration.test_agent import _phase, _ready_node
from vk_provider.kube.client import KubeClient
from vk_provider_dev.cluster import netns
from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.metrics_server import MetricsServer
from vk_provider_dev.cluster.ports import free_port

pytestmark = pytest.mark.integration
PY = sys.executable
LOCAL = {"name": "local-a", "offers": DEFAULT_OFFERS, "restart_backoff_seconds": 1}
MEMORY = {"type": "memory", "name": "mem", "enabled": True, "offers": [DEFAULT_OFFERS[1]]}
IDLE = [PY, "-c", "import time\nprint('up', flush=True)\nwhile True: time.sleep(0.5)"]


async def running_agent(
    agents: AgentHarness,
    control_plane: LocalCluster,
    api: KubeClient,
    link: netns.VethNamespace,
    *providers: dict[str, Any],
) -> AgentProcess:
    agent = start_agent_on(agents, control_plane, link, providers=list(providers) or [LOCAL])
    node = await _ready_node(api, agent)
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == link.host_address
    return agent


async def running_pod(
    kube: ApiClient, api: KubeClient, namespace: str, manifest: dict[str, Any]
) -> dict[str, Any]:
    await client.CoreV1Api(kube).create_namespaced_pod(namespace, manifest)
    name = manifest["metadata"]["name"]

    async def started() -> dict[str, Any] | None:
        pod = await api.get_pod(namespace, name)
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
        return pod if statuses and all("running" in s["state"] for s in statuses) else None

    return await wait_for(started, timeout=90, what=f"pod {name} running")


# --------------------------------------------------------------------------- node proxy


async def test_pods_and_running_pods_through_the_node_proxy(
    agents: AgentHarness,
    control_plane: LocalCluster,
    api: KubeClient,
    kube: ApiClient,
    namespace: str,
    node_link: netns.VethNamespace,
    kubectl: Commands,
) -> None:
    agent = await running_agent(agents, control_plane, api, node_link)
    manifest = pod_on(agent.node, "web", command=IDLE, gpus=0)
    manifest["spec"]["containers"].append(
        {"name": "side", "image": "example.com/side:2", "command": IDLE}
    )
    pod = await running_pod(kube, api, namespace, manifest)

    answer = kubectl.run("get", "--raw", f"/api/v1/nodes/{agent.node}/proxy/pods")
    assert answer.returncode == 0, answer.stderr
    listed = json.loads(answer.stdout)
    assert listed["kind"] == "PodList"
    [item] = [p for p in listed["items"] if p["metadata"]["name"] == "web"]
    assert item["metadata"]["uid"] == pod["metadata"]["uid"]
    assert [c["name"] for c in item["spec"]["containers"]] == ["main", "side"]

    async def running_listed() -> dict[str, Any] | None:
        answer = kubectl.run("get", "--raw", f"/api/v1/nodes/{agent.node}/proxy/runningpods/")
        assert answer.returncode == 0, answer.stderr
        items = json.loads(answer.stdout)["items"]
        return next((p for p in items if p["metadata"]["name"] == "web"), None)

    found = await wait_for(running_listed, timeout=30, what="web among the running pods")
    assert found["metadata"] == {
        "name": "web",
        "namespace": namespace,
        "uid": pod["metadata"]["uid"],
        "creationTimestamp": None,
    }
    assert {(c["name"], c["image"]) for c in found["spec"]["containers"]} == {
        ("main", "example.com/test:1"),
        ("side", "example.com/side:2"),
    }


# --------------------------------------------------------------------------- exec


async def test_exec_one_shot_interactive_and_on_a_terminal(
    agents: AgentHarness,
    control_plane: LocalCluster,
    api: KubeClient,
    kube: ApiClient,
    namespace: str,
    node_link: netns.VethNamespace,
    kubectl: Commands,
    cpu_hog: int,
) -> None:
    agent = await running_agent(agents, control_plane, api, node_link)
    manifest = pod_on(
        agent.node,
        "shell",
        command=IDLE,
        gpus=0,
        container={"env": [{"name": "GREETING", "value": "hello from the pod"}]},
    )
    await running_pod(kube, api, namespace, manifest)

    one_shot = kubectl.run(
        "exec", "-n", namespace, "shell", "--",
        "sh", "-c", 'echo "$GREETING"; echo oops >&2; exit 3',
    )  # fmt: skip
    assert one_shot.returncode == 3, one_shot.stderr
    assert one_shot.stdout == "hello from the pod\n"
    assert "oops" in one_shot.stderr

    interactive = kubectl.run(
        "exec", "-i", "-n", namespace, "shell", "--", "sh", "-c", "cat; echo done",
        input="line one\nline two\n",
    )  # fmt: skip
    assert interactive.returncode == 0, interactive.stderr
    assert interactive.stdout == "line one\nline two\ndone\n"

    master, slave = os.openpty()
    try:
        session = kubectl.start(
            "exec", "-it", "-n", namespace, "shell", "--", "sh",
            stdin=slave, stdout=slave, stderr=slave,
        )  # fmt: skip
        os.close(slave)
        slave = -1
        os.write(master, b"echo $((6 * 7)) $(tty)\n")
        seen = read_until(master, b"42 /dev/pts/", timeout=60)
        assert b"42 /dev/pts/" in seen
        os.write(master, b"exit 5\n")
        assert session.wait(timeout=60) == 5
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)


def read_until(fd: int, wanted: bytes, *, timeout: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while wanted not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                seen += os.read(fd, 4096)
            except OSError:
                break
    return seen


TICK = [
    PY,
    "-c",
    "import time\nn = 0\nwhile True:\n"
    "    n += 1\n    print('tick', n, flush=True)\n    time.sleep(0.3)\n",
]


async def test_attach_follows_the_containers_output(
    agents: AgentHarness,
    control_plane: LocalCluster,
    api: KubeClient,
    kube: ApiClient,
    namespace: str,
    node_link: netns.VethNamespace,
    kubectl: Commands,
) -> None:
    agent = await running_agent(agents, control_plane, api, node_link)
    await running_pod(kube, api, namespace, pod_on(agent.node, "ticker", command=TICK, gpus=0))
    attached = kubectl.start(
        "attach", "-n", namespace, "ticker", "-c", "main",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert attached.stdout is not None
    lines = [attached.stdout.readline() for _ in range(2)]
    assert all(line.startswith("tick ") for line in lines), lines
    first, second = (int(line.split()[1]) for line in lines)
    assert second == first + 1  # live output, in order
    assert attached.poll() is None


async def test_exec_on_a_provider_without_it_says_why(
    agents: AgentHarness,
    control_plane: LocalCluster,
    api: KubeClient,
    kube: ApiClient,
    namespace: str,
    node_link: netns.VethNamespace,
    kubectl: Commands,
) -> None:
    agent = await running_agent(agents, control_plane, api, node_link, MEMORY, LOCAL)
    manifest = pod_on(
        agent.node, "pretend", command=["true"], gpus=0,
        metadata={"annotations": {"vk-provider.io/providers": "mem"}},
    )  # fmt: skip
    await running_pod(kube, api, namespace, manifest)
    answer = kubectl.run("exec", "-n", namespace, "pretend", "--", "true")
    assert answer.returncode != 0
    assert "exec is not supported by provider mem" in answer.stderr


# --------------------------------------------------------------------------- logs --previous


async def test_logs_previous_returns_the_run_before(
    agents: AgentHarness,
    control_plane: LocalCluster,
    api: KubeClient,
    kube: ApiClient,
    namespace: str,
    node_link: netns.VethNamespace,
    kubectl: Commands,
    tmp_path: Path,
) -> None:
    agent = await running_agent(agents, control_plane, api, node_link)
    counter = tmp_path / "runs"
    # The first run fails after a moment; every later one stays up.
    script = (
        f"n=$(cat {counter} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {counter}; "
        'echo "run $n"; if [ "$n" = 1 ]; then sleep 1; exit 1; fi; exec sleep 300'
    )
    await client.CoreV1Api(kube).create_namespaced_pod(
        namespace, pod_on(agent.node, "flaky", command=["sh", "-c", script], gpus=0)
    )
    await client.CoreV1Api(kube).create_namespaced_pod(
        namespace, pod_on(agent.node, "steady", command=IDLE, gpus=0)
    )

    async def restarted() -> bool:
        pod = await api.get_pod(namespace, "flaky")
        [status] = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
        return status.get("restartCount", 0) >= 1 and "running" in status.get("state", {})

    await wait_for(restarted, timeout=90, what="flaky restarted and running again")
    previous = kubectl.run("logs", "-n", namespace, "flaky", "--previous")
    assert previous.returncode == 0, previous.stderr
    assert previous.stdout == "run 1\n"
    current = kubectl.run("logs", "-n", namespace, "flaky")
    assert current.stdout == "run 2\n"

    await _phase(api, namespace, "steady", "Running")
    never = kubectl.run("logs", "-n", namespace, "steady", "--previous")
    assert never.returncode != 0
    assert 'previous terminated container "main" in pod "steady" not found' in never.stderr


# --------------------------------------------------------------------------- port-forward

SERVE = (
    "import http.server, os\n"
    "class Hello(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = ('hello from ' + self.path).encode()\n"
    "        self.send_response(200)\n"
    "        self.send_header('Content-Length', str(len(body)))\n"
    "        self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "http.server.ThreadingHTTPServer(('127.0.0.1', int(os.environ['PORT'])), Hello)"
    ".serve_forever()\n"
)


async def test_port_forward_reaches_the_pods_port(
    agents: AgentHarness,
    control_plane: LocalCluster,
    api: KubeClient,
    kube: ApiClient,
    namespace: str,
    node_link: netns.VethNamespace,
    kubectl: Commands,
) -> None:
    agent = await running_agent(agents, control_plane, api, node_link)
    port, local = free_port(), free_port()
    manifest = pod_on(
        agent.node,
        "server",
        command=[PY, "-c", SERVE],
        gpus=0,
        container={
            "env": [{"name": "PORT", "value": str(port)}],
            "ports": [{"containerPort": port}],
        },
    )
    await running_pod(kube, api, namespace, manifest)
    await assert_port_forward(kubectl, namespace, local, port)


# --------------------------------------------------------------------------- kubectl top


BUSY = [
    PY,
    "-c",
    "import time\nwhile True:\n    end = time.time() + 0.05\n    while time.time() < end: pass\n"
    "    time.sleep(0.05)\n",
]


async def test_kubectl_top_pod_and_node(
    agents: AgentHarness,
    control_plane: LocalCluster,
    api: KubeClient,
    kube: ApiClient,
    namespace: str,
    node_link: netns.VethNamespace,
    metrics: MetricsServer,
    kubectl: Commands,
    cpu_hog: int,
) -> None:
    agent = await running_agent(agents, control_plane, api, node_link)
    await running_pod(kube, api, namespace, pod_on(agent.node, "busy", command=BUSY, gpus=0))

    async def top_pod() -> list[str] | None:
        answer = kubectl.run("top", "pod", "-n", namespace, "busy", "--no-headers")
        fields = answer.stdout.split()
        return fields if answer.returncode == 0 and fields[:1] == ["busy"] else None

    _, cpu, memory = await wait_for(top_pod, timeout=180, interval=2, what="kubectl top pod busy")
    assert cpu.endswith("m") and int(cpu[:-1]) > 0, cpu
    assert memory.endswith("Mi") and int(memory[:-2]) > 0, memory

    async def top_node() -> list[str] | None:
        answer = kubectl.run("top", "node", agent.node, "--no-headers")
        fields = answer.stdout.split()
        return fields if answer.returncode == 0 and fields[:1] == [agent.node] else None

    fields = await wait_for(top_node, timeout=120, interval=2, what="kubectl top node")
    assert fields[1].endswith("m") and int(fields[1][:-1]) > 0

    containers = kubectl.run("top", "pod", "-n", namespace, "busy", "--containers", "--no-headers")
    assert containers.returncode == 0 and containers.stdout.split()[:2] == ["busy", "main"]
