"""The Helm chart (deploy/chart/vk-provider) on the real control plane.

`helm lint`; `helm template` accepted by the API server's own validation (server-side dry
run, both identities); a real `helm install`, after which the agent process runs with exactly
what the chart created: the config.yaml of its ConfigMap, the environment of its Deployment
(credentials resolved from their Secrets as a kubelet resolves them) and a token of its
ServiceAccount (TokenRequest). No container runtime exists here, so the chart's own pod never
starts (nothing binds it: no node but the tests' virtual ones, whose taint it does not
tolerate); the agent runs beside the cluster as that pod would. With identity: node, the agent
also proves the Node authorizer's confinement: its certificate reads the Secret its pod
references and is refused (403) any other.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from tests.helpers import wait_for
from tests.integration.agent_harness import (
    DEFAULT_OFFERS,
    AgentHarness,
    AgentProcess,
    pod_on,
)
from tests.integration.kubelet_node import serves_a_certificate_of
from vk_provider.kube.client import KubeClient
from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.helm import HELM, ensure_helm

pytestmark = pytest.mark.integration
CHART = Path(__file__).resolve().parents[2] / "deploy" / "chart" / "vk-provider"
NODE_CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
KUBECTL = str(Path(sys.executable).parent / "kubectl")


@pytest.fixture(scope="module")
def helm() -> Path:
    """The cached helm (scripts/test builds it first with `cluster binaries --helm`)."""
    return ensure_helm()


def _run(
    command: list[str], *, stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )


def _helm(helm: Path, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _run([str(helm), "--kubeconfig", str(kubeconfig), *args])


def _kubectl(
    kubeconfig: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return _run([KUBECTL, "--kubeconfig", str(kubeconfig), *args], stdin=stdin)


def _values_file(tmp_path: Path, values: dict[str, Any]) -> Path:
    path = tmp_path / f"values-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def test_helm_lint_passes_for_both_identities(helm: Path, tmp_path: Path) -> None:
    version = _run([str(helm), "version", "--short"])
    assert version.stdout.strip().startswith(HELM.version), version.stdout  # stamped
    for identity in ("serviceAccount", "node"):
        values = _values_file(
            tmp_path,
            {
                "identity": identity,
                "serviceMonitor": {"enabled": True},
                "deschedulerPolicy": {"enabled": True},
            },
        )
        linted = _run([str(helm), "lint", "--strict", str(CHART), "-f", str(values)])
        assert linted.returncode == 0, linted.stdout + linted.stderr
        assert "0 chart(s) failed" in linted.stdout


def _local(name: str, **settings: Any) -> dict[str, Any]:
    """A node's config with one local provider of that name."""
    return {"providers": [{"type": "local", "name": name, "offers": [], **settings}]}


def _two_nodes() -> list[dict[str, Any]]:
    return [
        {"name": "gpu-a", "labels": {"pool": "a"}, "config": _local("la")},
        {"name": "gpu-b", "replicas": 2, "config": _local("lb")},
    ]


def test_bad_values_fail_the_render_naming_the_value(helm: Path, tmp_path: Path) -> None:
    for values, field in (
        ({"identity": "root"}, "identity:"),
        ({"replicas": 2, "leaderElection": {"enabled": False}}, "replicas:"),
        ({"credentials": [{"env": "X", "secretName": "s"}]}, "credentials[0]:"),
        ({"nodes": {"a": 1}}, "nodes: must be a list"),
        ({"nodes": [{"labels": {}}]}, "nodes[0].name: every node needs a name"),
        ({"nodes": [{"name": "Bad_Name"}]}, "nodes[0].name:"),
        ({"nodes": [{"name": "a"}, {"name": "a"}]}, "nodes[1].name:"),
        (
            {"nodes": [{"name": "a", "config": _local("x")}, {"name": "b", "config": _local("x")}]},
            "nodes[1].config.providers:",
        ),
        (
            {"leaderElection": {"config": {"lease_name": "l"}}, "nodes": _two_nodes()},
            "leaderElection.config.lease_name:",
        ),
        (
            {
                "config": {"overflow": {"enabled": True, "handover": {"enabled": True}}},
                "nodes": _two_nodes(),
            },
            "nodes[1].config.overflow.handover.enabled:",
        ),
    ):
        rendered = _run(
            [str(helm), "template", "r", str(CHART), "-f", str(_values_file(tmp_path, values))]
        )
        assert rendered.returncode != 0
        assert field in rendered.stderr, rendered.stderr


