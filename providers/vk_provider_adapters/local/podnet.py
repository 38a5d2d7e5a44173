"""A network of its own for each local pod (``pod_network``), as a CNI plugin gives one.

With ``pod_network`` (an IPv4 CIDR) every pod of the provider gets a /30 of it: a network
namespace ``vkp-<hash>`` holding ``eth0`` at the /30's second address, joined by a veth pair
to this machine, whose end ``vkp<hash>`` has the first (a point-to-point link, as the ptp
plugin makes). The pod's containers, its execs and its runner live in that namespace, so
every pod listens on its own ports at its own address — two replicas declaring the same port
run side by side — and this machine (the agent's probes and port-forwards, a client of the
cluster here) reaches it at that address without forwarding anything.

Invariants:
- ``network.json`` is written into the instance directory (``reserve``) before anything is
  created (and before the instance's record: an agent dying in between leaves an instance
  that reports lost, whose release removes its network), and
  ``remove`` deletes what it names, never raises and may run twice: whatever point a create
  or an agent died at, the instance's release removes its network.
- A /30 is never given twice: ``taken`` reads every instance directory's ``network.json``,
  and the caller allocates under one lock per provider.
- Only the ``ip`` tool (iproute2) is used, with CAP_NET_ADMIN; ``PodNetworkError`` says what
  failed. Nothing outside the pod's namespace and its veth is changed.
"""

from __future__ import annotations

import hashlib
import ipaddress
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from vk_provider_adapters.local.records import read_json, write_json

NETWORK_FILE = "network.json"


class PodNetworkError(RuntimeError):
    """A pod's network could not be made (no iproute2, not permitted, the CIDR is full)."""


@dataclass(frozen=True, slots=True)
class PodNetwork:
    namespace: str
    host_interface: str
    subnet: ipaddress.IPv4Network

    @property
    def host_address(self) -> str:
        return str(self.subnet.network_address + 1)

    @property
    def address(self) -> str:
        """The pod's own address: where its ports are reached."""
        return str(self.subnet.network_address + 2)

    def to_json(self) -> dict[str, object]:
        return {
            "namespace": self.namespace,
            "host_interface": self.host_interface,
            "subnet": str(self.subnet),
        }


def read(directory: Path) -> PodNetwork | None:
    data = read_json(directory / NETWORK_FILE)
    if not isinstance(data, dict):
        return None
    try:
        return PodNetwork(
            namespace=str(data["namespace"]),
            host_interface=str(data["host_interface"]),
            subnet=ipaddress.IPv4Network(str(data["subnet"])),
        )
    except (KeyError, ValueError):
        return None


def taken(instance_dirs: Iterable[Path]) -> set[ipaddress.IPv4Network]:
    return {net.subnet for d in instance_dirs if (net := read(d)) is not None}


def choose(cidr: str, busy: set[ipaddress.IPv4Network], directory: Path) -> PodNetwork:
    """A free /30 of ``cidr`` for the instance in ``directory``, and the names of its parts."""
    for subnet in ipaddress.IPv4Network(cidr).subnets(new_prefix=30):
        if subnet not in busy:
            tag = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:10]
            return PodNetwork(namespace=f"vkp-{tag}", host_interface=f"vkp{tag}", subnet=subnet)
    raise PodNetworkError(f"pod_network {cidr} has no free /30 left")


def _ip(*args: str, check: bool = True) -> None:
    tool = shutil.which("ip")
    if tool is None:
        raise PodNetworkError("pod_network needs the ip tool (iproute2), which is not installed")
    result = subprocess.run([tool, *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        message = (result.stderr or result.stdout).strip()
        raise PodNetworkError(f"ip {' '.join(args)}: {message} (pod_network needs CAP_NET_ADMIN)")


def reserve(directory: Path, network: PodNetwork) -> None:
    """Record ``network`` in the instance directory: its /30 is taken from now on."""
    write_json(directory / NETWORK_FILE, network.to_json())


def create(directory: Path, network: PodNetwork) -> None:
    """Make the ``network`` reserved for the instance in ``directory``; undone on failure."""
    inside = ("-n", network.namespace)
    try:
        _ip("netns", "add", network.namespace)
        _ip(*inside, "link", "set", "lo", "up")
        _ip("link", "add", network.host_interface, "type", "veth", "peer", "name", "eth0",
            "netns", network.namespace)  # fmt: skip
        _ip("addr", "add", f"{network.host_address}/30", "dev", network.host_interface)
        _ip("link", "set", network.host_interface, "up")
        _ip(*inside, "addr", "add", f"{network.address}/30", "dev", "eth0")
        _ip(*inside, "link", "set", "eth0", "up")
        _ip(*inside, "route", "add", "default", "via", network.host_address)
    except BaseException:
        remove(directory)
        raise


def remove(directory: Path) -> None:
    """Delete the instance's network, if it has one (the veth goes with its namespace)."""
    network = read(directory)
    if network is None:
        return
    try:
        _ip("link", "del", network.host_interface, check=False)
        _ip("netns", "del", network.namespace, check=False)
    except PodNetworkError:
        return  # no ip tool: nothing could have been made either
