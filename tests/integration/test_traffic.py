"""Traffic follows the pods: a Service reaches its replicas on the virtual node through the
EndpointSlices the agent writes (``endpoint_slices.enabled``).

On the real control plane, with the ``local`` provider exposing each declared port at the
host side of a veth pair this test creates (``local.address``): two replicas serving HTTP
with a readiness probe, each on ports of its own (so each is a slice of its own mapping), and
two Services over them with different ``targetPort`` names (and a third naming a port they do
not declare: no slice, a ``PortNotExposed`` Warning on each replica). An HTTP client inside the
test's network namespace connects to every listed endpoint and gets that replica's answer.
Then the agent is SIGKILLed (the slices stay as they were), restarted (both replicas stay
listed while it adopts), and a replica is deleted (its endpoint turns terminating, then
leaves). The audit log shows deploy/rbac-traffic.yaml is exactly what the agent used.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from tests.helpers import wait_for
from tests.integration import shipped_role
from tests.integration.agent_harness import (
    DEFAULT_OFFERS,
    TOLERATION,
    AgentHarness,
    AgentProcess,
    pod_on,
)
from tests.integration.audit import calls_of, grants_of, unused
from tests.integration.http_replica import replica_command
from vk_provider.kube.client import KubeClient
from vk_provider_dev.cluster import netns
from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.components import AUDITED_NAMESPACE
from vk_provider_dev.cluster.flip import kwok as kwok_mod
from vk_provider_dev.cluster.flip.adminapi import AdminApi
from vk_provider_dev.cluster.flip.kwok import start_kwok
from vk_provider_dev.cluster.flip.tools import ensure_kwok

pytestmark = pytest.mark.integration

PY = sys.executable
REPLICAS = {"infer-a": (18181, 18281), "infer-b": (18182, 18282)}
MANAGED = "endpointslice.kubernetes.io/managed-by=vk-provider.io"


def _replica(node: str, name: str) -> dict[str, Any]:
    http_port, admin_port = REPLICAS[name]
    return pod_on(
        node,
        name,
        command=replica_command(name, admin_port, http_port, delay=4, linger=True),
        gpus=0,
        grace=8,
        metadata={"labels": {"app": "infer"}},
        container={
            "ports": [
                {"name": "http", "containerPort": http_port},
                {"name": "admin", "containerPort": admin_port},
            ],
            "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
        },
    )


def _service(name: str, target: str, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "selector": {"app": "infer"},
            "ports": [{"name": "web", "port": port, "targetPort": target}],
        },
    }


async def _slices(api: KubeClient, namespace: str, service: str) -> list[dict[str, Any]]:
    body = await api.request(
        "GET",
        f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
        query={"labelSelector": f"{MANAGED},kubernetes.io/service-name={service}"},
    )
    return list(body.get("items") or [])


def _endpoints(slices: list[dict[str, Any]]) -> dict[str, tuple[str, int, dict[str, bool]]]:
    """pod name -> (address, port, conditions) over the slices of one single-port Service."""
    found = {}
    for slice_ in slices:
        (port,) = slice_["ports"]
        for endpoint in slice_["endpoints"]:
            (address,) = endpoint["addresses"]
            found[endpoint["targetRef"]["name"]] = (address, port["port"], endpoint["conditions"])
    return found


def _after_resyncs(agent: AgentProcess, ticks: int) -> Any:
    """A condition: the restarted agent compared the slices ``ticks`` times (its debug log)."""

    async def done() -> bool:
        run = agent.log_text().rpartition("registered; kubelet API")[2]
        return run.count("endpoint slices: ") - run.count("waiting for the providers") >= ticks

    return done


def _get_from(link: netns.VethNamespace, address: str, port: int) -> str:
    """An HTTP GET from inside the test's network namespace (a client of the cluster)."""
    script = (
        "import sys, urllib.request\n"
        "print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
    )
    answer = subprocess.run(
        ["ip", "netns", "exec", link.namespace, PY, "-c", script, f"http://{address}:{port}/"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert answer.returncode == 0, answer.stderr
    return answer.stdout.strip()


async def test_services_reach_the_replicas_where_the_provider_exposes_them(
    kube: ApiClient,
    api: KubeClient,
    agents: AgentHarness,
    namespace: str,
    node_link: netns.VethNamespace,
    control_plane: LocalCluster,
) -> None:
    agent = agents.start(
        providers=[
            {"name": "local-a", "offers": DEFAULT_OFFERS, "address": node_link.host_address}
        ],
        endpoint_slices={"enabled": True, "resync_seconds": 0.5},
    )
    core = client.CoreV1Api(kube)
    await core.create_namespaced_service(namespace, _service("infer", "http", 80))
    await core.create_namespaced_service(namespace, _service("infer-admin", "admin", 9090))
    # Names a port the replicas do not declare: no slice, a Warning on each ready replica.
    await core.create_namespaced_service(namespace, _service("infer-debug", "debug", 7000))
    for name in REPLICAS:
        await core.create_namespaced_pod(namespace, _replica(agent.node, name))

    # Listed once running, not ready before the probe passed, then ready.
    async def listed_unready() -> bool:
        seen = _endpoints(await _slices(api, namespace, "infer"))
        return any(not c["ready"] for _, _, c in seen.values())

    await wait_for(listed_unready, timeout=90, interval=0.2, what="an endpoint listed, not ready")

    async def all_ready() -> dict[str, tuple[str, int, dict[str, bool]]] | None:
        seen = _endpoints(await _slices(api, namespace, "infer"))
        ok = set(seen) == set(REPLICAS) and all(c["ready"] for _, _, c in seen.values())
        return seen if ok else None

    ready = await wait_for(all_ready, timeout=90, interval=0.5, what="both endpoints ready")
    slices = await _slices(api, namespace, "infer")
    assert len(slices) == 2  # the replicas' ports differ: a slice per mapping
    for slice_ in slices:
        assert slice_["addressType"] == "IPv4"
        (endpoint,) = slice_["endpoints"]
        assert endpoint["nodeName"] == agent.node
        assert endpoint["targetRef"]["kind"] == "Pod"
    for name, (address, port, _) in ready.items():
        assert (address, port) == (node_link.host_address, REPLICAS[name][0])
        assert _get_from(node_link, address, port) == f"{name}:{port}"
    admin = _endpoints(await _slices(api, namespace, "infer-admin"))
    assert {n: p for n, (_, p, _) in admin.items()} == {n: a for n, (_, a) in REPLICAS.items()}
    assert await _slices(api, namespace, "infer-debug") == []

    async def warned() -> list[Any] | None:
        events = await core.list_namespaced_event(namespace, field_selector="reason=PortNotExposed")
        return events.items if len(events.items) == len(REPLICAS) else None

    for event in await wait_for(warned, timeout=60, what="a PortNotExposed Warning per replica"):
        assert event.type == "Warning" and event.involved_object.name in REPLICAS
        assert "Service infer-debug port web will not reach this replica" in event.message
        assert "declares no TCP port named 'debug'" in event.message

    # An agent outage leaves the slices as they were; the restarted agent keeps them right.
    before = {s["metadata"]["name"]: s["endpoints"] for s in await _slices(api, namespace, "infer")}
    assert agent.process is not None
    agent.process.send_signal(signal.SIGKILL)
    agent.process.wait()
    after_kill = {
        s["metadata"]["name"]: s["endpoints"] for s in await _slices(api, namespace, "infer")
    }
    assert after_kill == before
    agent.start()

    # The restarted agent adopts before it writes: both replicas stay listed, infer-b ready,
    # while it starts, lists its provider and corrects the slices.
    async def restarted() -> bool:
        return agent.log_text().count("registered; kubelet API") >= 2

    gaps: list[dict[str, Any]] = []

    async def listed_while(done: Any) -> None:
        while not await done():
            seen = _endpoints(await _slices(api, namespace, "infer"))
            if set(seen) != set(REPLICAS) or not seen["infer-b"][2]["ready"]:
                gaps.append(seen)
            await asyncio.sleep(0.1)

    await wait_for(restarted, timeout=60, what="the agent restarted")
    await asyncio.wait_for(listed_while(_after_resyncs(agent, 3)), timeout=60)
    assert gaps == []

    # Deleting a replica: its endpoint turns terminating (it ignores SIGTERM for its grace
    # period), then leaves; the other stays ready throughout.
    await core.delete_namespaced_pod("infer-a", namespace)

    async def terminating() -> bool:
        seen = _endpoints(await _slices(api, namespace, "infer"))
        return "infer-a" in seen and seen["infer-a"][2]["terminating"]

    await wait_for(terminating, timeout=60, interval=0.2, what="infer-a terminating")

    async def left() -> dict[str, tuple[str, int, dict[str, bool]]] | None:
        seen = _endpoints(await _slices(api, namespace, "infer"))
        return seen if set(seen) == {"infer-b"} else None

    remaining = await wait_for(left, timeout=90, interval=0.5, what="infer-a's endpoint gone")
    assert remaining["infer-b"][2] == {"ready": True, "serving": True, "terminating": False}
    assert _get_from(node_link, node_link.host_address, REPLICAS["infer-b"][0]) == (
        f"infer-b:{REPLICAS['infer-b'][0]}"
    )

    # deploy/rbac-traffic.yaml is what these calls needed: none refused, every grant used
    # (the agent ran with the shipped role and that file's, the audit log says what it did).
    user = f"system:serviceaccount:{AUDITED_NAMESPACE}:{shipped_role.account_for(agent.node)}"
    calls = calls_of(control_plane.audit_log, user)
    assert not [c for c in calls if c.forbidden]
    traffic = [
        d for d in shipped_role.shipped_documents(traffic=True) if d["kind"] == "ClusterRole"
    ]
    role = [d for d in traffic if d["metadata"]["name"] == "vk-provider-traffic"]
    assert role and unused(grants_of(role), calls) == set(), "granted, never called"


# --- a Deployment half on the own nodes, half on rented GPUs ---------------------------------

# Every replica runs the same template: both ports on every address, after a few seconds (the
# probe fails first), each answer naming the replica (its POD_NAME from the downward API).
WEB, ADMIN = 18381, 18481
ONE_GPU = [
    {"sku": "a100", "gpu_model": "A100-80GB", "gpu_count": 1, "gpu_memory_gib": 80, "vcpus": 8,
     "memory_gib": 64, "price_per_hour": 1.5, "capacity": 1},
]  # fmt: skip


def _deployment(nodes: list[str]) -> dict[str, Any]:
    labels = {"app": "infer"}
    container = {
        "name": "server",
        "image": "example.com/inference:1",
        "command": replica_command(None, ADMIN, WEB, delay=4, linger=True),
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [
            {"name": "http", "containerPort": WEB},
            {"name": "admin", "containerPort": ADMIN},
        ],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    on_these = {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "infer"},
        "spec": {
            "replicas": 4,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [{"matchExpressions": [on_these]}]
                            }
                        }
                    },
                    "tolerations": [TOLERATION],
                    "terminationGracePeriodSeconds": 8,
                    "containers": [container],
                },
            },
        },
    }


