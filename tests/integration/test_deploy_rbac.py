"""deploy/rbac.yaml applied as shipped is enough: the agent of deploy/agent.yaml's node runs
pods end to end as that ServiceAccount, and the REST API authorises every route."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from tests.helpers import wait_for
from tests.integration.agent_harness import AgentHarness, pod_on
from tests.integration.shipped_role import SHIPPED_NODE
from vk_provider.kube.client import KubeClient
from vk_provider_dev.cluster.cluster import LocalCluster

pytestmark = pytest.mark.integration
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBECTL = str(Path(sys.executable).parent / "kubectl")


def _kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KUBECTL, "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def deployed_rbac(control_plane: LocalCluster) -> Iterator[None]:
    """deploy/ applied verbatim once for this module's tests. The namespace stays: every
    harness agent's ServiceAccount lives in it (tests/integration/shipped_role.py)."""
    files = ["-f", str(DEPLOY / "namespace.yaml"), "-f", str(DEPLOY / "rbac.yaml")]
    applied = _kubectl(control_plane.kubeconfig, "apply", *files)
    assert applied.returncode == 0, applied.stderr
    try:
        yield
    finally:
        _kubectl(
            control_plane.kubeconfig,
            "delete",
            "--wait=false",
            "--ignore-not-found",
            "-f",
            str(DEPLOY / "rbac.yaml"),
        )


async def test_agent_runs_with_only_the_deployed_rbac(
    deployed_rbac: None,
    control_plane: LocalCluster,
    kube: ApiClient,
    api: KubeClient,
    agents: AgentHarness,
    namespace: str,
    tmp_path: Path,
) -> None:
    dry_run = _kubectl(
        control_plane.kubeconfig, "apply", "--dry-run=server", "-f", str(DEPLOY / "agent.yaml")
    )
    assert dry_run.returncode == 0, dry_run.stderr
    core = client.CoreV1Api(kube)
    request = {"spec": {"audiences": [], "expirationSeconds": 3600}}
    token = (
        await core.create_namespaced_service_account_token("vk-provider", "vk-provider", request)
    ).status.token
    admin: dict[str, Any] = yaml.safe_load(control_plane.kubeconfig.read_text())
    admin["users"] = [{"name": "vk-provider", "user": {"token": token}}]
    admin["contexts"][0]["context"]["user"] = "vk-provider"
    kubeconfig = tmp_path / "sa.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(admin))

    # As deploy/agent.yaml sets it: the election Lease goes to the agent's own namespace,
    # which only deploy/rbac.yaml's vk-provider-leader-election Role opens.
    # The node deploy/agent.yaml names: deploy/rbac.yaml confines node and Lease rights to it.
    agent = agents.start(
        kubeconfig=kubeconfig, node={"name": SHIPPED_NODE}, env={"POD_NAMESPACE": "vk-provider"}
    )

    async def ready() -> bool:
        node = await api.get_node(agent.node)
        conditions = (node or {}).get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    await wait_for(ready, timeout=60, what="node Ready with SA credentials")
    lease = await api.get_lease(f"vk-provider-leader-{agent.node}", namespace="vk-provider")
    assert lease is not None and lease["spec"]["holderIdentity"] == agent.pod_name, lease
    command = [sys.executable, "-c", "print('as a service account', flush=True)"]
    await core.create_namespaced_pod(
        namespace, pod_on(agent.node, "sa-pod", command=command, restart_policy="Never")
    )

    async def succeeded() -> bool:
        pod = await api.get_pod(namespace, "sa-pod")
        return bool(pod) and (pod or {}).get("status", {}).get("phase") == "Succeeded"

    await wait_for(succeeded, timeout=60, what="the pod to succeed")
    logs = _kubectl(control_plane.kubeconfig, "logs", "-n", namespace, "sa-pod")
    assert logs.stdout.strip() == "as a service account", logs.stderr
    await core.delete_namespaced_pod("sa-pod", namespace)

    async def gone() -> bool:
        return await api.get_pod(namespace, "sa-pod") is None

    await wait_for(gone, timeout=20, what="the pod to be deleted")
    assert "Forbidden" not in agent.log_text(), agent.log_text()[-3000:]


async def _token(core: client.CoreV1Api, namespace: str, name: str) -> str:
    await core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
    )
    request = {"spec": {"audiences": [], "expirationSeconds": 3600}}
    token: str = (
        await core.create_namespaced_service_account_token(name, namespace, request)
    ).status.token
    return token


async def test_rest_api_authorises_every_route_with_the_viewer_role(
    deployed_rbac: None,
    control_plane: LocalCluster,
    kube: ApiClient,
    agents: AgentHarness,
    namespace: str,
) -> None:
    """TokenReview mode: authentication alone is not enough (docs/reference.md#rest-api)."""
    core = client.CoreV1Api(kube)
    nobody = await _token(core, namespace, "nobody")
    viewer = await _token(core, namespace, "viewer")
    binding = f"viewer-{namespace}"
    bound = _kubectl(
        control_plane.kubeconfig,
        "create",
        "clusterrolebinding",
        binding,
        "--clusterrole=vk-provider-viewer",
        f"--serviceaccount={namespace}:viewer",
    )
    assert bound.returncode == 0, bound.stderr
    try:
        agent = agents.start(rest_static_token=False)

        async def url() -> str | None:
            return agent.rest_url()

        base = await wait_for(url, timeout=30, what="the REST API to listen")
        routes = [
            "/v1/providers",
            "/v1/providers/local-a",
            "/v1/offers",
            "/v1/gpus",
            "/v1/pods",
            "/v1/spend",
            "/v1/overflow",
        ]
        pod = {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}}
        async with httpx.AsyncClient(base_url=base, timeout=15) as http:

            async def ready() -> bool:
                return (await http.get("/readyz")).status_code == 200

            await wait_for(ready, timeout=60, what="the agent ready")
            for path in routes:
                refused = await http.get(path, headers={"Authorization": f"Bearer {nobody}"})
                assert refused.status_code == 403, (path, refused.text)
                assert f"system:serviceaccount:{namespace}:nobody" in refused.text
                allowed = await http.get(path, headers={"Authorization": f"Bearer {viewer}"})
                assert allowed.status_code == 200, (path, allowed.text)
            # The dry run is create on placements.vk-provider.io, which the viewer role has.
            for token, status in ((nobody, 403), (viewer, 200)):
                answer = await http.post(
                    "/v1/placements", json=pod, headers={"Authorization": f"Bearer {token}"}
                )
                assert answer.status_code == status, answer.text
            anonymous = await http.get("/v1/pods")
            assert anonymous.status_code == 401
        log = agent.log_text()
        assert nobody not in log and viewer not in log
    finally:
        _kubectl(control_plane.kubeconfig, "delete", "clusterrolebinding", binding)
