"""End to end: a pod of cluster A runs as a pod in a remote cluster B.

Two real control planes: A is the session's ``control_plane``; B is started by this module.
B gets a virtual node of its own (an agent of ours with a ``local`` provider, so B's pods
really run, as local processes). A's agent has one provider, ``type: kubernetes``, pointing at
B's admin kubeconfig. A pod on A's virtual node therefore travels:

    A's agent → Kubernetes adapter → B's API → B's scheduler → B's agent → a local process

and its logs come back the other way (``kubectl logs`` on A → A's kubelet API → adapter →
B's ``pods/log`` → B's kubelet API → the process's log file). A whole pod (app containers,
an init container, a native sidecar, a readiness probe) travels as one remote pod: B's agent
runs every container and the probe, and A's pod shows each container as B reports it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import struct
import subprocess
import sys
import termios
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.api_client import ApiClient

from tests.helpers import wait_for
from tests.integration.agent_harness import AgentHarness, AgentProcess, local_providers, pod_on
from tests.integration.http_replica import replica_command
from tests.integration.kubelet_node import Commands, assert_port_forward, start_agent_on
from tests.integration.test_kubelet_endpoints import read_until
from vk_provider.kube.client import KubeClient
from vk_provider_dev.cluster import netns
from vk_provider_dev.cluster.binaries import ensure_binaries
from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.metrics_server import MetricsServer, ensure_metrics_server
from vk_provider_dev.cluster.ports import free_port

pytestmark = pytest.mark.integration
PY = sys.executable
PROVIDER = "remote-b"

# B's virtual node: four one-GPU machines of 8 vCPUs and 32 GiB, so each GPU's share of the
# node is 8 vCPUs and 32 GiB, which is what the adapter offers (and B's agent can place).
B_OFFERS: list[dict[str, Any]] = [
    {
        "sku": "a100",
        "gpu_model": "A100-80GB",
        "gpu_count": 1,
        "gpu_memory_gib": 80,
        "vcpus": 8,
        "memory_gib": 32,
        "price_per_hour": 1.5,
        "capacity": 4,
    }
]


@pytest.fixture(scope="module")
def cluster_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The remote cluster, for this module's tests."""
    cluster = LocalCluster(f"vkt-b-{os.getpid()}", root=tmp_path_factory.mktemp("cluster-b"))
    try:
        cluster.up(ensure_binaries())
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def agents_b(cluster_b: LocalCluster, tmp_path: Path) -> Iterator[AgentHarness]:
    harness = AgentHarness(cluster_b, tmp_path / "b")
    try:
        yield harness
    finally:
        harness.stop_all()


@pytest.fixture
async def api_b(cluster_b: LocalCluster) -> AsyncIterator[KubeClient]:
    kube = await KubeClient.connect(cluster_b.kubeconfig)
    try:
        yield kube
    finally:
        await kube.close()


@pytest.fixture
async def kube_b(cluster_b: LocalCluster) -> AsyncIterator[ApiClient]:
    api = await config.new_client_from_config(config_file=str(cluster_b.kubeconfig))
    try:
        yield api
    finally:
        await api.close()


@dataclass
class Bridge:
    """A's agent (provider ``kubernetes``) and B's agent (provider ``local``)."""

    agent_a: AgentProcess
    agent_b: AgentProcess
    remote_namespace: str


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return {}


async def _node_with_gpus(api: KubeClient, agent: AgentProcess) -> dict[str, Any]:
    """The agent's node once it is Ready and advertises GPUs."""

    async def ready() -> dict[str, Any] | None:
        if agent.process is not None and agent.process.poll() is not None:
            pytest.fail(
                f"agent exited with {agent.process.returncode}:\n{agent.log_text()[-3000:]}"
            )
        node = await api.get_node(agent.node)
        if not node or _condition(node, "Ready").get("status") != "True":
            return None
        gpus = int((node["status"].get("allocatable") or {}).get("nvidia.com/gpu", "0"))
        return node if gpus > 0 else None

    return await wait_for(ready, timeout=90, interval=0.5, what=f"node {agent.node} with GPUs")


async def _remote_namespace(kube_b: ApiClient) -> str:
    """The operator's part (the adapter never creates it): the namespace, its default
    ServiceAccount in place, before the agent starts."""
    remote_namespace = f"vk-remote-{uuid.uuid4().hex[:6]}"
    core_b = client.CoreV1Api(kube_b)
    await core_b.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=remote_namespace))
    )

    async def default_sa() -> bool:
        accounts = await core_b.list_namespaced_service_account(remote_namespace)
        return any(sa.metadata.name == "default" for sa in accounts.items)

    await wait_for(default_sa, timeout=60, what="the remote namespace's ServiceAccount")
    return remote_namespace


