"""A real data path: a real kube-proxy turns the Service's ClusterIP into the rented replicas.

Three network namespaces: the replicas' machines A and B (one ``local`` provider each, as in
test_traffic.py's Deployment half on rented GPUs) and a node K, wired to A and to B by veth
pairs of their own (``netns.connect``), so that K reaches each replica's address directly and
the root namespace forwards nothing. kube-proxy (built from the Go module proxy at the control
plane's version, ``vk_provider_dev.cluster.kubeproxy``) runs in K in nftables mode, as
``system:kube-proxy``, reaching the API server through a relay on K's host-side address. The
agent publishes the replicas' EndpointSlices; a client in K sends requests to the ClusterIP
until both replicas have answered; a deleted replica is dropped by kube-proxy as soon as its
endpoint is terminating (while it still serves), and stays out once its endpoint is gone.
kube-proxy's rules exist in K only: the root namespace has no kube-proxy table.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from tests.helpers import wait_for
from tests.integration.agent_harness import AgentHarness
from tests.integration.test_traffic import (
    ONE_GPU,
    PY,
    REPLICAS,
    _endpoints,
    _replica,
    _service,
    _slices,
)
from vk_provider.kube.client import KubeClient
from vk_provider_dev.cluster import netns
from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.kubeproxy import (
    KubeProxy,
    ensure_kube_proxy,
    in_namespace,
    start_kube_proxy,
)

pytestmark = pytest.mark.integration

SUFFIX = str(os.getpid() % 10**6)
GRACE = 20  # infer-a ignores SIGTERM this long: it still serves while its endpoint terminates

# Runs in K: GET the URL until every answer in ``want`` was seen (or ``count`` requests were
# made), within a deadline; prints every answer (an error as "error: ..."), as JSON.
CLIENT = """
import json, sys, time, urllib.request
url, want, count = sys.argv[1], set(json.loads(sys.argv[2])), int(sys.argv[3])
deadline = time.monotonic() + float(sys.argv[4])
answers = []
while time.monotonic() < deadline:
    try:
        answers.append(urllib.request.urlopen(url, timeout=5).read().decode())
    except OSError as exc:
        answers.append(f"error: {exc}")
    if (want and want <= set(answers)) or (count and len(answers) >= count):
        break
