"""metrics-server beside a local cluster, so that ``kubectl top`` works against virtual nodes.

The binary is built from the Go module proxy (``sigs.k8s.io/metrics-server`` at ``VERSION``:
its go.mod needs no replaces) into the version-keyed cache beside the control plane's
(``binaries.cache_root()``), unless ``$VK_PROVIDER_METRICS_SERVER`` names one. A cold build
takes about two and a half minutes on 2 cores (downloads included), a warm one is instant.

``MetricsServer.start`` runs it as a detached process on 127.0.0.1 and registers it as the
``v1beta1.metrics.k8s.io`` APIService, as its own manifests do, with these differences for a
cluster without kube-proxy or kubelets:

- the Service ``kube-system/metrics-server`` is an ``ExternalName`` of ``localhost`` (the
  aggregator resolves it without endpoints, as ``--enable-aggregator-routing`` stays off);
- its serving certificate comes from the cluster CA (names ``metrics-server.kube-system.svc``,
  which the aggregator checks, and 127.0.0.1), and the APIService's ``caBundle`` is that CA;
- it authenticates as the ServiceAccount ``kube-system/metrics-server`` with a bound token (a
  kubeconfig of its own): the API server checks it, and so does every kubelet API it scrapes
  (a virtual node's agent by TokenReview and a SubjectAccessReview on ``nodes/metrics``);
- it scrapes each node at its InternalIP and the port the node reports, verifying the serving
  certificate against the cluster CA (``--kubelet-certificate-authority``).

Invariants: ``stop`` removes the APIService before it stops the process (an unavailable
aggregated API would hold up discovery and namespace deletion); every file lives under the
cluster's directory; the process is identified by pid and start time like the control plane's.
"""

from __future__ import annotations

import base64
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from vk_provider_adapters.local.processes import (
    ProcessRecord,
    is_running,
    start_process,
    stop_process,
)
from vk_provider_dev.cluster import pki as pki_mod
from vk_provider_dev.cluster.binaries import Progress, build_go_program, cache_root
from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.errors import ClusterError
from vk_provider_dev.cluster.ports import free_ports

VERSION = "v0.9.0"
MODULE = "sigs.k8s.io/metrics-server"
PACKAGE = f"{MODULE}/cmd/metrics-server"
BINARY_ENV = "VK_PROVIDER_METRICS_SERVER"
APISERVICE = "v1beta1.metrics.k8s.io"
NAMESPACE = "kube-system"
NAME = "metrics-server"
RESOLUTION_SECONDS = 10  # the least metrics-server allows; kubectl top needs two scrapes


def _quiet(_phase: str, _done: int, _total: int) -> None:
    return None


def cache_directory() -> Path:
    return cache_root() / f"metrics-server-{VERSION}-v1"


def find_metrics_server() -> Path | None:
    explicit = os.environ.get(BINARY_ENV)
    if explicit:
        path = Path(explicit).expanduser()
        if not os.access(path, os.X_OK):
            raise ClusterError(f"${BINARY_ENV}={path} is not an executable file")
        return path
    cached = cache_directory() / NAME
    return cached if os.access(cached, os.X_OK) else None


