"""The agent's Kubernetes client does no per-request environment work (issue 14)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vk_provider.kube.client import KubeClient

KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://{host}:6443", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: not-a-secret}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


async def connect(tmp_path: Path, host: str = "10.1.2.3") -> KubeClient:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG.replace("{host}", host))
    return await KubeClient.connect(path)


async def test_no_netrc_or_proxy_lookup_per_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    kube = await connect(tmp_path)
    try:
        assert kube._api.rest_client.pool_manager.trust_env is False
        assert not kube._api.rest_client.proxy
    finally:
        await kube.close()


async def test_the_environments_proxy_is_resolved_once_at_connect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "bypassed.example")
    kube = await connect(tmp_path)
    bypassed = await connect(tmp_path, host="bypassed.example")
    try:
        assert kube._api.rest_client.proxy == "http://proxy.example:3128"
        assert not bypassed._api.rest_client.proxy
    finally:
        await kube.close()
        await bypassed.close()
