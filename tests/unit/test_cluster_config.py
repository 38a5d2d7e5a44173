"""Local-cluster decisions that need no running processes."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from vk_provider_dev.cluster.cluster import LocalCluster, validate_name
from vk_provider_dev.cluster.components import ClusterPorts
from vk_provider_dev.cluster.errors import ClusterError


@pytest.mark.parametrize("name", ["", "Upper", "-lead", "trail-", "a" * 41, "has_underscore"])
def test_bad_cluster_names_are_refused(name: str) -> None:
    with pytest.raises(ClusterError, match="cluster name"):
        validate_name(name)


def test_a_taken_port_is_named(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        cluster = LocalCluster("ports", root=tmp_path)
        ports = ClusterPorts(taken, 1, 2, 3, 4)
        with pytest.raises(ClusterError, match=f"port {taken} for kube-apiserver .* is taken"):
            cluster._check_ports_free(ports, skip=set())
        # A port held by the cluster's own running component is not a conflict.
        cluster._check_ports_free(ClusterPorts(taken, *_free(4)), skip={"kube-apiserver"})


def _free(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for sock in sockets:
        sock.close()
    return ports


def test_down_of_a_cluster_that_never_existed_is_a_no_op(tmp_path: Path) -> None:
    LocalCluster("never", root=tmp_path).down()
    assert not (tmp_path / "clusters" / "never").exists()
