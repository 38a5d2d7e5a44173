"""A real kube-proxy, in nftables mode, inside a network namespace of the test's.

The binary is ``k8s.io/kubernetes/cmd/kube-proxy`` at the control plane's pinned version,
built from the Go module proxy like the control plane (``binaries.build_kubernetes_program``:
same wrapper module and staging replaces, same version stamps) into
``cache_root()/kube-proxy-<version>-v1/``; its nftables mode runs Debian's ``nft``
(``nft.ensure_nft``). ``ensure_kube_proxy`` finds or fetches both.

``start_kube_proxy(cluster, link, ...)`` runs it in ``link.namespace`` (``ip netns exec``):

- **API server.** The local API server binds 127.0.0.1 of the root namespace only, which no
  other namespace reaches. A TCP relay (a child process of ours, ``relay``) listens on the
  link's host-side address, the one address of the root namespace the namespace reaches over
  its own veth, and passes bytes to the API server; TLS stays end to end (the kubeconfig names
  the relay as server, with ``tls-server-name: localhost``, a name of the serving certificate).
- **Identity.** A client certificate for ``system:kube-proxy`` from the cluster CA: the user
  the default ClusterRoleBinding ``system:node-proxier`` grants exactly what kube-proxy needs
  (watch Services, EndpointSlices, ServiceCIDRs and its Node; write Events). No RBAC object is
  created.
- **Its Node.** kube-proxy waits up to 30 s for the Node named by ``--hostname-override`` and
  only then starts; its ``/healthz`` is never healthy without one. So a Node of that name is
  registered with the namespace's address as InternalIP, unschedulable and tainted
  ``NoSchedule`` so that no pod lands on it, and deleted by ``stop``.
- **Flags.** ``--proxy-mode=nftables``; ``--conntrack-max-per-core=0``: ``nf_conntrack_max``
  and the conntrack hash size are host-wide (no network namespace has its own), so kube-proxy
  must not raise them; the conntrack timeouts it sets are per namespace and stay its defaults.
  ``--healthz-bind-address`` and ``--metrics-bind-address`` on the namespace's own 127.0.0.1.
  ``--oom-score-adj=0``: a test's process does not ask the OOM killer to spare it (the default
  -999 needs CAP_SYS_RESOURCE, which a container may lack).
  No ``--cluster-cidr``: nothing is masqueraded, replicas see the client's address.
- **ClusterIPs.** The cluster's service CIDR is routed in the namespace into a sink
  (``netns.sink_route``): a packet kube-proxy does not DNAT is dropped there, never sent on.

Ready means ``/healthz`` answers 200 with a synced IPv4 proxier (its first full sync of the
rules done). ``stop`` stops kube-proxy and the relay, deletes the Node and the sink;
kube-proxy's table lives in the namespace only and goes with it.

Invariants: nothing here reads or writes a rule or a sysctl of the root namespace; every file
lives under ``directory``; a failed start stops and deletes what it started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import yaml

from vk_provider_dev.cluster import components, netns
from vk_provider_dev.cluster import pki as pki_mod
from vk_provider_dev.cluster.binaries import (
    PINNED,
    Progress,
    build_kubernetes_program,
    cache_root,
)
from vk_provider_dev.cluster.cluster import SERVICE_CIDR, LocalCluster
from vk_provider_dev.cluster.errors import ClusterError
from vk_provider_dev.cluster.flip.child import ChildProcess, RunningComponent, log_tail
from vk_provider_dev.cluster.nft import Nft, ensure_nft

NAME: Final = "kube-proxy"
USER: Final = "system:kube-proxy"  # bound to ClusterRole system:node-proxier by default
HEALTHZ: Final = "127.0.0.1:10256"  # inside the namespace
METRICS: Final = "127.0.0.1:10249"  # inside the namespace
TABLE: Final = "kube-proxy"  # the nftables table kube-proxy owns (family ip and ip6)
NO_PODS_TAINT: Final = "vk-provider.io/kube-proxy-only"
_RELAYING: Final = "relaying "


def _ignore_progress(_phase: str, _done: int, _total: int) -> None:
    return None


def cache_directory() -> Path:
    # "-v1": bump when the recipe changes, so an older build is never taken for this one.
    return cache_root() / f"kube-proxy-{PINNED.kubernetes}-v1"


@dataclass(frozen=True, slots=True)
class KubeProxyBinaries:
    kube_proxy: Path
    nft: Nft

    def describe(self) -> list[tuple[str, Path]]:
        """(name, path) of each program, for `vk-provider cluster binaries --kube-proxy`."""
        return [("kube-proxy", self.kube_proxy), (f"nft {self.nft.version}", self.nft.path)]


def find_kube_proxy() -> Path | None:
    cached = cache_directory() / NAME
    return cached if os.access(cached, os.X_OK) else None


def ensure_kube_proxy(*, progress: Progress = _ignore_progress) -> KubeProxyBinaries:
    """kube-proxy (built into the cache first if absent) and Debian's nft (fetched likewise)."""
    binary = find_kube_proxy() or build_kubernetes_program(
        NAME, cache_directory(), PINNED, progress=progress
    )
    return KubeProxyBinaries(kube_proxy=binary, nft=ensure_nft(progress=progress))


