"""The benchmark (``python -m bench``) runs end to end at tiny sizes and prints its table.

Not a timed test: it asserts no speed, only that every measurement ran and was reported
(figures come from ``bench/README.md``'s full-size run, not from here).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import __main__ as bench_main
from vk_provider_dev.cluster.cluster import LocalCluster

pytestmark = pytest.mark.integration

ROWS = (
    "| figure | min / median / max | target | median |",
    "raw: pods/s bind→Running (3 pods)",
    "kwok: pods/s bind→Running (3 pods)",
    "memory vs KWOK throughput (3)",
    "local vs minimal client throughput (3)",
    "memory p99 bind→Running (3)",
    "memory: agent CPU holding 3 pods, nothing changing",
    "local: per-pod provider status reads while idle (3 pods)",
    "memory: agent RSS holding 3 pods",
    "memory: API writes per pod",
    "memory: provider list calls per reconcile cycle",
    "burst: 4 pods on 3 providers",
    "burst: provider creates per pod",
    "memory vs KWOK throughput (4)",
    "memory vs KWOK deletion time (4)",
    "memory: agent RSS holding 4 pods",
    "freed slot → reused",
    "outage of 2 pods → all replaced",
    "place() vs single-pass baseline",
    "local runner start",
)


async def test_the_bench_prints_its_table_at_tiny_sizes(
    control_plane: LocalCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = bench_main.parser().parse_args(
        [
            "--pods",
            "3",
            "--rounds",
            "1",
            "--large-pods",
            "4",
            "--large-rounds",
            "1",
            "--burst-pods",
            "4",
            "--outage-pods",
            "2",
            "--slot-wait",
            "1",
            "--idle-seconds",
            "2",
        ]
    )
    lines = await bench_main.measure_on(control_plane, args, tmp_path)
    printed = capsys.readouterr().out
    for row in ROWS:
        assert any(row in line for line in lines), (row, printed)
    # Every figure was taken: none is "not taken" (a figure whose every round gave no value,
    # a ratio over nothing); a subject that fails raises and fails the run itself.
    assert not [line for line in lines if "not taken" in line], printed
    assert "| measure | figure |" in printed
    assert bench_main.agentproc.reap_runners(tmp_path) == 0  # nothing left running
