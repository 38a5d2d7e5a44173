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
    "raw baseline: bind→Running",
    "memory provider: bind→Running",
    "throughput vs raw baseline",
    "API writes / GETs per pod (agent)",
    "agent CPU-seconds per pod",
    "agent RSS idle",
    "provider list calls per reconcile cycle",
    "agent CPU holding 3 pods, nothing changing",
    "local provider: bind→Running",
    "freed slot → reused",
    "outage of 2 pods → all replaced",
    "place() vs single-pass baseline",
    "local runner start",
    "agent RSS with 4 pods Running",
)


async def test_the_bench_prints_its_table_at_tiny_sizes(
    control_plane: LocalCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = bench_main.parser().parse_args(
        [
            "--pods",
            "3",
            "--rss-pods",
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
    assert "| measure | figure |" in printed
    assert bench_main.agentproc.reap_runners(tmp_path) == 0  # nothing left running
