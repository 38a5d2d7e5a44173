"""Detached control-plane processes that outlive the command that started them.

``vk-provider cluster up`` returns while etcd and the Kubernetes components keep running, so
their identities are written to disk and ``down`` finds them again from there.

Invariants:
- A process is identified by (pid, kernel start time); a recycled pid never matches a record,
  so ``down`` cannot kill a stranger.
- Every process starts in a session of its own, so it survives the terminal that started it,
  and is stopped by signalling its whole process group (children included).
- A zombie counts as stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """A started process: enough to recognise it again and to stop it."""

    name: str
    pid: int
    start_ticks: int

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "pid": self.pid, "start_ticks": self.start_ticks}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ProcessRecord:
        return cls(
            name=str(data["name"]),
            pid=int(str(data["pid"])),
            start_ticks=int(str(data["start_ticks"])),
        )


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may contain spaces and parentheses; split after the last ')'.
    return raw[raw.rfind(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """Kernel start time of ``pid`` in clock ticks since boot, or None if it does not exist."""
    fields = _stat_fields(pid)
    # After the command name, field index 0 is the state (field 3 of proc(5)); start time is 22.
    return int(fields[19]) if fields else None


def is_running(record: ProcessRecord) -> bool:
    fields = _stat_fields(record.pid)
    if fields is None:
        return False
    return fields[0] != "Z" and int(fields[19]) == record.start_ticks


def start_process(name: str, argv: list[str], *, log_file: Path, cwd: Path) -> ProcessRecord:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    ticks = start_ticks(proc.pid)
    if ticks is None:
        raise RuntimeError(f"{name} exited immediately; see {log_file}")
    return ProcessRecord(name=name, pid=proc.pid, start_ticks=ticks)


def _reap(pid: int) -> None:
    # If we are the parent (tests start clusters in-process), collect the exit status so the
    # child does not linger as a zombie; otherwise init reaps it and this is a no-op.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stop_process(record: ProcessRecord, *, timeout: float = 10.0) -> None:
    """SIGTERM the process group, wait up to ``timeout``, then SIGKILL it."""
    if not is_running(record):
        _reap(record.pid)
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(record.pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(record.pid)
            if not is_running(record):
                _reap(record.pid)  # it may have turned zombie after the first reap
                return
            time.sleep(0.05)
    raise RuntimeError(f"{record.name} (pid {record.pid}) did not stop after SIGKILL")


# --- signals ------------------------------------------------------------------------------


def signal_group(process: ProcessRecord, sig: signal.Signals) -> None:
    """Signal the runner's process group, only if the recorded runner is still that process."""
    if is_running(process):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)


def signal_runner(process: ProcessRecord, sig: signal.Signals) -> None:
    if is_running(process):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(process.pid, sig)


def reap(process: ProcessRecord) -> None:
    # While the agent that started a runner lives, it is the runner's parent: collect the exit
    # status so finished runners do not stay zombies. Only a zombie that still carries the
    # recorded start time is ours; after an agent restart init reaps and this is a no-op.
    if start_ticks(process.pid) == process.start_ticks:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(process.pid, os.WNOHANG)


# What the command line of a local runner, or of its spawner, names (a forked runner carries
# its spawner's command line).
_LOCAL_PROCESS = "vk_provider_adapters.local."


def kill_local_processes(root: Path) -> list[int]:
    """SIGKILL (by process group) every local runner and spawner whose command line names a
    path under ``root``: the clean-up of tests and benchmarks that started agents there.
    Returns the group leaders' pids."""
    killed = []
    marker = str(root)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if _LOCAL_PROCESS in cmdline and marker in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(entry.name), signal.SIGKILL)  # each leads its own group
                killed.append(int(entry.name))
    return killed
