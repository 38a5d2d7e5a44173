"""EndpointSlices for the Services that select pods on the virtual node: pure functions.

A pod on the virtual node is reached where its provider exposes it (``PortEndpoint``: the
address and port a client in the cluster connects to for one declared container port), not
at a pod IP and the container's own port. ``slices_for`` turns a Service and the pods of our
node it selects into the EndpointSlices that say so, as kube-controller-manager's
EndpointSlice controller would for ordinary pods:

- a Service port's ``targetPort`` (a number, or the name of a declared container port; the
  Service ``port`` when unset) is resolved per pod to that pod's exposed endpoint for that
  container port and protocol; a port a pod does not expose is left out for that pod;
- pods whose resolved ports are the same share a slice (one slice per distinct mapping, as
  ports differ between providers and replicas), at most ``MAX_ENDPOINTS`` endpoints each;
  IPv4, IPv6 and hostname (FQDN) endpoints go to slices of their own address type, and ports
  a pod exposes at different addresses are an endpoint per address;
- each endpoint's conditions follow the pod: ``serving`` its readiness, ``terminating`` its
  deletion, ``ready`` = serving and not terminating; ``targetRef`` is the pod, ``nodeName``
  the virtual node;
- slices are labelled ``kubernetes.io/service-name``, ``endpointslice.kubernetes.io/managed-by:
  vk-provider.io`` and ``vk-provider.io/node`` (so agents of several virtual nodes never
  touch each other's), owned by the Service, and named deterministically from the Service,
  the node and the mapping, so writing them again is idempotent.

``changes`` compares the slices wanted with those that exist (ours only) and says which to
create, replace and delete.

``reachable_pod_ip`` decides the pod's ``podIP``: kube-controller-manager builds the
Service's own slices from it and the container's port, so a pod on the virtual node carries
one only where that is true: an IP at which its provider exposes every declared port on its
own number (a VM or a flat network, 1:1). Anywhere else (mapped ports, a proxy host, a tunnel,
no port exposed) it has none, and the cluster's controller leaves it out of its slices.

Invariants: pure; never a slice for a Service without a selector or of type ExternalName;
never an endpoint of a pod in another namespace, on another node, or that the selector does
not match; never an address the provider did not report as reachable.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from vk_provider.domain.handoverworld import pod_ready
from vk_provider.domain.models import PortEndpoint

JSON = dict[str, Any]

MANAGED_BY: Final = "vk-provider.io"
MANAGED_BY_LABEL: Final = "endpointslice.kubernetes.io/managed-by"
SERVICE_LABEL: Final = "kubernetes.io/service-name"
NODE_LABEL: Final = "vk-provider.io/node"
MAX_ENDPOINTS: Final = 100  # kube-controller-manager's default --max-endpoints-per-slice


@dataclass(frozen=True, slots=True)
class DeclaredPort:
    """A ``containerPort`` a container of the pod declares (its name, number, protocol)."""

    name: str | None
    container_port: int
    protocol: str = "TCP"


@dataclass(frozen=True, slots=True)
class ExposedPod:
    """What the slices need of one pod of our node: identity, readiness, ports, exposure."""

    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str]
    ready: bool
    terminating: bool
    declared: tuple[DeclaredPort, ...]
    exposed: tuple[PortEndpoint, ...]


def _target_of(port: Mapping[str, Any]) -> int | str:
    """A Service port's ``targetPort``: a number, or a container port's name (its ``port``
    when unset)."""
    target = port.get("targetPort")
    if target is None or target == "":
        target = port.get("port")
    if isinstance(target, str) and not target.isdigit():
        return target
    return int(target)  # type: ignore[arg-type]


def _container_port(pod: ExposedPod, port: Mapping[str, Any]) -> int | None:
    """The container port a Service port targets on ``pod``; None for a name it does not
    declare."""
    target = _target_of(port)
    if isinstance(target, int):
        return target
    protocol = str(port.get("protocol") or "TCP")
    named = [d for d in pod.declared if d.name == target and d.protocol == protocol]
    return named[0].container_port if named else None


def _target(pod: ExposedPod, port: Mapping[str, Any]) -> PortEndpoint | None:
    """The pod's exposed endpoint for one Service port, or None when it has none."""
    protocol = str(port.get("protocol") or "TCP")
    number = _container_port(pod, port)
    for endpoint in pod.exposed:
        if endpoint.container_port == number and endpoint.protocol == protocol:
            return endpoint
    return None


def unreached(service: Mapping[str, Any], pod: ExposedPod) -> list[tuple[str, str]]:
    """(port key, why) for each port of ``service`` that reaches nothing of ``pod``, which it
    selects: a ``targetPort`` name the pod does not declare, or a port its provider does not
    expose. The key names the Service port (its name, else its number)."""
    found = []
    for port in (service.get("spec") or {}).get("ports") or []:
        if _target(pod, port) is not None:
            continue
        protocol = str(port.get("protocol") or "TCP")
        number = _container_port(pod, port)
        if number is None:
            why = f"the pod declares no {protocol} port named {_target_of(port)!r}"
        else:
            why = f"its provider does not expose container port {number}/{protocol}"
        found.append((str(port.get("name") or port.get("port")), why))
    return found


def selects(service: Mapping[str, Any], pod: ExposedPod) -> bool:
    spec = service.get("spec") or {}
    selector = spec.get("selector") or {}
    metadata = service.get("metadata") or {}
    return (
        bool(selector)
        and spec.get("type") != "ExternalName"
        and pod.namespace == metadata.get("namespace")
        and all(pod.labels.get(k) == v for k, v in selector.items())
    )


def _name(service: str, node: str, key: object, chunk: int) -> str:
    digest = hashlib.sha256(json.dumps([node, key, chunk]).encode()).hexdigest()[:10]
    return f"{service[:52]}-vk-{digest}"


