"""Where a plugin listens: ``unix:///path/to.sock`` or ``host:port``, parsed once for both sides.

Invariants: a Unix socket path is absolute; a TCP address has a host and a port (0 only for a
server, which then picks a free one); the error says what is wrong with the value. The gRPC
target string of a parsed address is what grpc itself accepts.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class PluginAddress:
    unix_path: Path | None = None
    host: str = ""
    port: int = 0

    @property
    def target(self) -> str:
        """The address as gRPC spells it (a channel target or a server port)."""
        if self.unix_path is not None:
            return f"unix://{self.unix_path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def loopback(self) -> bool:
        """A Unix socket, or TCP to a loopback host: traffic that never leaves the machine."""
        if self.unix_path is not None:
            return True
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def __str__(self) -> str:
        return self.target


def parse_address(value: str, *, server: bool = False) -> PluginAddress:
    """``unix:///abs/path`` (or ``unix:/abs/path``) or ``host:port`` / ``[v6]:port``."""
    if value.startswith("unix:"):
        raw = value.removeprefix("unix:")
        raw = raw.removeprefix("//") if raw.startswith("///") else raw
        path = Path(raw)
        if not raw.startswith("/") or raw.startswith("//"):
            raise ValueError(f"{value!r}: a Unix socket address is unix:///absolute/path.sock")
        return PluginAddress(unix_path=path)
    if "://" in value:
        raise ValueError(f"{value!r}: give unix:///path.sock or host:port (no other scheme)")
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{value!r}: give unix:///path.sock or host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{value!r}: write an IPv6 host in brackets, [::1]:port")
    if not port_text.isdigit() or not (0 if server else 1) <= int(port_text) <= 65535:
        lowest = 0 if server else 1
        raise ValueError(f"{value!r}: the port must be a number {lowest}-65535")
    return PluginAddress(host=host, port=int(port_text))
