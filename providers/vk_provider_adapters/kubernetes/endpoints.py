"""Where cluster A reaches a remote pod's declared ports (``Instance.endpoints``), read from B.

Every endpoint comes from B's own answers (the pod, its Service, the nodes), never from what
the adapter asked for, and only while the remote pod runs (phase Running: a pod being deleted
still serves until its containers stop, as its EndpointSlices in B say). One ``PortEndpoint``
per declared (containerPort, protocol) of the app containers and native sidecars, by
``expose`` (``config``):

- ``flat``: at the pod's ``status.podIP`` and the containerPort;
- ``node-port``: at one Ready node's address (``node_address``) and the nodePort B assigned;
- ``load-balancer``: at the first entry of ``status.loadBalancer.ingress`` with a reachable
  ``ip``, else ``hostname``, and the Service port (the containerPort).

A ``PortEndpoint`` carries one address, and the agent's EndpointSlices take the first endpoint
of a container port (``vk_provider.domain.endpointslices``), so a NodePort Service is reported
at ONE node: the first address type of ``node_address_types`` that any schedulable Ready node
of ``node_selector`` has, on the first such node by name. Deterministic, so every read reports
the same node while it stays Ready; when it stops being Ready (or is cordoned, often the
first step of its removal) the next read moves to the next one. A load balancer's port whose
``ingress[].ports[].error`` is set is not listed; nothing is listed before B (its cloud
controller) has assigned an ingress.

An address EndpointSlices refuse or A cannot reach (loopback, link-local, unspecified,
multicast), or a hostname that is not a DNS name, is never reported.

Invariants: pure; never raises: an absent or odd field is "not there yet" (nothing is listed
for it), as one odd object must not fail the reading of every other pod's endpoints.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence

from vk_provider.sdk import PortEndpoint
from vk_provider_adapters.payload import text

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def reachable(address: str) -> bool:
    """An IP an EndpointSlice may carry and another network may route to, or a DNS name."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return len(address) <= 253 and _DNS_SUBDOMAIN.fullmatch(address) is not None
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast)


def _obj(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Mapping[str, object]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _port_number(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535:
        return value
    return None


def serving(pod: Mapping[str, object]) -> bool:
    """Whether the remote pod runs (its phase is Running)."""
    return text(_obj(pod.get("status")), "phase") == "Running"


def pod_ports(pod: Mapping[str, object]) -> list[tuple[int, str]]:
    """(containerPort, protocol) of each port the pod's app containers and native sidecars
    declare, each once, in spec order."""
    spec = _obj(pod.get("spec"))
    sidecars = [c for c in _list(spec.get("initContainers")) if c.get("restartPolicy") == "Always"]
    found: list[tuple[int, str]] = []
    for container in (*sidecars, *_list(spec.get("containers"))):
        for port in _list(container.get("ports")):
            number = _port_number(port.get("containerPort"))
            if number is None:
                continue
            key = (number, text(port, "protocol") or "TCP")
            if key not in found:
                found.append(key)
    return found


def flat(pod: Mapping[str, object]) -> tuple[PortEndpoint, ...]:
    """``expose: flat``: each declared port at the running pod's IP and its own number."""
    ip = text(_obj(pod.get("status")), "podIP")
    if not serving(pod) or not ip or not reachable(ip):
        return ()
    return tuple(PortEndpoint(port, protocol, ip, port) for port, protocol in pod_ports(pod))


def owned_by(service: Mapping[str, object], pod: Mapping[str, object]) -> bool:
    """Whether ``service`` belongs to this very pod (its uid among the owners), not to an
    earlier pod of the same name whose Service B's garbage collector has not removed yet."""
    uid = text(_obj(pod.get("metadata")), "uid")
    owners = _list(_obj(service.get("metadata")).get("ownerReferences"))
    return bool(uid) and any(o.get("kind") == "Pod" and o.get("uid") == uid for o in owners)


def needs_node(service: Mapping[str, object]) -> bool:
    return text(_obj(service.get("spec")), "type") == "NodePort"


def _ready(node: Mapping[str, object]) -> bool:
    status = _obj(node.get("status"))
    if _obj(node.get("spec")).get("unschedulable") is True:
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in _list(status.get("conditions"))
    )


def node_address(nodes: Sequence[Mapping[str, object]], types: Sequence[str]) -> str | None:
    """The address a NodePort is reported at (module docstring); None when no schedulable
    Ready node has a reachable address of any of ``types``."""
    ready = sorted(
        (n for n in nodes if _ready(n)),
        key=lambda n: text(_obj(n.get("metadata")), "name"),
    )
    for wanted in types:
        for node in ready:
            for entry in _list(_obj(node.get("status")).get("addresses")):
                address = text(entry, "address")
                if entry.get("type") == wanted and address and reachable(address):
                    return address
    return None


def _container_port(port: Mapping[str, object]) -> int | None:
    """The container port a Service port targets: ``targetPort`` (ours are numbers), else
    ``port``; None for a named targetPort (not ours: someone changed the Service)."""
    target = port.get("targetPort")
    if target is None:
        return _port_number(port.get("port"))
    return _port_number(target)


def _ingress(service: Mapping[str, object]) -> tuple[str, Mapping[str, object]] | None:
    """The first ingress point of a load balancer with a reachable ip (else hostname)."""
    balancer = _obj(_obj(service.get("status")).get("loadBalancer"))
    for entry in _list(balancer.get("ingress")):
        address = text(entry, "ip") or text(entry, "hostname")
        if address and reachable(address):
            return address, entry
    return None


def service_endpoints(
    service: Mapping[str, object], *, node: str | None
) -> tuple[PortEndpoint, ...]:
    """``expose: node-port`` (at ``node``) or ``load-balancer``: each port of the pod's
    Service where B has made it reachable (module docstring)."""
    spec = _obj(service.get("spec"))
    kind = text(spec, "type")
    ports = _list(spec.get("ports"))
    found: list[PortEndpoint] = []
    if kind == "NodePort" and node is not None:
        for port in ports:
            target, node_port = _container_port(port), _port_number(port.get("nodePort"))
            if target is not None and node_port is not None:
                found.append(PortEndpoint(target, text(port, "protocol") or "TCP", node, node_port))
    elif kind == "LoadBalancer" and (ingress := _ingress(service)) is not None:
        address, entry = ingress
        failed = {
            (_port_number(p.get("port")), text(p, "protocol") or "TCP")
            for p in _list(entry.get("ports"))
            if text(p, "error")
        }
        for port in ports:
            target, number = _container_port(port), _port_number(port.get("port"))
            protocol = text(port, "protocol") or "TCP"
            if target is not None and number is not None and (number, protocol) not in failed:
                found.append(PortEndpoint(target, protocol, address, number))
    return tuple(found)
