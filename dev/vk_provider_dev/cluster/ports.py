"""Ports for processes that bind later: chosen outside the kernel's ephemeral range.

A port found free by binding to port 0 comes from the ephemeral range, the same range the kernel
hands out to every outgoing connection; between choosing it and the process binding it, any
client socket on the machine (an API-server watch, a Prometheus scrape) may take it, and the
process then fails with "address already in use". Ports chosen here lie below that range, where
the kernel never assigns a port on its own, so only another listener choosing the same number can
collide; the choice is random and checked by binding, which makes that unlikely.

Invariants:
- Every port returned was bindable on the address at the moment of the choice, and lies in
  ``[LOWEST, ephemeral range start)``.
- Ports returned by one call are distinct.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 20000
RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_START = 32768


def ephemeral_start(text: str | None = None) -> int:
    """The first port of the kernel's ephemeral range (``ip_local_port_range``)."""
    if text is None:
        try:
            text = RANGE_FILE.read_text()
        except OSError:
            return DEFAULT_EPHEMERAL_START
    fields = text.split()
    try:
        return int(fields[0])
    except (IndexError, ValueError):
        return DEFAULT_EPHEMERAL_START


def port_is_free(port: int, address: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True


def free_ports(count: int, address: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free on ``address``, none in the ephemeral range."""
    high = ephemeral_start()
    if high - LOWEST < count * 4:
        raise RuntimeError(
            f"the ephemeral port range starts at {high}: too few ports below it to choose from"
        )
    chosen: list[int] = []
    candidates = random.sample(range(LOWEST, high), k=min(high - LOWEST, count * 200))
    for port in candidates:
        if port_is_free(port, address):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise RuntimeError(f"no {count} free ports on {address} between {LOWEST} and {high}")


def free_port(address: str = "127.0.0.1") -> int:
    return free_ports(1, address)[0]
