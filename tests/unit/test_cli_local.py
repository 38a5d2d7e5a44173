"""`vk-provider local ...`: faults and losses injected by hand reach a local provider."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.integration.agent_harness import reap_runners
from vk_provider.domain.models import InstanceState
from vk_provider_adapters.local.adapter import LocalProvider
from vk_provider_adapters.local.config import LocalProviderConfig
from vk_provider_adapters.local.faults import inject_instance, read_fault_overrides


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vk_provider", "local", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_faults_are_set_and_cleared(tmp_path: Path) -> None:
    done = _cli("faults", str(tmp_path), "--fail-creates", "3", "--create-error", "auth")
    assert done.returncode == 0, done.stderr
    assert read_fault_overrides(tmp_path / "faults.json") == {
        "fail_creates": 3,
        "create_error": "auth",
    }
    refused = _cli("faults", str(tmp_path), "--call-failure-rate", "1.5")
    assert refused.returncode == 2
    assert "call_failure_rate must be between 0 and 1" in refused.stderr
    assert _cli("faults", str(tmp_path), "--clear").returncode == 0
    assert not (tmp_path / "faults.json").exists()


async def test_an_instance_is_lost_and_listed(tmp_path: Path) -> None:
    made = inject_instance(tmp_path, pod_uid="u-1", suffix="by-hand")
    try:
        listed = _cli("instances", str(tmp_path))
        assert listed.returncode == 0, listed.stderr
        assert made in listed.stdout
        lost = _cli("lose", str(tmp_path), made, "--message", "reclaimed")
        assert lost.returncode == 0, lost.stderr
        provider = LocalProvider(
            LocalProviderConfig(type="local", name="x", enabled=True, offers=[]),
            state_dir=tmp_path,
        )
        instance = await provider.get(made)
        assert (instance.state, instance.message) == (InstanceState.LOST, "reclaimed")
        assert _cli("lose", str(tmp_path), "local-nope").returncode == 1
    finally:
        reap_runners(tmp_path)


async def test_instances_lists_whole_ids_however_narrow_the_output(tmp_path: Path) -> None:
    uid = "ae8357d1-5150-4570-aa19-78d0ec016412"  # a real pod UID: ids are long
    made = inject_instance(tmp_path, pod_uid=uid, suffix="0")
    try:
        listed = _cli("instances", str(tmp_path))  # to a pipe: rich's 80 columns
        assert listed.returncode == 0, listed.stderr
        assert made in listed.stdout and uid in listed.stdout
        assert "…" not in listed.stdout
    finally:
        reap_runners(tmp_path)
