"""Fixtures for the kubelet API tests: a node address of the tests' own, metrics-server, and
a reaper for the kubectl processes a test leaves running (port-forward).

``node_link`` makes a veth pair into a network namespace for the session (``cluster/netns``):
its host side, 10.213.N.1, is the address the agent's kubelet API listens on and advertises
as the node's InternalIP, so the API server proxies to it (it refuses loopback) and test
traffic goes nowhere but to loopback and this pair. It is removed however the session ends.

``metrics`` runs metrics-server for the session (built into the binary cache first if it is
not there: about 2.5 minutes cold), registered as ``v1beta1.metrics.k8s.io``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.helpers import wait_for, wait_until
from tests.integration.agent_harness import AgentHarness, AgentProcess
from vk_provider_dev.cluster import netns
from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.metrics_server import MetricsServer, ensure_metrics_server
from vk_provider_dev.cluster.pki import CertPair, issue_certificate

KUBECTL = str(Path(sys.executable).parent / "kubectl")


@pytest.fixture(scope="session")
def node_link() -> Iterator[netns.VethNamespace]:
    name = f"t{os.getpid() % 10**8}"
    try:
        link = netns.create(name, seed=os.getpid())
    except netns.NetnsUnavailable as exc:
        pytest.skip(f"no network namespace for a node address: {exc}")
    try:
        yield link
    finally:
        netns.remove(link)


@pytest.fixture(scope="session")
def metrics(control_plane: LocalCluster) -> Iterator[MetricsServer]:
    def report(phase: str, done: int, total: int) -> None:
        if total == 0 or done == total:
            print(f"metrics-server: {phase} {done}/{total}", file=sys.stderr, flush=True)

    server = MetricsServer(control_plane, ensure_metrics_server(progress=report))
    try:
        server.start()
        yield server
    finally:
        server.stop()


def start_agent_on(
    agents: AgentHarness,
    cluster: LocalCluster,
    link: netns.VethNamespace,
    *,
    providers: list[dict[str, Any]] | None = None,
    settings: dict[str, Any] | None = None,
) -> AgentProcess:
    """An agent whose kubelet API listens on the link's host address and advertises it, with a
    serving certificate from the cluster CA (so metrics-server can verify it); ``settings``
    replace top-level sections of its configuration (``providers`` of another type). On a
    cluster whose API server verifies kubelets, the agent asks the cluster to sign it
    (``kubelet_api.serving.source: cluster``), as in production; else the test issues it."""
    verified = cluster.flags().verify_kubelets
    agent = agents.start(
        providers=providers,
        node={"address": link.host_address},
        start=False,
        cluster_serving=verified,
    )
    if verified:
        config = yaml.safe_load(agent.config_path.read_text())
        config.update(settings or {})
        config["kubelet_api"].update(listen=f"{link.host_address}:0")
        agent.config_path.write_text(yaml.safe_dump(config))
        agent.start()
        # The node runs before its certificate is signed; the kubelet API serves once it is.
        wait_until(
            lambda: serves_a_certificate_of(cluster, agent.node, link.host_address),
            timeout=120,
            interval=0.5,
            what=f"the kubelet API of {agent.node} serving a cluster-signed certificate",
        )
        return agent
    serving = CertPair(
        agent.config_path.parent / "kubelet.crt", agent.config_path.parent / "kubelet.key"
    )
    issue_certificate(
        cluster.pki.ca,
        serving,
        common_name=agent.node,
        server=True,
        dns_names=(agent.node,),
        ip_addresses=(link.host_address,),
    )
    config = yaml.safe_load(agent.config_path.read_text())
    config.update(settings or {})
    config["kubelet_api"].pop("serving")  # given files instead
    config["kubelet_api"].update(
        listen=f"{link.host_address}:0",
        tls_cert_file=str(serving.cert),
        tls_key_file=str(serving.key),
    )
    agent.config_path.write_text(yaml.safe_dump(config))
    agent.start()
    return agent


def serves_a_certificate_of(cluster: LocalCluster, node: str, address: str) -> bool:
    """Whether the kubelet API ``node`` advertises completes a TLS handshake verified
    against the cluster CA for ``address``."""
    answer = subprocess.run(
        [
            KUBECTL,
            "--kubeconfig",
            str(cluster.kubeconfig),
            "get",
            "node",
            node,
            "-o",
            "jsonpath={.status.daemonEndpoints.kubeletEndpoint.Port}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if answer.returncode != 0 or not answer.stdout.strip().isdigit():
        return False
    context = ssl.create_default_context(cafile=str(cluster.pki.ca.cert))
    try:
        with (
            socket.create_connection((address, int(answer.stdout)), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname=address),
        ):
            return True
    except (OSError, ssl.SSLError):
        return False


class Commands:
    """kubectl processes started in the background; every one is killed at the end."""

    def __init__(self, kubeconfig: Path) -> None:
        self._kubeconfig = kubeconfig
        self.started: list[subprocess.Popen[str]] = []

    def start(self, *args: str, **kwargs: Any) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [KUBECTL, "--kubeconfig", str(self._kubeconfig), *args],
            text=True,
            start_new_session=True,
            **kwargs,
        )
        self.started.append(proc)
        return proc

    def run(
        self, *args: str, timeout: float = 60, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [KUBECTL, "--kubeconfig", str(self._kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            **kwargs,
        )

    def reap(self) -> None:
        for proc in self.started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def kubectl(kubeconfig: Path) -> Iterator[Commands]:
    commands = Commands(kubeconfig)
    try:
        yield commands
    finally:
        commands.reap()


async def assert_port_forward(kubectl: Commands, namespace: str, local: int, port: int) -> None:
    """``kubectl port-forward`` of pod/server (an HTTP server answering "hello from /PATH" on
    ``port``) to 127.0.0.1:``local``: two connections of one session are answered, and the
    forward is still running afterwards."""
    forward = kubectl.start(
        "port-forward", "-n", namespace, "pod/server", f"{local}:{port}",
        "--address", "127.0.0.1", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert forward.stdout is not None
    line = forward.stdout.readline()
    assert f"Forwarding from 127.0.0.1:{local}" in line, line

    async def answered() -> httpx.Response | None:
        with contextlib.suppress(httpx.HTTPError):
            async with httpx.AsyncClient(timeout=10) as http:
                return await http.get(f"http://127.0.0.1:{local}/first")
        return None

    first = await wait_for(answered, timeout=60, what="an answer through the forward")
    assert first.status_code == 200 and first.text == "hello from /first"
    async with httpx.AsyncClient(timeout=10) as http:  # a second connection, same session
        second = await http.get(f"http://127.0.0.1:{local}/second")
    assert second.text == "hello from /second"
    assert forward.poll() is None  # still forwarding