@pytest.fixture
def own_nodes(control_plane: LocalCluster, tmp_path: Path) -> Iterator[list[str]]:
    """Two KWOK GPU nodes of one GPU each (the own cluster's), removed afterwards."""
    with AdminApi(control_plane) as admin:
        kwok = start_kwok(
            ensure_kwok(), kubeconfig=control_plane.kubeconfig, directory=tmp_path / "kwok"
        )
        names = kwok_mod.gpu_node_names(2, prefix=f"own-{os.getpid()}")
        try:
            kwok_mod.create_gpu_nodes(admin, 2, prefix=f"own-{os.getpid()}", gpus=1)
            kwok_mod.wait_nodes_ready(admin, names)
            yield names
        finally:
            kwok_mod.delete_gpu_nodes(admin, names)
            kwok.stop()


@pytest.fixture
def pod_networks() -> Iterator[list[netns.VethNamespace]]:
    """Two network namespaces, one per ``local`` provider: the machines the replicas on the
    virtual node run on, each reached from here over a veth pair."""
    made: list[netns.VethNamespace] = []
    try:
        for index in range(2):
            made.append(netns.create(f"r{index}{os.getpid() % 10**6}", seed=os.getpid() + index))
        yield made
    except netns.NetnsUnavailable as exc:
        pytest.skip(f"no network namespace for a replica: {exc}")
    finally:
        for link in made:
            netns.remove(link)