def _kubernetes_provider(cluster_b: LocalCluster, remote_namespace: str) -> dict[str, Any]:
    return {
        "type": "kubernetes",
        "name": PROVIDER,
        "kubeconfig": f"file:{cluster_b.kubeconfig}",
        "namespace": remote_namespace,
        "gpu_model": "A100-80GB",
        "gpu_price_per_hour": 1.0,
        "cpu_price_per_hour": 0.01,
    }


@pytest.fixture
async def bridge(
    agents: AgentHarness,
    agents_b: AgentHarness,
    api: KubeClient,
    api_b: KubeClient,
    cluster_b: LocalCluster,
    kube_b: ApiClient,
) -> Bridge:
    agent_b = agents_b.start(
        providers=[{"name": "local-a", "offers": B_OFFERS, "restart_backoff_seconds": 1}]
    )
    await _node_with_gpus(api_b, agent_b)

    remote_namespace = await _remote_namespace(kube_b)
    agent_a = agents.start(start=False, intervals={"offers_ttl_seconds": 2})
    settings = yaml.safe_load(agent_a.config_path.read_text())
    settings["providers"] = [_kubernetes_provider(cluster_b, remote_namespace)]
    agent_a.config_path.write_text(yaml.safe_dump(settings))
    agent_a.provider_entries = []  # nothing local to clean up for this agent
    agent_a.start()
    await _node_with_gpus(api, agent_a)  # offers from B have arrived
    return Bridge(agent_a=agent_a, agent_b=agent_b, remote_namespace=remote_namespace)


def _kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(PY).parent / "kubectl"), "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


async def _running(api: KubeClient, namespace: str, name: str, agent: AgentProcess) -> Any:
    async def check() -> dict[str, Any] | None:
        if agent.process is not None and agent.process.poll() is not None:
            pytest.fail(f"agent A exited:\n{agent.log_text()[-3000:]}")
        pod = await api.get_pod(namespace, name)
        return pod if pod and (pod.get("status") or {}).get("phase") == "Running" else None

    return await wait_for(check, timeout=90, interval=0.5, what=f"pod {name} Running in A")


async def _remote_pods(kube_b: ApiClient, namespace: str) -> list[dict[str, Any]]:
    pods = await client.CoreV1Api(kube_b).list_namespaced_pod(
        namespace, label_selector=f"vk-provider.io/managed-by={PROVIDER}"
    )
    return [kube_b.sanitize_for_serialization(p) for p in pods.items]


async def _logs_through_a(kubeconfig: Path, namespace: str, name: str, expected: str) -> str:
    async def check() -> str | None:
        result = _kubectl(kubeconfig, "logs", "-n", namespace, name)
        return result.stdout if result.returncode == 0 and expected in result.stdout else None

    return await wait_for(check, timeout=30, interval=0.5, what=f"'{expected}' in the logs")


async def test_a_pod_of_a_runs_in_b_and_its_logs_come_back(
    bridge: Bridge,
    api: KubeClient,
    kube: ApiClient,
    namespace: str,
    kubeconfig: Path,
    kube_b: ApiClient,
) -> None:
    script = "import time\nprint('hello from B', flush=True)\ntime.sleep(600)\n"
    core_a = client.CoreV1Api(kube)
    await core_a.create_namespaced_pod(
        namespace, pod_on(bridge.agent_a.node, "hello", command=[PY, "-c", script])
    )
    pod_a = await _running(api, namespace, "hello", bridge.agent_a)

    (remote,) = await _remote_pods(kube_b, bridge.remote_namespace)
    assert remote["metadata"]["labels"]["vk-provider.io/pod-uid"] == pod_a["metadata"]["uid"]
    assert remote["metadata"]["labels"]["vk-provider.io/attempt"] == "0"
    assert remote["spec"]["nodeName"] == bridge.agent_b.node  # B's virtual node runs it
    assert remote["status"]["phase"] == "Running"
    assert remote["spec"]["restartPolicy"] == "Always"  # the pod's own: B's kubelet restarts
    (container,) = remote["spec"]["containers"]
    assert container["command"] == [PY, "-c", script]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    annotations = pod_a["metadata"]["annotations"]
    assert annotations["vk-provider.io/provider"] == PROVIDER
    assert annotations["vk-provider.io/instance-id"] == remote["metadata"]["name"]
    assert annotations["vk-provider.io/offer"] == f"{PROVIDER}/1gpu.8cpu.32gib/remote"
    # ... and B's agent really runs it as a local process.
    (provider_b,) = local_providers(bridge.agent_b)
    (instance,) = await provider_b.list_ours()
    assert instance.pod_uid == remote["metadata"]["uid"]

    logs = await _logs_through_a(kubeconfig, namespace, "hello", "hello from B")
    assert logs.strip() == "hello from B"

    await core_a.delete_namespaced_pod("hello", namespace)

    async def gone_everywhere() -> bool:
        return not await _remote_pods(kube_b, bridge.remote_namespace) and (
            await api.get_pod(namespace, "hello") is None
        )

    await wait_for(gone_everywhere, timeout=30, interval=0.5, what="the pod gone from A and B")


