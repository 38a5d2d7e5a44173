"""A veth pair into a network namespace of its own: a non-loopback address for a local node.

The API server refuses to proxy ``nodes/<node>/proxy/...`` (and so metrics-server's path to
``kubectl top``) to a loopback address, and tests must not use this machine's own interface
address. So tests give the agent an address of its own: a veth pair whose host side gets
``10.213.N.1/30`` and whose peer, in a namespace created for it, ``10.213.N.2/30``. The agent's
kubelet API listens on the host side and advertises it as the node's InternalIP; the API
server and metrics-server reach it there, and traffic never leaves the machine.

Invariants:
- The /30 is chosen so that it overlaps no address or route this machine has (``N`` from a
  seed, then the next free one), so a test run never shadows a real network.
- ``remove`` deletes the namespace and the pair (deleting one end deletes both) and never
  raises, so it can run in any ``finally``; ``create`` that fails half-way removes what it made.
- Needs ``ip`` (iproute2) and CAP_NET_ADMIN; ``NetnsUnavailable`` says which is missing.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

BASE = ipaddress.IPv4Network("10.213.0.0/16")


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (no iproute2, or not allowed to)."""


@dataclass(frozen=True, slots=True)
class VethNamespace:
    namespace: str
    host_interface: str
    peer_interface: str
    network: ipaddress.IPv4Network

    @property
    def host_address(self) -> str:
        return str(self.network.network_address + 1)

    @property
    def peer_address(self) -> str:
        return str(self.network.network_address + 2)


def choose_network(seed: int, taken: Iterable[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """The first /30 of 10.213.0.0/16 from ``seed`` on that overlaps none of ``taken``."""
    busy = list(taken)
    count = 2 ** (30 - BASE.prefixlen)
    for offset in range(count):
        index = (seed + offset) % count
        candidate = ipaddress.IPv4Network((int(BASE.network_address) + 4 * index, 30))
        if not any(candidate.overlaps(network) for network in busy):
            return candidate
    raise NetnsUnavailable("every /30 of 10.213.0.0/16 is in use on this machine")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("ip")
    if tool is None:
        raise NetnsUnavailable("the ip tool (iproute2) is not installed")
    result = subprocess.run([tool, *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        message = result.stderr.strip() or result.stdout.strip()
        if "Operation not permitted" in message or "Permission denied" in message:
            raise NetnsUnavailable(f"ip {' '.join(args)}: {message} (needs CAP_NET_ADMIN)")
        raise RuntimeError(f"ip {' '.join(args)} failed: {message}")
    return result


def networks_in_use() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this machine has an address in or a route to."""
    found: list[ipaddress.IPv4Network] = []
    addresses = json.loads(_ip("-j", "-4", "addr", "show").stdout or "[]")
    for link in addresses:
        for info in link.get("addr_info", ()):
            found.append(
                ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False)
            )
    for route in json.loads(_ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        destination = route.get("dst", "")
        if destination and destination != "default":
            with_prefix = destination if "/" in destination else f"{destination}/32"
            try:
                found.append(ipaddress.IPv4Network(with_prefix, strict=False))
            except ValueError:
                continue
    return found


def create(name: str, *, seed: int) -> VethNamespace:
    """Namespace ``vk-<name>`` and the pair ``vkh<name>``/``vkn<name>`` (``name``: up to 11
    lowercase letters and digits), addressed from a free /30."""
    if not (name.isalnum() and name.islower() and len(name) <= 11):
        raise ValueError(f"{name!r}: use up to 11 lowercase letters and digits")
    link = VethNamespace(
        namespace=f"vk-{name}",
        host_interface=f"vkh{name}",
        peer_interface=f"vkn{name}",
        network=choose_network(seed, networks_in_use()),
    )
    try:
        _ip("netns", "add", link.namespace)
        _ip("link", "add", link.host_interface, "type", "veth", "peer", "name", link.peer_interface)
        _ip("link", "set", link.peer_interface, "netns", link.namespace)
        _ip("addr", "add", f"{link.host_address}/30", "dev", link.host_interface)
        _ip("link", "set", link.host_interface, "up")
        inside = ("-n", link.namespace)
        _ip(*inside, "addr", "add", f"{link.peer_address}/30", "dev", link.peer_interface)
        _ip(*inside, "link", "set", link.peer_interface, "up")
        _ip(*inside, "link", "set", "lo", "up")
    except BaseException:
        remove(link)
        raise
    return link


def remove(link: VethNamespace) -> None:
    _ip("link", "del", link.host_interface, check=False)
    _ip("netns", "del", link.namespace, check=False)


def exists(link: VethNamespace) -> bool:
    listed = _ip("-j", "link", "show", link.host_interface, check=False)
    return listed.returncode == 0 and bool(json.loads(listed.stdout or "[]"))
