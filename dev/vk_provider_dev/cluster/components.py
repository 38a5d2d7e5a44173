"""The control plane's command lines and configuration files, as pure functions.

``LocalCluster`` (``cluster.py``) decides where things live and when processes start; this
module only says what each component is started with, so a flag is changed in one place.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

import yaml

from vk_provider_dev.cluster import pki as pki_mod
from vk_provider_dev.cluster.binaries import Binaries


@dataclass(frozen=True, slots=True)
class ClusterPorts:
    apiserver: int
    etcd_client: int
    etcd_peer: int
    controller_manager: int
    scheduler: int

    def by_component(self) -> dict[str, tuple[int, ...]]:
        return {
            "etcd": (self.etcd_client, self.etcd_peer),
            "kube-apiserver": (self.apiserver,),
            "kube-controller-manager": (self.controller_manager,),
            "kube-scheduler": (self.scheduler,),
        }


def kubeconfig_text(
    name: str, apiserver_port: int, *, ca: Path, client: pki_mod.CertPair, user: str
) -> str:
    """A kubeconfig for ``user`` with its client certificate, the cluster CA inlined."""

    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    context = f"vk-{name}"
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": context,
                "cluster": {
                    "server": f"https://127.0.0.1:{apiserver_port}",
                    "certificate-authority-data": b64(ca),
                },
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(client.cert),
                    "client-key-data": b64(client.key),
                },
            }
        ],
        "contexts": [{"name": context, "context": {"cluster": context, "user": user}}],
        "current-context": context,
    }
    return yaml.safe_dump(document, sort_keys=False)


# The namespace whose ServiceAccounts the API server audits (deploy/namespace.yaml): the
# agent's identity when it runs as deploy/rbac.yaml sets it up. Their requests, at Metadata
# level, land in audit.log in the cluster's directory: who called which verb on which object
# and what the answer was, which is how the tests derive the agent's RBAC from its calls.
AUDITED_NAMESPACE = "vk-provider"


def audit_policy() -> str:
    """Metadata for the audited ServiceAccounts' requests, nothing for anyone else's."""
    return yaml.safe_dump(
        {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [
                {
                    "level": "Metadata",
                    "userGroups": [f"system:serviceaccounts:{AUDITED_NAMESPACE}"],
                },
                {"level": "None"},
            ],
        },
        sort_keys=False,
    )


def scheduler_config(kubeconfig: Path) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "leaderElection": {"leaderElect": False},
        }
    )


def commands(
    name: str,
    directory: Path,
    pki: pki_mod.ClusterPKI,
    binaries: Binaries,
    ports: ClusterPorts,
    service_cidr: str,
) -> dict[str, list[str]]:
    """Every component's command line, in start order."""
    d = directory
    p = pki
    etcd_url = f"http://127.0.0.1:{ports.etcd_client}"
    peer_url = f"http://127.0.0.1:{ports.etcd_peer}"
    cm_kubeconfig = str(d / "controller-manager.kubeconfig")
    sched_kubeconfig = str(d / "scheduler.kubeconfig")
    return {
        "etcd": [
            str(binaries.etcd),
            f"--name=vk-{name}",
            f"--data-dir={d / 'etcd-data'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=vk-{name}={peer_url}",
            # Development and test clusters trade durability for speed.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ],
        "kube-apiserver": [
            str(binaries.kube_apiserver),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={ports.apiserver}",
            f"--cert-dir={d / 'apiserver-certs'}",
            f"--tls-cert-file={p.apiserver.cert}",
            f"--tls-private-key-file={p.apiserver.key}",
            f"--client-ca-file={p.ca.cert}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p.service_account_pub}",
            f"--service-account-signing-key-file={p.service_account_key}",
            f"--service-cluster-ip-range={service_cidr}",
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            f"--kubelet-client-certificate={p.kubelet_client.cert}",
            f"--kubelet-client-key={p.kubelet_client.key}",
            "--kubelet-preferred-address-types=InternalIP,Hostname,ExternalIP",
            # The aggregation layer (metrics.k8s.io from metrics-server): the API server
            # proxies as front-proxy-client; extension servers trust the request headers it
            # sets once that certificate checks out against the front-proxy CA.
            f"--requestheader-client-ca-file={p.front_proxy_ca.cert}",
            f"--requestheader-allowed-names={pki_mod.FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={p.front_proxy_client.cert}",
            f"--proxy-client-key-file={p.front_proxy_client.key}",
            f"--audit-policy-file={d / 'audit-policy.yaml'}",
            f"--audit-log-path={d / 'audit.log'}",
            "--audit-log-format=json",
            "--audit-log-maxsize=200",
            "--audit-log-maxbackup=1",
            "--profiling=false",
            "--v=1",
        ],
        "kube-controller-manager": [
            str(binaries.kube_controller_manager),
            f"--kubeconfig={cm_kubeconfig}",
            f"--authentication-kubeconfig={cm_kubeconfig}",
            f"--authorization-kubeconfig={cm_kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.controller_manager}",
            f"--cert-dir={d / 'controller-manager-certs'}",
            "--leader-elect=false",
            "--controllers=*",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={p.service_account_key}",
            f"--root-ca-file={p.ca.cert}",
            f"--cluster-signing-cert-file={p.ca.cert}",
            f"--cluster-signing-key-file={p.ca.key}",
            f"--service-cluster-ip-range={service_cidr}",
            "--allocate-node-cidrs=false",
            # Short timings so NotReady nodes and controller reactions show up in tests.
            "--node-monitor-period=2s",
            "--node-monitor-grace-period=20s",
            "--horizontal-pod-autoscaler-sync-period=5s",
            "--profiling=false",
            "--v=1",
        ],
        "kube-scheduler": [
            str(binaries.kube_scheduler),
            f"--config={d / 'scheduler-config.yaml'}",
            f"--authentication-kubeconfig={sched_kubeconfig}",
            f"--authorization-kubeconfig={sched_kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.scheduler}",
            f"--cert-dir={d / 'scheduler-certs'}",
            "--profiling=false",
            "--v=1",
        ],
    }
