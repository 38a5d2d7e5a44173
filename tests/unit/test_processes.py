"""Detached processes: recognised by pid and start time, stopped with their children."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from vk_provider_adapters.local.processes import (
    ProcessRecord,
    is_running,
    start_process,
    stop_process,
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_start_and_stop_a_process_group(tmp_path: Path) -> None:
    # The parent ignores SIGTERM and has a child: stop must escalate and take the child too.
    script = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    log = tmp_path / "logs" / "p.log"
    record = start_process("p", [sys.executable, "-c", script], log_file=log, cwd=tmp_path)
    deadline = time.monotonic() + 10
    while not log.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(log.read_text().split()[0])
    assert is_running(record)
    assert _alive(child)
    stop_process(record, timeout=0.5)
    assert not is_running(record)
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_a_recycled_pid_is_not_ours(tmp_path: Path) -> None:
    record = start_process(
        "p",
        [sys.executable, "-c", "import time; time.sleep(30)"],
        log_file=tmp_path / "l",
        cwd=tmp_path,
    )
    stranger = ProcessRecord(name="p", pid=record.pid, start_ticks=record.start_ticks + 1)
    assert not is_running(stranger)
    stop_process(stranger)  # must not touch the real process
    assert is_running(record)
    stop_process(record)
    assert not is_running(record)


def test_round_trip_through_json() -> None:
    record = ProcessRecord(name="etcd", pid=42, start_ticks=7)
    assert ProcessRecord.from_json(record.to_json()) == record
