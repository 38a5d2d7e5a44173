"""Where the local provider's processes listen: this machine's network, or a namespace.

By default a local container is a process in this machine's own network (a pod sharing the
host's network), reached by the agent's probes and port-forwards on loopback. With
``network_namespace`` every process of the provider (the spawner, each runner and its
containers, each ``kubectl exec``) runs in that existing network namespace (``ip netns``),
entered with ``nsenter``: two providers' pods may then listen on the same port, as pods on two
nodes do, and the agent reaches them at ``address``, the namespace's address.

Invariants: nothing here creates or deletes a namespace (the operator, or a test, owns it);
with no namespace configured every command runs unchanged.
"""

from __future__ import annotations

from pathlib import Path

NETNS_DIR = Path("/run/netns")  # where ``ip netns add`` binds each namespace
LOOPBACK = "127.0.0.1"


def namespace_path(name: str) -> Path:
    return NETNS_DIR / name


def entered(argv: list[str], namespace: str | None) -> list[str]:
    """``argv`` run in ``namespace`` (unchanged without one)."""
    if namespace is None:
        return argv
    return ["nsenter", f"--net={namespace_path(namespace)}", "--", *argv]


def reached_at(namespace: str | None, address: str | None) -> str:
    """Where the agent connects to the provider's processes (probes, port-forward)."""
    if namespace is not None and address is not None:
        return address
    return LOOPBACK