async def test_secret_env_travels_as_a_secret_owned_by_the_remote_pod(
    bridge: Bridge,
    api: KubeClient,
    kube: ApiClient,
    namespace: str,
    kubeconfig: Path,
    kube_b: ApiClient,
) -> None:
    secret_value = "s3cr3t-" + uuid.uuid4().hex[:12]
    core_a = client.CoreV1Api(kube)
    await core_a.create_namespaced_secret(
        namespace, {"metadata": {"name": "api-key"}, "stringData": {"token": secret_value}}
    )
    script = (
        "import hashlib, os, time\n"
        "print(hashlib.sha256(os.environ['API_TOKEN'].encode()).hexdigest(), flush=True)\n"
        "time.sleep(600)\n"
    )
    env = [
        {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "api-key", "key": "token"}}}
    ]
    pod = pod_on(
        bridge.agent_a.node, "uses-secret", command=[PY, "-c", script], container={"env": env}
    )
    await core_a.create_namespaced_pod(namespace, pod)
    await _running(api, namespace, "uses-secret", bridge.agent_a)

    (remote,) = await _remote_pods(kube_b, bridge.remote_namespace)
    name = remote["metadata"]["name"]
    (container,) = remote["spec"]["containers"]
    assert container["env"] == [
        {
            "name": "API_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": name, "key": "main.API_TOKEN"}},
        }
    ]
    assert secret_value not in json.dumps(remote)
    core_b = client.CoreV1Api(kube_b)
    secret = await core_b.read_namespaced_secret(name, bridge.remote_namespace)
    (owner,) = secret.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid) == ("Pod", name, remote["metadata"]["uid"])

    digest = hashlib.sha256(secret_value.encode()).hexdigest()
    logs = await _logs_through_a(kubeconfig, namespace, "uses-secret", digest)
    assert logs.strip() == digest

    await core_a.delete_namespaced_pod("uses-secret", namespace)

    async def remote_gone() -> bool:
        if await _remote_pods(kube_b, bridge.remote_namespace):
            return False
        secrets = await core_b.list_namespaced_secret(bridge.remote_namespace)
        return all(s.metadata.name != name for s in secrets.items)

    await wait_for(remote_gone, timeout=30, interval=0.5, what="the remote pod and Secret gone")
    for agent in (bridge.agent_a, bridge.agent_b):
        assert secret_value not in agent.log_text()


LOOP = "import time\nprint('up', flush=True)\nwhile True: time.sleep(0.2)\n"


def _by_name(statuses: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in statuses or []}


def _health_server(port: int, flag: Path) -> list[str]:
    """A container serving /health: 200 once ``flag`` exists, 503 before."""
    script = (
        "import http.server, os\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        f"        self.send_response(200 if os.path.exists({str(flag)!r}) else 503)\n"
        "        self.end_headers()\n"
        "    def log_message(self, *a): pass\n"
        "print('up', flush=True)\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n"
    )
    return [PY, "-c", script]


def _whole_pod(node: str, name: str, shared: Path) -> dict[str, Any]:
    """Two app containers (one with the GPU, one with a readiness probe that passes once a
    flag file exists), a plain init container that writes what the app reads, and a native
    sidecar."""
    weights, flag = shared / f"{name}-weights", shared / f"{name}-ready"
    pod = pod_on(
        node,
        name,
        command=[PY, "-c", f"print(open({str(weights)!r}).read(), flush=True)\n{LOOP}"],
    )
    port = free_port()
    pod["spec"]["containers"].append(
        {
            "name": "metrics",
            "image": "example.com/exporter:1",
            "command": _health_server(port, flag),
            "ports": [{"containerPort": port, "name": "health"}],
            "readinessProbe": {
                "httpGet": {"port": "health", "path": "/health"},
                "periodSeconds": 1,
                "failureThreshold": 1,
            },
        }
    )
    pod["spec"]["initContainers"] = [
        {
            "name": "fetch-weights",
            "image": "example.com/fetch:1",
            "command": [PY, "-c", f"open({str(weights)!r}, 'w').write('weights ready')"],
        },
        {
            "name": "proxy",
            "image": "example.com/proxy:1",
            "restartPolicy": "Always",
            "command": [PY, "-c", LOOP],
        },
    ]
    return pod


