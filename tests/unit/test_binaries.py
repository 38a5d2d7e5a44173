"""Where control-plane binaries come from, and how a failed build explains itself."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

from vk_provider_dev.cluster import binaries as b
from vk_provider_dev.cluster.errors import ClusterError

GO = shutil.which("go")


def _fake_programs(directory: Path, names: tuple[str, ...] = b.COMPONENTS) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = directory / name
        path.write_text("#!/bin/sh\nexit 0\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.delenv(b.BIN_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    return tmp_path


def test_explicit_directory_wins(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_programs(isolated / "mine")
    _fake_programs(b.cache_root() / b.PINNED.cache_key)
    monkeypatch.setenv(b.BIN_DIR_ENV, str(isolated / "mine"))
    found = b.find_binaries()
    assert found is not None
    assert found.kube_apiserver == isolated / "mine" / "kube-apiserver"


def test_explicit_directory_missing_a_program_names_it(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_programs(isolated / "mine", names=("etcd", "kube-apiserver"))
    monkeypatch.setenv(b.BIN_DIR_ENV, str(isolated / "mine"))
    with pytest.raises(ClusterError, match="kube-controller-manager, kube-scheduler"):
        b.find_binaries()


def test_cache_is_keyed_by_version(isolated: Path) -> None:
    other = b.ControlPlaneVersions(kubernetes="v1.36.0", staging="v0.36.0", etcd="v3.6.13")
    _fake_programs(b.cache_root() / other.cache_key)
    assert b.find_binaries(b.PINNED) is None
    found = b.find_binaries(other)
    assert found is not None
    assert other.cache_key in str(found.etcd)


def test_path_is_used_only_when_complete(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    partial = isolated / "partial"
    _fake_programs(partial, names=("etcd", "kube-apiserver", "kube-scheduler"))
    monkeypatch.setenv("PATH", str(partial))
    assert b.find_binaries() is None
    _fake_programs(partial)
    found = b.find_binaries()
    assert found is not None
    assert found.source == "PATH"


def test_no_go_toolchain_is_explained(isolated: Path) -> None:
    with pytest.raises(ClusterError, match="no Go toolchain is on PATH"):
        b.ensure_binaries()


def test_unreachable_proxy_is_explained(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert GO, "the Go toolchain is part of this machine kind"
    monkeypatch.setenv("PATH", str(Path(GO).parent))
    # A closed loopback port: the proxy refuses at once; an empty module cache forces a fetch.
    monkeypatch.setenv("GOPROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("GOMODCACHE", str(isolated / "modcache"))
    monkeypatch.setenv("GOFLAGS", "-modcacherw")
    with pytest.raises(ClusterError, match="module proxy is unreachable"):
        b.ensure_binaries()
    assert not (b.cache_root() / b.PINNED.cache_key).exists()


def test_staging_modules_are_read_from_go_mod() -> None:
    go_mod = """
module k8s.io/kubernetes
replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/cri-streaming => ./staging/src/k8s.io/cri-streaming
\tgithub.com/x/y => github.com/x/y v1.0.0
)
"""
    assert b._staging_modules(go_mod) == ["k8s.io/api", "k8s.io/cri-streaming"]
