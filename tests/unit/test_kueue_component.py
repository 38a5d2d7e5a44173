"""Kueue beside the local control plane, the pure parts (``vk_provider_dev.cluster.flip.kueue``):
its configuration, its webhooks by URL, and the command that gives it a private /etc."""

from __future__ import annotations

import base64
from pathlib import Path

from vk_provider_dev.cluster.flip import kueue


def _hook(name: str, path: str) -> dict[str, object]:
    return {
        "name": name,
        "clientConfig": {
            "service": {"name": "webhook-service", "namespace": "system", "path": path}
        },
        "failurePolicy": "Fail",
        "rules": [{"operations": ["CREATE"]}],
    }


MANIFESTS = [
    {
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "mutating-webhook-configuration"},
        "webhooks": [
            _hook("mjob.kb.io", "/mutate-batch-v1-job"),
            _hook("mpod.kb.io", "/mutate--v1-pod"),
            _hook("mdeployment.kb.io", "/mutate-apps-v1-deployment"),
            _hook("mworkload.kb.io", "/mutate-kueue-x-k8s-io-v1beta2-workload"),
            _hook("mrayjob.kb.io", "/mutate-ray-io-v1-rayjob"),
        ],
    },
    {
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "validating-webhook-configuration"},
        "webhooks": [_hook("vclusterqueue.kb.io", "/validate-kueue-x-k8s-io-v1beta2-clusterqueue")],
    },
    {"kind": "Service", "metadata": {"name": "webhook-service"}},
]


def test_only_the_kueue_api_and_job_hooks_are_registered_by_url() -> None:
    found = kueue.webhook_configurations(
        MANIFESTS, base_url="https://127.0.0.1:9443", ca_bundle=b"CA PEM"
    )
    assert [c["kind"] for c in found] == [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ]
    mutating = found[0]["webhooks"]
    assert [h["name"] for h in mutating] == ["mjob.kb.io", "mworkload.kb.io"]
    assert mutating[0]["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate-batch-v1-job",
        "caBundle": base64.b64encode(b"CA PEM").decode(),
    }
    assert mutating[0]["failurePolicy"] == "Fail"  # kept as Kueue ships it
    excluded = mutating[0]["namespaceSelector"]["matchExpressions"][0]
    assert excluded["operator"] == "NotIn" and "kube-system" in excluded["values"]
    assert all(c["metadata"]["name"] == kueue.WEBHOOK_NAME for c in found)
    assert MANIFESTS[0]["webhooks"][0]["clientConfig"]["service"]  # the input is not changed


def test_the_configuration_runs_outside_the_cluster_for_jobs_only(tmp_path: Path) -> None:
    config = kueue.kueue_config(
        webhook_port=9443, health_port=8081, metrics_port=8443, cert_dir=tmp_path
    )
    assert config["webhook"] == {"host": "127.0.0.1", "port": 9443, "certDir": str(tmp_path)}
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["internalCertManagement"] == {"enable": False}
    assert config["integrations"] == {"frameworks": ["batch/job"]}
    assert config["manageJobsWithoutQueueName"] is False
    assert config["health"]["healthProbeBindAddress"].startswith("127.0.0.1:")
    assert config["metrics"]["bindAddress"].startswith("127.0.0.1:")


def test_the_manager_gets_a_private_etc_for_its_fixed_metrics_certificate(tmp_path: Path) -> None:
    argv = kueue.manager_command(
        tmp_path / "kueue", config=tmp_path / "c.yaml", cert_dir=tmp_path / "certs", work=tmp_path
    )
    assert argv[0] == "unshare" and "--mount" in argv
    script = argv[-1]
    assert f"upperdir={tmp_path / 'upper'}" in script and "lowerdir=/etc" in script
    assert "mkdir -p /etc/kueue/metrics/certs" in script
    assert script.rstrip().endswith("--zap-log-level=info")
    assert "--feature-gates=VisibilityOnDemand=false" in script