async def test_a_whole_pod_runs_in_b_and_a_shows_every_container(
    bridge: Bridge,
    api: KubeClient,
    kube: ApiClient,
    namespace: str,
    kubeconfig: Path,
    kube_b: ApiClient,
    tmp_path: Path,
) -> None:
    core_a = client.CoreV1Api(kube)
    pod = _whole_pod(bridge.agent_a.node, "infer", tmp_path)
    await core_a.create_namespaced_pod(namespace, pod)

    async def all_running() -> dict[str, Any] | None:
        if bridge.agent_a.process is not None and bridge.agent_a.process.poll() is not None:
            pytest.fail(f"agent A exited:\n{bridge.agent_a.log_text()[-3000:]}")
        pod = await api.get_pod(namespace, "infer")
        status = (pod or {}).get("status") or {}
        apps = _by_name(status.get("containerStatuses"))
        inits = _by_name(status.get("initContainerStatuses"))
        running = all("running" in apps.get(n, {}).get("state", {}) for n in ("main", "metrics"))
        proxy_up = "running" in inits.get("proxy", {}).get("state", {})
        return pod if status.get("phase") == "Running" and running and proxy_up else None

    pod_a = await wait_for(all_running, timeout=120, interval=0.5, what="every container running")
    status = pod_a["status"]
    apps = _by_name(status["containerStatuses"])
    inits = _by_name(status["initContainerStatuses"])
    assert set(apps) == {"main", "metrics"} and set(inits) == {"fetch-weights", "proxy"}
    assert inits["fetch-weights"]["state"]["terminated"]["exitCode"] == 0
    assert inits["fetch-weights"]["state"]["terminated"]["reason"] == "Completed"
    assert apps["main"]["ready"] is True and inits["proxy"]["ready"] is True
    # B's agent runs the readiness probe, and A shows its verdict: not ready before the flag.
    assert apps["metrics"]["ready"] is False
    assert _condition(pod_a, "Ready").get("status") == "False"

    (remote,) = await _remote_pods(kube_b, bridge.remote_namespace)
    spec = remote["spec"]
    assert spec["nodeName"] == bridge.agent_b.node
    assert spec["restartPolicy"] == "Always"
    assert [c["name"] for c in spec["initContainers"]] == ["fetch-weights", "proxy"]
    assert [c.get("restartPolicy") for c in spec["initContainers"]] == [None, "Always"]
    main, metrics = spec["containers"]
    assert (main["name"], metrics["name"]) == ("main", "metrics")
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "1"  # the GPU where it was asked
    assert "nvidia.com/gpu" not in metrics["resources"].get("limits", {})
    probe = metrics["readinessProbe"]
    port = metrics["ports"][0]["containerPort"]
    assert probe["httpGet"] == {"path": "/health", "port": port, "scheme": "HTTP"}
    assert (probe["periodSeconds"], probe["failureThreshold"], probe["timeoutSeconds"]) == (1, 1, 1)

    (tmp_path / "infer-ready").touch()

    async def ready() -> dict[str, Any] | None:
        pod = await api.get_pod(namespace, "infer")
        return pod if pod and _condition(pod, "Ready").get("status") == "True" else None

    pod_a = await wait_for(ready, timeout=60, interval=0.5, what="the whole pod Ready in A")
    assert _by_name(pod_a["status"]["containerStatuses"])["metrics"]["ready"] is True

    # The app read what the init container wrote: B ran it first. (The first app container's
    # logs, which kubectl picks when no container is named.)
    logs = await _logs_through_a(kubeconfig, namespace, "infer", "weights ready")
    assert logs.splitlines()[0] == "weights ready"

    await core_a.delete_namespaced_pod("infer", namespace)

    async def gone_everywhere() -> bool:
        return not await _remote_pods(kube_b, bridge.remote_namespace) and (
            await api.get_pod(namespace, "infer") is None
        )

    await wait_for(gone_everywhere, timeout=30, interval=0.5, what="the pod gone from A and B")


