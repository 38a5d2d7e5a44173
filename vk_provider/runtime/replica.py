"""This replica: the lock on its state directory and its name in leader election.

A replica's identity in the election Lease must survive a restart of its process, so that a
restarted leader renews its own Lease at once instead of waiting a whole lease duration for
its dead self to expire (the node would go NotReady meanwhile and every pod on it with it):
the configured ``leader_election.identity``, else the pod's name (``POD_NAME``, kept across
container restarts), else ``<hostname>_<id>`` with an id made once and kept in the state
directory.

Invariants: one live agent per state directory (an exclusive ``flock`` held for the
process's life, released by the kernel when it dies, however it dies), so two live processes
never share an identity, nor the instances and certificates kept there.
"""

from __future__ import annotations

import fcntl
import os
import socket
import uuid
from pathlib import Path

from vk_provider.settings.leader import LeaderElectionConfig
from vk_provider.settings.secrets import ConfigError

LOCK_FILE = "agent.lock"
ID_FILE = "replica-id"


def lock_state_dir(state_dir: Path) -> int:
    """Hold the state directory for this process; the descriptor stays open until exit."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise ConfigError(
            f"--state-dir {state_dir}: in use by a running agent (pid {holder}); give each "
            "agent a state directory of its own"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def replica_identity(election: LeaderElectionConfig, state_dir: Path) -> str:
    """The identity of this replica (see the module docstring)."""
    if election.identity:
        return election.identity
    pod = os.environ.get("POD_NAME", "").strip()
    if pod:
        return pod
    path = state_dir / ID_FILE
    try:
        kept = path.read_text().strip()
    except FileNotFoundError:
        kept = ""
    if not kept:
        kept = uuid.uuid4().hex[:12]
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        temporary = path.with_name(f".{ID_FILE}.{os.getpid()}")
        temporary.write_text(kept + "\n")
        temporary.replace(path)
    return f"{socket.gethostname()}_{kept}"
