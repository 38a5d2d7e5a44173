"""``kubectl port-forward`` for the local provider: a TCP connection to 127.0.0.1.

Local containers share this machine's network, so a pod's port is a port on 127.0.0.1. For
the same reason not every port there is the pod's: the API server, etcd and whatever else
listens on this machine's loopback are too. Only ports a container of the pod declares
(``containerPort``, recorded in its ``spec.json``) are forwarded; any other is refused with a
message naming the declared ones.

Invariants: connections go to 127.0.0.1 only; the stream's ``close`` closes the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from vk_provider.sdk import InvalidSpec, Transient
from vk_provider_adapters.local.layout import container_names, container_spec


def declared_ports(instance_dir: Path) -> set[int]:
    ports: set[int] = set()
    for name in container_names(instance_dir):
        listed = (container_spec(instance_dir, name) or {}).get("ports")
        for number in listed if isinstance(listed, list) else ():
            if isinstance(number, int) and not isinstance(number, bool):
                ports.add(number)
    return ports


class TcpPortStream:
    """``PortStream`` over an asyncio TCP connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, size: int) -> bytes:
        try:
            return await self._reader.read(size)
        except ConnectionError:
            return b""

    async def write(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()


async def open_local_port(
    instance_dir: Path, port: int, *, provider: str, host: str = "127.0.0.1"
) -> TcpPortStream:
    declared = declared_ports(instance_dir)
    if port not in declared:
        listed = ", ".join(str(p) for p in sorted(declared)) or "none"
        raise InvalidSpec(
            f"port {port} is not a port of this pod (declared containerPorts: {listed}); local "
            "containers share the machine's network, so only declared ports are forwarded",
            provider=provider,
        )
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as exc:
        raise Transient(
            f"failed to connect to {host}:{port}: {exc.strerror or exc}", provider=provider
        ) from exc
    return TcpPortStream(reader, writer)