async def test_a_crashing_container_is_restarted_by_b_never_relaunched_by_a(
    bridge: Bridge,
    api: KubeClient,
    kube: ApiClient,
    namespace: str,
    kube_b: ApiClient,
) -> None:
    crash = "print('run', flush=True)\nraise SystemExit(3)\n"
    core_a = client.CoreV1Api(kube)
    await core_a.create_namespaced_pod(
        namespace, pod_on(bridge.agent_a.node, "crashy", command=[PY, "-c", crash])
    )

    async def restarted() -> dict[str, Any] | None:
        pod = await api.get_pod(namespace, "crashy")
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
        if not statuses or statuses[0].get("restartCount", 0) < 2:
            return None
        return pod

    pod_a = await wait_for(restarted, timeout=90, interval=0.5, what="two restarts shown in A")
    assert pod_a["status"]["phase"] == "Running"  # B's kubelet restarts it; the pod runs on
    (main,) = pod_a["status"]["containerStatuses"]
    assert main["lastState"]["terminated"]["exitCode"] == 3
    # One remote pod, the first attempt, all along: A never launched another.
    (remote,) = await _remote_pods(kube_b, bridge.remote_namespace)
    assert remote["metadata"]["labels"]["vk-provider.io/attempt"] == "0"
    assert (
        pod_a["metadata"]["annotations"]["vk-provider.io/instance-id"]
        == (remote["metadata"]["name"])
    )
    assert remote["status"]["containerStatuses"][0]["restartCount"] >= 2


# --------------------------------------------------------------------------- streams and usage
# Both agents' kubelet APIs listen on the session's veth address (``kubelet_node.node_link``),
# so each API server can reach its node: kubectl on A → A's API server → A's kubelet API →
# the adapter's WebSocket → B's API server → B's kubelet API (our agent) → a local process.


@pytest.fixture(scope="module")
def metrics_b(cluster_b: LocalCluster) -> Iterator[MetricsServer]:
    """metrics-server for B: the adapter reads usage from B's metrics.k8s.io."""
    server = MetricsServer(cluster_b, ensure_metrics_server())
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
async def linked_bridge(
    agents: AgentHarness,
    agents_b: AgentHarness,
    api: KubeClient,
    api_b: KubeClient,
    cluster_b: LocalCluster,
    control_plane: LocalCluster,
    kube_b: ApiClient,
    node_link: netns.VethNamespace,
) -> Bridge:
    agent_b = start_agent_on(
        agents_b,
        cluster_b,
        node_link,
        providers=[{"name": "local-a", "offers": B_OFFERS, "restart_backoff_seconds": 1}],
    )
    await _node_with_gpus(api_b, agent_b)
    remote_namespace = await _remote_namespace(kube_b)
    agent_a = start_agent_on(
        agents,
        control_plane,
        node_link,
        settings={"providers": [_kubernetes_provider(cluster_b, remote_namespace)]},
    )
    agent_a.provider_entries = []
    await _node_with_gpus(api, agent_a)
    return Bridge(agent_a=agent_a, agent_b=agent_b, remote_namespace=remote_namespace)


SHELL = [PY, "-c", "import time\nprint('up', flush=True)\nwhile True: time.sleep(0.5)"]


async def test_exec_through_a_reaches_the_container_in_b(
    linked_bridge: Bridge,
    api: KubeClient,
    kube: ApiClient,
    namespace: str,
    kubectl: Commands,
) -> None:
    env = [{"name": "GREETING", "value": "hello from B"}]
    pod = pod_on(linked_bridge.agent_a.node, "shell", command=SHELL, container={"env": env})
    await client.CoreV1Api(kube).create_namespaced_pod(namespace, pod)
    await _running(api, namespace, "shell", linked_bridge.agent_a)

    one_shot = kubectl.run(
        "exec", "-n", namespace, "shell", "--",
        "sh", "-c", 'echo "$GREETING"; echo oops >&2; exit 3',
    )  # fmt: skip
    assert one_shot.returncode == 3, one_shot.stderr
    assert one_shot.stdout == "hello from B\n"
    assert "oops" in one_shot.stderr

    # stdin and its end cross both hops: cat ends only when the input does.
    interactive = kubectl.run(
        "exec", "-i", "-n", namespace, "shell", "--", "sh", "-c", "cat; echo done",
        input="line one\nline two\n",
    )  # fmt: skip
    assert interactive.returncode == 0, interactive.stderr
    assert interactive.stdout == "line one\nline two\ndone\n"

    # Without -i the command's stdin is at its end at once (cat does not hang).
    no_stdin = kubectl.run("exec", "-n", namespace, "shell", "--", "sh", "-c", "cat; echo end")
    assert (no_stdin.returncode, no_stdin.stdout) == (0, "end\n"), no_stdin.stderr

    # A terminal: B's command sees a tty whose size A's kubectl set, and its exit code.
    master, slave = os.openpty()
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 111, 0, 0))
        session = kubectl.start(
            "exec", "-it", "-n", namespace, "shell", "--", "sh",
            stdin=slave, stdout=slave, stderr=slave,
        )  # fmt: skip
        os.close(slave)
        slave = -1
        os.write(master, b"echo $((6 * 7)) $(stty size)\n")
        seen = read_until(master, b"42 33 111", timeout=60)
        assert b"42 33 111" in seen, seen
        os.write(master, b"exit 5\n")
        assert session.wait(timeout=60) == 5
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)


