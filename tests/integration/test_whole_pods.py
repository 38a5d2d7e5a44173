"""Whole pods against the real control plane: several app containers, an init container and a
native sidecar on the local provider; routing away from a single-container provider;
readiness and liveness probes; missing Secret and ConfigMap references.

Each test starts its own agent (``vk-provider run``) with a ``local`` provider, whose pod
runner runs every container as a local process, and (where the test needs one) a ``memory``
provider that can only run one container per pod and is cheaper.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from tests.helpers import wait_for
from tests.integration.agent_harness import DEFAULT_OFFERS, AgentHarness, AgentProcess, pod_on
from tests.integration.test_agent import _events, _kubectl, _phase, _pod, _ready_node
from vk_provider.kube.client import KubeClient
from vk_provider_dev.cluster.ports import free_port

pytestmark = pytest.mark.integration
PY = sys.executable

CHEAP_SINGLE = {
    "type": "memory",
    "name": "mem",
    "enabled": True,
    "offers": [{**DEFAULT_OFFERS[0], "price_per_hour": 0.25}],
}
LOCAL = {"name": "local-a", "offers": DEFAULT_OFFERS, "restart_backoff_seconds": 1}

LOOP = "import time\nprint('up', flush=True)\nwhile True: time.sleep(0.2)\n"


def _condition(pod: dict[str, Any], kind: str) -> str | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return str(condition.get("status"))
    return None


def _by_name(statuses: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in statuses or []}


def whole_pod(node: str, name: str, shared: Path, **extra: Any) -> dict[str, Any]:
    """Two app containers, a plain init container and a native sidecar."""
    weights = shared / f"{name}-weights"
    pod = pod_on(
        node,
        name,
        command=[PY, "-c", f"print(open({str(weights)!r}).read(), flush=True)\n{LOOP}"],
        **extra,
    )
    pod["spec"]["containers"].append(
        {"name": "metrics", "image": "example.com/exporter:1", "command": [PY, "-c", LOOP]}
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


async def _agent(agents: AgentHarness, api: KubeClient, *providers: dict[str, Any]) -> AgentProcess:
    agent = agents.start(providers=list(providers) or [LOCAL])
    await _ready_node(api, agent)
    return agent


async def test_a_whole_pod_runs_on_local_and_is_routed_away_from_a_single_container_provider(
    api: KubeClient,
    kube: ApiClient,
    kubeconfig: Path,
    namespace: str,
    agents: AgentHarness,
    tmp_path: Path,
) -> None:
    agent = await _agent(agents, api, CHEAP_SINGLE, LOCAL)
    core = client.CoreV1Api(kube)
    await core.create_namespaced_pod(namespace, whole_pod(agent.node, "infer", tmp_path))

    async def ready() -> dict[str, Any] | None:
        pod = await _pod(api, namespace, "infer")
        return pod if _condition(pod, "Ready") == "True" else None

    pod = await wait_for(ready, timeout=90, what="the whole pod Ready")
    assert pod["status"]["phase"] == "Running"
    annotations = pod["metadata"]["annotations"]
    assert annotations["vk-provider.io/provider"] == "local-a"
    assert pod["metadata"]["labels"]["vk-provider.io/provider"] == "local-a"
    assert (
        "skipped provider(s) mem: cannot run 2 app container(s)"
        in annotations["vk-provider.io/placement"]
    )
    apps = _by_name(pod["status"]["containerStatuses"])
    inits = _by_name(pod["status"]["initContainerStatuses"])
    assert set(apps) == {"main", "metrics"}
    assert all(s["ready"] and "running" in s["state"] for s in apps.values())
    assert inits["fetch-weights"]["state"]["terminated"]["reason"] == "Completed"
    assert "running" in inits["proxy"]["state"] and inits["proxy"]["ready"] is True
    for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready"):
        assert _condition(pod, kind) == "True", kind
    # Events are written by the recorder's own senders, after the status that shows the
    # containers running: wait for them rather than read them at once.
    expected = [f"Started container {n}" for n in ("fetch-weights", "main", "metrics", "proxy")]

    async def all_started() -> list[Any] | None:
        found = [e for e in await _events(kube, namespace) if e.involved_object.name == "infer"]
        started = sorted(e.message for e in found if e.reason == "Started")
        return found if started == expected else None

    try:
        events = await wait_for(all_started, timeout=60, what="a Started Event per container")
    except BaseException:
        found = [e for e in await _events(kube, namespace) if e.involved_object.name == "infer"]
        print("Events of infer:", [(e.reason, e.message) for e in found])
        raise
    selected = [e for e in events if e.reason == "ProviderSelected"]
    assert selected and "skipped provider(s) mem" in selected[0].message

    # The app read what the init container wrote: it ran first.
    # As a user would (the agent's own role may not read logs through the API server).
    logs = _kubectl(kubeconfig, "logs", "-n", namespace, "infer", "-c", "main")
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.splitlines()[0] == "weights ready"
    listed = _kubectl(
        kubeconfig,
        "get",
        "pods",
        "-n",
        namespace,
        "-l",
        "vk-provider.io/provider=local-a",
        "-o",
        "name",
    )
    assert listed.stdout.split() == ["pod/infer"]


async def test_a_whole_pod_only_a_single_container_provider_may_take_is_invalid(
    api: KubeClient, kube: ApiClient, namespace: str, agents: AgentHarness, tmp_path: Path
) -> None:
    agent = await _agent(agents, api, CHEAP_SINGLE, LOCAL)
    pod = whole_pod(
        agent.node,
        "pinned",
        tmp_path,
        restart_policy="Never",
        metadata={"annotations": {"vk-provider.io/providers": "mem"}},
    )
    await client.CoreV1Api(kube).create_namespaced_pod(namespace, pod)
    failed = await _phase(api, namespace, "pinned", "Failed", timeout=60)
    assert failed["status"]["reason"] == "InvalidSpec"
    assert failed["status"]["message"].startswith("spec.containers[1]: no provider can run")
    events = [e for e in await _events(kube, namespace) if e.reason == "InvalidSpec"]
    assert events and "provider(s) mem cannot" in events[0].message


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


async def test_readiness_drives_ready_and_liveness_restarts_the_container(
    api: KubeClient, kube: ApiClient, namespace: str, agents: AgentHarness, tmp_path: Path
) -> None:
    agent = await _agent(agents, api)
    port, flag = free_port(), tmp_path / "ready"
    readiness = {
        "httpGet": {"port": port, "path": "/health"},
        "periodSeconds": 1,
        "failureThreshold": 1,
    }
    served = pod_on(
        agent.node,
        "served",
        command=_health_server(port, flag),
        container={"readinessProbe": readiness},
    )
    dead_port = free_port()
    liveness = {"tcpSocket": {"port": dead_port}, "periodSeconds": 1, "failureThreshold": 2}
    dying = pod_on(
        agent.node, "dying", command=[PY, "-c", LOOP], container={"livenessProbe": liveness}
    )
    core = client.CoreV1Api(kube)
    await core.create_namespaced_pod(namespace, served)
    await core.create_namespaced_pod(namespace, dying)

    async def running_not_ready() -> dict[str, Any] | None:
        pod = await _pod(api, namespace, "served")
        status = _by_name(pod["status"].get("containerStatuses")).get("main", {})
        if pod["status"].get("phase") == "Running" and "running" in status.get("state", {}):
            return pod
        return None

    pod = await wait_for(running_not_ready, timeout=60, what="served Running")
    assert _condition(pod, "Ready") == "False"
    assert pod["status"]["containerStatuses"][0]["ready"] is False

    async def unhealthy() -> bool:
        return any(
            e.reason == "Unhealthy" and e.involved_object.name == "served"
            for e in await _events(kube, namespace)
        )

    await wait_for(unhealthy, timeout=30, what="an Unhealthy event")
    flag.touch()

    async def ready() -> bool:
        return _condition(await _pod(api, namespace, "served"), "Ready") == "True"

    await wait_for(ready, timeout=30, what="served Ready once its probe passes")
    flag.unlink()

    async def not_ready() -> bool:
        return _condition(await _pod(api, namespace, "served"), "Ready") == "False"

    await wait_for(not_ready, timeout=30, what="served not Ready again")

    async def restarted() -> dict[str, Any] | None:
        pod = await _pod(api, namespace, "dying")
        (status,) = pod["status"].get("containerStatuses") or [{}]
        return status if int(status.get("restartCount") or 0) >= 1 else None

    status = await wait_for(restarted, timeout=60, what="dying restarted by its liveness probe")
    assert status["lastState"]["terminated"]["exitCode"] in (143, 137)
    pod = await _pod(api, namespace, "dying")
    assert pod["status"]["phase"] == "Running"
    killing = [
        e
        for e in await _events(kube, namespace)
        if e.reason == "Killing" and e.involved_object.name == "dying"
    ]
    assert killing and "failed liveness probe, will be restarted" in killing[0].message
    # The same instance throughout: restarted in place, not relaunched.
    assert pod["metadata"]["annotations"]["vk-provider.io/instance-id"].endswith("-0")


async def test_missing_references_are_reported_as_virtual_kubelet_does_until_they_appear(
    api: KubeClient, kube: ApiClient, namespace: str, agents: AgentHarness
) -> None:
    """One pod reading two mandatory keys and four optional ones: while a mandatory Secret,
    ConfigMap or key is missing it waits in CreateContainerConfigError with virtual-kubelet's
    Event for it (all four Mandatory reasons, one after the other as each appears), nothing
    is created; then it runs, with the four Optional reasons and InvalidEnvironmentVariableNames
    for the envFrom keys that cannot be variables."""
    agent = await _agent(agents, api)

    def ref(kind: str, name: str, key: str, *, optional: bool = False) -> dict[str, Any]:
        return {kind: {"name": name, "key": key} | ({"optional": True} if optional else {})}

    env = [
        {"name": "TOKEN", "valueFrom": ref("secretKeyRef", "api-token", "t")},
        {"name": "CONF", "valueFrom": ref("configMapKeyRef", "settings", "c")},
        {"name": "O1", "valueFrom": ref("secretKeyRef", "absent-s", "x", optional=True)},
        {"name": "O2", "valueFrom": ref("configMapKeyRef", "absent-c", "x", optional=True)},
        {"name": "O3", "valueFrom": ref("secretKeyRef", "api-token", "nokey", optional=True)},
        {"name": "O4", "valueFrom": ref("configMapKeyRef", "settings", "nokey", optional=True)},
    ]
    pod = pod_on(
        agent.node,
        "refs",
        command=[PY, "-c", "import os; print(os.environ['TOKEN'], flush=True)\n" + LOOP],
        container={"env": env, "envFrom": [{"configMapRef": {"name": "names"}}]},
    )
    core = client.CoreV1Api(kube)
    await core.create_namespaced_config_map(
        namespace,
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name="names"), data={"9bad": "x"}),
    )
    await core.create_namespaced_pod(namespace, pod)

    async def waiting_with(reason: str) -> dict[str, Any] | None:
        found = await _pod(api, namespace, "refs")
        assert found["status"].get("phase") == "Pending"
        assert not found["metadata"].get("annotations", {}).get("vk-provider.io/instance-id")
        (status,) = found["status"].get("containerStatuses") or [{}]
        state = (status.get("state") or {}).get("waiting")
        if not state or state.get("reason") != "CreateContainerConfigError":
            return None
        events = [e for e in await _events(kube, namespace) if e.reason == reason]
        return {"state": state, "event": events[0]} if events else None

    seen = await wait_for(lambda: waiting_with("MandatorySecretNotFound"), timeout=60, what="1")
    assert seen["event"].type == "Warning"
    assert seen["event"].message == 'secret "api-token" not found'
    await core.create_namespaced_secret(
        namespace,
        client.V1Secret(metadata=client.V1ObjectMeta(name="api-token"), string_data={"u": "1"}),
    )
    seen = await wait_for(lambda: waiting_with("MandatorySecretKeyNotFound"), timeout=90, what="2")
    assert seen["event"].message == 'key "t" does not exist in secret "api-token"'
    await core.patch_namespaced_secret("api-token", namespace, {"stringData": {"t": "s3"}})
    seen = await wait_for(lambda: waiting_with("MandatoryConfigMapNotFound"), timeout=90, what="3")
    assert seen["event"].message == 'configmap "settings" not found'
    await core.create_namespaced_config_map(
        namespace,
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name="settings"), data={"d": "x"}),
    )
    seen = await wait_for(
        lambda: waiting_with("MandatoryConfigMapKeyNotFound"), timeout=90, what="4"
    )
    assert seen["event"].message == 'key "c" does not exist in configmap "settings"'
    await core.patch_namespaced_config_map("settings", namespace, {"data": {"c": "v"}})

    await _phase(api, namespace, "refs", "Running", timeout=90)
    events: dict[str, list[Any]] = {}
    for event in await _events(kube, namespace):
        events.setdefault(event.reason, []).append(event)
    expected = {
        "OptionalSecretNotFound": 'skipping optional envvar "O1": secret "absent-s" not found',
        "OptionalConfigMapNotFound": (
            'skipping optional envvar "O2": configmap "absent-c" not found'
        ),
        "OptionalSecretKeyNotFound": (
            'skipping optional envvar "O3": key "nokey" does not exist in secret "api-token"'
        ),
        "OptionalConfigMapKeyNotFound": (
            'skipping optional envvar "O4": key "nokey" does not exist in configmap "settings"'
        ),
        "InvalidEnvironmentVariableNames": (
            f"keys [9bad] from configmap {namespace}/names were skipped since they are "
            "invalid as environment variable names"
        ),
    }
    for reason, message in expected.items():
        assert reason in events, (reason, sorted(events))
        assert [(e.type, e.message) for e in events[reason]] == [("Warning", message)]