async def _get(address: str, port: int) -> str:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(address, port), 10)
    try:
        writer.write(f"GET / HTTP/1.0\r\nHost: {address}\r\n\r\n".encode())
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    return answer.decode().partition("\r\n\r\n")[2]


async def test_a_deployment_half_on_rented_gpus_is_reached_at_the_replicas_real_addresses(
    kube: ApiClient,
    api: KubeClient,
    agents: AgentHarness,
    namespace: str,
    own_nodes: list[str],
    pod_networks: list[netns.VethNamespace],
) -> None:
    """4 replicas of one Deployment: 2 on own (KWOK) nodes, 2 on the virtual node, one on
    each of two ``local`` providers whose processes run in network namespaces of their own
    (so both listen on the same ports, as on two machines). The Service's slices of our node
    list exactly the 2 rented replicas at the address and port each really listens on, ready
    only once the probe passed; an HTTP client gets each replica's own answer there; a second
    Service with another ``targetPort`` name gets the other port. The replicas have that
    address as their ``podIP`` (every port 1:1 there). SIGKILL of the agent leaves the slices
    as they were; after the restart they stay right; a deleted replica's endpoint turns
    terminating, then leaves, and its replacement is listed."""
    agent = agents.start(
        providers=[
            {
                "name": f"rent-{i}",
                "offers": ONE_GPU,
                "address": link.peer_address,
                "network_namespace": link.namespace,
            }
            for i, link in enumerate(pod_networks)
        ],
        endpoint_slices={"enabled": True, "resync_seconds": 0.5},
    )
    core = client.CoreV1Api(kube)
    await core.create_namespaced_service(namespace, _service("infer", "http", 80))
    await core.create_namespaced_service(namespace, _service("infer-admin", "admin", 9090))
    await client.AppsV1Api(kube).create_namespaced_deployment(
        namespace, _deployment([*own_nodes, agent.node])
    )
    addresses = {link.peer_address for link in pod_networks}

    async def rented() -> dict[str, str] | None:
        pods, _ = await api.list_node_pods(agent.node)
        running = {
            p["metadata"]["name"]: p["status"].get("podIP", "")
            for p in pods
            if p["metadata"]["namespace"] == namespace and p["status"].get("phase") == "Running"
        }
        return running if len(running) == 2 else None

    async def listed_unready() -> bool:
        seen = _endpoints(await _slices(api, namespace, "infer"))
        return any(not c["ready"] for _, _, c in seen.values())

    await wait_for(listed_unready, timeout=120, interval=0.2, what="an endpoint listed, not ready")
    on_node = await wait_for(rented, timeout=120, what="two replicas running on the virtual node")
    assert set(on_node.values()) == addresses  # podIP: the address every port is reached at

    async def all_ready() -> dict[str, tuple[str, int, dict[str, bool]]] | None:
        seen = _endpoints(await _slices(api, namespace, "infer"))
        ok = set(seen) == set(on_node) and all(c["ready"] for _, _, c in seen.values())
        return seen if ok else None

    ready = await wait_for(all_ready, timeout=120, interval=0.5, what="both endpoints ready")
    (slice_,) = await _slices(api, namespace, "infer")  # same port on both: one slice
    assert {e["nodeName"] for e in slice_["endpoints"]} == {agent.node}
    for name, (address, port, _) in ready.items():
        assert address == on_node[name] and port == WEB
        assert await _get(address, port) == f"{name}:{WEB}"
    admin = _endpoints(await _slices(api, namespace, "infer-admin"))
    assert {n: (a, p) for n, (a, p, _) in admin.items()} == {
        n: (on_node[n], ADMIN) for n in on_node
    }
    for name, (address, port, _) in admin.items():
        assert await _get(address, port) == f"{name}:{ADMIN}"
    everywhere = await client.AppsV1Api(kube).read_namespaced_deployment("infer", namespace)
    assert everywhere.status.ready_replicas == 4  # the KWOK half is ready too

    before = {s["metadata"]["name"]: s["endpoints"] for s in await _slices(api, namespace, "infer")}
    assert agent.process is not None
    agent.process.send_signal(signal.SIGKILL)
    agent.process.wait()
    assert {
        s["metadata"]["name"]: s["endpoints"] for s in await _slices(api, namespace, "infer")
    } == before
    agent.start()

    async def restarted() -> bool:
        return agent.log_text().count("registered; kubelet API") >= 2

    await wait_for(restarted, timeout=60, what="the agent restarted")
    await wait_for(_after_resyncs(agent, 3), timeout=60, what="three resyncs after the restart")
    assert _endpoints(await _slices(api, namespace, "infer")) == ready

    gone = sorted(on_node)[0]
    await core.delete_namespaced_pod(gone, namespace)

    async def terminating() -> bool:
        seen = _endpoints(await _slices(api, namespace, "infer"))
        return gone in seen and seen[gone][2]["terminating"]

    await wait_for(terminating, timeout=60, interval=0.2, what=f"{gone} terminating")

    async def replaced() -> dict[str, tuple[str, int, dict[str, bool]]] | None:
        seen = _endpoints(await _slices(api, namespace, "infer"))
        fresh = set(seen) - set(on_node)
        ok = (
            gone not in seen
            and len(seen) == 2
            and fresh
            and all(c["ready"] for _, _, c in seen.values())
        )
        return seen if ok else None

    after = await wait_for(replaced, timeout=120, interval=0.5, what=f"{gone} replaced")
    for name, (address, port, _) in after.items():
        assert await _get(address, port) == f"{name}:{WEB}"