async def test_port_forward_through_a_reaches_a_server_in_b(
    linked_bridge: Bridge,
    api: KubeClient,
    kube: ApiClient,
    namespace: str,
    kubectl: Commands,
) -> None:
    port, local = free_port(), free_port()
    pod = pod_on(
        linked_bridge.agent_a.node,
        "server",
        command=[PY, "-c", SERVE],
        container={
            "env": [{"name": "PORT", "value": str(port)}],
            "ports": [{"containerPort": port}],  # B's local provider forwards declared ports
        },
    )
    await client.CoreV1Api(kube).create_namespaced_pod(namespace, pod)
    await _running(api, namespace, "server", linked_bridge.agent_a)
    await assert_port_forward(kubectl, namespace, local, port)


async def test_stats_summary_of_a_shows_the_remote_pods_usage(
    linked_bridge: Bridge,
    metrics_b: MetricsServer,
    api: KubeClient,
    kube: ApiClient,
    namespace: str,
    kubectl: Commands,
) -> None:
    pod = pod_on(linked_bridge.agent_a.node, "busy", command=BUSY)
    await client.CoreV1Api(kube).create_namespaced_pod(namespace, pod)
    await _running(api, namespace, "busy", linked_bridge.agent_a)
    node = linked_bridge.agent_a.node

    async def measured() -> dict[str, Any] | None:
        answer = kubectl.run("get", "--raw", f"/api/v1/nodes/{node}/proxy/stats/summary")
        assert answer.returncode == 0, answer.stderr
        pods = json.loads(answer.stdout).get("pods") or []
        found = [p for p in pods if p["podRef"]["name"] == "busy"]
        return found[0] if found else None

    stats = await wait_for(measured, timeout=180, interval=2, what="busy in A's stats/summary")
    (container,) = stats["containers"]
    assert container["name"] == "main"
    assert container["cpu"]["usageCoreNanoSeconds"] > 0
    assert container["memory"]["workingSetBytes"] > 0


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
BUSY = [
    PY,
    "-c",
    "import time\nwhile True:\n    end = time.time() + 0.05\n    while time.time() < end: pass\n"
    "    time.sleep(0.05)\n",
]


# --------------------------------------------------------------------------- ports (expose)
# A's agent writes EndpointSlices (endpoint_slices.enabled) for a Service of A over the pod,
# from the endpoints the adapter reads in B. B's agent runs the pods with ``local.address``
# the veth's host address, so B's pod carries that address as its podIP (every declared port
# 1:1 there) and a process listening on every address is reached there from the test's
# network namespace, a client of the clusters.

SLICES = "endpointslice.kubernetes.io/managed-by=vk-provider.io"


@pytest.fixture
def exposing(
    agents: AgentHarness,
    agents_b: AgentHarness,
    api: KubeClient,
    api_b: KubeClient,
    cluster_b: LocalCluster,
    kube_b: ApiClient,
    node_link: netns.VethNamespace,
) -> Any:
    """Starts the bridge with A's provider settings extended by ``settings`` (``expose``):
    B's agent on the veth's host address (its node's InternalIP, and its local provider's
    ``address``), A's agent writing EndpointSlices."""

    async def start(**settings: Any) -> Bridge:
        local = {"name": "local-a", "offers": B_OFFERS, "address": node_link.host_address}
        agent_b = start_agent_on(agents_b, cluster_b, node_link, providers=[local])
        await _node_with_gpus(api_b, agent_b)
        remote_namespace = await _remote_namespace(kube_b)
        # A's agent with the traffic rights (the harness grants them with endpoint_slices).
        agent_a = agents.start(
            start=False,
            intervals={"offers_ttl_seconds": 2},
            endpoint_slices={"enabled": True, "resync_seconds": 0.5},
        )
        config_a = yaml.safe_load(agent_a.config_path.read_text())
        config_a["providers"] = [_kubernetes_provider(cluster_b, remote_namespace) | settings]
        agent_a.config_path.write_text(yaml.safe_dump(config_a))
        agent_a.provider_entries = []
        agent_a.start()
        await _node_with_gpus(api, agent_a)
        return Bridge(agent_a=agent_a, agent_b=agent_b, remote_namespace=remote_namespace)

    return start