def test_the_service_account_roles_are_deploy_rbac_yaml_s(helm: Path) -> None:
    """The chart and the raw manifests grant the same rights (one tested set of rules)."""
    rendered = _run([str(helm), "template", "r", str(CHART)])
    assert rendered.returncode == 0, rendered.stderr
    ours = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(rendered.stdout) if d}
    raw = {
        (d["kind"], d["metadata"]["name"]): d
        for d in yaml.safe_load_all((CHART.parents[1] / "rbac.yaml").read_text())
        if d
    }
    for kind, chart_name, raw_name in (
        ("ClusterRole", "r-vk-provider", "vk-provider"),
        ("Role", "r-vk-provider-lease", "vk-provider-lease"),
        ("ClusterRole", "r-vk-provider-viewer", "vk-provider-viewer"),
        ("Role", "r-vk-provider-leader-election", "vk-provider-leader-election"),
    ):
        assert ours[(kind, chart_name)]["rules"] == raw[(kind, raw_name)]["rules"], chart_name


def _feature_role(
    helm: Path,
    tmp_path: Path,
    values: dict[str, Any],
    raw_file: str,
    suffix: str,
    *,
    without: tuple[dict[str, Any], ...] = ({},),
) -> None:
    """The chart renders the role ``<release>-vk-provider-<suffix>`` with ``values`` and not
    with any of ``without`` (default: the chart's defaults), with the rules of
    deploy/<raw_file>, bound to the chart's ServiceAccount."""

    def render(given: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
        answer = _run(
            [str(helm), "template", "r", str(CHART), "-f", str(_values_file(tmp_path, given))]
        )
        assert answer.returncode == 0, answer.stderr
        documents = yaml.safe_load_all(answer.stdout)
        return {(d["kind"], d["metadata"]["name"]): d for d in documents if d}

    for other in without:
        assert ("ClusterRole", f"r-vk-provider-{suffix}") not in render(other), other
    ours = render(values)
    raw = {
        (d["kind"], d["metadata"]["name"]): d
        for d in yaml.safe_load_all((CHART.parents[1] / raw_file).read_text())
        if d
    }
    role = ours[("ClusterRole", f"r-vk-provider-{suffix}")]
    assert role["rules"] == raw[("ClusterRole", f"vk-provider-{suffix}")]["rules"]
    binding = ours[("ClusterRoleBinding", f"r-vk-provider-{suffix}")]
    assert binding["roleRef"]["name"] == f"r-vk-provider-{suffix}"


def test_the_hand_over_role_is_rendered_only_with_the_hand_over_and_is_deploy_s(
    helm: Path, tmp_path: Path
) -> None:
    """overflow.handover.enabled adds deploy/rbac-handover.yaml's rights, and only then."""
    values = {"config": {"overflow": {"enabled": True, "handover": {"enabled": True}}}}
    _feature_role(helm, tmp_path, values, "rbac-handover.yaml", "handover")


def test_the_traffic_role_is_rendered_only_with_endpoint_slices_and_is_deploy_s(
    helm: Path, tmp_path: Path
) -> None:
    """endpoint_slices.enabled adds deploy/rbac-traffic.yaml's rights, and only then."""
    values = {"config": {"endpoint_slices": {"enabled": True}}}
    _feature_role(helm, tmp_path, values, "rbac-traffic.yaml", "traffic")


def _api(settings: dict[str, Any]) -> dict[str, Any]:
    return {"config": {"kubelet_api": settings}}


def test_the_serving_role_is_rendered_by_default_and_not_for_a_self_signed_or_given_one(
    helm: Path, tmp_path: Path
) -> None:
    """A cluster-signed serving certificate is the default: deploy/rbac-serving.yaml's rights
    come with it, and not when the certificate is self-signed or given as files."""
    _feature_role(
        helm,
        tmp_path,
        {},
        "rbac-serving.yaml",
        "serving",
        without=(
            _api({"serving": {"source": "self-signed"}}),
            _api({"tls_cert_file": "/tls/c.pem", "tls_key_file": "/tls/k.pem"}),
        ),
    )


def test_the_approve_role_is_rendered_only_with_self_approve_and_is_deploy_s(
    helm: Path, tmp_path: Path
) -> None:
    """serving.self_approve adds deploy/rbac-serving-approve.yaml's rights, and only then."""
    _feature_role(
        helm,
        tmp_path,
        _api({"serving": {"self_approve": True}}),
        "rbac-serving-approve.yaml",
        "serving-approve",
        without=({}, _api({"serving": {"source": "self-signed", "self_approve": True}})),
    )


def test_the_roles_follow_the_node_name_and_secret_namespaces(helm: Path, tmp_path: Path) -> None:
    """resourceNames name the release's node and Leases; rbac.secretNamespaces moves Secret and
    ConfigMap reads from the ClusterRole into a Role per named namespace."""
    values = {"nodeName": "gpu-pool-2", "rbac": {"secretNamespaces": ["team-a", "team-b"]}}
    rendered = _run(
        [
            str(helm),
            "template",
            "r",
            str(CHART),
            "-n",
            "vk",
            "-f",
            str(_values_file(tmp_path, values)),
        ]
    )
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    by = {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")): d for d in docs}
    cluster_rules = by[("ClusterRole", "r-vk-provider", None)]["rules"]
    assert not any("secrets" in r["resources"] for r in cluster_rules)
    named = {
        r.get("resources")[0]: r.get("resourceNames") for r in cluster_rules if "resourceNames" in r
    }
    assert named == {"nodes": ["gpu-pool-2"], "nodes/status": ["gpu-pool-2"]}
    lease = by[("Role", "r-vk-provider-lease", "kube-node-lease")]["rules"]
    assert [r.get("resourceNames") for r in lease] == [None, ["gpu-pool-2"]]
    election = by[("Role", "r-vk-provider-leader-election", "vk")]["rules"]
    assert [r.get("resourceNames") for r in election] == [None, ["vk-provider-leader-gpu-pool-2"]]
    for team in ("team-a", "team-b"):
        role = by[("Role", "r-vk-provider-pod-values", team)]
        assert role["rules"] == [
            {"apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": ["get"]}
        ]
        binding = by[("RoleBinding", "r-vk-provider-pod-values", team)]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "r-vk-provider", "namespace": "vk"}
        ]


