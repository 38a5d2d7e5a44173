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

Namespaces can also be wired to each other without the root namespace (``connect``): a veth
pair with one end in each, from a /30 that overlaps nothing of the root namespace or of either
side, and a /32 route each way to the other namespace's own (``peer_address``) address. So one
namespace reaches another's address directly and the root namespace never forwards anything
(its ``ip_forward`` and rules are never touched; nothing here changes a sysctl anywhere). The
root namespace does not see such a pair, so a later ``create`` may take its /30 there; that
is harmless, as neither namespace has a route to the root namespace's copy.
``sink_route`` routes a network into a sink inside a namespace: packets to it that
nothing there rewrites (kube-proxy's DNAT of ClusterIPs) are dropped, never sent out.
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


def networks_in_use(namespace: str | None = None) -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this machine (or ``namespace``) has an address in or a route to."""
    found: list[ipaddress.IPv4Network] = []
    where = ("-n", namespace) if namespace else ()
    addresses = json.loads(_ip(*where, "-j", "-4", "addr", "show").stdout or "[]")
    for link in addresses:
        for info in link.get("addr_info", ()):
            found.append(
                ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False)
            )
    routes = _ip(*where, "-j", "-4", "route", "show", "table", "all").stdout
    for route in json.loads(routes or "[]"):
        destination = route.get("dst", "")
        if destination and destination != "default":
            with_prefix = destination if "/" in destination else f"{destination}/32"
            try:
                found.append(ipaddress.IPv4Network(with_prefix, strict=False))
            except ValueError:
                continue
    return found


def _check_name(name: str) -> None:
    if not (name.isalnum() and name.islower() and len(name) <= 11):
        raise ValueError(f"{name!r}: use up to 11 lowercase letters and digits")


def create(name: str, *, seed: int) -> VethNamespace:
    """Namespace ``vk-<name>`` and the pair ``vkh<name>``/``vkn<name>`` (``name``: up to 11
    lowercase letters and digits), addressed from a free /30."""
    _check_name(name)
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


# --------------------------------------------------------------------------- between namespaces


@dataclass(frozen=True, slots=True)
class NamespaceLink:
    """A veth pair between two namespaces: ``left_interface`` (``network``'s first address)
    in ``left.namespace``, ``right_interface`` (its second) in ``right.namespace``."""

    left: VethNamespace
    right: VethNamespace
    left_interface: str
    right_interface: str
    network: ipaddress.IPv4Network

    @property
    def left_address(self) -> str:
        return str(self.network.network_address + 1)

    @property
    def right_address(self) -> str:
        return str(self.network.network_address + 2)


def connect(left: VethNamespace, right: VethNamespace, *, name: str, seed: int) -> NamespaceLink:
    """The pair ``vkl<name>`` (in ``left``) / ``vkr<name>`` (in ``right``), made inside the two
    namespaces (it never appears in the root namespace), addressed from a /30 free in the root
    namespace and in both; then a /32 route in each to the other's ``peer_address`` over it."""
    _check_name(name)
    taken = networks_in_use() + networks_in_use(left.namespace) + networks_in_use(right.namespace)
    link = NamespaceLink(
        left=left,
        right=right,
        left_interface=f"vkl{name}",
        right_interface=f"vkr{name}",
        network=choose_network(seed, taken),
    )
    try:
        _ip(
            "link", "add", link.left_interface, "netns", left.namespace, "type", "veth",
            "peer", "name", link.right_interface, "netns", right.namespace,
        )  # fmt: skip
        ends = (
            (left.namespace, link.left_interface, link.left_address),
            (right.namespace, link.right_interface, link.right_address),
        )
        for namespace, interface, address in ends:
            _ip("-n", namespace, "addr", "add", f"{address}/30", "dev", interface)
            _ip("-n", namespace, "link", "set", interface, "up")
        _ip("-n", left.namespace, "route", "add", f"{right.peer_address}/32",
            "via", link.right_address, "dev", link.left_interface)  # fmt: skip
        _ip("-n", right.namespace, "route", "add", f"{left.peer_address}/32",
            "via", link.left_address, "dev", link.right_interface)  # fmt: skip
    except BaseException:
        disconnect(link)
        raise
    return link


def disconnect(link: NamespaceLink) -> None:
    """Delete the pair (and with it its routes); never raises (a namespace already gone is
    fine: its interfaces went with it)."""
    _ip("-n", link.left.namespace, "link", "del", link.left_interface, check=False)
    _ip("-n", link.right.namespace, "link", "del", link.right_interface, check=False)


def sink_interface(name: str) -> str:
    return f"vks{name}"


def sink_route(link: VethNamespace, network: str, *, name: str) -> str:
    """Route ``network`` inside ``link.namespace`` into a sink, with ``link.peer_address`` as
    the source; the sink's interface. A packet to ``network`` goes nowhere unless something in
    the namespace rewrites its destination first (kube-proxy's DNAT): the sink is a veth pair
    with both ends in the namespace, ``vks<name>`` (routed to) and ``vkt<name>`` (no address, so
    nothing answers ARP for ``network`` and nothing is ever sent; a dummy device would do, but
    not every kernel has one). ``remove_sink`` undoes it."""
    _check_name(name)
    device = sink_interface(name)
    inside = ("-n", link.namespace)
    try:
        _ip(*inside, "link", "add", device, "type", "veth", "peer", "name", f"vkt{name}")
        _ip(*inside, "link", "set", device, "up")
        _ip(*inside, "link", "set", f"vkt{name}", "up")
        _ip(*inside, "route", "add", network, "dev", device, "src", link.peer_address)
    except BaseException:
        remove_sink(link, name=name)
        raise
    return device


def remove_sink(link: VethNamespace, *, name: str) -> None:
    """Delete the pair of ``sink_route`` (and its route); never raises."""
    _ip("-n", link.namespace, "link", "del", sink_interface(name), check=False)
