"""The local listing's kept observations: read once per change, never trusted when racy."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from vk_provider.sdk import Instance, InstanceState
from vk_provider_adapters.local.observations import RACY_SECONDS, Observations
from vk_provider_adapters.local.processes import ProcessRecord, start_ticks
from vk_provider_adapters.local.records import Record


def _record(process: ProcessRecord | None = None) -> Record:
    return Record("local-x-0", "uid-x", 0, "cpu", "local/cpu/x", 0.1, 0.0, process)


def _instance(state: InstanceState) -> Instance:
    return Instance(
        provider="local",
        instance_id="local-x-0",
        pod_uid="uid-x",
        attempt=0,
        state=state,
        offer_key="local/cpu/x",
    )


class Reads:
    """A ``fresh`` that counts its calls and returns what it is told."""

    def __init__(self, record: Record, state: InstanceState) -> None:
        self.calls = 0
        self.record = record
        self.state = state

    def __call__(self) -> tuple[Record, Instance]:
        self.calls += 1
        return self.record, _instance(self.state)


def _instance_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "local-x-0"
    (directory / "containers" / "c").mkdir(parents=True)
    return directory


def _later() -> float:
    return time.time() + 10 * RACY_SECONDS  # every mtime is long settled


def _rename_into(directory: Path, name: str) -> None:
    tmp = directory / f".{name}.tmp"
    tmp.write_text("{}")
    tmp.replace(directory / name)


def test_an_unchanged_instance_is_read_once(tmp_path: Path) -> None:
    directory = _instance_dir(tmp_path)
    observations = Observations(clock=_later)
    reads = Reads(_record(), InstanceState.EXITED)
    first = observations.observe(directory, reads)
    again = observations.observe(directory, reads)
    assert reads.calls == 1
    assert first == again


def test_a_file_renamed_into_the_instance_or_a_container_is_read_again(tmp_path: Path) -> None:
    directory = _instance_dir(tmp_path)
    observations = Observations(clock=_later)
    reads = Reads(_record(), InstanceState.EXITED)
    observations.observe(directory, reads)
    _rename_into(directory, "terminate.json")
    os.utime(directory, ns=(1, directory.stat().st_mtime_ns + 1_000_000))
    observations.observe(directory, reads)
    assert reads.calls == 2
    container = directory / "containers" / "c"
    _rename_into(container, "status.json")
    os.utime(container, ns=(1, container.stat().st_mtime_ns + 1_000_000))
    observations.observe(directory, reads)
    assert reads.calls == 3
    observations.observe(directory, reads)
    assert reads.calls == 3


def test_an_instance_changed_within_the_racy_window_is_not_kept(tmp_path: Path) -> None:
    directory = _instance_dir(tmp_path)
    observations = Observations(clock=time.time)  # its mtimes are from just now
    reads = Reads(_record(), InstanceState.EXITED)
    observations.observe(directory, reads)
    observations.observe(directory, reads)
    assert reads.calls == 2


def test_a_terminating_instance_is_observed_afresh_every_time(tmp_path: Path) -> None:
    directory = _instance_dir(tmp_path)
    observations = Observations(clock=_later)
    reads = Reads(_record(), InstanceState.TERMINATING)
    observations.observe(directory, reads)
    observations.observe(directory, reads)
    assert reads.calls == 2


def test_a_runner_that_ends_makes_the_instance_read_again(tmp_path: Path) -> None:
    directory = _instance_dir(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ticks = start_ticks(child.pid)
        assert ticks is not None
        record = _record(ProcessRecord("runner", child.pid, ticks))
        observations = Observations(clock=_later)
        reads = Reads(record, InstanceState.RUNNING)
        observations.observe(directory, reads)
        observations.observe(directory, reads)
        assert reads.calls == 1
    finally:
        child.kill()
        child.wait()
    reads.state = InstanceState.LOST
    _, instance = observations.observe(directory, reads) or (None, None)
    assert reads.calls == 2
    assert instance is not None and instance.state is InstanceState.LOST


def test_a_released_instance_is_forgotten(tmp_path: Path) -> None:
    directory = _instance_dir(tmp_path)
    observations = Observations(clock=_later)
    reads = Reads(_record(), InstanceState.EXITED)
    observations.observe(directory, reads)
    observations.keep_only([])
    observations.observe(directory, reads)
    assert reads.calls == 2


def test_a_vanished_directory_is_not_kept(tmp_path: Path) -> None:
    observations = Observations(clock=_later)
    reads = Reads(_record(), InstanceState.EXITED)
    gone = tmp_path / "local-gone-0"
    observations.observe(gone, reads)
    observations.observe(gone, reads)
    assert reads.calls == 2