# --------------------------------------------------------------------------- running it


def _ip_tool() -> str:
    tool = shutil.which("ip")
    if tool is None:
        raise netns.NetnsUnavailable("the ip tool (iproute2) is not installed")
    return tool


def in_namespace(namespace: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside ``namespace`` (``ip netns exec``)."""
    return [_ip_tool(), "netns", "exec", namespace, *argv]


def _apiserver(cluster: LocalCluster) -> tuple[str, int]:
    """Host and port of the API server, from the cluster's admin kubeconfig."""
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    server = str(config["clusters"][0]["cluster"]["server"])
    host, _, port = server.removeprefix("https://").rstrip("/").rpartition(":")
    return host, int(port)


def _write_kubeconfig(cluster: LocalCluster, directory: Path, server: str) -> Path:
    """A kubeconfig for ``system:kube-proxy`` (a certificate of its own) reaching ``server``."""
    pair = pki_mod.CertPair(cert=directory / "kube-proxy.crt", key=directory / "kube-proxy.key")
    pki_mod.issue_certificate(cluster.pki.ca, pair, common_name=USER, client=True)
    _, port = _apiserver(cluster)
    document: dict[str, Any] = yaml.safe_load(
        components.kubeconfig_text(
            cluster.name, port, ca=cluster.pki.ca.cert, client=pair, user=NAME
        )
    )
    for entry in document["clusters"]:
        entry["cluster"]["server"] = server
        # The relay's address is not in the serving certificate; "localhost" is.
        entry["cluster"]["tls-server-name"] = "localhost"
    path = directory / "kube-proxy.kubeconfig"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(yaml.safe_dump(document, sort_keys=False))
    return path


def _start_relay(cluster: LocalCluster, link: netns.VethNamespace, directory: Path) -> ChildProcess:
    host, port = _apiserver(cluster)
    log = directory / "relay.log"
    argv = [
        sys.executable, "-m", "vk_provider_dev.cluster.kubeproxy", "relay",
        "--listen", link.host_address, "--to-host", host, "--to-port", str(port),
    ]  # fmt: skip
    return ChildProcess.start(
        "api-relay",
        argv,
        log_file=log,
        health=lambda: _RELAYING in log.read_text(errors="replace"),
        cwd=directory,
        timeout=30,
    )


def _relay_address(relay: ChildProcess) -> str:
    """``host:port`` the relay listens on (the first line it logs)."""
    for line in relay.log_file.read_text(errors="replace").splitlines():
        if line.startswith(_RELAYING):
            return line.removeprefix(_RELAYING).split()[0]
    raise ClusterError(f"the API relay logged no address: {log_tail(relay.log_file)}")


def node_object(name: str, address: str) -> dict[str, Any]:
    """The Node kube-proxy runs for: its address, and no pod may run on it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {
            "unschedulable": True,
            "taints": [{"key": NO_PODS_TAINT, "effect": "NoSchedule"}],
        },
        "status": {"addresses": [{"type": "InternalIP", "address": address}]},
    }


def command(binary: Path, *, kubeconfig: Path, node: str) -> list[str]:
    """kube-proxy's command line (the module docstring says why each flag)."""
    return [
        str(binary),
        "--proxy-mode=nftables",
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={node}",
        f"--healthz-bind-address={HEALTHZ}",
        f"--metrics-bind-address={METRICS}",
        "--conntrack-max-per-core=0",
        "--oom-score-adj=0",
        "--v=2",
    ]


_HEALTH_SCRIPT = """
import json, sys, urllib.error, urllib.request
try:
    answer = urllib.request.urlopen(sys.argv[1], timeout=3)
except (OSError, urllib.error.URLError):
    sys.exit(1)
body = json.loads(answer.read())
synced = body.get("status", {}).get("IPv4", {}).get("healthy")
sys.exit(0 if answer.status == 200 and body.get("healthy") and synced else 1)
"""


def _synced(namespace: str) -> bool:
    """kube-proxy's /healthz answers 200, its node eligible and its IPv4 rules synced."""
    argv = in_namespace(
        namespace, [sys.executable, "-c", _HEALTH_SCRIPT, f"http://{HEALTHZ}/healthz"]
    )
    return subprocess.run(argv, capture_output=True, timeout=15, check=False).returncode == 0


@dataclass
class KubeProxy(RunningComponent):
    """A running kube-proxy in ``link.namespace`` and what was made for it."""

    child: ChildProcess
    relay: ChildProcess
    cluster: LocalCluster
    link: netns.VethNamespace
    node: str
    nft: Nft
    sink: str

    def log_text(self) -> str:
        return self.log_file.read_text(errors="replace")

    def ruleset(self, family: str = "ip") -> str:
        """``nft list table <family> kube-proxy`` inside the namespace ("" when absent)."""
        listed = subprocess.run(
            in_namespace(self.link.namespace, [str(self.nft.path), "list", "table", family, TABLE]),
            capture_output=True,
            text=True,
            env=self.nft.environment(),
            timeout=30,
            check=False,
        )
        return listed.stdout if listed.returncode == 0 else ""

    def stop(self) -> None:
        """Stop kube-proxy and the relay, delete the Node and the sink. Idempotent."""
        try:
            self.child.stop()
        finally:
            _undo(self.cluster, self.link, relay=self.relay, node=self.node, sink=self.sink)


def _undo(
    cluster: LocalCluster, link: netns.VethNamespace, *, relay: ChildProcess, node: str, sink: str
) -> None:
    """Stop the relay, delete the Node and the sink; whatever of it exists."""
    try:
        relay.stop()
    finally:
        with contextlib.suppress(ClusterError, httpx.HTTPError, OSError):
            cluster.request("DELETE", f"/api/v1/nodes/{node}")
        netns.remove_sink(link, name=sink)


def start_kube_proxy(
    cluster: LocalCluster,
    link: netns.VethNamespace,
    *,
    directory: Path,
    node: str,
    sink: str,
    binaries: KubeProxyBinaries | None = None,
    timeout: float = 90.0,
) -> KubeProxy:
    """kube-proxy in ``link.namespace`` as Node ``node``, ready (module docstring). ``sink``
    names the sink of the service CIDR's route (``netns.sink_route``)."""
    binaries = binaries or ensure_kube_proxy()
    directory.mkdir(parents=True, exist_ok=True)
    relay = _start_relay(cluster, link, directory)
    try:
        kubeconfig = _write_kubeconfig(cluster, directory, f"https://{_relay_address(relay)}")
        cluster.create_object("/api/v1/nodes", node_object(node, link.peer_address))
        netns.sink_route(link, SERVICE_CIDR, name=sink)
        child = ChildProcess.start(
            NAME,
            in_namespace(
                link.namespace, command(binaries.kube_proxy, kubeconfig=kubeconfig, node=node)
            ),
            log_file=directory / "kube-proxy.log",
            health=lambda: _synced(link.namespace),
            cwd=directory,
            env=binaries.nft.environment(),
            timeout=timeout,
        )
    except BaseException:  # ChildProcess.start stopped kube-proxy already
        _undo(cluster, link, relay=relay, node=node, sink=sink)
        raise
    return KubeProxy(
        child=child, relay=relay, cluster=cluster, link=link, node=node, nft=binaries.nft, sink=sink
    )


# --------------------------------------------------------------------------- the API relay


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()


async def _relay(listen: str, to_host: str, to_port: int) -> None:
    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(to_host, to_port)
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        finally:
            upstream_writer.close()
            writer.close()

    server = await asyncio.start_server(connection, listen, 0)
    port = server.sockets[0].getsockname()[1]
    print(f"{_RELAYING}{listen}:{port} to {to_host}:{to_port}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vk_provider_dev.cluster.kubeproxy relay --listen A --to-host H --to-port P``:
    the API relay (a TCP relay on A, a free port, to H:P), until killed."""
    parser = argparse.ArgumentParser(prog="vk_provider_dev.cluster.kubeproxy")
    commands = parser.add_subparsers(dest="command", required=True)
    relay = commands.add_parser("relay")
    relay.add_argument("--listen", required=True)
    relay.add_argument("--to-host", required=True)
    relay.add_argument("--to-port", type=int, required=True)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_relay(args.listen, args.to_host, args.to_port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