def test_several_nodes_render_an_agent_each_sharing_the_account_and_roles(
    helm: Path, tmp_path: Path
) -> None:
    """`nodes`: a ConfigMap, Deployment and Service per node, selecting only its own agent's
    pods, its config the base merged with its own; one ServiceAccount whose roles name every
    node and every node's Lease."""
    values = {"config": {"workers": 8}, "nodes": _two_nodes()}
    rendered = _run(
        [str(helm), "template", "r", str(CHART), "-f", str(_values_file(tmp_path, values))]
    )
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"] == [
        "r-vk-provider"
    ]
    selectors = set()
    for node, provider, replicas in (("gpu-a", "la", 1), ("gpu-b", "lb", 2)):
        name = f"r-vk-provider-{node}"
        config = yaml.safe_load(by[("ConfigMap", name)]["data"]["config.yaml"])
        assert config["node"]["name"] == node
        assert [p["name"] for p in config["providers"]] == [provider]
        assert config["workers"] == 8  # the base config under the node's own
        deployment = by[("Deployment", name)]
        assert deployment["spec"]["replicas"] == replicas
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector["vk-provider.io/node-agent"] == name
        template = deployment["spec"]["template"]
        assert selector.items() <= template["metadata"]["labels"].items()
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        assert volumes["config"]["configMap"]["name"] == name
        assert by[("Service", name)]["spec"]["selector"] == selector
        selectors.add(tuple(sorted(selector.items())))
    assert len(selectors) == 2  # no Deployment adopts the other's pods
    assert yaml.safe_load(by[("ConfigMap", "r-vk-provider-gpu-a")]["data"]["config.yaml"])["node"][
        "labels"
    ] == {"pool": "a"}
    named = [
        r["resourceNames"]
        for r in by[("ClusterRole", "r-vk-provider")]["rules"]
        if "resourceNames" in r
    ]
    assert named == [["gpu-a", "gpu-b"], ["gpu-a", "gpu-b"]]
    election = by[("Role", "r-vk-provider-leader-election")]["rules"]
    assert [r.get("resourceNames") for r in election] == [
        None,
        ["vk-provider-leader-gpu-a", "vk-provider-leader-gpu-b"],
    ]


