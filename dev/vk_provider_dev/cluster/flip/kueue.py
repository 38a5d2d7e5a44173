"""Kueue v0.19 beside the local control plane: training Jobs queued, admitted and preempted
by quota, as a real cluster with Kueue installed does it.

``start_kueue`` installs Kueue's CRDs (server-side apply: they are too large for the
last-applied annotation), issues a serving certificate for 127.0.0.1 from the cluster's CA,
runs the manager outside the cluster (no leader election, ``batch/job`` the only integration,
system namespaces not managed) and registers its webhooks by URL once they answer, with the
cluster CA as their ``caBundle``. Kueue's internal certificate manager cannot be used: it
issues certificates for ``<service>.<namespace>.svc`` only, which the API server cannot
reach without cluster DNS. With it off, Kueue reads its metrics certificate from the fixed
path ``/etc/kueue/metrics/certs``: the manager runs in a mount namespace of its own with an
overlay on ``/etc`` (``unshare``), so nothing is written to the machine's ``/etc``.

``stop`` removes the webhook configurations first: they fail closed (``failurePolicy:
Fail``), so while Kueue is down no Job or Kueue object could be written.

Invariants: only the webhooks of the Kueue API and of batch/v1 Jobs are registered (pods and
Deployments, inference, are not Kueue's); the webhook configurations exist only while the
manager runs; ``kueue_config`` and ``webhook_configurations`` are pure.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import os
import shlex
import ssl
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from vk_provider_dev.cluster import pki as pki_mod
from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.errors import ClusterError
from vk_provider_dev.cluster.flip.adminapi import AdminApi
from vk_provider_dev.cluster.flip.child import ChildProcess, RunningComponent, http_ok
from vk_provider_dev.cluster.ports import free_ports

JSON = dict[str, Any]
NAMESPACE: Final = "kueue-system"
CRDS: Final = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MUTATING: Final = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
VALIDATING: Final = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
WEBHOOK_NAME: Final = "vk-dev-kueue"
# Webhook paths kept: the Kueue API's own objects, and batch/v1 Jobs (training).
KEPT_PATHS: Final = ("-kueue-x-k8s-io-", "-batch-v1-job")
SYSTEM_NAMESPACES: Final = ("kube-system", "kube-node-lease", "kube-public", NAMESPACE)
METRICS_CERTS: Final = "/etc/kueue/metrics/certs"


@dataclass(frozen=True, slots=True)
class KueueFiles:
    """The kueue binary and the manifests copied beside it from its module's source."""

    binary: Path
    crds: Path  # directory of CRD YAMLs
    webhooks: Path  # config/components/webhook/manifests.yaml


