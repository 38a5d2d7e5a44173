"""The control plane's command lines: what every local cluster's API server is started with."""

from __future__ import annotations

from pathlib import Path

from vk_provider_dev.cluster.binaries import Binaries
from vk_provider_dev.cluster.components import ClusterPorts, commands
from vk_provider_dev.cluster.pki import ClusterPKI


def test_the_api_server_has_the_aggregation_layer(tmp_path: Path) -> None:
    pki = ClusterPKI(tmp_path / "pki")
    binaries = Binaries.in_directory(tmp_path / "bin", source="test")
    lines = commands("t", tmp_path, pki, binaries, ClusterPorts(1, 2, 3, 4, 5), "10.0.0.0/24")
    flags = dict(arg.split("=", 1) for arg in lines["kube-apiserver"][1:] if "=" in arg)
    assert flags["--requestheader-client-ca-file"] == str(pki.front_proxy_ca.cert)
    assert flags["--requestheader-allowed-names"] == "front-proxy-client"
    assert flags["--requestheader-username-headers"] == "X-Remote-User"
    assert flags["--requestheader-group-headers"] == "X-Remote-Group"
    assert flags["--requestheader-extra-headers-prefix"] == "X-Remote-Extra-"
    assert flags["--proxy-client-cert-file"] == str(pki.front_proxy_client.cert)
    assert flags["--proxy-client-key-file"] == str(pki.front_proxy_client.key)
    # Service routing stays the default: extension servers are reached by their Service.
    assert "--enable-aggregator-routing" not in flags