def _endpoint(pod: ExposedPod, address: str, node: str) -> JSON:
    return {
        "addresses": [address],
        "conditions": {
            "ready": pod.ready and not pod.terminating,
            "serving": pod.ready,
            "terminating": pod.terminating,
        },
        "targetRef": {"kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.uid},
        "nodeName": node,
    }


def slices_for(service: Mapping[str, Any], pods: Iterable[ExposedPod], *, node: str) -> list[JSON]:
    """The EndpointSlices ``service`` should have for the pods of ``node`` (module docstring)."""
    metadata = service.get("metadata") or {}
    ports: Sequence[Mapping[str, Any]] = (service.get("spec") or {}).get("ports") or []
    groups: dict[tuple[str, tuple[tuple[str, int, str], ...]], list[JSON]] = {}
    for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
        if not selects(service, pod):
            continue
        resolved = [(p, _target(pod, p)) for p in ports]
        by_address: dict[str, list[tuple[Mapping[str, Any], PortEndpoint]]] = {}
        for port, endpoint in resolved:
            if endpoint is not None:
                by_address.setdefault(endpoint.address, []).append((port, endpoint))
        # Ports a provider exposes at different addresses (RunPod: TCP on the public IP,
        # HTTP through its proxy host) are one endpoint per address, in slices of their own.
        for address, found in sorted(by_address.items()):
            key = (
                found[0][1].address_type,
                tuple(sorted((str(p.get("name") or ""), e.port, e.protocol) for p, e in found)),
            )
            groups.setdefault(key, []).append(_endpoint(pod, address, node))
    slices = []
    for (address_type, mapping), endpoints in sorted(groups.items()):
        for chunk, start in enumerate(range(0, len(endpoints), MAX_ENDPOINTS)):
            slices.append(
                {
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSlice",
                    "metadata": {
                        "name": _name(
                            str(metadata.get("name")), node, [address_type, mapping], chunk
                        ),
                        "namespace": metadata.get("namespace"),
                        "labels": {
                            SERVICE_LABEL: metadata.get("name"),
                            MANAGED_BY_LABEL: MANAGED_BY,
                            NODE_LABEL: node,
                        },
                        "ownerReferences": [
                            {
                                "apiVersion": "v1",
                                "kind": "Service",
                                "name": metadata.get("name"),
                                "uid": metadata.get("uid"),
                                "controller": True,
                                "blockOwnerDeletion": True,
                            }
                        ],
                    },
                    "addressType": address_type,
                    "ports": [
                        {"name": name, "port": port, "protocol": protocol}
                        for name, port, protocol in mapping
                    ],
                    "endpoints": endpoints[start : start + MAX_ENDPOINTS],
                }
            )
    return slices


@dataclass(frozen=True, slots=True)
class Changes:
    create: tuple[JSON, ...] = ()
    replace: tuple[JSON, ...] = ()
    delete: tuple[str, ...] = ()  # names


def _content(slice_: Mapping[str, Any]) -> object:
    return (
        slice_.get("addressType"),
        slice_.get("ports"),
        slice_.get("endpoints"),
        (slice_.get("metadata") or {}).get("labels"),
    )


def changes(wanted: Iterable[JSON], existing: Iterable[Mapping[str, Any]]) -> Changes:
    """What to write so that ``existing`` (our slices of one Service) becomes ``wanted``."""
    have = {str((s.get("metadata") or {}).get("name")): s for s in existing}
    want = {str(s["metadata"]["name"]): s for s in wanted}
    return Changes(
        create=tuple(s for n, s in want.items() if n not in have),
        replace=tuple(s for n, s in want.items() if n in have and _content(have[n]) != _content(s)),
        delete=tuple(sorted(n for n in have if n not in want)),
    )


def _declared(pod: Mapping[str, Any]) -> tuple[DeclaredPort, ...]:
    spec = pod.get("spec") or {}
    sidecars = [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    return tuple(
        DeclaredPort(
            name=port.get("name") or None,
            container_port=int(port["containerPort"]),
            protocol=str(port.get("protocol") or "TCP"),
        )
        for container in (*sidecars, *(spec.get("containers") or []))
        for port in container.get("ports") or []
        if isinstance(port.get("containerPort"), int)
    )


def reachable_pod_ip(
    declared: Iterable[tuple[int, str]], endpoints: Sequence[PortEndpoint]
) -> str | None:
    """The ``podIP`` of a pod of our node declaring the ``declared`` (containerPort,
    protocol) pairs, given its instance's ``endpoints``: the one IP address at which every
    declared port is exposed on its own number, else none (no port declared or exposed, a
    port left out, mapped elsewhere or at a hostname)."""
    wanted = {(number, protocol.upper()) for number, protocol in declared}
    if not wanted:
        return None
    reached = {
        (e.container_port, e.protocol.upper()): e
        for e in endpoints
        if e.port == e.container_port and e.address_type != "FQDN"
    }
    if not wanted <= reached.keys():
        return None
    addresses = {reached[key].address for key in wanted}
    return addresses.pop() if len(addresses) == 1 else None


def exposed_pod(pod: Mapping[str, Any], endpoints: Sequence[PortEndpoint]) -> ExposedPod:
    """What the slices need of a pod object of our node and its instance's ``endpoints``:
    ready when its Ready condition is True, terminating once its deletion began."""
    metadata = pod.get("metadata") or {}
    return ExposedPod(
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        uid=str(metadata.get("uid") or ""),
        labels=dict(metadata.get("labels") or {}),
        ready=pod_ready(pod),
        terminating=bool(metadata.get("deletionTimestamp")),
        declared=_declared(pod),
        exposed=tuple(endpoints),
    )
