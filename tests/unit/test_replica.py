"""A replica's election identity survives its restarts; a state directory has one agent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vk_provider.runtime.replica import lock_state_dir, replica_identity
from vk_provider.settings.leader import LeaderElectionConfig
from vk_provider.settings.secrets import ConfigError


def test_outside_a_pod_the_identity_is_kept_in_the_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarted process (same state directory) is the same replica, and renews its own
    Lease at once; another state directory is another replica."""
    monkeypatch.delenv("POD_NAME", raising=False)
    election = LeaderElectionConfig()
    (tmp_path / "a").mkdir()
    first = replica_identity(election, tmp_path / "a")
    assert replica_identity(election, tmp_path / "a") == first
    (tmp_path / "b").mkdir()
    assert replica_identity(election, tmp_path / "b") != first
    assert str(os.getpid()) not in first.rpartition("_")[2]


def test_the_pod_name_and_then_the_configured_identity_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_NAME", "vk-provider-7d9f-abcde")
    assert replica_identity(LeaderElectionConfig(), tmp_path) == "vk-provider-7d9f-abcde"
    configured = LeaderElectionConfig(identity="replica-a")
    assert replica_identity(configured, tmp_path) == "replica-a"
    assert not (tmp_path / "replica-id").exists()


def test_a_state_directory_in_use_is_refused_naming_the_holder(tmp_path: Path) -> None:
    held = lock_state_dir(tmp_path / "state")
    try:
        with pytest.raises(ConfigError, match=rf"in use by a running agent \(pid {os.getpid()}\)"):
            lock_state_dir(tmp_path / "state")
    finally:
        os.close(held)
    os.close(lock_state_dir(tmp_path / "state"))  # free again once its holder is gone
