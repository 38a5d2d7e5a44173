"""Which declared ports a Modal sandbox opens, and where the cluster reaches them.

Modal exposes a sandbox's ports only through its public tunnels, asked for at create
(``Sandbox.create(encrypted_ports=, unencrypted_ports=)``) and known after the start
(``Sandbox.tunnels()``: container port -> ``Tunnel(host, port, unencrypted_host,
unencrypted_port)``). The adapter's ``expose`` setting picks the kind for every TCP port:

    | expose | Sandbox.create      | endpoint reported                 | the client speaks       |
    |--------|---------------------|-----------------------------------|-------------------------|
    | tcp    | unencrypted_ports   | unencrypted_host:unencrypted_port | the container's protocol|
    | tls    | encrypted_ports     | host:port (443)                   | TLS, SNI = host         |

Modal tunnels TCP only: UDP and SCTP ports are not opened (the adapter warns at create).
``h2_ports`` (TLS with HTTP/2 advertised) are not used: a pod's port declaration cannot say
that its server speaks HTTP/2. Neither the SDK (1.6.4) nor Modal's guides state a maximum
number of ports per sandbox, so none is imposed here; what Modal refuses at create comes back
as ``InvalidSpec`` (``sdk.translate_error``).

The sandbox's ``PORTS_TAG`` (``ports_tag``: "<expose>.<count>") records how many ports it
opened and how, so that any later status read, also after an agent restart or a change of
``expose``, knows whether to ask for tunnels, which address of a tunnel to report, and when
the answer is complete.

Invariants: pure; an endpoint is only ever made from a tunnel's own answer (a host that is
not empty and a port in 1..65535), never invented; an endpoint's address is the host as Modal
gives it (a hostname, so an FQDN EndpointSlice, or an IP).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from vk_provider.sdk import PortEndpoint, WorkloadSpec
from vk_provider_adapters.modal.sandbox import SandboxTunnel

Expose = Literal["tcp", "tls"]

_TAG_VALUE: Final = re.compile(r"(tcp|tls)\.([1-9][0-9]{0,4})")


@dataclass(frozen=True, slots=True)
class OpenedPorts:
    """What a sandbox's ``PORTS_TAG`` says: how its ports were opened, and how many."""

    expose: Expose
    count: int


def tcp_ports(spec: WorkloadSpec) -> tuple[int, ...]:
    """The container's TCP ports, each once, in declaration order."""
    ports: list[int] = []
    for port in spec.main.ports:
        if port.protocol.upper() == "TCP" and port.container_port not in ports:
            ports.append(port.container_port)
    return tuple(ports)


def unexposable(spec: WorkloadSpec) -> list[str]:
    """The declared ports Modal cannot tunnel, as "<port>/<protocol>"."""
    return [
        f"{port.container_port}/{port.protocol.upper()}"
        for port in spec.main.ports
        if port.protocol.upper() != "TCP"
    ]


def ports_tag(expose: Expose, count: int) -> str:
    """The ``PORTS_TAG`` value of a sandbox that opened ``count`` (> 0) ports this way."""
    return f"{expose}.{count}"


def opened_ports(value: str | None) -> OpenedPorts | None:
    """``ports_tag``'s value read back; None for a sandbox without ports (or a value this
    version did not write)."""
    match = _TAG_VALUE.fullmatch(value or "")
    if match is None:
        return None
    expose: Expose = "tcp" if match.group(1) == "tcp" else "tls"
    return OpenedPorts(expose, int(match.group(2)))


def reached_at(tunnels: Mapping[int, SandboxTunnel], expose: Expose) -> tuple[PortEndpoint, ...]:
    """Where the cluster reaches each tunnelled port, by container port: the raw TCP endpoint
    of an unencrypted tunnel (``tcp``), the TLS one of an encrypted tunnel (``tls``). A tunnel
    without that endpoint (yet) is left out."""
    found: list[PortEndpoint] = []
    for container_port, tunnel in sorted(tunnels.items()):
        if not _valid_port(container_port):
            continue
        if expose == "tcp":
            host, port = tunnel.unencrypted_host, tunnel.unencrypted_port
        else:
            host, port = tunnel.host, tunnel.port
        if host and _valid_port(port):
            found.append(PortEndpoint(container_port, "TCP", host, port))
    return tuple(found)


def _valid_port(port: int) -> bool:
    return 1 <= port <= 65535