def test_template_passes_a_server_side_dry_run(
    helm: Path, control_plane: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    """The API server validates every object against its OpenAPI schema (fields, types,
    RBAC roles it would grant) without storing anything."""
    for identity in ("serviceAccount", "node"):
        values = _values_file(
            tmp_path,
            {
                "identity": identity,
                "nodeName": f"vk-dry-{identity.lower()}",
                "deschedulerPolicy": {"enabled": True},
                "credentials": [{"env": "RUNPOD_API_KEY", "secretName": "runpod", "key": "k"}],
                "config": {"providers": [{"type": "local", "name": "l", "offers": []}]},
            },
        )
        rendered = _helm(
            helm,
            control_plane.kubeconfig,
            "template",
            "dry",
            str(CHART),
            "-n",
            namespace,
            "-f",
            str(values),
        )
        assert rendered.returncode == 0, rendered.stderr
        kinds = {d["kind"] for d in yaml.safe_load_all(rendered.stdout) if d}
        assert {"Deployment", "ConfigMap", "ServiceAccount", "ClusterRole"} <= kinds
        applied = _kubectl(
            control_plane.kubeconfig,
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "-f",
            "-",
            stdin=rendered.stdout,
        )
        assert applied.returncode == 0, applied.stderr
        assert "(server dry run)" in applied.stdout


async def _service_account_kubeconfig(
    core: client.CoreV1Api, control_plane: LocalCluster, namespace: str, name: str, path: Path
) -> Path:
    request = {"spec": {"audiences": [], "expirationSeconds": 3600}}
    token = (
        await core.create_namespaced_service_account_token(name, namespace, request)
    ).status.token
    admin: dict[str, Any] = yaml.safe_load(control_plane.kubeconfig.read_text())
    admin["users"] = [{"name": name, "user": {"token": token}}]
    admin["contexts"][0]["context"]["user"] = name
    path.write_text(yaml.safe_dump(admin))
    return path


async def _deployment_env(
    core: client.CoreV1Api, namespace: str, deployment: dict[str, Any]
) -> dict[str, str]:
    """The agent container's env as a kubelet resolves it (secretKeyRef read from the Secret;
    the downward API's pod name and namespace as they would be for the Deployment's pod)."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    pod_fields = {
        "metadata.name": f"{deployment['metadata']['name']}-0",
        "metadata.namespace": namespace,
    }
    env: dict[str, str] = {}
    for entry in container.get("env") or []:
        ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
        field_ref = (entry.get("valueFrom") or {}).get("fieldRef")
        if field_ref:
            if field_ref["fieldPath"] in pod_fields:  # status.podIP: no pod here
                env[entry["name"]] = pod_fields[field_ref["fieldPath"]]
        elif ref:
            secret = await core.read_namespaced_secret(ref["name"], namespace)
            env[entry["name"]] = base64.b64decode(secret.data[ref["key"]]).decode()
        elif "value" in entry:
            env[entry["name"]] = entry["value"]
    return env


def _api_server(control_plane: LocalCluster) -> str:
    kubeconfig = yaml.safe_load(control_plane.kubeconfig.read_text())
    return str(kubeconfig["clusters"][0]["cluster"]["server"])


def _as_node(agent: AgentProcess, control_plane: LocalCluster) -> httpx.AsyncClient:
    """A client that is exactly the agent's node identity (its certificate and key)."""
    directory = agent.state_dir / "node-identity"
    context = ssl.create_default_context(cafile=str(control_plane.pki.ca.cert))
    context.load_cert_chain(directory / "node-client.crt", directory / "node-client.key")
    return httpx.AsyncClient(base_url=_api_server(control_plane), verify=context, timeout=30)


def _as_token(token: str, control_plane: LocalCluster) -> httpx.AsyncClient:
    context = ssl.create_default_context(cafile=str(control_plane.pki.ca.cert))
    return httpx.AsyncClient(
        base_url=_api_server(control_plane),
        verify=context,
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


async def _kubelet_port(api: KubeClient, node: str) -> int | None:
    body = await api.get_node(node)
    endpoint = ((body or {}).get("status") or {}).get("daemonEndpoints") or {}
    return int((endpoint.get("kubeletEndpoint") or {}).get("Port") or 0) or None


@pytest.mark.parametrize("identity", ["serviceAccount", "node"])
async def test_install_then_the_agent_runs_with_what_the_chart_created(
    identity: str,
    helm: Path,
    control_plane: LocalCluster,
    kube: ApiClient,
    api: KubeClient,
    agents: AgentHarness,
    namespace: str,
    tmp_path: Path,
) -> None:
    core = client.CoreV1Api(kube)
    node_name = f"vk-{uuid.uuid4().hex[:8]}"
    release = f"r{uuid.uuid4().hex[:6]}"
    secret_value = f"s3cret-{uuid.uuid4().hex[:6]}"
    for name, data in (
        ("vk-credentials", {"rest-token": "chart-rest-token"}),
        ("pod-secret", {"value": secret_value}),
        ("unrelated", {"value": "not yours"}),
    ):
        await core.create_namespaced_secret(
            namespace, client.V1Secret(metadata=client.V1ObjectMeta(name=name), string_data=data)
        )
    instances = tmp_path / "instances" / "local-a"
    values = {
        "identity": identity,
        "nodeName": node_name,
        "deschedulerPolicy": {"enabled": True},
        "credentials": [
            {"env": "VK_REST_TOKEN", "secretName": "vk-credentials", "key": "rest-token"}
        ],
        "config": {
            "node": {"address": "127.0.0.1"},
            "kubelet_api": {
                "listen": "127.0.0.1:0",
                "client_ca_file": str(control_plane.pki.ca.cert),
            },
            "rest": {"listen": "127.0.0.1:0", "static_token": "env:VK_REST_TOKEN"},
            "intervals": {"lease_seconds": 2, "node_status_seconds": 5, "pod_status_seconds": 0.5},
            # The shortest lifetime a CSR may ask (600 s), renewed at a tenth: within a minute.
            "identity": {"certificate_seconds": 600, "renew_fraction": 0.1},
            "providers": [
                {
                    "type": "local",
                    "name": "local-a",
                    "enabled": True,
                    "state_dir": str(instances),
                    "offers": DEFAULT_OFFERS,
                }
            ],
        },
    }
    installed = _helm(
        helm,
        control_plane.kubeconfig,
        "install",
        release,
        str(CHART),
        "-n",
        namespace,
        "-f",
        str(_values_file(tmp_path, values)),
    )
    assert installed.returncode == 0, installed.stderr
    assert "What to run next" in installed.stdout  # NOTES.txt
    agent: AgentProcess | None = None
    try:
        fullname = f"{release}-vk-provider"
        apps = client.AppsV1Api(kube)
        deployment = kube.sanitize_for_serialization(
            await apps.read_namespaced_deployment(fullname, namespace)
        )
        pod_spec = deployment["spec"]["template"]["spec"]
        assert pod_spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
        dashboards = await core.list_namespaced_config_map(
            namespace, label_selector="grafana_dashboard=1"
        )
        assert [json.loads(c.data["vk-provider.json"])["title"] for c in dashboards.items]
        policy = await core.read_namespaced_config_map(f"{fullname}-descheduler-policy", namespace)
        assert "RemovePodsViolatingNodeTaints" in policy.data["policy.yaml"]

        config_map = await core.read_namespaced_config_map(fullname, namespace)
        config_path = tmp_path / "config.yaml"
        config_path.write_text(config_map.data["config.yaml"])
        kubeconfig = await _service_account_kubeconfig(
            core,
            control_plane,
            namespace,
            pod_spec["serviceAccountName"],
            tmp_path / "sa.kubeconfig",
        )
        agent = AgentProcess(
            node=node_name,
            config_path=config_path,
            state_dir=tmp_path / "state",
            log_path=tmp_path / "agent.log",
            kubeconfig=kubeconfig,
            provider_dirs={"local-a": instances},
            env=await _deployment_env(core, namespace, deployment),
        )
        agents.agents.append(agent)  # stopped, its instances ended and its node deleted
        agent.start()

        async def ready() -> bool:
            node = await api.get_node(node_name)
            conditions = (node or {}).get("status", {}).get("conditions") or []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        await wait_for(
            ready, timeout=90, what=f"node Ready ({identity}); log:\n{agent.log_text()[-2000:]}"
        )

        async def rest_url() -> str | None:
            return agent.rest_url()

        # The chart's default serving certificate: the cluster signs it once an operator
        # approves the node's request (docs/kubelet-api.md); until then no handshake.
        port = await wait_for(
            lambda: _kubelet_port(api, node_name), timeout=30, what="the kubelet port"
        )
        assert not serves_a_certificate_of(control_plane, node_name, "127.0.0.1")

        async def request() -> str | None:
            # By signer: with identity: node its client certificate request is labelled too.
            listed = _kubectl(
                control_plane.kubeconfig,
                "get", "csr", "-l", f"vk-provider.io/node={node_name}",
                "--field-selector", "spec.signerName=kubernetes.io/kubelet-serving", "-o", "name",
            )  # fmt: skip
            names = listed.stdout.split()
            return names[-1].rpartition("/")[2] if listed.returncode == 0 and names else None

        csr = await wait_for(request, timeout=60, what="the serving certificate request")
        approved = _kubectl(control_plane.kubeconfig, "certificate", "approve", csr)
        assert approved.returncode == 0, approved.stderr

        async def signed() -> bool:
            return serves_a_certificate_of(control_plane, node_name, "127.0.0.1")

        await wait_for(signed, timeout=60, what=f"the kubelet API on {port} serving it")

        base = await wait_for(rest_url, timeout=30, what="the REST API to listen")
        async with httpx.AsyncClient(base_url=base, timeout=10) as rest:
            # The credential came from the Secret through the Deployment's env.
            token = {"Authorization": "Bearer chart-rest-token"}
            assert (await rest.get("/v1/providers", headers=token)).status_code == 200

        command = [sys.executable, "-c", "import os; print(os.environ['FROM_SECRET'], flush=True)"]
        env = [
            {
                "name": "FROM_SECRET",
                "valueFrom": {"secretKeyRef": {"name": "pod-secret", "key": "value"}},
            }
        ]
        await core.create_namespaced_pod(
            namespace,
            pod_on(
                node_name,
                "chart-pod",
                command=command,
                restart_policy="Never",
                container={"env": env},
            ),
        )

        async def succeeded() -> bool:
            pod = await api.get_pod(namespace, "chart-pod")
            return (pod or {}).get("status", {}).get("phase") == "Succeeded"

        await wait_for(
            succeeded, timeout=90, what=f"the pod to succeed; log:\n{agent.log_text()[-2000:]}"
        )
        logs = _kubectl(control_plane.kubeconfig, "logs", "-n", namespace, "chart-pod")
        assert logs.stdout.strip() == secret_value, logs.stderr

        if identity == "node":
            certificate = x509.load_pem_x509_certificate(
                (agent.state_dir / "node-identity" / "node-client.crt").read_bytes()
            )
            subject = certificate.subject
            assert (
                subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
                == f"system:node:{node_name}"
            )
            assert (
                subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:nodes"
            )
            secrets = f"/api/v1/namespaces/{namespace}/secrets"
            async with _as_node(agent, control_plane) as as_node:
                # Its pod references pod-secret: the Node authorizer lets the node read it...
                assert (await as_node.get(f"{secrets}/pod-secret")).status_code == 200
                # ...and no other Secret, nor the list of them.
                refused = await as_node.get(f"{secrets}/unrelated")
                assert refused.status_code == 403, refused.text
                assert f"system:node:{node_name}" in refused.json()["message"]
                assert (await as_node.get(secrets)).status_code == 403
            pod = await api.get_pod(namespace, "chart-pod")
            assert pod is not None
            assert pod["metadata"]["annotations"]["vk-provider.io/provider"] == "local-a"
            # The ServiceAccount, for its part, reads no Secret at all.
            sa_token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
            async with _as_token(sa_token, control_plane) as as_sa:
                assert (await as_sa.get(f"{secrets}/pod-secret")).status_code == 403

            # Approved by the csrapproving controller (the nodeclient ClusterRole), not by us.
            certificates = client.CertificatesV1Api(kube)
            selector = f"vk-provider.io/node={node_name}"
            client_csrs = f"spec.signerName={NODE_CLIENT_SIGNER}"  # not the serving one
            csrs = await certificates.list_certificate_signing_request(
                label_selector=selector, field_selector=client_csrs
            )
            assert csrs.items
            for csr in csrs.items:
                approved = [c for c in csr.status.conditions if c.type == "Approved"]
                assert approved and approved[0].reason == "AutoApproved", csr.status.conditions

            # Renewal: a new certificate before the old one expires, and the agent goes on
            # working through it (a second pod runs with its Secret).
            first_serial = certificate.serial_number
            cert_file = agent.state_dir / "node-identity" / "node-client.crt"

            async def renewed() -> bool:
                fresh = x509.load_pem_x509_certificate(cert_file.read_bytes())
                return fresh.serial_number != first_serial

            await wait_for(renewed, timeout=150, interval=1, what="the node certificate renewed")
            renewals = await certificates.list_certificate_signing_request(
                label_selector=selector, field_selector=client_csrs
            )
            assert len(renewals.items) >= 2
            await core.create_namespaced_pod(
                namespace,
                pod_on(
                    node_name,
                    "after-renewal",
                    command=command,
                    restart_policy="Never",
                    container={"env": env},
                ),
            )

            async def renewed_pod_succeeded() -> bool:
                pod = await api.get_pod(namespace, "after-renewal")
                return (pod or {}).get("status", {}).get("phase") == "Succeeded"

            await wait_for(renewed_pod_succeeded, timeout=90, what="a pod after the renewal")
            assert await ready()
            await core.delete_namespaced_pod("after-renewal", namespace)

        await core.delete_namespaced_pod("chart-pod", namespace)

        async def gone() -> bool:
            return await api.get_pod(namespace, "chart-pod") is None

        await wait_for(gone, timeout=30, what="the pod to be deleted")
        assert "Forbidden" not in agent.log_text(), agent.log_text()[-3000:]
    finally:
        if agent is not None:
            agent.stop()  # before its RBAC goes with the release
        uninstalled = _helm(helm, control_plane.kubeconfig, "uninstall", release, "-n", namespace)
        assert uninstalled.returncode == 0, uninstalled.stderr
    roles = _kubectl(control_plane.kubeconfig, "get", "clusterrole", "-o", "name")
    assert release not in roles.stdout  # cluster-scoped objects go with the release


async def test_two_nodes_install_runs_an_agent_per_node_each_leading_its_own_lease(
    helm: Path,
    control_plane: LocalCluster,
    kube: ApiClient,
    api: KubeClient,
    agents: AgentHarness,
    namespace: str,
    tmp_path: Path,
) -> None:
    """Sharding: `nodes` [a, b] installs two agents' objects; each agent, run with its own
    ConfigMap, Deployment env and the shared ServiceAccount, registers its node with its
    labels, leads the Lease of its node, and runs the pods the scheduler puts on its node,
    with its own providers; neither is refused a call by the shared roles."""
    core = client.CoreV1Api(kube)
    coordination = client.CoordinationV1Api(kube)
    apps = client.AppsV1Api(kube)
    run = uuid.uuid4().hex[:6]
    release = f"r{run}"
    pool = "vk-provider.io/test-pool"
    nodes: dict[str, dict[str, Any]] = {}
    for shard in ("a", "b"):
        nodes[shard] = {
            "name": f"vk-{run}-{shard}",
            "labels": {pool: f"{run}-{shard}"},
            "config": _local(
                f"local-{shard}",
                enabled=True,
                state_dir=str(tmp_path / "instances" / shard),
                offers=DEFAULT_OFFERS,
            ),
        }
    values = {
        "nodes": list(nodes.values()),
        "config": {
            "node": {"address": "127.0.0.1"},
            "kubelet_api": {"listen": "127.0.0.1:0", "serving": {"source": "self-signed"}},
            "rest": {"listen": "127.0.0.1:0"},
            "intervals": {"lease_seconds": 2, "node_status_seconds": 5, "pod_status_seconds": 0.5},
        },
    }
    installed = _helm(
        helm,
        control_plane.kubeconfig,
        "install",
        release,
        str(CHART),
        "-n",
        namespace,
        "-f",
        str(_values_file(tmp_path, values)),
    )
    assert installed.returncode == 0, installed.stderr
    running: dict[str, AgentProcess] = {}
    try:
        for shard, node in nodes.items():
            obj = f"{release}-vk-provider-{node['name']}"
            deployment = kube.sanitize_for_serialization(
                await apps.read_namespaced_deployment(obj, namespace)
            )
            config_map = await core.read_namespaced_config_map(obj, namespace)
            config_path = tmp_path / f"config-{shard}.yaml"
            config_path.write_text(config_map.data["config.yaml"])
            kubeconfig = await _service_account_kubeconfig(
                core,
                control_plane,
                namespace,
                deployment["spec"]["template"]["spec"]["serviceAccountName"],
                tmp_path / f"sa-{shard}.kubeconfig",
            )
            agent = AgentProcess(
                node=node["name"],
                config_path=config_path,
                state_dir=tmp_path / f"state-{shard}",
                log_path=tmp_path / f"agent-{shard}.log",
                kubeconfig=kubeconfig,
                provider_dirs={f"local-{shard}": tmp_path / "instances" / shard},
                env=await _deployment_env(core, namespace, deployment),
            )
            agents.agents.append(agent)  # stopped, its instances ended and its node deleted
            running[shard] = agent
            agent.start()

        for shard, node in nodes.items():
            agent = running[shard]
            holder = f"{release}-vk-provider-{node['name']}-0"  # its pod's name (POD_NAME)

            async def ready(name: str = node["name"]) -> dict[str, Any] | None:
                body = await api.get_node(name)
                conditions = (body or {}).get("status", {}).get("conditions") or []
                ok = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
                return body if ok else None

            body = await wait_for(
                ready, timeout=90, what=f"node {shard} Ready; log:\n{agent.log_text()[-2000:]}"
            )
            assert body["metadata"]["labels"][pool] == f"{run}-{shard}"
            lease = await coordination.read_namespaced_lease(
                f"vk-provider-leader-{node['name']}", namespace
            )
            assert lease.spec.holder_identity == holder

        # The scheduler places a pod by b's label: b's agent runs it, with b's provider.
        pod = pod_on(
            nodes["b"]["name"],
            "on-b",
            command=[sys.executable, "-c", "print('on b', flush=True)"],
            restart_policy="Never",
            spec={"nodeSelector": {pool: f"{run}-b"}},
        )
        await core.create_namespaced_pod(namespace, pod)

        async def succeeded() -> dict[str, Any] | None:
            body = await api.get_pod(namespace, "on-b")
            return body if (body or {}).get("status", {}).get("phase") == "Succeeded" else None

        done = await wait_for(
            succeeded, timeout=90, what=f"the pod on b; log:\n{running['b'].log_text()[-2000:]}"
        )
        assert done["spec"]["nodeName"] == nodes["b"]["name"]
        assert done["metadata"]["annotations"]["vk-provider.io/provider"] == "local-b"
        await core.delete_namespaced_pod("on-b", namespace)

        async def gone() -> bool:
            return await api.get_pod(namespace, "on-b") is None

        await wait_for(gone, timeout=30, what="the pod on b to be deleted")
        for shard, agent in running.items():
            assert "Forbidden" not in agent.log_text(), (shard, agent.log_text()[-3000:])
    finally:
        for agent in running.values():
            agent.stop()  # before their RBAC goes with the release
        uninstalled = _helm(helm, control_plane.kubeconfig, "uninstall", release, "-n", namespace)
        assert uninstalled.returncode == 0, uninstalled.stderr
