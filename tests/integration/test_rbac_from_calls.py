"""deploy/rbac.yaml is derived from the agent's calls: the API server's audit log of a full run
(node registration and status, Leases, a pod with Secret and ConfigMap values, Events and a
repeated one from a failing readiness probe, logs through the kubelet API, a REST call
checked by TokenReview, deletion) lists every call the agent made, and the shipped role
allows each of them and grants nothing that none of them used.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from tests.helpers import wait_for
from tests.integration import shipped_role
from tests.integration.agent_harness import AgentHarness, pod_on
from tests.integration.audit import Call, calls_of, grants_of, unused
from vk_provider.kube.client import KubeClient
from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.components import AUDITED_NAMESPACE

pytestmark = pytest.mark.integration
KUBECTL = str(Path(sys.executable).parent / "kubectl")


def test_every_grant_matches_calls_and_every_call_is_granted() -> None:
    """The comparison itself can fail: a call outside the role, a grant no call used."""
    role = [
        {
            "kind": "Role",
            "metadata": {"name": "r", "namespace": "ns"},
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "delete"]},
                {
                    "apiGroups": [""],
                    "resources": ["nodes"],
                    "resourceNames": ["mine"],
                    "verbs": ["patch"],
                },
            ],
        }
    ]
    grants = grants_of(role)
    get = Call("", "pods", "get", "ns", "p", 200)
    assert [g.verb for g in grants if g.allows(get)] == ["get"]
    assert not any(g.allows(Call("", "pods", "get", "other", "p", 200)) for g in grants)
    assert not any(g.allows(Call("", "nodes", "patch", "ns", "theirs", 200)) for g in grants)
    assert unused(grants, [get]) == {("", "pods", "delete"), ("", "nodes", "patch")}


def _set_rules(cluster: LocalCluster, role: str, rules: list[dict[str, Any]]) -> None:
    patched = _kubectl(
        cluster, "patch", "clusterrole", role, "--type=merge", "-p", json.dumps({"rules": rules})
    )
    assert patched.returncode == 0, patched.stderr


def _cluster_role(node: str) -> dict[str, Any]:
    return next(d for d in shipped_role.render(node) if d["kind"] == "ClusterRole")


def _kubectl(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KUBECTL, "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_the_shipped_role_is_exactly_the_calls_of_a_full_run(
    control_plane: LocalCluster,
    kube: ApiClient,
    api: KubeClient,
    agents: AgentHarness,
    namespace: str,
) -> None:
    core = client.CoreV1Api(kube)
    await core.create_namespaced_secret(
        namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="s"), string_data={"k": "1"})
    )
    await core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="c"), data={"k": "2"})
    )
    # Harness default: the shipped role for this node; REST callers checked by TokenReview.
    agent = agents.start(rest_static_token=False)
    env = [
        {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
    ]
    talker = [sys.executable, "-c", "import os; print(os.environ['S'] + os.environ['C'])"]
    await core.create_namespaced_pod(
        namespace,
        pod_on(
            agent.node,
            "talker",
            command=talker,
            gpus=0,
            restart_policy="Never",
            container={"env": env},
        ),
    )
    # A readiness probe that fails every second with the same message: the same Unhealthy
    # Event again and again, which the recorder writes once and then counts (a patch).
    failing = {
        "exec": {"command": [sys.executable, "-c", "raise SystemExit(3)"]},
        "periodSeconds": 1,
        "failureThreshold": 1,
    }
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    await core.create_namespaced_pod(
        namespace,
        pod_on(
            agent.node, "crasher", command=sleeper, gpus=0, container={"readinessProbe": failing}
        ),
    )

    async def talked() -> bool:
        pod = await api.get_pod(namespace, "talker")
        return (pod or {}).get("status", {}).get("phase") == "Succeeded"

    await wait_for(talked, timeout=90, what="the pod with Secret and ConfigMap values to end")
    logs = _kubectl(control_plane, "logs", "-n", namespace, "talker")
    assert logs.stdout.strip() == "12", logs.stderr

    async def repeated() -> bool:
        events = await core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=crasher"
        )
        return any((e.count or 0) > 1 for e in events.items)

    await wait_for(repeated, timeout=120, what="a repeated Event about the unready pod")
    token = _kubectl(
        control_plane,
        "create",
        "token",
        shipped_role.account_for(agent.node),
        "-n",
        AUDITED_NAMESPACE,
    )
    assert token.returncode == 0, token.stderr

    async def rest() -> str | None:
        return agent.rest_url()

    base = await wait_for(rest, timeout=30, what="the REST API to listen")
    async with httpx.AsyncClient(base_url=base, timeout=15) as http:
        # Authenticated (TokenReview), then refused: the agent's own identity is no viewer.
        answer = await http.get(
            "/v1/pods", headers={"Authorization": f"Bearer {token.stdout.strip()}"}
        )
        assert answer.status_code == 403, answer.text
    for name in ("talker", "crasher"):
        await core.delete_namespaced_pod(name, namespace)

    async def gone() -> bool:
        return not (await core.list_namespaced_pod(namespace)).items

    await wait_for(gone, timeout=90, what="both pods deleted by the agent")
    assert agent.stop() == 0, agent.log_text()[-3000:]

    user = f"system:serviceaccount:{AUDITED_NAMESPACE}:{shipped_role.account_for(agent.node)}"
    calls = calls_of(control_plane.audit_log, user)
    assert calls, f"no call of {user} in {control_plane.audit_log}"
    refused = [c for c in calls if c.code == 403]
    assert not refused, refused
    grants = grants_of(shipped_role.render(agent.node))
    ungranted = {c for c in calls if not any(g.allows(c) for g in grants)}
    assert not ungranted, ungranted
    assert unused(grants, calls) == set(), "granted, never called"


async def test_a_secret_the_role_does_not_cover_waits_naming_the_missing_grant(
    control_plane: LocalCluster,
    kube: ApiClient,
    api: KubeClient,
    agents: AgentHarness,
    namespace: str,
) -> None:
    """Confined Secret reads (the chart's rbac.secretNamespaces): a pod outside them is told
    why it waits, and runs once the grant is there."""
    core = client.CoreV1Api(kube)
    await core.create_namespaced_secret(
        namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="s"), string_data={"k": "1"})
    )
    agent = agents.start()
    role = f"vk-provider-{agent.node}"
    widened = _cluster_role(agent.node)["rules"]
    confined = [r for r in widened if "secrets" not in r["resources"]]
    _set_rules(control_plane, role, confined)
    env = [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    await core.create_namespaced_pod(
        namespace, pod_on(agent.node, "p", command=sleeper, gpus=0, container={"env": env})
    )

    async def waiting() -> dict[str, Any] | None:
        pod = await api.get_pod(namespace, "p")
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
        return (statuses[0].get("state") or {}).get("waiting")

    state = await wait_for(waiting, timeout=60, what="the pod waiting for its Secret")
    assert state["reason"] == "CreateContainerConfigError", state
    assert f"Secret 's': the agent may not read it in namespace {namespace!r}" in state["message"]
    assert "grant it get on secrets" in state["message"]
    _set_rules(control_plane, role, widened)

    async def running() -> bool:
        pod = await api.get_pod(namespace, "p")
        return ((pod or {}).get("status") or {}).get("phase") == "Running"

    await wait_for(running, timeout=90, what="the pod running once the grant is back")