print(json.dumps(answers))
"""


@dataclass(frozen=True, slots=True)
class DataPath:
    """The replicas' namespaces A and B, the node K, and K's links to A and B."""

    replicas: list[netns.VethNamespace]
    node: netns.VethNamespace
    links: list[netns.NamespaceLink]


@pytest.fixture
def data_path() -> Iterator[DataPath]:
    made: list[netns.VethNamespace] = []
    links: list[netns.NamespaceLink] = []
    try:
        for index, role in enumerate(("kpa", "kpb", "kpk")):
            made.append(netns.create(f"{role}{SUFFIX}", seed=os.getpid() + 7 * index))
        *replicas, node = made
        for role, replica in zip(("kla", "klb"), replicas, strict=True):
            links.append(
                netns.connect(node, replica, name=f"{role}{SUFFIX}", seed=os.getpid() + 31)
            )
        yield DataPath(replicas=replicas, node=node, links=links)
    except netns.NetnsUnavailable as exc:
        pytest.skip(f"no network namespaces here: {exc}")
    finally:
        for link in links:
            netns.disconnect(link)
        for made_one in made:
            netns.remove(made_one)


@pytest.fixture
def kube_proxy(
    control_plane: LocalCluster, data_path: DataPath, tmp_path: Path
) -> Iterator[KubeProxy]:
    running = start_kube_proxy(
        control_plane,
        data_path.node,
        directory=tmp_path / "kube-proxy",
        node=f"kube-proxy-{SUFFIX}",
        sink=f"kps{SUFFIX}",
        binaries=ensure_kube_proxy(),
    )
    with running:
        yield running
    assert not running.running


def _from_node(
    node: netns.VethNamespace, url: str, *, want: set[str] | None = None, count: int = 0
) -> list[str]:
    """Requests from inside K (see ``CLIENT``), within a generous deadline."""
    wanted = json.dumps(sorted(want or ()))
    argv = in_namespace(node.namespace, [PY, "-c", CLIENT, url, wanted, str(count), "90"])
    ran = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 0, ran.stderr
    answers: list[str] = json.loads(ran.stdout)
    return answers


def _service_endpoints(proxy: KubeProxy, namespace: str, service: str) -> set[str]:
    """The ``address:port`` pairs kube-proxy's nftables chain of the Service sends to
    (``dnat to A:P`` for one endpoint, ``dnat ip to numgen random mod 2 map { 0 : A . P, ...``
    for more)."""
    ruleset = proxy.ruleset()
    match = re.search(
        rf"chain service-\w+-{re.escape(namespace)}/{service}/tcp/web \{{(.*?)\n\t\}}",
        ruleset,
        re.DOTALL,
    )
    if match is None:
        return set()
    return {
        f"{a}:{p}" for a, p in re.findall(r"(\d+\.\d+\.\d+\.\d+)(?::| \. )(\d+)", match.group(1))
    }


def _root_tables(proxy: KubeProxy) -> str:
    """``nft list tables`` of the root namespace (read-only)."""
    listed = subprocess.run(
        [str(proxy.nft.path), "list", "tables"],
        capture_output=True,
        text=True,
        env=proxy.nft.environment(),
        timeout=30,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    return listed.stdout


def _on_gpu(node: str, name: str) -> dict[str, Any]:
    """test_traffic's replica (its own ports, a readiness probe, ignores SIGTERM) with a GPU,
    so that the two replicas take one ``local`` provider (one namespace) each."""
    pod = _replica(node, name)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    pod["spec"]["terminationGracePeriodSeconds"] = GRACE
    return pod


async def test_a_real_kube_proxy_reaches_the_rented_replicas_through_the_cluster_ip(
    data_path: DataPath,
    kube_proxy: KubeProxy,
    kube: ApiClient,
    api: KubeClient,
    agents: AgentHarness,
    namespace: str,
) -> None:
    agent = agents.start(
        providers=[
            {
                "name": f"rent-{i}",
                "offers": ONE_GPU,
                "address": link.peer_address,
                "network_namespace": link.namespace,
            }
            for i, link in enumerate(data_path.replicas)
        ],
        endpoint_slices={"enabled": True, "resync_seconds": 0.5},
    )
    core = client.CoreV1Api(kube)
    service = await core.create_namespaced_service(namespace, _service("infer", "http", 80))
    cluster_ip = service.spec.cluster_ip
    url = f"http://{cluster_ip}:80/"
    for name in REPLICAS:
        await core.create_namespaced_pod(namespace, _on_gpu(agent.node, name))

    async def all_ready() -> dict[str, tuple[str, int, dict[str, bool]]] | None:
        seen = _endpoints(await _slices(api, namespace, "infer"))
        ok = set(seen) == set(REPLICAS) and all(c["ready"] for _, _, c in seen.values())
        return seen if ok else None

    ready = await wait_for(all_ready, timeout=120, interval=0.5, what="both endpoints ready")
    addresses = {link.peer_address for link in data_path.replicas}
    assert {address for address, _, _ in ready.values()} == addresses  # one in A, one in B
    published = {f"{a}:{p}" for a, p, _ in ready.values()}

    async def programmed() -> bool:
        return _service_endpoints(kube_proxy, namespace, "infer") == published

    await wait_for(programmed, timeout=60, interval=0.5, what="kube-proxy's rules of both")
    answers = _from_node(data_path.node, url, want={f"{n}:{p}" for n, (p, _) in REPLICAS.items()})
    assert set(answers) == {f"{n}:{p}" for n, (p, _) in REPLICAS.items()}, answers

    # nftables mode, its table in K only; the root namespace has none (a read-only look).
    assert "Using nftables Proxier" in kube_proxy.log_text()
    assert f"{cluster_ip} . tcp . 80" in kube_proxy.ruleset()
    assert "kube-proxy" not in _root_tables(kube_proxy)

    # infer-a deleted: kube-proxy drops it while its endpoint terminates (it still serves,
    # ignoring SIGTERM), and it stays out once the endpoint is gone.
    gone_address, gone_port, _ = ready["infer-a"]
    kept = f"infer-b:{REPLICAS['infer-b'][0]}"
    await core.delete_namespaced_pod("infer-a", namespace)

    async def terminating() -> bool:
        seen = _endpoints(await _slices(api, namespace, "infer"))
        return "infer-a" in seen and seen["infer-a"][2]["terminating"]

    await wait_for(terminating, timeout=60, interval=0.2, what="infer-a terminating")
    remaining = {f"{a}:{p}" for n, (a, p, _) in ready.items() if n != "infer-a"}

    async def dropped() -> bool:
        return _service_endpoints(kube_proxy, namespace, "infer") == remaining

    await wait_for(dropped, timeout=30, interval=0.2, what="kube-proxy dropped infer-a")
    assert _from_node(data_path.node, url, count=20) == [kept] * 20
    still = _from_node(data_path.node, f"http://{gone_address}:{gone_port}/", count=1)
    assert still == [f"infer-a:{gone_port}"]  # over K's own link to A: infer-a still serves

    async def left() -> bool:
        return set(_endpoints(await _slices(api, namespace, "infer"))) == {"infer-b"}

    await wait_for(left, timeout=GRACE + 60, interval=0.5, what="infer-a's endpoint gone")
    assert _from_node(data_path.node, url, count=20) == [kept] * 20
