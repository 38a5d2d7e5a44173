"""CPU and memory of a local instance's containers, from ``/proc``.

A local container is its program's process tree (the program and every descendant, found by
parent pid in one scan of ``/proc``). For each container:

- CPU is the time its live processes have run, in nanoseconds from each thread's
  ``schedstat`` (so even a mostly idle program has a figure above zero, as a cgroup's
  ``cpuacct`` would), plus what their reaped children used (``cutime``/``cstime`` of
  ``stat``, in clock ticks);
- the working set is approximated by the resident set (``statm``), summed over the tree.

Invariants: only containers whose recorded program still runs (pid and kernel start time
match, ``processes.is_running``) are reported; a process that vanishes during the scan is
skipped, never an error; pure reads, no signals.
"""

from __future__ import annotations

import os
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

from vk_provider.sdk import ContainerUsage
from vk_provider_adapters.local.layout import container_names, container_process
from vk_provider_adapters.local.processes import is_running

_PROC = Path("/proc")
_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # After the command name (which may hold spaces and parentheses): state, ppid, ...
    return raw[raw.rfind(")") + 2 :].split()


def children_by_parent() -> dict[int, list[int]]:
    """Every process's children, from one scan of ``/proc``."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            children[int(fields[1])].append(int(entry.name))
    return children


def process_tree(root: int, children: dict[int, list[int]]) -> list[int]:
    tree: list[int] = []
    pending, seen = [root], set()
    while pending:
        pid = pending.pop()
        if pid in seen:
            continue
        seen.add(pid)
        tree.append(pid)
        pending.extend(children.get(pid, ()))
    return tree


def cpu_nanoseconds(pid: int) -> int:
    """Time ``pid``'s threads ran, plus its reaped children's, in nanoseconds (0 if gone)."""
    total = 0
    try:
        tasks = list((_PROC / str(pid) / "task").iterdir())
    except OSError:
        return 0
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    fields = _stat_fields(pid)
    if fields is not None and len(fields) > 14:
        # cutime and cstime (fields 16 and 17 of proc(5); index 0 here is field 3): the CPU
        # of children that ended and were waited for, which schedstat no longer shows.
        total += (int(fields[13]) + int(fields[14])) * _TICK_NS
    return total


def resident_bytes(pid: int) -> int:
    try:
        return int((_PROC / str(pid) / "statm").read_text().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def instance_usage(instance_dir: Path, *, now: datetime | None = None) -> list[ContainerUsage]:
    """Usage of every running container of the instance (blocking: run it in a thread)."""
    children = children_by_parent()
    moment = now or datetime.now(UTC)
    usages = []
    for name in container_names(instance_dir):
        process = container_process(instance_dir, name)
        if process is None or not is_running(process):
            continue
        tree = process_tree(process.pid, children)
        usages.append(
            ContainerUsage(
                name=name,
                cpu_core_nanoseconds=sum(cpu_nanoseconds(pid) for pid in tree),
                memory_working_set_bytes=sum(resident_bytes(pid) for pid in tree),
                timestamp=moment,
            )
        )
    return usages