async def _serve_on_a(kube: ApiClient, namespace: str, node: str, name: str) -> dict[str, int]:
    """A pod on A's virtual node serving HTTP on two declared ports, and a Service of A over
    its ``http`` port; the ports by name."""
    ports = {"http": free_port(), "admin": free_port()}
    pod = pod_on(
        node,
        name,
        command=replica_command(name, *ports.values()),
        metadata={"labels": {"app": name}},
        container={"ports": [{"name": n, "containerPort": p} for n, p in ports.items()]},
    )
    core = client.CoreV1Api(kube)
    await core.create_namespaced_service(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name},
            "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": "http"}]},
        },
    )
    await core.create_namespaced_pod(namespace, pod)
    return ports


async def _listed(api: KubeClient, namespace: str, service: str) -> list[tuple[str, int, bool]]:
    """(address, port, ready) of each endpoint of A's slices for ``service`` (one port)."""
    body = await api.request(
        "GET",
        f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
        query={"labelSelector": f"{SLICES},kubernetes.io/service-name={service}"},
    )
    found = []
    for slice_ in body.get("items") or []:
        (port,) = slice_["ports"]
        for endpoint in slice_["endpoints"]:
            (address,) = endpoint["addresses"]
            found.append((address, port["port"], bool(endpoint["conditions"]["ready"])))
    return found


