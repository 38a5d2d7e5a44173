"""deploy/prometheus/flip-rules.yaml is valid and does what its unit tests say, per promtool.

promtool is Debian's, from the version-keyed cache (``ensure_prometheus``; scripts/test fetches
it ahead with ``vk-provider cluster binaries --flip``). The test file covers: idle, full,
Succeeded/Failed pods not counted, unscheduled demand, the virtual node not counted, no own
node and no pod series meaning no data (never "all free"), cordoned and NotReady own nodes
giving no capacity, and a pending pod that fits no own node (fragmentation) counting as full.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from vk_provider_dev.cluster.flip.deployfiles import FLIP_RULES, FLIP_RULES_TEST, deploy_file
from vk_provider_dev.cluster.flip.tools import ensure_prometheus


@pytest.fixture(scope="module")
def promtool() -> Path:
    return ensure_prometheus().promtool


def _promtool(promtool: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args],
        cwd=deploy_file(FLIP_RULES).parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_rules_are_valid(promtool: Path) -> None:
    result = _promtool(promtool, "check", "rules", str(deploy_file(FLIP_RULES)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 10 rules found" in result.stdout


def test_the_rules_pass_their_unit_tests(promtool: Path) -> None:
    result = _promtool(promtool, "test", "rules", str(deploy_file(FLIP_RULES_TEST)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_a_wrong_expectation_fails(promtool: Path, tmp_path: Path) -> None:
    # The unit tests can fail: the same file with one expected value changed does.
    rules = deploy_file(FLIP_RULES)
    (tmp_path / rules.name).write_text(rules.read_text())
    broken = deploy_file(FLIP_RULES_TEST).read_text().replace("value: 16}", "value: 15}", 1)
    (tmp_path / "broken.test.yaml").write_text(broken)
    result = subprocess.run(
        [str(promtool), "test", "rules", "broken.test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert "FAILED" in result.stdout + result.stderr