def ensure_metrics_server(*, progress: Progress = _quiet) -> Path:
    """The metrics-server binary, built into the cache first if it is not there."""
    found = find_metrics_server()
    if found is not None:
        return found
    # Stamped as its Makefile does, so `metrics-server --version` says what it is.
    stamps = {"gitVersion": VERSION, "gitTreeState": "clean", "buildDate": "1970-01-01T00:00:00Z"}
    ldflags = " ".join(f"-X k8s.io/client-go/pkg/version.{k}={v}" for k, v in stamps.items())
    return build_go_program(
        MODULE, VERSION, PACKAGE, cache_directory(), ldflags=ldflags, progress=progress
    )


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def registration_objects(*, port: int, ca_bundle: str) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object) for everything metrics-server needs in the cluster."""
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    account = {"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}

    def binding(kind: str, name: str, role_kind: str, role: str) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": name}
        if kind == "RoleBinding":
            metadata["namespace"] = NAMESPACE
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": kind,
            "metadata": metadata,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
            "subjects": [account],
        }

    return [
        (
            f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME}},
        ),
        (
            f"{rbac}/clusterroles",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "system:metrics-server"},
                "rules": [
                    {"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]},
                    {
                        "apiGroups": [""],
                        "resources": ["pods", "nodes"],
                        "verbs": ["get", "list", "watch"],
                    },
                ],
            },
        ),
        (
            f"{rbac}/clusterrolebindings",
            binding(
                "ClusterRoleBinding",
                "system:metrics-server",
                "ClusterRole",
                "system:metrics-server",
            ),
        ),
        (
            f"{rbac}/clusterrolebindings",
            binding(
                "ClusterRoleBinding",
                "metrics-server:system:auth-delegator",
                "ClusterRole",
                "system:auth-delegator",
            ),
        ),
        (
            f"{rbac}/namespaces/{NAMESPACE}/rolebindings",
            binding(
                "RoleBinding",
                "metrics-server-auth-reader",
                "Role",
                "extension-apiserver-authentication-reader",
            ),
        ),
        (
            f"/api/v1/namespaces/{NAMESPACE}/services",
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": NAME},
                "spec": {
                    "type": "ExternalName",
                    "externalName": "localhost",
                    "ports": [{"name": "https", "port": port}],
                },
            },
        ),
        (
            "/apis/apiregistration.k8s.io/v1/apiservices",
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": APISERVICE},
                "spec": {
                    "group": "metrics.k8s.io",
                    "version": "v1beta1",
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                    "service": {"name": NAME, "namespace": NAMESPACE, "port": port},
                    "caBundle": ca_bundle,
                },
            },
        ),
    ]


def command(
    binary: Path, *, port: int, kubeconfig: Path, cert: pki_mod.CertPair, ca: Path
) -> list[str]:
    return [
        str(binary),
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={cert.cert}",
        f"--tls-private-key-file={cert.key}",
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--kubelet-preferred-address-types=InternalIP",
        "--kubelet-use-node-status-port",
        f"--kubelet-certificate-authority={ca}",
        f"--metric-resolution={RESOLUTION_SECONDS}s",
        "--kubelet-request-timeout=5s",  # below 0.9 x the resolution, as it demands
        "--v=2",
    ]


@dataclass
class MetricsServer:
    """One metrics-server for ``cluster``; ``start`` registers and runs it, ``stop`` undoes."""

    cluster: LocalCluster
    binary: Path
    port: int = 0
    record: ProcessRecord | None = None

    @property
    def directory(self) -> Path:
        return self.cluster.directory / "metrics-server"

    @property
    def log_file(self) -> Path:
        return self.directory / "metrics-server.log"

    def start(self, *, timeout: float = 120.0) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_ports(1)[0]
        pki = self.cluster.pki
        serving = pki_mod.CertPair(self.directory / "serving.crt", self.directory / "serving.key")
        pki_mod.issue_certificate(
            pki.ca,
            serving,
            common_name=NAME,
            server=True,
            dns_names=(f"{NAME}.{NAMESPACE}.svc", f"{NAME}.{NAMESPACE}.svc.cluster.local"),
            ip_addresses=("127.0.0.1",),
        )
        for collection, body in registration_objects(port=self.port, ca_bundle=_b64(pki.ca.cert)):
            self.cluster.create_object(collection, body)
        kubeconfig = self._kubeconfig(self._token())
        self.record = start_process(
            NAME,
            command(
                self.binary, port=self.port, kubeconfig=kubeconfig, cert=serving, ca=pki.ca.cert
            ),
            log_file=self.log_file,
            cwd=self.directory,
        )
        self._wait_available(timeout)

    def stop(self) -> None:
        path = f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}"
        try:
            self.cluster.request("DELETE", path)
        finally:
            if self.record is not None:
                stop_process(self.record)
                self.record = None

    def _token(self) -> str:
        path = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{NAME}/token"
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 24 * 3600},
        }
        status, answer = self.cluster.request("POST", path, request)
        token = (answer.get("status") or {}).get("token")
        if status != 201 or not token:
            raise ClusterError(f"no token for {NAMESPACE}/{NAME}: HTTP {status} {answer}")
        return str(token)

    def _kubeconfig(self, token: str) -> Path:
        server = self.cluster.status().server
        document = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {
                        "server": server,
                        "certificate-authority-data": _b64(self.cluster.pki.ca.cert),
                    },
                }
            ],
            "users": [{"name": NAME, "user": {"token": token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": NAME}}],
            "current-context": "local",
        }
        path = self.directory / "metrics-server.kubeconfig"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(yaml.safe_dump(document))
        return path

    def _wait_available(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        path = f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}"
        last: object = None
        while time.monotonic() < deadline:
            if self.record is not None and not is_running(self.record):
                raise ClusterError(f"metrics-server exited; see {self.log_file}:\n{self._tail()}")
            _, answer = self.cluster.request("GET", path)
            conditions = (answer.get("status") or {}).get("conditions") or []
            available = next((c for c in conditions if c.get("type") == "Available"), None)
            if available is not None and available.get("status") == "True":
                return
            last = available
            time.sleep(0.5)
        raise ClusterError(
            f"APIService {APISERVICE} not available after {timeout:.0f}s ({json.dumps(last)}); "
            f"metrics-server log:\n{self._tail()}"
        )

    def _tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
