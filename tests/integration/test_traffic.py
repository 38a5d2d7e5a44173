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
import signal
import subprocess
import sys
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from tests.helpers import wait_for
from tests.integration import shipped_role
from tests.integration.agent_harness import DEFAULT_OFFERS, AgentHarness, AgentProcess, pod_on
from tests.integration.audit import calls_of, grants_of, unused
from vk_provider.kube.client import KubeClient
from vk_provider_dev.cluster import netns
from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.components import AUDITED_NAMESPACE

pytestmark = pytest.mark.integration

PY = sys.executable
# Binds its two ports only after a few seconds (so the readiness probe fails first), answers
# every GET with its name, and ignores SIGTERM (so its deletion takes the grace period).
SERVER = """
import http.server, signal, sys, threading, time
name, http_port, admin_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(4)
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"{name}:{self.server.server_address[1]}".encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *args): pass
for port in (admin_port, http_port):
    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
print("serving", flush=True)
while True: time.sleep(1)
"""
REPLICAS = {"infer-a": (18181, 18281), "infer-b": (18182, 18282)}
MANAGED = "endpointslice.kubernetes.io/managed-by=vk-provider.io"


def _replica(node: str, name: str) -> dict[str, Any]:
    http_port, admin_port = REPLICAS[name]
    return pod_on(
        node,
        name,
        command=[PY, "-c", SERVER, name, str(http_port), str(admin_port)],
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