async def _reached_from(link: netns.VethNamespace, address: str, port: int) -> str:
    """An HTTP GET from inside the test's network namespace, once it answers."""
    script = (
        "import sys, urllib.request\n"
        "print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"
    )
    url = f"http://{address}:{port}/"

    async def answered() -> str | None:
        done = subprocess.run(
            ["ip", "netns", "exec", link.namespace, PY, "-c", script, url],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return done.stdout.strip() if done.returncode == 0 else None

    return await wait_for(answered, timeout=30, interval=0.5, what=f"an answer from {url}")


async def _gone_in_b(kube_b: ApiClient, namespace: str, name: str) -> None:
    """The remote pod and its Service are gone (B's garbage collector removes the Service)."""
    core_b = client.CoreV1Api(kube_b)

    async def gone() -> bool:
        pods = await core_b.list_namespaced_pod(namespace)
        services = await core_b.list_namespaced_service(namespace)
        return not pods.items and all(s.metadata.name != name for s in services.items)

    await wait_for(gone, timeout=60, interval=0.5, what=f"pod and service {name} gone from B")


async def test_flat_reaches_the_pod_at_bs_pod_ip_and_its_own_port(
    exposing: Any,
    api: KubeClient,
    kube: ApiClient,
    namespace: str,
    kube_b: ApiClient,
    node_link: netns.VethNamespace,
) -> None:
    bridge = await exposing(expose="flat")
    ports = await _serve_on_a(kube, namespace, bridge.agent_a.node, "flat")
    pod_a = await _running(api, namespace, "flat", bridge.agent_a)

    async def listed() -> list[tuple[str, int, bool]] | None:
        found = await _listed(api, namespace, "flat")
        return found if found and all(ready for _, _, ready in found) else None

    (endpoint,) = await wait_for(listed, timeout=90, interval=0.5, what="flat's endpoint")
    (remote,) = await _remote_pods(kube_b, bridge.remote_namespace)
    assert remote["status"]["podIP"] == node_link.host_address  # B's local provider, 1:1
    assert endpoint[:2] == (remote["status"]["podIP"], ports["http"])
    assert await _reached_from(node_link, *endpoint[:2]) == f"flat:{ports['http']}"
    # Every port 1:1 at one address: A's pod carries it as its podIP too.
    pod_a = await api.get_pod(namespace, "flat")
    assert pod_a is not None and pod_a["status"].get("podIP") == node_link.host_address
    services_b = await client.CoreV1Api(kube_b).list_namespaced_service(bridge.remote_namespace)
    assert services_b.items == []  # flat makes nothing in B


async def test_node_port_makes_a_service_in_b_reported_at_a_nodes_address(
    exposing: Any,
    api: KubeClient,
    kube: ApiClient,
    namespace: str,
    kube_b: ApiClient,
    node_link: netns.VethNamespace,
) -> None:
    # B's only node is its virtual node (no kube-proxy: the node port itself is not served in
    # this test), so the selector that leaves virtual nodes out is cleared.
    bridge = await exposing(expose="node-port", node_selector="")
    ports = await _serve_on_a(kube, namespace, bridge.agent_a.node, "np")
    pod_a = await _running(api, namespace, "np", bridge.agent_a)
    (remote,) = await _remote_pods(kube_b, bridge.remote_namespace)
    name = remote["metadata"]["name"]
    service = kube_b.sanitize_for_serialization(
        await client.CoreV1Api(kube_b).read_namespaced_service(name, bridge.remote_namespace)
    )
    (owner,) = service["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", name, remote["metadata"]["uid"])
    spec = service["spec"]
    assert spec["type"] == "NodePort" and spec["externalTrafficPolicy"] == "Cluster"
    assert spec["selector"] == {
        "vk-provider.io/managed-by": PROVIDER,
        "vk-provider.io/instance": name,
    }
    assert all(remote["metadata"]["labels"][k] == v for k, v in spec["selector"].items())
    assert [(p["name"], p["protocol"], p["port"], p["targetPort"]) for p in spec["ports"]] == [
        (n, "TCP", p, p) for n, p in ports.items()
    ]
    node_ports = {p["name"]: p["nodePort"] for p in spec["ports"]}
    assert all(30000 <= port <= 32767 for port in node_ports.values())  # as B assigned them
    # B selects the remote pod: its own EndpointSlice lists it.
    node_b = await client.CoreV1Api(kube_b).read_node(bridge.agent_b.node)
    addresses = {a.type: a.address for a in node_b.status.addresses}
    assert addresses["InternalIP"] == node_link.host_address

    async def listed() -> list[tuple[str, int, bool]] | None:
        found = await _listed(api, namespace, "np")
        return found if found and all(ready for _, _, ready in found) else None

    (endpoint,) = await wait_for(listed, timeout=90, interval=0.5, what="np's endpoint")
    assert endpoint[:2] == (addresses["InternalIP"], node_ports["http"])
    # The ports are mapped: A's pod carries no podIP (the cluster's own slices leave it out).
    pod_a = await api.get_pod(namespace, "np")
    assert pod_a is not None and not pod_a["status"].get("podIP")

    await client.CoreV1Api(kube).delete_namespaced_pod("np", namespace)
    await _gone_in_b(kube_b, bridge.remote_namespace, name)


async def test_load_balancer_is_listed_once_b_assigns_it_and_reaches_the_pod(
    exposing: Any,
    api: KubeClient,
    kube: ApiClient,
    namespace: str,
    kube_b: ApiClient,
    node_link: netns.VethNamespace,
) -> None:
    bridge = await exposing(expose="load-balancer")
    ports = await _serve_on_a(kube, namespace, bridge.agent_a.node, "lb")
    await _running(api, namespace, "lb", bridge.agent_a)
    (remote,) = await _remote_pods(kube_b, bridge.remote_namespace)
    name = remote["metadata"]["name"]
    core_b = client.CoreV1Api(kube_b)
    service = await core_b.read_namespaced_service(name, bridge.remote_namespace)
    assert service.spec.type == "LoadBalancer"
    assert not service.status.load_balancer.ingress  # no cloud controller in B

    # The agent saw the ready pod and found no endpoint for the Service's port: a Warning
    # (so it has looked), and no slice.
    async def warned() -> bool:
        events = await client.CoreV1Api(kube).list_namespaced_event(
            namespace, field_selector="reason=PortNotExposed"
        )
        return any(e.involved_object.name == "lb" for e in events.items)

    await wait_for(warned, timeout=90, interval=0.5, what="a PortNotExposed Warning on lb")
    assert await _listed(api, namespace, "lb") == []

    # What a cloud controller writes once its load balancer is up (here: the address the
    # process is reached at from the test's network namespace).
    await core_b.patch_namespaced_service_status(
        name,
        bridge.remote_namespace,
        {"status": {"loadBalancer": {"ingress": [{"ip": node_link.host_address}]}}},
    )

    async def listed() -> list[tuple[str, int, bool]] | None:
        found = await _listed(api, namespace, "lb")
        return found if found and all(ready for _, _, ready in found) else None

    (endpoint,) = await wait_for(listed, timeout=60, interval=0.5, what="lb's endpoint")
    assert endpoint[:2] == (node_link.host_address, ports["http"])
    assert await _reached_from(node_link, *endpoint[:2]) == f"lb:{ports['http']}"

    await client.CoreV1Api(kube).delete_namespaced_pod("lb", namespace)
    await _gone_in_b(kube_b, bridge.remote_namespace, name)
