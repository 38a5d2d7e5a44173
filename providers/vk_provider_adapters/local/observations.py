"""Observations of local instances for the listing: each read from its files once per change.

A listing observes every instance directory each poll (``observe``: about ten file reads and
JSON parses per instance, 14% of a core at 1,000 idle pods). Most instances do not change
between polls, so the listing keeps each observation with a fingerprint of what it was read
from — the modification times (ns) of the instance's directory, of its ``containers``
directory and of each container's directory, and whether its runner is alive — and an
unchanged fingerprint returns the kept ``Instance`` after one ``stat`` per directory and the
runner's liveness check.

Invariants:
- Every file an observation reads is written by a rename into one of those directories (or
  created there), which moves that directory's mtime; nothing rewrites one in place.
- Only settled observations are kept: PENDING, RUNNING, EXITED, and LOST with no live runner.
  A TERMINATING one depends on the clock (its kill deadline), a LOST one with a live runner
  acts (kills it): both are observed afresh every time.
- Racy mtimes are not trusted (git's "racily clean" rule): a directory changed less than
  ``RACY_SECONDS`` before the observation may change again within the file system's
  timestamp granularity without its mtime moving, so such an observation is not kept.
- ``get``, ``create`` and ``delete`` do not use it: they observe afresh.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from vk_provider.sdk import Instance, InstanceState
from vk_provider_adapters.local.layout import CONTAINERS_DIR
from vk_provider_adapters.local.processes import is_running
from vk_provider_adapters.local.records import Record

RACY_SECONDS: Final = 1.0
_SETTLED: Final = frozenset(
    {InstanceState.PENDING, InstanceState.RUNNING, InstanceState.EXITED, InstanceState.LOST}
)

Fingerprint = tuple[int, ...]


def fingerprint(directory: Path) -> tuple[Fingerprint, float] | None:
    """The mtimes (ns) of ``directory``, its containers directory and each container's, and
    the newest of them in seconds; None when the directory is gone."""
    try:
        stamps = [directory.stat().st_mtime_ns]
        containers = directory / CONTAINERS_DIR
        try:
            stamps.append(containers.stat().st_mtime_ns)
            with os.scandir(containers) as entries:
                stamps.extend(
                    sorted(e.stat().st_mtime_ns for e in entries if e.is_dir(follow_symlinks=False))
                )
        except FileNotFoundError:
            stamps.append(0)
    except FileNotFoundError:
        return None
    return tuple(stamps), max(stamps) / 1e9


@dataclass(frozen=True, slots=True)
class _Kept:
    fingerprint: Fingerprint
    record: Record
    alive: bool
    instance: Instance


class Observations:
    """The listing's kept observations, by instance directory."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._kept: dict[Path, _Kept] = {}

    def observe(
        self, directory: Path, fresh: Callable[[], tuple[Record, Instance] | None]
    ) -> tuple[Record, Instance] | None:
        """The kept (record, observation) of ``directory`` when nothing they were read from
        changed, else ``fresh()`` (kept when settled and not racy)."""
        found = fingerprint(directory)
        kept = self._kept.get(directory)
        if found is not None and kept is not None and kept.fingerprint == found[0]:
            process = kept.record.process
            if (process is not None and is_running(process)) == kept.alive:
                return kept.record, kept.instance
        self._kept.pop(directory, None)
        observed = fresh()
        if observed is None or found is None:
            return observed
        record, instance = observed
        if instance.state not in _SETTLED:
            return observed
        alive = record.process is not None and is_running(record.process)
        if instance.state is InstanceState.LOST and alive:
            return observed
        if found[1] > self._clock() - RACY_SECONDS:
            return observed  # changed too recently to trust its mtimes
        after = fingerprint(directory)  # nothing moved while it was read
        if after is not None and after[0] == found[0]:
            self._kept[directory] = _Kept(found[0], record, alive, instance)
        return observed

    def keep_only(self, directories: Iterable[Path]) -> None:
        """Forget every directory not in ``directories`` (released instances)."""
        wanted = set(directories)
        for directory in [d for d in self._kept if d not in wanted]:
            del self._kept[directory]
