"""Run a test agent with exactly the rights deploy/rbac.yaml grants, for its own node.

deploy/rbac.yaml is written for one agent (ServiceAccount ``vk-provider`` in namespace
``vk-provider``, node ``vk-gpu``); each test agent has a node of its own, so the manifests are
rendered per agent: the node's name in ``resourceNames`` and in the Lease names, a
ServiceAccount and role objects named after the node, labelled so ``revoke`` removes them.
Only the roles bound to the agent's ServiceAccount are rendered (not the viewer role, which
is for people). The ServiceAccounts live in ``vk-provider``, the namespace whose requests the
local API server audits (``vk_provider_dev.cluster.components.audit_policy``).
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.components import AUDITED_NAMESPACE

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SHIPPED_NODE = "vk-gpu"
SHIPPED_ACCOUNT = "vk-provider"
LABEL = "vk-provider.io/test-node"
_KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount")


def shipped_documents(
    *, handover: bool = False, serving: bool = False, traffic: bool = False
) -> list[dict[str, Any]]:
    """deploy/rbac.yaml, and deploy/rbac-handover.yaml beside it for a hand-over agent,
    deploy/rbac-serving.yaml and -approve.yaml for one whose serving certificate the cluster
    signs on its own approval, deploy/rbac-traffic.yaml for one writing EndpointSlices."""
    files = ["rbac.yaml"] + ["rbac-handover.yaml"] * handover + ["rbac-traffic.yaml"] * traffic
    files += ["rbac-serving.yaml", "rbac-serving-approve.yaml"] * serving
    return [d for f in files for d in yaml.safe_load_all((DEPLOY / f).read_text()) if d]


def account_for(node: str) -> str:
    return f"agent-{node}"


def render(
    node: str, *, handover: bool = False, serving: bool = False, traffic: bool = False
) -> list[dict[str, Any]]:
    """deploy/rbac.yaml's objects bound to its ServiceAccount, rewritten for ``node``."""
    documents = shipped_documents(handover=handover, serving=serving, traffic=traffic)
    bound = {
        (d["roleRef"]["kind"], d["roleRef"]["name"], d["metadata"].get("namespace"))
        for d in documents
        if d["kind"].endswith("Binding")
        and any(s.get("name") == SHIPPED_ACCOUNT for s in d.get("subjects", []))
    }
    rendered = []
    for original in documents:
        d = copy.deepcopy(original)
        kind, meta = d["kind"], d["metadata"]
        if kind not in _KINDS:
            continue
        if kind.endswith("Role") and not any(
            k == kind and n == meta["name"] and (kind == "ClusterRole" or ns == meta["namespace"])
            for k, n, ns in bound
        ):
            continue
        meta["name"] = account_for(node) if kind == "ServiceAccount" else f"{meta['name']}-{node}"
        meta.setdefault("labels", {})[LABEL] = node
        for rule in d.get("rules", []):
            if "resourceNames" in rule:
                rule["resourceNames"] = [
                    n.replace(SHIPPED_NODE, node) for n in rule["resourceNames"]
                ]
        if "roleRef" in d:
            d["roleRef"]["name"] = f"{d['roleRef']['name']}-{node}"
            for subject in d["subjects"]:
                subject["name"] = account_for(node)
        rendered.append(d)
    return rendered


def grant(
    cluster: LocalCluster,
    node: str,
    directory: Path,
    *,
    handover: bool = False,
    serving: bool = False,
    traffic: bool = False,
) -> Path:
    """Apply the rendered role for ``node`` (with the hand-over's when ``handover``, the
    serving certificate's when ``serving``, the EndpointSlices' when ``traffic``); a
    kubeconfig of its ServiceAccount's token."""
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": AUDITED_NAMESPACE}}
    applied = _kubectl(
        cluster,
        "apply",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(
            [namespace, *render(node, handover=handover, serving=serving, traffic=traffic)]
        ),
    )
    if applied.returncode != 0:
        raise RuntimeError(f"applying the shipped role for {node}: {applied.stderr}")
    token = _kubectl(
        cluster, "create", "token", account_for(node), "-n", AUDITED_NAMESPACE, "--duration=24h"
    )
    if token.returncode != 0:
        raise RuntimeError(f"a token for {account_for(node)}: {token.stderr}")
    admin: dict[str, Any] = yaml.safe_load(cluster.kubeconfig.read_text())
    admin["users"] = [{"name": account_for(node), "user": {"token": token.stdout.strip()}}]
    admin["contexts"][0]["context"]["user"] = account_for(node)
    path = directory / "shipped-role.kubeconfig"
    path.write_text(yaml.safe_dump(admin))
    path.chmod(0o600)
    return path


def revoke(cluster: LocalCluster, node: str) -> None:
    """Delete what ``grant`` created for ``node`` (best effort: the cluster may be gone)."""
    selector = f"{LABEL}={node}"
    _kubectl(cluster, "delete", "clusterrole,clusterrolebinding", "-l", selector, "--wait=false")
    _kubectl(
        cluster, "delete", "role,rolebinding,serviceaccount", "-A", "-l", selector, "--wait=false"
    )


def _kubectl(
    cluster: LocalCluster, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "kubectl"),
            "--kubeconfig",
            str(cluster.kubeconfig),
            *args,
        ],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