def kueue_config(*, webhook_port: int, health_port: int, metrics_port: int, cert_dir: Path) -> JSON:
    """Kueue's Configuration for a manager outside the cluster."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "managedJobsNamespaceSelector": {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": list(SYSTEM_NAMESPACES),
                }
            ]
        },
        "integrations": {"frameworks": ["batch/job"]},
        "clientConnection": {"qps": 100, "burst": 200},
    }


def webhook_configurations(
    manifests: Iterable[Mapping[str, Any]], *, base_url: str, ca_bundle: bytes
) -> list[JSON]:
    """Kueue's webhook configurations for a manager at ``base_url``: only the kept hooks,
    each called by URL with ``ca_bundle``, and every hook kept out of system namespaces."""
    configurations = []
    for manifest in manifests:
        if manifest.get("kind") not in (
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        ):
            continue
        kept = []
        for hook in manifest.get("webhooks") or []:
            path = str(((hook.get("clientConfig") or {}).get("service") or {}).get("path", ""))
            if not any(part in path for part in KEPT_PATHS):
                continue
            hook = copy.deepcopy(dict(hook))
            hook["clientConfig"] = {
                "url": f"{base_url}{path}",
                "caBundle": base64.b64encode(ca_bundle).decode(),
            }
            hook["namespaceSelector"] = {
                "matchExpressions": [
                    {
                        "key": "kubernetes.io/metadata.name",
                        "operator": "NotIn",
                        "values": list(SYSTEM_NAMESPACES),
                    }
                ]
            }
            kept.append(hook)
        configurations.append(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": manifest["kind"],
                "metadata": {"name": WEBHOOK_NAME},
                "webhooks": kept,
            }
        )
    return configurations


def manager_command(binary: Path, *, config: Path, cert_dir: Path, work: Path) -> list[str]:
    """Kueue in a mount namespace of its own, its metrics certificate where it insists."""
    inner = " && ".join(
        [
            f"mount -t overlay overlay -o lowerdir=/etc,upperdir={work / 'upper'},"
            f"workdir={work / 'overlay-work'} /etc",
            f"mkdir -p {METRICS_CERTS}",
            f"cp {shlex.quote(str(cert_dir / 'tls.crt'))} {shlex.quote(str(cert_dir / 'tls.key'))}"
            f" {METRICS_CERTS}/",
            "exec "
            + shlex.join(
                [
                    str(binary),
                    f"--config={config}",
                    "--feature-gates=VisibilityOnDemand=false",
                    "--zap-log-level=info",
                ]
            ),
        ]
    )
    isolate = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        isolate[1:1] = ["--user", "--map-root-user"]
    return [*isolate, "sh", "-c", inner]


@dataclass(slots=True)
class Kueue(RunningComponent):
    """A running Kueue manager and its registered webhooks (``start_kueue``)."""

    child: ChildProcess
    api: AdminApi
    webhook_port: int

    def stop(self) -> None:
        for collection in (MUTATING, VALIDATING):
            with contextlib.suppress(Exception):
                self.api.delete(f"{collection}/{WEBHOOK_NAME}")
        self.child.stop()


def _documents(path: Path) -> list[JSON]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def install_crds(api: AdminApi, crds: Path) -> list[str]:
    """Kueue's CRDs, server-side applied; their names once every one is Established."""
    names = []
    for path in sorted(crds.glob("kueue.x-k8s.io_*.yaml")):
        for crd in _documents(path):
            name = crd["metadata"]["name"]
            api.apply(f"{CRDS}/{name}", crd, field_manager="vk-provider-dev")
            names.append(name)
    for name in names:
        api.wait(
            f"{CRDS}/{name}",
            lambda crd: any(
                c.get("type") == "Established" and c.get("status") == "True"
                for c in (crd.get("status") or {}).get("conditions") or []
            ),
            timeout=60,
            what=f"CRD {name} Established",
        )
    return names


def _answers_tls(port: int, ca: Path) -> bool:
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}/healthz-not-a-hook", context=context, timeout=2
        ):
            return True
    except urllib.error.HTTPError:
        return True  # it answered over TLS with a certificate the CA signed
    except (OSError, ssl.SSLError):
        return False


def start_kueue(
    cluster: LocalCluster, files: KueueFiles, *, directory: Path, api: AdminApi
) -> Kueue:
    """Install and start Kueue; on return its webhooks are registered and it is ready."""
    directory.mkdir(parents=True, exist_ok=True)
    install_crds(api, files.crds)
    api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}}, exist_ok=True)
    certs = directory / "certs"
    certs.mkdir(exist_ok=True)
    pki_mod.issue_certificate(
        cluster.pki.ca,
        pki_mod.CertPair(cert=certs / "tls.crt", key=certs / "tls.key"),
        common_name="kueue-webhook",
        server=True,
        ip_addresses=("127.0.0.1",),
    )
    for part in ("upper", "overlay-work"):
        (directory / part).mkdir(exist_ok=True)
    webhook_port, health_port, metrics_port = free_ports(3)
    config = directory / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            kueue_config(
                webhook_port=webhook_port,
                health_port=health_port,
                metrics_port=metrics_port,
                cert_dir=certs,
            )
        )
    )
    ready = http_ok(f"http://127.0.0.1:{health_port}/readyz")
    child = ChildProcess.start(
        "kueue",
        manager_command(files.binary, config=config, cert_dir=certs, work=directory),
        log_file=directory / "kueue.log",
        health=lambda: ready() and _answers_tls(webhook_port, cluster.pki.ca.cert),
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        cwd=directory,
        timeout=120,
    )
    kueue = Kueue(child=child, api=api, webhook_port=webhook_port)
    try:
        for configuration in webhook_configurations(
            _documents(files.webhooks),
            base_url=f"https://127.0.0.1:{webhook_port}",
            ca_bundle=cluster.pki.ca.cert.read_bytes(),
        ):
            collection = (
                MUTATING if configuration["kind"] == "MutatingWebhookConfiguration" else VALIDATING
            )
            api.create(collection, configuration, exist_ok=True)
    except BaseException:
        kueue.stop()
        raise
    if not child.running:
        raise ClusterError(f"kueue exited: {child.log_file}")
    return kueue
