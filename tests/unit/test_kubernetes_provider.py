"""The Kubernetes adapter without a cluster: pure parts, and the HTTP layer against a fake API.

Pure: kubeconfig parsing, quantities, names, offers from node and pod lists, manifests, the
state table and the error table. HTTP: ``FakeApi`` (an ``httpx.MockTransport``) answers the few
paths the adapter uses with Kubernetes' own ``Status`` shapes (as a 1.37 API server sends
them) and records every request, so the order of writes and their bodies can be checked.
Retries never sleep: the ``RetryPolicy`` records the waits it would have made.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import re
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pydantic
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.unit import canary
from vk_provider.domain.breaker import counts_as_failure
from vk_provider.domain.containers import ContainerSpec, ContainerState, Probe
from vk_provider.domain.contract import Provider
from vk_provider.domain.errors import (
    AuthFailed,
    CapacityUnavailable,
    InvalidSpec,
    NotFound,
    ProviderError,
    RateLimited,
    Transient,
)
from vk_provider.domain.models import (
    EnvVar,
    Instance,
    InstanceState,
    LogOptions,
    Offer,
    Port,
    WorkloadSpec,
)
from vk_provider.domain.redact import Redactor
from vk_provider.settings.secrets import ConfigError
from vk_provider_adapters.kubernetes import endpoints, states
from vk_provider_adapters.kubernetes.adapter import DEFAULT_RETRY, KubernetesProvider
from vk_provider_adapters.kubernetes.config import KubernetesProviderConfig
from vk_provider_adapters.kubernetes.failures import ApiFailure, Call, api_failure, classify_failure
from vk_provider_adapters.kubernetes.kubeconfig import KubeconfigError, load_kubeconfig
from vk_provider_adapters.kubernetes.logs import LineSplitter, log_params
from vk_provider_adapters.kubernetes.manifests import build_pod, build_secret, service_ports
from vk_provider_adapters.kubernetes.names import (
    ANN_ATTEMPT,
    ANN_OFFER,
    ANN_POD_UID,
    ANN_PRICE,
    LABEL_ATTEMPT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_POD_UID,
    label_value,
    pod_name,
    secret_keys,
)
from vk_provider_adapters.kubernetes.offers import (
    GPU_RESOURCE,
    REGION_LABEL,
    NodeCapacity,
    OfferScope,
    Resources,
    Shape,
    node_capacities,
    plan_offers,
    pod_requests,
    read_quantity,
)
from vk_provider_adapters.kubernetes.plugin import requirements
from vk_provider_adapters.kubernetes.states import observe, parse_instance
from vk_provider_adapters.payload import MalformedResponse

SERVER = "https://b.example.test:6443"
TOKEN = "eyJhbGciOiJSUzI1NiJ9.TESTTOKEN.secretsignature"
NAMESPACE = "vk-work"
PROVIDER = "remote-b"
UID = "0f4a3c52-7d7e-4a57-9d55-2b0c1f6f0a11"
JSON = dict[str, Any]


# --- helpers --------------------------------------------------------------------------------


def _kubeconfig(user: JSON, *, cluster: JSON | None = None, extra: JSON | None = None) -> str:
    document: JSON = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "other", "cluster": {"server": "https://other.test"}},
            {"name": "b", "cluster": cluster or {"server": SERVER}},
        ],
        "users": [
            {"name": "someone", "user": {"token": "not-this-one"}},
            {"name": "me", "user": user},
        ],
        "contexts": [
            {"name": "other", "context": {"cluster": "other", "user": "someone"}},
            {"name": "b", "context": {"cluster": "b", "user": "me"}},
        ],
        "current-context": "b",
        **(extra or {}),
    }
    return yaml.safe_dump(document)


def _spec(
    *,
    uid: str = UID,
    attempt: int = 0,
    env: tuple[EnvVar, ...] = (),
    gpus: int = 1,
    cpu: float = 2.0,
    memory_gib: float = 4.0,
    image: str = "example.com/train:1",
) -> WorkloadSpec:
    return WorkloadSpec(
        pod_uid=uid,
        namespace="team-a",
        pod_name="train",
        containers=(
            ContainerSpec(
                name="main",
                image=image,
                command=("python", "train.py"),
                args=("--epochs", "3"),
                env=env,
                ports=(Port(8080, "TCP", "http"),),
                working_dir="/work",
                cpu=cpu,
                memory_bytes=int(memory_gib * 2**30),
                gpu_count=gpus,
            ),
        ),
        gpu_count=gpus,
        cpu=cpu,
        memory_bytes=int(memory_gib * 2**30),
        attempt=attempt,
    )


SCOPE = OfferScope(
    provider=PROVIDER,
    regions=(),
    gpu_model="A100-80GB",
    gpu_price_per_hour=2.0,
    cpu_price_per_hour=0.05,
    max_gpus=64,
    max_price_per_hour=None,
)
GPU_SHAPE = Shape(1, 8.0, 32.0)


def _offer(shape: Shape = GPU_SHAPE, region: str = "remote") -> Offer:
    return Offer(
        provider=PROVIDER,
        sku=shape.sku,
        region=region,
        gpu_model="A100-80GB" if shape.gpus else None,
        gpu_count=shape.gpus,
        gpu_memory_gib=80.0,
        vcpus=shape.vcpus,
        memory_gib=shape.memory_gib,
        price_per_hour=SCOPE.price(shape),
    )


def _node(
    name: str,
    *,
    gpus: int = 8,
    cpu: str = "64",
    memory: str = "512Gi",
    ready: bool = True,
    taints: list[JSON] | None = None,
    labels: dict[str, str] | None = None,
    unschedulable: bool = False,
) -> JSON:
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus:
        allocatable[GPU_RESOURCE] = str(gpus)
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def _bound_pod(
    node: str,
    *,
    gpus: int = 0,
    cpu: str = "1",
    memory: str = "1Gi",
    phase: str = "Running",
    namespace: str = "default",
    labels: dict[str, str] | None = None,
) -> JSON:
    requests = {"cpu": cpu, "memory": memory}
    limits = {GPU_RESOURCE: str(gpus)} if gpus else {}
    return {
        "metadata": {"name": f"p-{node}", "namespace": namespace, "labels": labels or {}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": requests, "limits": limits}}],
        },
        "status": {"phase": phase},
    }


def _remote_pod(name: str = f"vk-{UID}-0", **status: Any) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": "b-uid-1",
            "labels": {LABEL_MANAGED_BY: PROVIDER, LABEL_POD_UID: UID, LABEL_ATTEMPT: "0"},
            "annotations": {
                ANN_POD_UID: UID,
                ANN_ATTEMPT: "0",
                ANN_OFFER: f"{PROVIDER}/{GPU_SHAPE.sku}/remote",
                ANN_PRICE: "2.400000",
            },
        },
        "spec": {"containers": [{"name": "main", "image": "example.com/train:1"}]},
        "status": {"phase": "Pending", **status},
    }


def _status(code: int, reason: str, message: str, **details: Any) -> httpx.Response:
    body: JSON = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return httpx.Response(code, json=body)


class Sleeps:
    """A ``RetryPolicy.sleep`` that records instead of waiting."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


Handler = Callable[[httpx.Request], httpx.Response | None]


def _selects(selector: str, labels: dict[str, str]) -> bool:
    """A label selector's equality-based and existence terms, as the API server reads them."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _merge_patch(target: JSON, patch: JSON) -> JSON:
    """RFC 7386, as ``application/merge-patch+json`` is applied: objects merge, null removes,
    anything else (lists included) replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge_patch(target[key], value)
        else:
            target[key] = value
    return target


_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")


def _invalid_service(service: JSON) -> httpx.Response | None:
    """The 422 B answers for a Service it would refuse (the checks this adapter could fail)."""
    name = service["metadata"]["name"]
    spec = service.get("spec") or {}
    causes: list[JSON] = []
    if len(name) > 63 or not _DNS_1035.fullmatch(name):
        causes.append({"field": "metadata.name", "message": "a DNS-1035 label is required"})
    if spec.get("type", "ClusterIP") not in _SERVICE_TYPES:
        causes.append({"field": "spec.type", "message": "Unsupported value"})
    ports = spec.get("ports") or []
    names: set[str] = set()
    keys: set[tuple[int, str]] = set()
    for index, port in enumerate(ports):
        port_name = port.get("name") or ""
        if len(ports) > 1 and not port_name:
            causes.append({"field": f"spec.ports[{index}].name", "message": "Required value"})
        if port_name in names:
            causes.append({"field": f"spec.ports[{index}].name", "message": "Duplicate value"})
        key = (port.get("port"), port.get("protocol", "TCP"))
        if key in keys:
            causes.append({"field": f"spec.ports[{index}]", "message": "Duplicate value"})
        names.add(port_name)
        keys.add(key)
    if not causes:
        return None
    detail = ", ".join(f"{c['field']}: {c['message']}" for c in causes)
    return _status(
        422, "Invalid", f'Service "{name}" is invalid: {detail}', kind="Service", causes=causes
    )


class FakeApi:
    """Cluster B's API for the adapter: pods, secrets and services in dicts, failures on
    demand. Services get a clusterIP and, for NodePort and LoadBalancer, a nodePort per port
    (kept across updates, as the API server keeps them); deleting a pod removes what it owns
    (B's garbage collector, at once)."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.namespaces: set[str] = {NAMESPACE}
        self.pods: dict[str, JSON] = {}
        self.secrets: dict[str, JSON] = {}
        self.services: dict[str, JSON] = {}
        self.nodes: list[JSON] = []
        self.cluster_pods: list[JSON] = []
        self.overrides: list[Handler] = []  # consulted first; return None to pass
        self.log_body = b""
        self._uids = 0
        self._node_ports = 30000

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def calls(self) -> list[str]:
        return [f"{r.method} {r.url.path}" for r in self.requests]

    def _allocate(self, service: JSON, old: JSON | None = None) -> None:
        spec = service.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("clusterIP", f"10.96.0.{self._uids}")
        service.setdefault("status", {"loadBalancer": {}})
        if spec["type"] not in ("NodePort", "LoadBalancer"):
            return
        kept = {
            (p["port"], p.get("protocol", "TCP")): p["nodePort"]
            for p in ((old or {}).get("spec") or {}).get("ports") or []
            if p.get("nodePort")
        }
        for port in spec.get("ports") or []:
            port.setdefault("protocol", "TCP")
            if not port.get("nodePort"):
                key = (port["port"], port["protocol"])
                if key not in kept:
                    self._node_ports += 1
                    kept[key] = self._node_ports
                port["nodePort"] = kept[key]

    def _collect_garbage(self, owner: JSON) -> None:
        uid = owner["metadata"].get("uid")
        for store in (self.secrets, self.services):
            for name, dependent in list(store.items()):
                owners = dependent["metadata"].get("ownerReferences") or []
                if any(o.get("uid") == uid for o in owners):
                    del store[name]

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        for override in self.overrides:
            answer = override(request)
            if answer is not None:
                return answer
        return self.serve(request)

    def serve(self, request: httpx.Request) -> httpx.Response:
        """What B answers, overrides aside (an override may let a request through and lose
        the answer)."""
        path = request.url.path
        parts = path.strip("/").split("/")
        selector = request.url.params.get("labelSelector", "")
        if path == "/api/v1/nodes":
            nodes = [n for n in self.nodes if _selects(selector, n["metadata"].get("labels", {}))]
            return httpx.Response(200, json={"kind": "NodeList", "items": nodes})
        if path == "/api/v1/pods":
            return httpx.Response(200, json={"kind": "PodList", "items": self.cluster_pods})
        if path == "/api/v1/namespaces" and request.method == "POST":
            name = json.loads(request.content)["metadata"]["name"]
            if name in self.namespaces:
                return _status(409, "AlreadyExists", f'namespaces "{name}" already exists')
            self.namespaces.add(name)
            return httpx.Response(201, json={"metadata": {"name": name}})
        if len(parts) == 6 and parts[4] == "serviceaccounts" and request.method == "GET":
            # The controller-manager's default ServiceAccount: there as soon as the namespace.
            if parts[3] in self.namespaces and parts[5] == "default":
                return httpx.Response(200, json={"metadata": {"name": "default"}})
            return _status(404, "NotFound", f'serviceaccounts "{parts[5]}" not found')
        if len(parts) >= 5 and parts[:3] == ["api", "v1", "namespaces"]:
            namespace, kind = parts[3], parts[4]
            store = {"pods": self.pods, "services": self.services}.get(kind, self.secrets)
            list_kind = {"pods": "PodList", "services": "ServiceList"}.get(kind, "SecretList")
            name = parts[5] if len(parts) > 5 else None
            if request.method == "POST" and name is None:
                body = json.loads(request.content)
                if namespace not in self.namespaces:
                    return _status(
                        404, "NotFound", f'namespaces "{namespace}" not found', kind="namespaces"
                    )
                name = body["metadata"]["name"]
                if name in store:
                    return _status(409, "AlreadyExists", f'{kind} "{name}" already exists')
                if kind == "services" and (refused := _invalid_service(body)) is not None:
                    return refused
                self._uids += 1
                body["metadata"]["uid"] = f"uid-{self._uids}"
                if kind == "pods":
                    body.setdefault("status", {"phase": "Pending"})
                if kind == "services":
                    self._allocate(body)
                store[name] = body
                return httpx.Response(201, json=body)
            if request.method == "GET" and name is None:
                items = [
                    p
                    for p in store.values()
                    if _selects(selector, p["metadata"].get("labels") or {})
                ]
                return httpx.Response(200, json={"kind": list_kind, "items": items})
            assert name is not None
            if len(parts) == 7 and parts[6] == "log":
                if name not in store:
                    return _status(404, "NotFound", f'pods "{name}" not found', kind="pods")
                return httpx.Response(200, content=self.log_body)
            if name not in store:
                return _status(404, "NotFound", f'{kind} "{name}" not found', kind=kind)
            if request.method == "GET":
                return httpx.Response(200, json=store[name])
            if request.method == "DELETE":
                gone = store.pop(name)
                self._collect_garbage(gone)
                return httpx.Response(200, json=gone)
            if request.method == "PATCH":
                assert request.headers["Content-Type"] == "application/merge-patch+json"
                old = json.loads(json.dumps(store[name]))
                patched = _merge_patch(store[name], json.loads(request.content))
                if kind == "services":
                    self._allocate(patched, old)
                return httpx.Response(200, json=patched)
        return _status(404, "NotFound", "the server could not find the requested resource")


@pytest.fixture
def fake() -> FakeApi:
    return FakeApi()


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


def _config(monkeypatch: pytest.MonkeyPatch, **extra: Any) -> KubernetesProviderConfig:
    monkeypatch.setenv("VK_TEST_KUBECONFIG_B", _kubeconfig({"token": TOKEN}))
    return KubernetesProviderConfig.model_validate(
        {
            "type": "kubernetes",
            "name": PROVIDER,
            "kubeconfig": "env:VK_TEST_KUBECONFIG_B",
            "namespace": NAMESPACE,
            "gpu_model": "A100-80GB",
            "gpu_price_per_hour": 2.0,
            "cpu_price_per_hour": 0.05,
            **extra,
        }
    )


@pytest.fixture
async def provider(
    fake: FakeApi, sleeps: Sleeps, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[KubernetesProvider]:
    adapter = KubernetesProvider(
        _config(monkeypatch),
        transport=fake.transport(),
        retry=dataclasses.replace(DEFAULT_RETRY, sleep=sleeps),
    )
    try:
        yield adapter
    finally:
        await adapter.close()


# --- kubeconfig -----------------------------------------------------------------------------


def _pki() -> tuple[bytes, bytes, bytes]:
    """A CA certificate and a client certificate + key it signed (PEM)."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "admin")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(2)
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    pem = serialization.Encoding.PEM
    return ca.public_bytes(pem), cert.public_bytes(pem), key_pem


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_the_current_context_picks_server_ca_and_client_certificate(tmp_path: Path) -> None:
    ca, cert, key = _pki()
    text = _kubeconfig(
        {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)},
        cluster={"server": SERVER + "/", "certificate-authority-data": _b64(ca)},
    )
    access = load_kubeconfig(text)
    assert access.server == SERVER
    assert access.context == "b"
    # The loader's CA and client certificate are what the TLS context was built from.
    assert [c["subject"] for c in access.ssl_context().get_ca_certs()] == [
        ((("commonName", "test-ca"),),)
    ]
    assert access.token is None
    assert access.headers() == {}


def test_the_ssl_context_loads_the_certificates_and_leaves_no_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, cert, key = _pki()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    text = _kubeconfig(
        {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)},
        cluster={"server": SERVER, "certificate-authority-data": _b64(ca)},
    )
    context = load_kubeconfig(text).ssl_context()
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "test-ca"),),)]
    assert list(scratch.iterdir()) == []  # the key was written privately and removed


def test_file_paths_are_read_beside_the_kubeconfig(tmp_path: Path) -> None:
    ca, cert, key = _pki()
    (tmp_path / "ca.crt").write_bytes(ca)
    (tmp_path / "me.crt").write_bytes(cert)
    (tmp_path / "me.key").write_bytes(key)
    text = _kubeconfig(
        {"client-certificate": "me.crt", "client-key": str(tmp_path / "me.key")},
        cluster={"server": SERVER, "certificate-authority": "ca.crt"},
    )
    access = load_kubeconfig(text, base_dir=tmp_path)
    assert [c["subject"] for c in access.ssl_context().get_ca_certs()] == [
        ((("commonName", "test-ca"),),)
    ]


def test_the_client_key_is_a_credential_to_redact_in_any_form() -> None:
    ca, cert, key = _pki()
    text = _kubeconfig(
        {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)},
        cluster={"server": SERVER, "certificate-authority-data": _b64(ca)},
    )
    access = load_kubeconfig(text)
    assert key.decode().strip() in access.secrets
    assert key.decode() not in repr(access)
    redact = Redactor(access.secrets)
    pem_line = key.decode().splitlines()[1]  # one line of a multi-line key
    body_lines = [line for line in key.decode().splitlines() if not line.startswith("-----")]
    for echoed in (key.decode(), _b64(key), json.dumps(key.decode()), pem_line):
        out = redact(f"server said: {echoed}")
        assert "<redacted>" in out and _b64(key) not in out
        assert not any(line in out for line in body_lines)


def test_a_token_or_token_file_is_a_bearer_header(tmp_path: Path) -> None:
    access = load_kubeconfig(_kubeconfig({"token": TOKEN}))
    assert access.headers() == {"Authorization": f"Bearer {TOKEN}"}
    assert TOKEN not in repr(access)
    (tmp_path / "token").write_text(TOKEN + "\n")
    from_file = load_kubeconfig(_kubeconfig({"tokenFile": "token"}), base_dir=tmp_path)
    assert from_file.token == TOKEN


def test_insecure_skip_tls_verify_turns_verification_off() -> None:
    text = _kubeconfig(
        {"token": TOKEN}, cluster={"server": SERVER, "insecure-skip-tls-verify": True}
    )
    context = load_kubeconfig(text).ssl_context()
    assert context.verify_mode == ssl.CERT_NONE


def test_another_context_can_be_chosen() -> None:
    assert load_kubeconfig(_kubeconfig({"token": TOKEN}), context="other").token == "not-this-one"


@pytest.mark.parametrize(
    ("user", "extra", "expected"),
    [
        ({"exec": {"command": "aws"}}, {}, "users['me'].exec is not supported"),
        ({"auth-provider": {"name": "gcp"}}, {}, "auth-provider is not supported"),
        ({"client-certificate-data": _b64(b"x")}, {}, "needs both a client certificate"),
        ({"client-key-data": _b64(b"k")}, {}, "needs both a client certificate"),
        ({"token": TOKEN}, {"current-context": "nowhere"}, "no entry 'nowhere' in 'contexts'"),
        ({"token": TOKEN}, {"current-context": None}, "'current-context' is not set"),
        ({"client-certificate": "/nonexistent/me.crt"}, {}, "cannot read /nonexistent/me.crt"),
    ],
)
def test_unusable_kubeconfigs_name_the_field(user: JSON, extra: JSON, expected: str) -> None:
    with pytest.raises(KubeconfigError, match=re.escape(expected)) as raised:
        load_kubeconfig(_kubeconfig(user, extra=extra))
    assert isinstance(raised.value, ConfigError)


def test_kubeconfig_errors_never_quote_the_document() -> None:
    broken = f"users:\n- name: me\n  user: {{token: {TOKEN}\n"
    with pytest.raises(KubeconfigError) as raised:
        load_kubeconfig(broken)
    assert TOKEN not in str(raised.value)
    assert "line" in str(raised.value)
    with pytest.raises(KubeconfigError, match="server is not a URL"):
        load_kubeconfig(_kubeconfig({"token": TOKEN}, cluster={"server": "b.test"}))


def test_a_ca_that_is_not_pem_is_a_config_error() -> None:
    text = _kubeconfig(
        {"token": TOKEN}, cluster={"server": SERVER, "certificate-authority-data": _b64(b"nope")}
    )
    with pytest.raises(KubeconfigError, match="not PEM"):
        load_kubeconfig(text).ssl_context()


# --- quantities, names, skus ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", Decimal(2)),
        ("500m", Decimal("0.5")),
        ("1.5", Decimal("1.5")),
        ("64Gi", Decimal(64 * 2**30)),
        ("128974848", Decimal(128974848)),
        ("129e6", Decimal(129_000_000)),
        ("123Mi", Decimal(123 * 2**20)),
        ("1k", Decimal(1000)),
        (8, Decimal(8)),
    ],
)
def test_quantities(text: str | int, value: Decimal) -> None:
    assert read_quantity(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1Xi", None, True, "1.2.3"])
def test_unreadable_quantities_are_malformed(text: object) -> None:
    with pytest.raises(MalformedResponse):
        read_quantity(text)


def test_pod_names_are_deterministic_dns_labels() -> None:
    assert pod_name(_spec()) == f"vk-{UID}-0"
    assert pod_name(_spec(attempt=12)) == f"vk-{UID}-12"
    for uid in ("UPPER-case", "x" * 80, "has.dots", "under_score"):
        name = pod_name(_spec(uid=uid, attempt=3))
        assert len(name) <= 63
        assert name.startswith("vk-") and name.endswith("-3")
        assert name == pod_name(_spec(uid=uid, attempt=3))
        assert name != pod_name(_spec(uid=uid + "y", attempt=3))


def test_label_values_are_kept_or_hashed() -> None:
    assert label_value("remote-b") == "remote-b"
    assert label_value(UID) == UID
    for text in ("has space", "x" * 70, "-leading"):
        value = label_value(text)
        assert len(value) <= 63
        assert value == label_value(text)
        assert value != text


@pytest.mark.parametrize(
    "shape", [Shape(0, 1.0, 4.0), Shape(8, 96.0, 1024.0), Shape(1, 0.5, 1.5), GPU_SHAPE]
)
def test_skus_round_trip(shape: Shape) -> None:
    assert Shape.parse(shape.sku) == shape


@pytest.mark.parametrize(
    "sku",
    ["", "a100", "1gpu.8cpu", "secure:on-demand:1x:A100", "1gpu.0cpu.4gib", "x1gpu.1cpu.1gib"],
)
def test_foreign_skus_do_not_parse(sku: str) -> None:
    assert Shape.parse(sku) is None


# --- offers ---------------------------------------------------------------------------------


def test_pod_requests_count_limits_init_containers_sidecars_and_overhead() -> None:
    pod = {
        "spec": {
            "containers": [
                {"resources": {"requests": {"cpu": "500m"}, "limits": {GPU_RESOURCE: "2"}}},
                {"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
            ],
            "initContainers": [
                {"resources": {"requests": {"cpu": "4", "memory": "512Mi"}}},
                {"restartPolicy": "Always", "resources": {"requests": {"memory": "256Mi"}}},
            ],
            "overhead": {"cpu": "100m"},
        }
    }
    assert pod_requests(pod) == Resources(
        gpus=Decimal(2), cpu=Decimal("4.1"), memory=Decimal(1024 + 256) * 2**20
    )


def test_free_capacity_is_allocatable_minus_live_pods() -> None:
    nodes = {"items": [_node("gpu-1")]}
    pods = {
        "items": [
            _bound_pod("gpu-1", gpus=3, cpu="10", memory="100Gi"),
            _bound_pod("gpu-1", gpus=4, cpu="10", phase="Succeeded"),  # finished: holds nothing
            {"metadata": {"name": "unscheduled"}, "spec": {"containers": []}, "status": {}},
        ]
    }
    (node,) = node_capacities(nodes, pods, SCOPE)
    assert node.free == Resources(Decimal(5), Decimal(54), Decimal(412 * 2**30))
    assert node.region == "remote"
    assert node.takes_cpu_pods


@pytest.mark.parametrize(
    ("node", "counted", "cpu_pods"),
    [
        (_node("n", ready=False), False, False),
        (_node("n", unschedulable=True), False, False),
        (
            _node("n", taints=[{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]),
            False,
            False,
        ),
        (_node("n", taints=[{"key": "dedicated", "effect": "PreferNoSchedule"}]), True, True),
        (
            _node(
                "n",
                taints=[
                    {"key": "virtual-kubelet.io/provider", "value": "x", "effect": "NoSchedule"}
                ],
            ),
            True,
            True,
        ),
        (
            _node("n", taints=[{"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}]),
            True,
            False,
        ),
    ],
)
def test_nodes_count_when_ready_schedulable_and_tolerated(
    node: JSON, counted: bool, cpu_pods: bool
) -> None:
    found = node_capacities({"items": [node]}, {"items": []}, SCOPE)
    assert bool(found) is counted
    if found:
        assert found[0].takes_cpu_pods is cpu_pods


def test_regions_come_from_labels_then_configuration() -> None:
    nodes = {
        "items": [
            _node("eu", labels={REGION_LABEL: "eu-west"}),
            _node("us", labels={REGION_LABEL: "us-east"}),
            _node("bare"),
        ]
    }
    scope = OfferScope(**_scope_args(regions=("eu-west",)))
    found = {n.name: n.region for n in node_capacities(nodes, {"items": []}, scope)}
    assert found == {"eu": "eu-west", "bare": "eu-west"}  # us-east is not configured
    everywhere = {n.name: n.region for n in node_capacities(nodes, {"items": []}, SCOPE)}
    assert everywhere == {"eu": "eu-west", "us": "us-east", "bare": "remote"}


def _scope_args(**changes: Any) -> dict[str, Any]:
    base = {
        "provider": SCOPE.provider,
        "regions": SCOPE.regions,
        "gpu_model": SCOPE.gpu_model,
        "gpu_price_per_hour": SCOPE.gpu_price_per_hour,
        "cpu_price_per_hour": SCOPE.cpu_price_per_hour,
        "max_gpus": SCOPE.max_gpus,
        "max_price_per_hour": SCOPE.max_price_per_hour,
    }
    return {**base, **changes}


def _capacity(
    name: str = "n",
    *,
    gpus: int = 4,
    cpu: int = 32,
    memory_gib: int = 128,
    free_gpus: int = 4,
    free_cpu: int = 32,
    free_memory_gib: int = 128,
    region: str = "remote",
    cpu_pods: bool = True,
) -> NodeCapacity:
    return NodeCapacity(
        name=name,
        region=region,
        allocatable=Resources(Decimal(gpus), Decimal(cpu), Decimal(memory_gib * 2**30)),
        free=Resources(Decimal(free_gpus), Decimal(free_cpu), Decimal(free_memory_gib * 2**30)),
        gpu_memory_gib=80.0,
        takes_cpu_pods=cpu_pods,
    )


def test_gpu_offers_are_per_gpu_shares_priced_per_instance() -> None:
    offers = {o.sku: o for o in plan_offers([_capacity(free_gpus=3)], SCOPE, gpus_used=0)}
    gpu = {sku: o for sku, o in offers.items() if o.gpu_count}
    assert sorted(gpu) == [
        "1gpu.8cpu.32gib",
        "2gpu.16cpu.64gib",
        "3gpu.24cpu.96gib",
        "4gpu.32cpu.128gib",
    ]
    one = gpu["1gpu.8cpu.32gib"]
    assert (one.provider, one.region, one.gpu_model, one.gpu_memory_gib) == (
        PROVIDER,
        "remote",
        "A100-80GB",
        80.0,
    )
    assert one.price_per_hour == pytest.approx(1 * 2.0 + 8 * 0.05)
    assert [gpu[s].available for s in sorted(gpu)] == [3, 1, 1, 0]  # 4 GPUs: sold out


def test_cpu_offers_are_a_ladder_with_the_nodes_memory_per_vcpu() -> None:
    offers = plan_offers(
        [_capacity(gpus=0, cpu=8, memory_gib=32, free_cpu=3, free_gpus=0)], SCOPE, gpus_used=0
    )
    assert [(o.sku, o.available, o.gpu_model) for o in offers] == [
        ("0gpu.1cpu.4gib", 3, None),
        ("0gpu.2cpu.8gib", 1, None),
        ("0gpu.4cpu.16gib", 0, None),
        ("0gpu.8cpu.32gib", 0, None),
    ]
    assert offers[1].price_per_hour == pytest.approx(2 * 0.05)


def test_identical_nodes_add_up_and_gpu_only_nodes_offer_no_cpu_shapes() -> None:
    nodes = [_capacity("a", cpu_pods=False), _capacity("b", cpu_pods=False, free_gpus=1)]
    offers = plan_offers(nodes, SCOPE, gpus_used=0)
    assert all(o.gpu_count for o in offers)
    assert {o.sku: o.available for o in offers}["1gpu.8cpu.32gib"] == 5


def test_max_gpus_caps_counts_and_what_is_left_beside_our_pods() -> None:
    scope = OfferScope(**_scope_args(max_gpus=3))
    offers = {
        o.sku: o.available for o in plan_offers([_capacity()], scope, gpus_used=2) if o.gpu_count
    }
    assert offers == {"1gpu.8cpu.32gib": 1, "2gpu.16cpu.64gib": 0, "3gpu.24cpu.96gib": 0}


def test_max_price_drops_dearer_offers() -> None:
    scope = OfferScope(**_scope_args(max_price_per_hour=5.0))
    offers = plan_offers([_capacity()], scope, gpus_used=0)
    assert offers
    assert max(o.price_per_hour for o in offers) <= 5.0
    assert "2gpu.16cpu.64gib" in {o.sku for o in offers}  # 4.8
    assert "3gpu.24cpu.96gib" not in {o.sku for o in offers}  # 7.2


# --- manifests ------------------------------------------------------------------------------


def test_the_pod_carries_the_workload_and_its_identity() -> None:
    spec = _spec(env=(EnvVar("MODE", "fast"),))
    pod = build_pod(
        spec,
        GPU_SHAPE,
        name=pod_name(spec),
        namespace=NAMESPACE,
        provider=PROVIDER,
        offer=_offer(),
        fallback_region="remote",
        secret_name=None,
    )
    metadata, body = pod["metadata"], pod["spec"]
    assert isinstance(metadata, dict) and isinstance(body, dict)
    assert metadata["labels"] == {
        LABEL_MANAGED_BY: PROVIDER,
        LABEL_POD_UID: UID,
        LABEL_ATTEMPT: "0",
        LABEL_INSTANCE: pod_name(spec),  # what its Service selects, unique to it
    }
    assert metadata["annotations"][ANN_OFFER] == f"{PROVIDER}/1gpu.8cpu.32gib/remote"
    assert float(metadata["annotations"][ANN_PRICE]) == pytest.approx(2.4)
    assert body["restartPolicy"] == "Always"  # the pod's own: B's kubelet restarts containers
    assert "initContainers" not in body
    assert body["automountServiceAccountToken"] is False
    assert body["enableServiceLinks"] is False
    assert body["tolerations"] == [
        {"key": "virtual-kubelet.io/provider", "operator": "Exists"},
        {"key": GPU_RESOURCE, "operator": "Exists"},
    ]
    terms = body["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {"matchExpressions": [{"key": REGION_LABEL, "operator": "In", "values": ["remote"]}]},
        {"matchExpressions": [{"key": REGION_LABEL, "operator": "DoesNotExist"}]},
    ]
    (container,) = body["containers"]
    assert container == {
        "name": "main",
        "image": "example.com/train:1",
        "command": ["python", "train.py"],
        "args": ["--epochs", "3"],
        "workingDir": "/work",
        "env": [{"name": "MODE", "value": "fast"}],
        "ports": [{"containerPort": 8080, "protocol": "TCP", "name": "http"}],
        "resources": {
            "requests": {"cpu": "2000m", "memory": str(4 * 2**30)},
            "limits": {"cpu": "8000m", "memory": "32768Mi", GPU_RESOURCE: "1"},
        },
    }


def test_cpu_pods_tolerate_only_virtual_nodes_and_labelled_regions_are_pinned() -> None:
    spec = _spec(gpus=0, cpu=0, memory_gib=0)
    pod = build_pod(
        spec,
        Shape(0, 1.0, 4.0),
        name="p",
        namespace=NAMESPACE,
        provider=PROVIDER,
        offer=_offer(Shape(0, 1.0, 4.0), region="eu-west"),
        fallback_region="remote",
        secret_name=None,
    )
    body = pod["spec"]
    assert isinstance(body, dict)
    assert body["tolerations"] == [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}]
    terms = body["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {"matchExpressions": [{"key": REGION_LABEL, "operator": "In", "values": ["eu-west"]}]}
    ]
    resources = body["containers"][0]["resources"]
    # Explicit zero requests: otherwise the API server would turn the limits into requests.
    assert resources["requests"] == {"cpu": "0m", "memory": "0"}
    assert GPU_RESOURCE not in resources["limits"]


def test_secret_values_go_to_the_secret_and_are_referenced() -> None:
    spec = _spec(
        env=(
            EnvVar("PLAIN", "visible"),
            EnvVar("API_TOKEN", "hunter2", secret=True),
            EnvVar("weird name!", "s3cret", secret=True),
        )
    )
    name = pod_name(spec)
    secret = build_secret(spec, name=name, namespace=NAMESPACE, provider=PROVIDER)
    assert secret is not None
    assert secret["data"] == {
        "main.API_TOKEN": _b64(b"hunter2"),
        "main.env-2": _b64(b"s3cret"),
    }
    assert secret["metadata"] == {
        "name": name,
        "namespace": NAMESPACE,
        "labels": {LABEL_MANAGED_BY: PROVIDER, LABEL_POD_UID: UID, LABEL_ATTEMPT: "0"},
    }
    pod = build_pod(
        spec,
        GPU_SHAPE,
        name=name,
        namespace=NAMESPACE,
        provider=PROVIDER,
        offer=_offer(),
        fallback_region="remote",
        secret_name=name,
    )
    text = json.dumps(pod)
    assert "hunter2" not in text and "s3cret" not in text
    assert pod["spec"]["containers"][0]["env"] == [  # type: ignore[index]
        {"name": "PLAIN", "value": "visible"},
        {
            "name": "API_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": name, "key": "main.API_TOKEN"}},
        },
        {
            "name": "weird name!",
            "valueFrom": {"secretKeyRef": {"name": name, "key": "main.env-2"}},
        },
    ]
    assert build_secret(_spec(), name=name, namespace=NAMESPACE, provider=PROVIDER) is None


def test_a_pod_without_an_image_is_invalid() -> None:
    with pytest.raises(InvalidSpec) as raised:
        build_pod(
            _spec(image=" "),
            GPU_SHAPE,
            name="p",
            namespace=NAMESPACE,
            provider=PROVIDER,
            offer=_offer(),
            fallback_region="remote",
            secret_name=None,
        )
    assert raised.value.field == "spec.containers[0].image"


def _whole_spec(
    *,
    policy: str = "OnFailure",
    gpus: tuple[int, int] = (1, 0),
    env: tuple[EnvVar, ...] = (),
    sidecar_env: tuple[EnvVar, ...] = (),
) -> WorkloadSpec:
    """Two app containers, a plain init container and a native sidecar, with probes."""
    train = ContainerSpec(
        name="train",
        image="example.com/train:1",
        command=("python", "train.py"),
        args=("--epochs", "3"),
        env=env,
        ports=(Port(8080, "TCP", "http"),),
        working_dir="/work",
        cpu=2.0,
        memory_bytes=4 * 2**30,
        gpu_count=gpus[0],
        startup_probe=Probe(kind="exec", command=("cat", "/tmp/ready"), failure_threshold=30),
        readiness_probe=Probe(
            kind="http",
            port=8080,
            path="/healthz",
            headers=(("X-Probe", "1"),),
            period_seconds=5,
            success_threshold=2,
        ),
        liveness_probe=Probe(kind="grpc", port=9090, grpc_service="train", timeout_seconds=3),
    )
    exporter = ContainerSpec(
        name="exporter",
        image="example.com/exporter:1",
        args=("--port", "9100"),
        ports=(Port(9100),),
        cpu=0.5,
        memory_bytes=256 * 2**20,
        gpu_count=gpus[1],
        readiness_probe=Probe(kind="tcp", port=9100, host="127.0.0.1", initial_delay_seconds=2),
    )
    fetch = ContainerSpec(
        name="fetch-weights",
        image="example.com/fetch:1",
        command=("fetch", "s3://weights"),
        cpu=4.0,
        memory_bytes=2 * 2**30,
    )
    proxy = ContainerSpec(
        name="proxy",
        image="example.com/proxy:1",
        env=sidecar_env,
        restart_policy="Always",
        cpu=0.25,
        memory_bytes=128 * 2**20,
    )
    return WorkloadSpec(
        pod_uid=UID,
        namespace="team-a",
        pod_name="train",
        gpu_count=sum(gpus),
        cpu=4.0,
        memory_bytes=int(4.375 * 2**30),
        containers=(train, exporter),
        init_containers=(fetch, proxy),
        restart_policy=policy,
    )


def _build(spec: WorkloadSpec, shape: Shape = GPU_SHAPE, *, secret: bool = False) -> JSON:
    return build_pod(
        spec,
        shape,
        name=pod_name(spec),
        namespace=NAMESPACE,
        provider=PROVIDER,
        offer=_offer(shape),
        fallback_region="remote",
        secret_name=pod_name(spec) if secret else None,
    )


def test_a_whole_pod_keeps_every_container_in_order_with_its_own_fields() -> None:
    body = _build(_whole_spec(policy="OnFailure"))["spec"]
    assert body["restartPolicy"] == "OnFailure"  # the pod's own: B's kubelet restarts
    assert [c["name"] for c in body["initContainers"]] == ["fetch-weights", "proxy"]
    assert [c["name"] for c in body["containers"]] == ["train", "exporter"]
    fetch, proxy = body["initContainers"]
    assert "restartPolicy" not in fetch
    assert proxy["restartPolicy"] == "Always"  # a native sidecar stays one
    assert fetch["command"] == ["fetch", "s3://weights"]
    train, exporter = body["containers"]
    assert {k: train[k] for k in ("image", "command", "args", "workingDir", "ports")} == {
        "image": "example.com/train:1",
        "command": ["python", "train.py"],
        "args": ["--epochs", "3"],
        "workingDir": "/work",
        "ports": [{"containerPort": 8080, "protocol": "TCP", "name": "http"}],
    }
    assert exporter["args"] == ["--port", "9100"]
    assert exporter["ports"] == [{"containerPort": 9100, "protocol": "TCP"}]
    assert "command" not in exporter and "workingDir" not in exporter and "env" not in exporter


def test_probes_go_back_to_kubernetes_json_with_every_timing_field() -> None:
    train, exporter = _build(_whole_spec())["spec"]["containers"]

    def timing(
        initial: int = 0, period: int = 10, timeout: int = 1, ok: int = 1, bad: int = 3
    ) -> JSON:
        return {
            "initialDelaySeconds": initial,
            "periodSeconds": period,
            "timeoutSeconds": timeout,
            "successThreshold": ok,
            "failureThreshold": bad,
        }

    assert train["startupProbe"] == {"exec": {"command": ["cat", "/tmp/ready"]}} | timing(bad=30)
    assert train["readinessProbe"] == {
        "httpGet": {
            "path": "/healthz",
            "port": 8080,
            "scheme": "HTTP",
            "httpHeaders": [{"name": "X-Probe", "value": "1"}],
        }
    } | timing(period=5, ok=2)
    assert train["livenessProbe"] == {"grpc": {"port": 9090, "service": "train"}} | timing(
        timeout=3
    )
    assert exporter["readinessProbe"] == {
        "tcpSocket": {"port": 9100, "host": "127.0.0.1"}
    } | timing(initial=2)
    assert "livenessProbe" not in exporter and "startupProbe" not in exporter


def _limits(container: JSON) -> JSON:
    return dict(container["resources"].get("limits", {}))


def test_each_container_requests_its_own_and_gets_its_own_gpus() -> None:
    body = _build(_whole_spec(gpus=(1, 1)), Shape(2, 16.0, 64.0))["spec"]
    fetch, proxy = body["initContainers"]
    train, exporter = body["containers"]
    assert train["resources"]["requests"] == {"cpu": "2000m", "memory": str(4 * 2**30)}
    assert exporter["resources"]["requests"] == {"cpu": "500m", "memory": str(256 * 2**20)}
    assert proxy["resources"]["requests"] == {"cpu": "250m", "memory": str(128 * 2**20)}
    assert fetch["resources"]["requests"] == {"cpu": "4000m", "memory": str(2 * 2**30)}
    # Each GPU goes to the container that asked for it; the others get none.
    assert (_limits(train)[GPU_RESOURCE], _limits(exporter)[GPU_RESOURCE]) == ("1", "1")
    assert GPU_RESOURCE not in _limits(proxy) and GPU_RESOURCE not in _limits(fetch)


def test_limits_share_the_shape_among_what_runs_together() -> None:
    body = _build(_whole_spec())["spec"]  # on 1 GPU, 8 vCPUs, 32 GiB
    fetch, proxy = body["initContainers"]
    train, exporter = body["containers"]
    # Apps and sidecar run together: requests 2 + 0.5 + 0.25 vCPUs leave 5.25 for 3 (1.75 each).
    assert [_limits(c)["cpu"] for c in (proxy, train, exporter)] == ["2000m", "3750m", "2250m"]
    together = sum(read_quantity(_limits(c)["memory"]) for c in (proxy, train, exporter))
    assert together <= 32 * 2**30
    assert sum(read_quantity(_limits(c)["cpu"]) for c in (proxy, train, exporter)) == 8
    # The plain init container runs before the apps, beside no sidecar yet: the whole shape.
    assert _limits(fetch) == {"cpu": "8000m", "memory": "32768Mi"}
    for container in (fetch, proxy, train, exporter):
        requests = container["resources"]["requests"]
        for resource in ("cpu", "memory"):
            assert read_quantity(requests[resource]) <= read_quantity(_limits(container)[resource])


def test_an_init_container_after_a_sidecar_gets_what_the_sidecar_leaves() -> None:
    spec = _whole_spec()
    fetch, proxy = spec.init_containers
    later = dataclasses.replace(spec, init_containers=(proxy, fetch))
    proxy_json, fetch_json = _build(later)["spec"]["initContainers"]
    assert _limits(proxy_json)["cpu"] == "2000m"
    assert _limits(fetch_json)["cpu"] == "6000m"  # 8 vCPUs minus the sidecar's 2
    memory = read_quantity(_limits(proxy_json)["memory"]) + read_quantity(
        _limits(fetch_json)["memory"]
    )
    assert memory == 32 * 2**30


def test_a_container_that_asks_nothing_of_a_full_shape_gets_no_zero_limit() -> None:
    spec = _whole_spec()
    train, exporter = spec.containers
    full = dataclasses.replace(
        spec,
        containers=(dataclasses.replace(train, cpu=8.0), dataclasses.replace(exporter, cpu=0)),
        init_containers=(),
        cpu=8.0,
    )
    train_json, exporter_json = _build(full)["spec"]["containers"]
    assert _limits(train_json)["cpu"] == "8000m"
    assert "cpu" not in _limits(exporter_json)  # 0 would mean "no limit" to kubelet anyway
    assert exporter_json["resources"]["requests"]["cpu"] == "0m"


def test_a_one_container_pod_requests_its_own_and_is_limited_to_the_offer() -> None:
    (container,) = _build(_spec())["spec"]["containers"]
    assert container["resources"] == {
        "requests": {"cpu": "2000m", "memory": str(4 * 2**30)},
        "limits": {"cpu": "8000m", "memory": "32768Mi", GPU_RESOURCE: "1"},
    }


def test_secret_keys_are_unique_per_container_and_variable() -> None:
    spec = _whole_spec(
        env=(
            EnvVar("API_TOKEN", "train-token", secret=True),
            EnvVar("weird name!", "w1", secret=True),
            EnvVar("MODE", "fast"),
        ),
        sidecar_env=(
            EnvVar("API_TOKEN", "proxy-token", secret=True),
            EnvVar("env-0", "literal", secret=True),
            EnvVar("odd=", "w2", secret=True),
        ),
    )
    keys = secret_keys(spec)
    assert keys == {
        ("train", "API_TOKEN"): "train.API_TOKEN",
        ("train", "weird name!"): "train.env-1",
        ("proxy", "API_TOKEN"): "proxy.API_TOKEN",
        ("proxy", "env-0"): "proxy.env-0",
        ("proxy", "odd="): "proxy.env-2",
    }
    name = pod_name(spec)
    secret = build_secret(spec, name=name, namespace=NAMESPACE, provider=PROVIDER)
    assert secret is not None
    assert secret["data"] == {
        "train.API_TOKEN": _b64(b"train-token"),
        "train.env-1": _b64(b"w1"),
        "proxy.API_TOKEN": _b64(b"proxy-token"),
        "proxy.env-0": _b64(b"literal"),
        "proxy.env-2": _b64(b"w2"),
    }
    pod = _build(spec, secret=True)
    text = json.dumps(pod)
    for value in ("train-token", "proxy-token", "w1", "w2", "literal"):
        assert value not in text
    proxy = pod["spec"]["initContainers"][1]
    assert proxy["env"][0] == {
        "name": "API_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": name, "key": "proxy.API_TOKEN"}},
    }
    assert pod["spec"]["containers"][0]["env"][2] == {"name": "MODE", "value": "fast"}


def test_a_fallback_secret_key_steps_around_a_literal_one() -> None:
    spec = _whole_spec(
        sidecar_env=(
            EnvVar("bad name", "a", secret=True),
            EnvVar("env-0", "b", secret=True),
        )
    )
    assert secret_keys(spec) == {
        ("proxy", "bad name"): "proxy.env-0-1",
        ("proxy", "env-0"): "proxy.env-0",
    }


def test_an_init_container_without_an_image_is_named() -> None:
    spec = _whole_spec()
    fetch, proxy = spec.init_containers
    imageless = dataclasses.replace(proxy, image="")
    broken = dataclasses.replace(spec, init_containers=(fetch, imageless))
    with pytest.raises(InvalidSpec) as raised:
        _build(broken)
    assert raised.value.field == "spec.initContainers[1].image"


# --- states ---------------------------------------------------------------------------------

STARTED = "2026-03-13T20:00:01Z"
FINISHED = "2026-03-13T20:00:09Z"


def _with_container(state: JSON) -> JSON:
    return {"containerStatuses": [{"name": "main", "state": state}]}


STATE_CASE_IDS = [
    "row3-pending",
    "row3-pending-unschedulable",
    "row3-pending-container-creating",
    "row4-running",
    "row5-succeeded",
    "row5-succeeded-without-statuses",
    "row6-failed-oom-killed",
    "row4-running-with-a-terminated-container",
    "row4-running-while-crash-looping",
    "row3-pending-init-container-running",
    "row3-pending-init-container-crash-looping",
    "row3-pending-image-pull",
    "row3-pending-init-container-failed",
    "row6-failed-first-failed-app-container",
    "row6-failed-init-container",
    "row7-failed-but-no-container-failed",
    "row7-failed-before-any-container-ran",
    "row8-unknown",
    "row2-evicted",
    "row2-preempting",
    "row2-out-of-gpus",
    "row2-disruption-target",
    "row1-deletion-requested",
]


@pytest.mark.parametrize(
    ("status", "metadata", "state", "exit_code", "message"),
    [
        ({"phase": "Pending"}, {}, InstanceState.PENDING, None, "Pending"),
        (
            {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/3 nodes are available",
                    }
                ],
            },
            {},
            InstanceState.PENDING,
            None,
            "Unschedulable: 0/3 nodes are available",
        ),
        (
            {"phase": "Pending", **_with_container({"waiting": {"reason": "ContainerCreating"}})},
            {},
            InstanceState.PENDING,
            None,
            "ContainerCreating",
        ),
        (
            {
                "phase": "Running",
                "podIP": "10.1.2.3",
                **_with_container({"running": {"startedAt": STARTED}}),
            },
            {},
            InstanceState.RUNNING,
            None,
            "",
        ),
        (
            {
                "phase": "Succeeded",
                **_with_container({"terminated": {"exitCode": 0, "reason": "Completed"}}),
            },
            {},
            InstanceState.EXITED,
            0,
            "Completed",
        ),
        ({"phase": "Succeeded"}, {}, InstanceState.EXITED, 0, "Completed"),
        (
            {
                "phase": "Failed",
                **_with_container(
                    {
                        "terminated": {
                            "exitCode": 137,
                            "reason": "OOMKilled",
                            "startedAt": STARTED,
                            "finishedAt": FINISHED,
                        }
                    }
                ),
            },
            {},
            InstanceState.EXITED,
            137,
            "OOMKilled",
        ),
        (
            # B's kubelet restarts it (restartPolicy is the pod's): the pod still runs.
            {"phase": "Running", **_with_container({"terminated": {"exitCode": 2}})},
            {},
            InstanceState.RUNNING,
            None,
            "",
        ),
        (
            {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "main",
                        "restartCount": 4,
                        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                        "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
                    }
                ],
            },
            {},
            InstanceState.RUNNING,
            None,
            "",
        ),
        (
            {
                "phase": "Pending",
                "initContainerStatuses": [
                    {"name": "fetch", "state": {"running": {"startedAt": STARTED}}},
                    {"name": "proxy", "state": {"waiting": {"reason": "PodInitializing"}}},
                ],
                **_with_container({"waiting": {"reason": "PodInitializing"}}),
            },
            {},
            InstanceState.PENDING,
            None,
            "PodInitializing: init container fetch is running",
        ),
        (
            {
                "phase": "Pending",
                "initContainerStatuses": [
                    {
                        "name": "fetch",
                        "restartCount": 2,
                        "state": {
                            "waiting": {
                                "reason": "CrashLoopBackOff",
                                "message": "back-off 20s restarting failed container=fetch",
                            }
                        },
                    }
                ],
                **_with_container({"waiting": {"reason": "PodInitializing"}}),
            },
            {},
            InstanceState.PENDING,
            None,
            "CrashLoopBackOff: back-off 20s restarting failed container=fetch",
        ),
        (
            {
                "phase": "Pending",
                **_with_container(
                    {"waiting": {"reason": "ErrImagePull", "message": "manifest unknown"}}
                ),
            },
            {},
            InstanceState.PENDING,
            None,
            "ErrImagePull: manifest unknown",
        ),
        (
            {
                "phase": "Pending",
                "initContainerStatuses": [
                    {"name": "fetch", "state": {"terminated": {"exitCode": 4, "reason": "Error"}}}
                ],
                **_with_container({"waiting": {"reason": "PodInitializing"}}),
            },
            {},
            InstanceState.PENDING,
            None,
            "Error: init container fetch exited with 4",
        ),
        (
            {
                "phase": "Failed",
                "containerStatuses": [
                    {"name": "a", "state": {"terminated": {"exitCode": 0}}},
                    {"name": "b", "state": {"terminated": {"exitCode": 5, "reason": "Error"}}},
                ],
            },
            {},
            InstanceState.EXITED,
            5,
            "container b: Error (exit code 5)",
        ),
        (
            {
                "phase": "Failed",
                "initContainerStatuses": [
                    {"name": "fetch", "state": {"terminated": {"exitCode": 7, "reason": "Error"}}}
                ],
                **_with_container({"waiting": {"reason": "PodInitializing"}}),
            },
            {},
            InstanceState.EXITED,
            7,
            "container fetch: Error (exit code 7)",
        ),
        (
            {
                "phase": "Failed",
                "reason": "Unknown",
                **_with_container({"terminated": {"exitCode": 0, "reason": "Completed"}}),
            },
            {},
            InstanceState.LOST,
            None,
            "none of its containers did (Unknown)",
        ),
        (
            {"phase": "Failed", "reason": "DeadlineExceeded"},
            {},
            InstanceState.LOST,
            None,
            "failed before any container ran (DeadlineExceeded)",
        ),
        ({"phase": "Unknown"}, {}, InstanceState.LOST, None, "lost contact"),
        (
            {"phase": "Failed", "reason": "Evicted", "message": "low on memory"},
            {},
            InstanceState.LOST,
            None,
            "Evicted: low on memory",
        ),
        ({"phase": "Running", "reason": "Preempting"}, {}, InstanceState.LOST, None, "Preempting"),
        (
            {"phase": "Failed", "reason": "OutOfnvidia.com/gpu"},
            {},
            InstanceState.LOST,
            None,
            "OutOf",
        ),
        (
            {
                "phase": "Running",
                "conditions": [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "DeletionByTaintManager",
                    }
                ],
            },
            {},
            InstanceState.LOST,
            None,
            "DeletionByTaintManager",
        ),
        (
            {"phase": "Running", **_with_container({"running": {"startedAt": STARTED}})},
            {"deletionTimestamp": FINISHED},
            InstanceState.TERMINATING,
            None,
            "deletion requested",
        ),
    ],
    ids=STATE_CASE_IDS,
)
def test_the_state_table(
    status: JSON,
    metadata: JSON,
    state: InstanceState,
    exit_code: int | None,
    message: str,
    request: pytest.FixtureRequest,
) -> None:
    row = int(request.node.callspec.id.split("-")[0].removeprefix("row"))
    assert _docstring_rows()[row - 1] == state.name  # the case tests the row it names
    seen = observe({"metadata": metadata, "status": status})
    assert seen.state is state
    assert seen.exit_code == exit_code
    assert message in seen.message


def _docstring_rows() -> list[str]:
    """The instance state of each row of the table in ``states``' docstring."""
    assert states.__doc__ is not None
    rows: list[str] = []
    for line in states.__doc__.splitlines()[1:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 2 or set(cells[1]) <= {"-"}:
            continue
        if cells[1] and cells[1] != "instance state":
            rows.append(cells[1].split()[0])
    return rows


def test_every_row_of_the_documented_table_is_tested() -> None:
    rows = _docstring_rows()
    assert rows == [
        "TERMINATING",
        "LOST",
        "PENDING",
        "RUNNING",
        "EXITED",
        "EXITED",
        "LOST",
        "LOST",
    ]
    tested = {int(case.split("-")[0].removeprefix("row")) for case in STATE_CASE_IDS}
    assert tested == set(range(1, len(rows) + 1))


def test_an_unknown_phase_is_malformed() -> None:
    with pytest.raises(MalformedResponse, match="'Hibernating'"):
        observe({"metadata": {}, "status": {"phase": "Hibernating"}})


def test_instances_carry_ip_times_offer_and_price() -> None:
    pod = _remote_pod(
        phase="Running",
        podIP="10.1.2.3",
        containerStatuses=[{"name": "main", "state": {"running": {"startedAt": STARTED}}}],
    )
    instance = parse_instance(pod, provider=PROVIDER)
    assert instance is not None
    assert (instance.instance_id, instance.pod_uid, instance.attempt) == (f"vk-{UID}-0", UID, 0)
    assert instance.state is InstanceState.RUNNING
    assert instance.ip == "10.1.2.3"
    assert instance.started_at == dt.datetime(2026, 3, 13, 20, 0, 1, tzinfo=dt.UTC)
    assert instance.offer_key == f"{PROVIDER}/{GPU_SHAPE.sku}/remote"
    assert instance.price_per_hour == pytest.approx(2.4)


def _whole_remote_pod(**status: Any) -> JSON:
    """A remote whole pod as B's API serves it: spec order train, exporter; fetch, proxy."""
    pod = _remote_pod(**status)
    pod["spec"] = {
        "restartPolicy": "Always",
        "initContainers": [
            {"name": "fetch-weights", "image": "example.com/fetch:1"},
            {"name": "proxy", "image": "example.com/proxy:1", "restartPolicy": "Always"},
        ],
        "containers": [
            {"name": "train", "image": "example.com/train:1"},
            {"name": "exporter", "image": "example.com/exporter:1"},
        ],
    }
    return pod


def _b_status(name: str, state: JSON, **fields: Any) -> JSON:
    """One entry of containerStatuses with every field a 1.3x kubelet writes."""
    return {
        "name": name,
        "image": f"example.com/{name}:1",
        "imageID": f"example.com/{name}@sha256:0f",
        "containerID": f"containerd://{name}0",
        "ready": False,
        "restartCount": 0,
        "started": False,
        "lastState": {},
        "state": state,
        **fields,
    }


RESTARTED = "2026-03-13T20:00:30Z"


def test_every_container_is_reported_in_spec_order_with_b_s_verdicts() -> None:
    pod = _whole_remote_pod(
        phase="Running",
        podIP="10.244.1.7",
        startTime="2026-03-13T20:00:00Z",
        initContainerStatuses=[
            _b_status(
                "fetch-weights",
                {
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "startedAt": STARTED,
                        "finishedAt": FINISHED,
                        "containerID": "containerd://fetch0",
                    }
                },
                ready=True,
            ),
            _b_status("proxy", {"running": {"startedAt": FINISHED}}, ready=True, started=True),
        ],
        # kubelet sorts app container statuses by name, not by the spec
        containerStatuses=[
            _b_status(
                "exporter",
                {
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": "back-off 20s restarting failed container=exporter",
                    }
                },
                restartCount=2,
                lastState={
                    "terminated": {
                        "exitCode": 2,
                        "reason": "Error",
                        "message": "bad flag",
                        "startedAt": FINISHED,
                        "finishedAt": RESTARTED,
                    }
                },
            ),
            _b_status("train", {"running": {"startedAt": RESTARTED}}, ready=True, started=True),
        ],
    )
    instance = parse_instance(pod, provider=PROVIDER)
    assert instance is not None
    assert instance.state is InstanceState.RUNNING
    assert instance.started_at == dt.datetime(2026, 3, 13, 20, 0, 30, tzinfo=dt.UTC)
    train, exporter = instance.containers
    assert (train.name, train.state, train.ready, train.started) == (
        "train",
        ContainerState.RUNNING,
        True,
        True,
    )
    assert (exporter.name, exporter.state, exporter.reason) == (
        "exporter",
        ContainerState.WAITING,
        "CrashLoopBackOff",
    )
    assert "back-off 20s" in exporter.message
    assert (exporter.ready, exporter.started, exporter.restart_count) == (False, False, 2)
    assert exporter.last_termination is not None
    assert (exporter.last_termination.exit_code, exporter.last_termination.message) == (
        2,
        "bad flag",
    )
    assert exporter.last_termination.finished_at == dt.datetime(
        2026, 3, 13, 20, 0, 30, tzinfo=dt.UTC
    )
    fetch, proxy = instance.init_containers
    assert (fetch.name, fetch.state, fetch.exit_code, fetch.reason) == (
        "fetch-weights",
        ContainerState.TERMINATED,
        0,
        "Completed",
    )
    assert fetch.finished_at == dt.datetime(2026, 3, 13, 20, 0, 9, tzinfo=dt.UTC)
    assert (proxy.state, proxy.ready, proxy.started) == (ContainerState.RUNNING, True, True)


def test_a_status_without_verdicts_leaves_them_unknown() -> None:
    pod = _whole_remote_pod(
        phase="Pending",
        containerStatuses=[{"name": "train", "state": {}, "ready": False}],
    )
    instance = parse_instance(pod, provider=PROVIDER)
    assert instance is not None
    (train,) = instance.containers
    assert (train.state, train.ready, train.started, train.restart_count) == (
        ContainerState.WAITING,
        False,
        None,
        0,
    )


def test_an_ended_pod_reports_every_app_container() -> None:
    succeeded = parse_instance(_whole_remote_pod(phase="Succeeded"), provider=PROVIDER)
    assert succeeded is not None
    assert [(c.name, c.state, c.exit_code) for c in succeeded.containers] == [
        ("train", ContainerState.TERMINATED, 0),
        ("exporter", ContainerState.TERMINATED, 0),
    ]
    failed = _whole_remote_pod(
        phase="Failed",
        initContainerStatuses=[
            _b_status("fetch-weights", {"terminated": {"exitCode": 3, "reason": "Error"}})
        ],
    )
    instance = parse_instance(failed, provider=PROVIDER)
    assert instance is not None
    assert (instance.state, instance.exit_code) == (InstanceState.EXITED, 3)
    assert [(c.name, c.state, c.reason) for c in instance.containers] == [
        ("train", ContainerState.WAITING, "PodInitializing"),
        ("exporter", ContainerState.WAITING, "PodInitializing"),
    ]


def test_a_failed_pod_names_the_first_failed_app_container_of_the_spec() -> None:
    pod = _whole_remote_pod(
        phase="Failed",
        containerStatuses=[
            _b_status(
                "exporter",
                {"terminated": {"exitCode": 9, "reason": "Error", "finishedAt": RESTARTED}},
            ),
            _b_status(
                "train",
                {"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": FINISHED}},
            ),
        ],
    )
    instance = parse_instance(pod, provider=PROVIDER)
    assert instance is not None
    assert (instance.state, instance.exit_code) == (InstanceState.EXITED, 137)
    assert instance.message == "container train: OOMKilled (exit code 137)"
    assert instance.finished_at == dt.datetime(2026, 3, 13, 20, 0, 30, tzinfo=dt.UTC)  # the last


def test_an_unreadable_container_status_is_malformed() -> None:
    pod = _whole_remote_pod(phase="Running", containerStatuses=[{"state": {}}])
    with pytest.raises(MalformedResponse, match="containerStatuses"):
        parse_instance(pod, provider=PROVIDER)


def test_pods_of_others_are_not_ours() -> None:
    other = _remote_pod()
    other["metadata"]["labels"][LABEL_MANAGED_BY] = "another-agent"
    assert parse_instance(other, provider=PROVIDER) is None
    unannotated = _remote_pod()
    unannotated["metadata"]["annotations"] = {}
    assert parse_instance(unannotated, provider=PROVIDER) is None


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failure", "call", "expected"),
    [
        (ApiFailure(401, "Unauthorized", "Unauthorized"), Call.READ, AuthFailed),
        (
            ApiFailure(
                403, "Forbidden", 'pods is forbidden: User "x" cannot create resource "pods"'
            ),
            Call.WRITE,
            AuthFailed,
        ),
        (
            ApiFailure(
                403, "Forbidden", 'pods "p" is forbidden: exceeded quota: q, requested: pods=1'
            ),
            Call.WRITE,
            CapacityUnavailable,
        ),
        (
            ApiFailure(
                403,
                "Forbidden",
                'pods "p" is forbidden: error looking up service account ns/default: '
                'serviceaccount "default" not found',
            ),
            Call.WRITE,
            Transient,
        ),
        (ApiFailure(404, "NotFound", 'pods "p" not found'), Call.READ, NotFound),
        (ApiFailure(409, "Conflict", "the object has been modified"), Call.WRITE, Transient),
        (ApiFailure(422, "Invalid", "Pod is invalid"), Call.WRITE, InvalidSpec),
        (ApiFailure(400, "BadRequest", "bad"), Call.WRITE, InvalidSpec),
        (
            ApiFailure(400, "BadRequest", 'container "main" is waiting to start'),
            Call.LOGS,
            Transient,
        ),
        (
            ApiFailure(
                400,
                "BadRequest",
                'previous terminated container "main" in pod "p" not found',
            ),
            Call.LOGS,
            NotFound,
        ),
        (ApiFailure(429, "TooManyRequests", "slow down", retry_after=3.0), Call.READ, RateLimited),
        (ApiFailure(500, "InternalError", "etcd timeout"), Call.READ, Transient),
        (ApiFailure(503, "ServiceUnavailable", ""), Call.READ, Transient),
        (ApiFailure(None, message="ConnectError: refused"), Call.READ, Transient),
    ],
)
def test_each_failure_lands_in_its_class(
    failure: ApiFailure, call: Call, expected: type[ProviderError]
) -> None:
    error = classify_failure(failure, provider=PROVIDER, what="create pod p", call=call)
    assert type(error) is expected
    assert error.provider == PROVIDER
    assert "create pod p" in str(error)
    if isinstance(error, RateLimited):
        assert error.retry_after == 3.0


def test_invalid_names_the_field_from_the_status_causes() -> None:
    response = _status(
        422,
        "Invalid",
        'Pod "p9" is invalid: spec.containers[0].ports[0].containerPort: Required value',
        name="p9",
        kind="Pod",
        causes=[
            {
                "reason": "FieldValueRequired",
                "message": "Required value",
                "field": "spec.containers[0].ports[0].containerPort",
            }
        ],
    )
    failure = api_failure(response)
    assert failure.fields == ("spec.containers[0].ports[0].containerPort",)
    error = classify_failure(failure, provider=PROVIDER, what="create pod p9", call=Call.WRITE)
    assert isinstance(error, InvalidSpec)
    assert error.field == "spec.containers[0].ports[0].containerPort"
    no_causes = classify_failure(
        ApiFailure(422, "Invalid", 'Pod "p" is invalid: spec.containers[0].image: Required value'),
        provider=PROVIDER,
        what="create",
        call=Call.WRITE,
    )
    assert isinstance(no_causes, InvalidSpec) and no_causes.field == "spec.containers[0].image"


def test_retry_after_comes_from_the_header_or_the_status() -> None:
    header = httpx.Response(429, text="Too many requests", headers={"Retry-After": "2"})
    assert api_failure(header).retry_after == 2.0
    assert api_failure(header).message == "Too many requests"
    status = _status(429, "TooManyRequests", "slow", retryAfterSeconds=7)
    assert api_failure(status).retry_after == 7.0
    assert api_failure(status).reason == "TooManyRequests"


# --- logs helpers ---------------------------------------------------------------------------


def test_log_parameters() -> None:
    options = LogOptions(
        tail_lines=10, follow=True, timestamps=True, since_seconds=60, limit_bytes=5
    )
    assert log_params("main", options) == {
        "container": "main",
        "follow": "true",
        "timestamps": "true",
        "tailLines": "10",
        "sinceSeconds": "60",
        "limitBytes": "5",
    }
    assert log_params("main", LogOptions()) == {"container": "main"}
    assert log_params("proxy", LogOptions(previous=True)) == {
        "container": "proxy",
        "previous": "true",
    }


def test_lines_are_whole_and_end_with_a_newline() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"one\ntw") == [b"one\n"]
    assert splitter.feed(b"o\nthr") == [b"two\n"]
    assert splitter.feed(b"ee") == []
    assert splitter.flush() == b"three\n"
    assert splitter.flush() == b""


# --- the adapter over HTTP ------------------------------------------------------------------


async def test_it_is_a_whole_pod_provider_with_every_log_capability(
    provider: KubernetesProvider,
) -> None:
    assert isinstance(provider, Provider)
    assert provider.name == PROVIDER
    caps = provider.capabilities
    assert (caps.logs, caps.follow_logs, caps.log_timestamps, caps.previous_logs) == (
        True,
        True,
        True,
        True,
    )
    assert (caps.multi_container, caps.init_containers, caps.sidecars) == (True, True, True)
    assert caps.probes == "provider"  # B's kubelet probes; the agent shows its verdicts
    # Relayed through B's API server (exec and attach, port-forward, metrics.k8s.io).
    assert (caps.exec, caps.attach, caps.port_forward, caps.usage) == (True, True, True, True)


def _pod_metrics(cpu: str, memory: str, at: str) -> JSON:
    return {
        "kind": "PodMetrics",
        "apiVersion": "metrics.k8s.io/v1beta1",
        "metadata": {"name": f"vk-{UID}-0", "namespace": NAMESPACE},
        "timestamp": at,
        "window": "10s",
        "containers": [{"name": "main", "usage": {"cpu": cpu, "memory": memory}}],
    }


async def test_usage_is_read_from_metrics_k8s_io_and_counted_up(
    provider: KubernetesProvider, fake: FakeApi
) -> None:
    name = f"vk-{UID}-0"
    answers = [
        _pod_metrics("500m", "64Mi", "2026-01-01T00:00:00Z"),
        _pod_metrics("250m", "65Mi", "2026-01-01T00:00:20Z"),
    ]
    path = f"/apis/metrics.k8s.io/v1beta1/namespaces/{NAMESPACE}/pods/{name}"

    def metrics(request: httpx.Request) -> httpx.Response | None:
        return httpx.Response(200, json=answers.pop(0)) if request.url.path == path else None

    fake.overrides.append(metrics)
    (first,) = await provider.usage(name)
    assert (first.name, first.cpu_core_nanoseconds) == ("main", 5_000_000_000)  # 0.5 x 10 s
    assert first.memory_working_set_bytes == 64 * 2**20
    (second,) = await provider.usage(name)
    assert second.cpu_core_nanoseconds == 5_000_000_000 + 250_000_000 * 20
    assert second.timestamp - first.timestamp == dt.timedelta(seconds=20)
    assert fake.calls()[-1] == f"GET {path}"


async def test_no_metrics_yet_is_no_usage_not_zero(
    provider: KubernetesProvider, fake: FakeApi
) -> None:
    fake.overrides.append(
        lambda request: (
            _status(404, "NotFound", 'podmetrics.metrics.k8s.io "x" not found')
            if "metrics.k8s.io" in request.url.path
            else None
        )
    )
    assert await provider.usage(f"vk-{UID}-0") == []
    with pytest.raises(NotFound):
        await provider.usage("../not-a-pod-name")


async def test_exec_into_a_container_the_pod_lacks_names_it(
    provider: KubernetesProvider, fake: FakeApi
) -> None:
    instance = await provider.create(_spec(), _offer())
    with pytest.raises(NotFound, match="has no container 'nope'"):
        await provider.exec(instance.instance_id, "nope", ["true"], tty=False)


async def test_create_sends_the_token_and_returns_a_pending_instance(
    provider: KubernetesProvider, fake: FakeApi
) -> None:
    instance = await provider.create(_spec(), _offer())
    assert instance.instance_id == f"vk-{UID}-0"
    assert instance.state is InstanceState.PENDING
    assert (instance.pod_uid, instance.attempt) == (UID, 0)
    assert instance.offer_key == f"{PROVIDER}/1gpu.8cpu.32gib/remote"
    (post,) = fake.requests
    assert post.headers["Authorization"] == f"Bearer {TOKEN}"
    assert post.url.params["fieldManager"] == "vk-provider"
    assert fake.calls() == [f"POST /api/v1/namespaces/{NAMESPACE}/pods"]


async def test_a_second_create_returns_the_same_pod(
    provider: KubernetesProvider, fake: FakeApi
) -> None:
    first = await provider.create(_spec(), _offer())
    second = await provider.create(_spec(), _offer())
    assert second.instance_id == first.instance_id
    assert len(fake.pods) == 1
    assert fake.calls()[-1] == f"GET /api/v1/namespaces/{NAMESPACE}/pods/{first.instance_id}"


async def test_a_pod_of_that_name_made_for_something_else_is_refused(
    provider: KubernetesProvider, fake: FakeApi
) -> None:
    squatter = _remote_pod()
    squatter["metadata"]["annotations"][ANN_ATTEMPT] = "5"
    fake.pods[squatter["metadata"]["name"]] = squatter
    with pytest.raises(CapacityUnavailable, match="not made for"):
        await provider.create(_spec(), _offer())


async def test_a_missing_namespace_is_named_never_created_and_spares_the_breaker(
    monkeypatch: pytest.MonkeyPatch, fake: FakeApi, sleeps: Sleeps
) -> None:
    fake.namespaces.clear()
    adapter = KubernetesProvider(
        _config(monkeypatch),
        transport=fake.transport(),
        retry=dataclasses.replace(DEFAULT_RETRY, sleep=sleeps),
    )
    secret = EnvVar("TOKEN", "s3cr3t-value", secret=True)
    try:
        with pytest.raises(CapacityUnavailable) as raised:
            await adapter.create(_spec(), _offer())
        with pytest.raises(CapacityUnavailable):
            await adapter.create(_spec(attempt=1, env=(secret,)), _offer())
    finally:
        await adapter.close()
    message = str(raised.value)
    assert f"namespace {NAMESPACE!r} does not exist" in message
    assert "create/get/list/delete pods" in message and "never creates namespaces" in message
    # Never creates the namespace nor reads its ServiceAccount (rights nobody was granted).
    assert fake.calls() == [
        f"POST /api/v1/namespaces/{NAMESPACE}/pods",
        f"POST /api/v1/namespaces/{NAMESPACE}/secrets",
    ]
    assert not counts_as_failure(raised.value)  # the provider answers; it is only not set up


async def test_secret_first_then_pod_then_owner(
    provider: KubernetesProvider, fake: FakeApi
) -> None:
    spec = _spec(env=(EnvVar("API_TOKEN", "hunter2", secret=True),))
    instance = await provider.create(spec, _offer())
    base = f"/api/v1/namespaces/{NAMESPACE}"
    name = instance.instance_id
    assert fake.calls() == [
        f"POST {base}/secrets",
        f"POST {base}/pods",
        f"PATCH {base}/secrets/{name}",
    ]
    patch = fake.requests[2]
    assert patch.headers["Content-Type"] == "application/merge-patch+json"
    pod_uid = fake.pods[name]["metadata"]["uid"]
    assert fake.secrets[name]["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod_uid, "controller": True}
    ]
    assert "hunter2" not in json.dumps(fake.pods[name])


async def test_a_refused_pod_takes_its_secret_with_it_and_names_the_field(
    provider: KubernetesProvider, fake: FakeApi
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response | None:
        if request.method == "POST" and request.url.path.endswith("/pods"):
            return _status(
                422,
                "Invalid",
                'Pod "p" is invalid: spec.containers[0].env[0].valueFrom: hunter2 is not allowed',
                causes=[{"field": "spec.containers[0].env[0].valueFrom", "message": "x"}],
            )
        return None

    fake.overrides.append(refuse)
    spec = _spec(env=(EnvVar("API_TOKEN", "hunter2", secret=True),))
    with pytest.raises(InvalidSpec) as raised:
        await provider.create(spec, _offer())
    assert raised.value.field == "spec.containers[0].env[0].valueFrom"
    assert "hunter2" not in str(raised.value)
    assert fake.secrets == {}
    assert fake.calls()[-1] == f"DELETE /api/v1/namespaces/{NAMESPACE}/secrets/{pod_name(spec)}"


async def test_an_existing_secret_is_brought_up_to_date(
    provider: KubernetesProvider, fake: FakeApi
) -> None:
    spec = _spec(env=(EnvVar("API_TOKEN", "new", secret=True),))
    fake.secrets[pod_name(spec)] = {
        "metadata": {"name": pod_name(spec)},
        "data": {"main.API_TOKEN": "b2xk"},
    }
    await provider.create(spec, _offer())
    assert fake.secrets[pod_name(spec)]["data"] == {"main.API_TOKEN": _b64(b"new")}


async def test_a_whole_pod_is_created_with_one_secret_for_all_its_containers(
    provider: KubernetesProvider, fake: FakeApi
) -> None:
    spec = _whole_spec(
        env=(EnvVar("API_TOKEN", "train-token", secret=True),),
        sidecar_env=(EnvVar("API_TOKEN", "proxy-token", secret=True),),
    )
    instance = await provider.create(spec, _offer())
    name = instance.instance_id
    assert fake.secrets[name]["data"] == {
        "train.API_TOKEN": _b64(b"train-token"),
        "proxy.API_TOKEN": _b64(b"proxy-token"),
    }
    pod = fake.pods[name]
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["fetch-weights", "proxy"]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["train", "exporter"]
    assert pod["spec"]["restartPolicy"] == "OnFailure"
    assert "train-token" not in json.dumps(pod) and "proxy-token" not in json.dumps(pod)


async def test_every_container_s_secret_is_redacted_from_a_refusal(
    provider: KubernetesProvider, fake: FakeApi
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response | None:
        if request.method == "POST" and request.url.path.endswith("/pods"):
            return _status(
                422,
                "Invalid",
                'Pod "p" is invalid: spec.initContainers[1].env[0]: proxy-token, train-token',
                causes=[{"field": "spec.initContainers[1].env[0]", "message": "x"}],
            )
        return None

    fake.overrides.append(refuse)
    spec = _whole_spec(
        env=(EnvVar("API_TOKEN", "train-token", secret=True),),
        sidecar_env=(EnvVar("API_TOKEN", "proxy-token", secret=True),),
    )
    with pytest.raises(InvalidSpec) as raised:
        await provider.create(spec, _offer())
    assert raised.value.field == "spec.initContainers[1].env[0]"
    assert "proxy-token" not in str(raised.value) and "train-token" not in str(raised.value)
    assert fake.secrets == {}


@pytest.mark.parametrize(
    ("sku", "provider_name"),
    [("a100", PROVIDER), (GPU_SHAPE.sku, "someone-else"), ("0gpu.1cpu.2gib", PROVIDER)],
)
async def test_foreign_or_too_small_offers_are_capacity_errors(
    provider: KubernetesProvider, fake: FakeApi, sku: str, provider_name: str
) -> None:
    offer = Offer(
        provider=provider_name,
        sku=sku,
        region="remote",
        gpu_model=None,
        gpu_count=0,
        gpu_memory_gib=0,
        vcpus=1,
        memory_gib=2,
        price_per_hour=0.1,
    )
    with pytest.raises(CapacityUnavailable):
        await provider.create(_spec(), offer)
    assert fake.requests == []


async def test_server_errors_are_retried_then_succeed(
    provider: KubernetesProvider, fake: FakeApi, sleeps: Sleeps
) -> None:
    failures = iter([_status(500, "InternalError", "etcd"), _status(503, "ServiceUnavailable", "")])

    def flaky(request: httpx.Request) -> httpx.Response | None:
        return next(failures, None)

    fake.overrides.append(flaky)
    instance = await provider.create(_spec(), _offer())
    assert instance.state is InstanceState.PENDING
    assert sleeps.waits == [0.25, 0.5]


async def test_a_lost_answer_is_found_by_the_retry(
    provider: KubernetesProvider, fake: FakeApi
) -> None:
    lost = {"done": False}

    def lose_first_answer(request: httpx.Request) -> httpx.Response | None:
        if request.method == "POST" and not lost["done"]:
            lost["done"] = True
            fake.overrides.remove(lose_first_answer)
            fake.handle(request)  # the pod is made ...
            raise httpx.ReadTimeout("timed out", request=request)  # ... the answer is lost
        return None

    fake.overrides.append(lose_first_answer)
    instance = await provider.create(_spec(), _offer())
    assert instance.pod_uid == UID
    assert len(fake.pods) == 1


async def test_rate_limits_wait_as_told_then_give_up(
    provider: KubernetesProvider, fake: FakeApi, sleeps: Sleeps
) -> None:
    fake.overrides.append(
        lambda r: httpx.Response(
            429,
            headers={"Retry-After": "1"},
            json={
                "kind": "Status",
                "reason": "TooManyRequests",
                "message": "slow down",
                "code": 429,
            },
        )
    )
    with pytest.raises(RateLimited) as raised:
        await provider.get("vk-x-0")
    assert raised.value.retry_after == 1.0
    assert sleeps.waits == [1.0, 1.0, 1.0]


async def test_connection_errors_become_transient_after_the_retries(
    provider: KubernetesProvider, fake: FakeApi, sleeps: Sleeps
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    fake.overrides.append(refuse)
    with pytest.raises(Transient, match="ConnectError"):
        await provider.list_ours()
    assert len(fake.requests) == 4


async def test_malformed_answers_are_transient_and_say_what(
    provider: KubernetesProvider, fake: FakeApi
) -> None:
    fake.overrides.append(lambda r: httpx.Response(200, content=b"<html>proxy</html>"))
    with pytest.raises(Transient, match="malformed JSON"):
        await provider.get("vk-x-0")
    fake.overrides[:] = [lambda r: httpx.Response(200, json={"kind": "PodList"})]
    with pytest.raises(Transient, match="'items' is missing"):
        await provider.list_ours()


async def test_the_token_is_never_in_a_message(
    provider: KubernetesProvider, fake: FakeApi, caplog: pytest.LogCaptureFixture
) -> None:
    fake.overrides.append(lambda r: _status(401, "Unauthorized", f"token {TOKEN} expired"))
    caplog.set_level(logging.DEBUG)
    with pytest.raises(AuthFailed) as raised:
        await provider.get("vk-x-0")
    assert TOKEN not in str(raised.value)
    assert TOKEN not in caplog.text


async def test_get_reads_ours_and_refuses_others(
    provider: KubernetesProvider, fake: FakeApi
) -> None:
    fake.pods[f"vk-{UID}-0"] = _remote_pod(phase="Running", podIP="10.0.0.9")
    other = _remote_pod("vk-other-0")
    other["metadata"]["labels"][LABEL_MANAGED_BY] = "another-agent"
    fake.pods["vk-other-0"] = other
    got = await provider.get(f"vk-{UID}-0")
    assert (got.state, got.ip) == (InstanceState.RUNNING, "10.0.0.9")
    with pytest.raises(NotFound, match="not ours"):
        await provider.get("vk-other-0")
    with pytest.raises(NotFound):
        await provider.get("vk-gone-0")
    with pytest.raises(NotFound):
        await provider.get("../../nodes/x")
    assert len(fake.requests) == 3  # the last one never went out


async def test_list_selects_by_label_and_keeps_only_ours(
    provider: KubernetesProvider, fake: FakeApi
) -> None:
    fake.pods[f"vk-{UID}-0"] = _remote_pod()
    unannotated = _remote_pod("vk-stray-0")
    unannotated["metadata"]["annotations"] = {}
    fake.pods["vk-stray-0"] = unannotated
    listed = await provider.list_ours()
    assert [i.instance_id for i in listed] == [f"vk-{UID}-0"]
    assert fake.requests[0].url.params["labelSelector"] == f"{LABEL_MANAGED_BY}={PROVIDER}"


@pytest.mark.parametrize(("grace", "sent"), [(0, 1), (0.2, 1), (7.5, 8), (30, 30)])
async def test_delete_asks_for_a_grace_period_and_drops_the_secret(
    provider: KubernetesProvider, fake: FakeApi, grace: float, sent: int
) -> None:
    fake.pods[f"vk-{UID}-0"] = _remote_pod()
    await provider.delete(f"vk-{UID}-0", grace_seconds=grace)
    assert fake.pods == {}
    delete = fake.requests[0]
    assert json.loads(delete.content) == {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "gracePeriodSeconds": sent,
        "propagationPolicy": "Background",
    }
    assert fake.calls()[1] == f"DELETE /api/v1/namespaces/{NAMESPACE}/secrets/vk-{UID}-0"


async def test_deleting_what_is_gone_succeeds(provider: KubernetesProvider, fake: FakeApi) -> None:
    await provider.delete("vk-gone-0", grace_seconds=0)
    await provider.delete("Not A Name", grace_seconds=0)
    assert len(fake.requests) == 2  # pod and secret of the first; nothing for the second


async def test_logs_stream_whole_lines_with_the_query(
    provider: KubernetesProvider, fake: FakeApi
) -> None:
    fake.pods[f"vk-{UID}-0"] = _remote_pod(phase="Running")
    fake.log_body = b"2026-03-13T20:00:01.5Z hello\n2026-03-13T20:00:02Z partial"
    options = LogOptions(tail_lines=2, timestamps=True)
    chunks = [c async for c in provider.logs(f"vk-{UID}-0", options)]
    assert chunks == [b"2026-03-13T20:00:01.5Z hello\n", b"2026-03-13T20:00:02Z partial\n"]
    request = fake.requests[-1]
    assert request.url.path.endswith("/log")
    assert dict(request.url.params) == {"container": "main", "timestamps": "true", "tailLines": "2"}


async def test_logs_of_a_chosen_container_sidecar_or_init_container(
    provider: KubernetesProvider, fake: FakeApi
) -> None:
    fake.pods[f"vk-{UID}-0"] = _whole_remote_pod(phase="Running")
    fake.log_body = b"proxy up\n"
    for wanted, sent in (
        (None, "train"),
        ("exporter", "exporter"),
        ("proxy", "proxy"),
        ("fetch-weights", "fetch-weights"),
    ):
        chunks = [c async for c in provider.logs(f"vk-{UID}-0", LogOptions(container=wanted))]
        assert chunks == [b"proxy up\n"]
        assert fake.requests[-1].url.params["container"] == sent


async def test_logs_of_an_unknown_container_are_refused_by_name(
    provider: KubernetesProvider, fake: FakeApi
) -> None:
    fake.pods[f"vk-{UID}-0"] = _whole_remote_pod(phase="Running")
    with pytest.raises(NotFound, match="no container 'sidecar'") as raised:
        _ = [c async for c in provider.logs(f"vk-{UID}-0", LogOptions(container="sidecar"))]
    assert "train, exporter, fetch-weights, proxy" in str(raised.value)
    assert not any(r.url.path.endswith("/log") for r in fake.requests)


async def test_previous_logs_are_asked_for_and_a_missing_run_is_not_found(
    provider: KubernetesProvider, fake: FakeApi
) -> None:
    name = f"vk-{UID}-0"
    fake.pods[name] = _whole_remote_pod(phase="Running")
    fake.log_body = b"the run before\n"
    options = LogOptions(container="exporter", previous=True)
    assert [c async for c in provider.logs(name, options)] == [b"the run before\n"]
    assert dict(fake.requests[-1].url.params) == {"container": "exporter", "previous": "true"}

    def no_previous(request: httpx.Request) -> httpx.Response | None:
        if request.url.path.endswith("/log") and request.url.params.get("previous"):
            # What B's API server answers (kubelet's error, as a BadRequest Status).
            container = request.url.params["container"]
            return _status(
                400,
                "BadRequest",
                f'previous terminated container "{container}" in pod "{name}" not found',
            )
        return None

    fake.overrides.append(no_previous)
    sent = len(fake.requests)
    with pytest.raises(NotFound) as raised:
        _ = [c async for c in provider.logs(name, LogOptions(container="train", previous=True))]
    message = str(raised.value)
    assert "the container has not restarted" in message and "'train'" in message
    assert len(fake.requests) == sent + 2  # the pod, then one log request: not retried


async def test_logs_of_a_missing_pod_are_not_found(provider: KubernetesProvider) -> None:
    with pytest.raises(NotFound):
        _ = [c async for c in provider.logs("vk-gone-0", LogOptions())]


async def test_offers_from_nodes_and_pods(provider: KubernetesProvider, fake: FakeApi) -> None:
    fake.nodes = [_node("gpu-1", gpus=2, cpu="16", memory="64Gi"), _node("down", ready=False)]
    fake.cluster_pods = [
        _bound_pod(
            "gpu-1", gpus=1, cpu="2", namespace=NAMESPACE, labels={LABEL_MANAGED_BY: PROVIDER}
        )
    ]
    offers = {o.sku: o for o in await provider.offers()}
    assert offers["1gpu.8cpu.32gib"].available == 1
    assert offers["2gpu.16cpu.64gib"].available == 0
    assert offers["0gpu.1cpu.4gib"].available == 14
    pods_query = fake.requests[1].url.params["fieldSelector"]
    assert pods_query == "status.phase!=Succeeded,status.phase!=Failed"


async def test_a_secret_that_cannot_be_deleted_does_not_fail_the_delete(
    provider: KubernetesProvider, fake: FakeApi, caplog: pytest.LogCaptureFixture
) -> None:
    fake.pods[f"vk-{UID}-0"] = _remote_pod()

    def forbid_secrets(request: httpx.Request) -> httpx.Response | None:
        if "/secrets/" in request.url.path:
            return _status(403, "Forbidden", 'secrets "x" is forbidden: User cannot delete')
        return None

    fake.overrides.append(forbid_secrets)
    await provider.delete(f"vk-{UID}-0", grace_seconds=3)
    assert fake.pods == {}
    assert "not cleaned up" in caplog.text


async def test_a_byte_limited_log_keeps_its_cut(
    provider: KubernetesProvider, fake: FakeApi
) -> None:
    fake.pods[f"vk-{UID}-0"] = _remote_pod(phase="Running")
    fake.log_body = b"line one\nline t"
    chunks = [c async for c in provider.logs(f"vk-{UID}-0", LogOptions(limit_bytes=15))]
    assert b"".join(chunks) == b"line one\nline t"


async def test_the_provider_reads_a_kubeconfig_file_with_relative_paths(
    tmp_path: Path,
) -> None:
    ca, cert, key = _pki()
    (tmp_path / "ca.crt").write_bytes(ca)
    (tmp_path / "admin.crt").write_bytes(cert)
    (tmp_path / "admin.key").write_bytes(key)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        _kubeconfig(
            {"client-certificate": "admin.crt", "client-key": "admin.key"},
            cluster={"server": SERVER, "certificate-authority": "ca.crt"},
        )
    )
    config = KubernetesProviderConfig.model_validate(
        {"type": "kubernetes", "name": PROVIDER, "kubeconfig": f"file:{kubeconfig}"}
    )
    adapter = KubernetesProvider(config)  # builds its TLS transport from the files
    await adapter.close()
    kubeconfig.write_text(_kubeconfig({"exec": {"command": "aws"}}))
    with pytest.raises(ConfigError, match="exec is not supported"):
        KubernetesProvider(config)


# --- redaction: canaries through every error path ----------------------------------------


def _canary_answers() -> dict[str, httpx.Response | Exception]:
    text = canary.echo()
    return {
        "status 422": _status(422, "Invalid", text, causes=[{"field": "spec", "message": text}]),
        "status 500": _status(500, "InternalError", text),
        "long 403": _status(403, "Forbidden", "x" * 490 + " " + canary.KEY),
        "text 503": httpx.Response(503, text=text),
        "malformed": httpx.Response(200, content=b"<html>" + text.encode()),
        "transport": httpx.ConnectError(f"proxy refused: {text}"),
    }


_KUBE_ROUTES = {
    "offers": ("GET", "/api/v1/nodes"),
    "create-secret": ("POST", f"/api/v1/namespaces/{NAMESPACE}/secrets"),
    "create-pod": ("POST", f"/api/v1/namespaces/{NAMESPACE}/pods"),
    "create-owner": ("PATCH", f"/api/v1/namespaces/{NAMESPACE}/secrets/"),
    "list": ("GET", f"/api/v1/namespaces/{NAMESPACE}/pods"),
    "get": ("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/"),
    "delete": ("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/"),
    "logs": ("GET", "/log"),
}


@pytest.mark.parametrize("answer", list(_canary_answers()))
@pytest.mark.parametrize("operation", list(_KUBE_ROUTES))
async def test_no_canary_leaks_from_any_error_path(
    operation: str,
    answer: str,
    fake: FakeApi,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if (operation, answer) == ("logs", "malformed"):
        pytest.skip("a 200 log answer is the container's own output, not an error")
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("VK_TEST_KUBECONFIG_B", _kubeconfig({"token": canary.KEY}))
    config = KubernetesProviderConfig.model_validate(
        {
            "type": "kubernetes",
            "name": PROVIDER,
            "kubeconfig": "env:VK_TEST_KUBECONFIG_B",
            "namespace": NAMESPACE,
        }
    )
    adapter = KubernetesProvider(
        config,
        transport=fake.transport(),
        retry=dataclasses.replace(DEFAULT_RETRY, attempts=2, sleep=Sleeps()),
    )
    created = await adapter.create(_spec(attempt=5), _offer())
    method, path = _KUBE_ROUTES[operation]
    reply = _canary_answers()[answer]

    def inject(request: httpx.Request) -> httpx.Response | None:
        matches = request.method == method and (
            request.url.path == path
            if not path.endswith("/") and operation != "logs"
            else (
                request.url.path.endswith(path)
                if operation == "logs"
                else request.url.path.startswith(path) and not request.url.path.endswith("/log")
            )
        )
        if not matches:
            return None
        if isinstance(reply, Exception):
            raise reply
        return reply

    fake.overrides.append(inject)
    workload = _spec(env=(EnvVar("HF_TOKEN", canary.SECRET, secret=True),))
    returned: list[object] = []
    error: BaseException | None = None
    try:
        if operation == "offers":
            returned.append(await adapter.offers())
        elif operation.startswith("create"):
            returned.append(await adapter.create(workload, _offer()))
        elif operation == "list":
            returned.append(await adapter.list_ours())
        elif operation == "get":
            returned.append(await adapter.get(created.instance_id))
        elif operation == "delete":
            returned.append(await adapter.delete(created.instance_id, grace_seconds=0))
        else:
            returned.append([c async for c in adapter.logs(created.instance_id, LogOptions())])
    except ProviderError as exc:
        error = exc
    finally:
        await adapter.close()
    values = (canary.KEY, canary.SECRET) if operation.startswith("create") else (canary.KEY,)
    canary.assert_clean(error=error, records=caplog.records, returned=returned, values=values)


@pytest.mark.parametrize(
    ("server", "allowed", "fine"),
    [
        ("http://cluster-b.example:6443", True, False),
        ("http://127.0.0.1:6443", False, False),
        ("http://127.0.0.1:6443", True, True),
    ],
)
def test_a_kubeconfig_server_must_be_https_unless_loopback_and_allowed(
    server: str, allowed: bool, fine: bool
) -> None:
    text = _kubeconfig({"token": TOKEN}, cluster={"server": server})
    if fine:
        assert load_kubeconfig(text, allow_insecure_loopback=allowed).server == server
        return
    with pytest.raises(KubeconfigError, match="context 'b'") as raised:
        load_kubeconfig(text, allow_insecure_loopback=allowed)
    assert TOKEN not in str(raised.value)


# --- endpoints: where cluster A reaches the declared ports (config.expose) -----------------


def _ported_spec() -> WorkloadSpec:
    """A whole pod declaring ports in every kind of container: named and unnamed, UDP, one
    declared twice, and one on a plain init container (which serves nothing once the pod runs)."""
    spec = _whole_spec()
    train, exporter = spec.containers
    fetch, proxy = spec.init_containers
    return dataclasses.replace(
        spec,
        containers=(
            dataclasses.replace(train, ports=(Port(8080, "TCP", "http"), Port(5353, "UDP"))),
            dataclasses.replace(exporter, ports=(Port(9100), Port(8080, "TCP"))),
        ),
        init_containers=(
            dataclasses.replace(fetch, ports=(Port(7000),)),
            dataclasses.replace(proxy, ports=(Port(15000, "TCP", "proxy"),)),
        ),
    )


# (containerPort, protocol) the pod of ``_ported_spec`` exposes, sidecars first as in B's spec.
PORTED = [(15000, "TCP"), (8080, "TCP"), (5353, "UDP"), (9100, "TCP")]


def _address(kind: str, address: str) -> JSON:
    return {"type": kind, "address": address}


def _b_node(
    name: str,
    *addresses: JSON,
    ready: bool = True,
    unschedulable: bool = False,
    labels: dict[str, str] | None = None,
) -> JSON:
    node = _node(name, ready=ready, unschedulable=unschedulable, labels=labels)
    node["status"]["addresses"] = list(addresses)
    return node


def _runs(fake: FakeApi, name: str, pod_ip: str = "10.244.1.7") -> None:
    """What B's kubelet writes once the pod runs."""
    fake.pods[name]["status"] = {
        "phase": "Running",
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": "2026-03-13T20:00:00Z",
    }


@contextlib.asynccontextmanager
async def _exposing(
    monkeypatch: pytest.MonkeyPatch, fake: FakeApi, sleeps: Sleeps, **config: Any
) -> AsyncIterator[KubernetesProvider]:
    adapter = KubernetesProvider(
        _config(monkeypatch, **config),
        transport=fake.transport(),
        retry=dataclasses.replace(DEFAULT_RETRY, sleep=sleeps),
    )
    try:
        yield adapter
    finally:
        await adapter.close()


def _reached(instance: Instance) -> set[tuple[int, str, str, int]]:
    return {(e.container_port, e.protocol, e.address, e.port) for e in instance.endpoints}


async def test_by_default_nothing_is_exposed_and_no_service_is_read_or_made(
    provider: KubernetesProvider, fake: FakeApi
) -> None:
    assert _config(pytest.MonkeyPatch()).expose == "none"
    instance = await provider.create(_ported_spec(), _offer())
    _runs(fake, instance.instance_id)
    assert (await provider.get(instance.instance_id)).endpoints == ()
    (listed,) = await provider.list_ours()
    assert listed.endpoints == ()
    assert fake.services == {}
    assert not [c for c in fake.calls() if "/services" in c or c.endswith("/nodes")]


async def test_flat_reports_each_declared_port_at_the_running_pods_ip(
    monkeypatch: pytest.MonkeyPatch, fake: FakeApi, sleeps: Sleeps
) -> None:
    async with _exposing(monkeypatch, fake, sleeps, expose="flat") as adapter:
        created = await adapter.create(_ported_spec(), _offer())
        assert created.endpoints == ()  # Pending: nothing runs, nothing is reached
        _runs(fake, created.instance_id, "10.244.1.7")
        got = await adapter.get(created.instance_id)
        (listed,) = await adapter.list_ours()
    expected = {(port, protocol, "10.244.1.7", port) for port, protocol in PORTED}
    assert _reached(got) == _reached(listed) == expected
    assert len(got.endpoints) == len(PORTED)  # 8080 declared twice, reported once; 7000 not
    assert fake.services == {}  # flat makes nothing in B


@pytest.mark.parametrize(
    "status",
    [
        {"phase": "Running"},  # no IP yet
        {"phase": "Running", "podIP": "127.0.0.1"},  # a virtual node's loopback
        {"phase": "Running", "podIP": "169.254.3.4"},
        {"phase": "Succeeded", "podIP": "10.244.1.7"},  # ended: nothing listens
        {"phase": "Pending", "podIP": "10.244.1.7"},
    ],
)
async def test_flat_reports_nothing_without_a_reachable_ip_on_a_running_pod(
    monkeypatch: pytest.MonkeyPatch, fake: FakeApi, sleeps: Sleeps, status: JSON
) -> None:
    async with _exposing(monkeypatch, fake, sleeps, expose="flat") as adapter:
        created = await adapter.create(_ported_spec(), _offer())
        fake.pods[created.instance_id]["status"] = status
        assert (await adapter.get(created.instance_id)).endpoints == ()


async def test_node_port_makes_one_service_owned_by_the_pod_selecting_only_it(
    monkeypatch: pytest.MonkeyPatch, fake: FakeApi, sleeps: Sleeps
) -> None:
    annotations = {"service.beta.kubernetes.io/aws-load-balancer-internal": "true"}
    async with _exposing(
        monkeypatch, fake, sleeps, expose="node-port", service_annotations=annotations
    ) as adapter:
        spec = _ported_spec()
        created = await adapter.create(spec, _offer())
    name = created.instance_id
    base = f"/api/v1/namespaces/{NAMESPACE}"
    assert fake.calls() == [f"POST {base}/pods", f"POST {base}/services"]
    pod, service = fake.pods[name], fake.services[name]
    assert fake.requests[1].url.params["fieldManager"] == "vk-provider"
    assert service["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": name,
            "uid": pod["metadata"]["uid"],
            "controller": True,
        }
    ]
    assert service["metadata"]["labels"][LABEL_MANAGED_BY] == PROVIDER
    assert service["metadata"]["annotations"] == annotations
    selector = service["spec"]["selector"]
    assert selector == {LABEL_MANAGED_BY: PROVIDER, LABEL_INSTANCE: name}
    assert all(pod["metadata"]["labels"][k] == v for k, v in selector.items())
    assert service["spec"]["type"] == "NodePort"
    assert service["spec"]["externalTrafficPolicy"] == "Cluster"
    ports = [
        {k: p[k] for k in ("name", "protocol", "port", "targetPort")}
        for p in service["spec"]["ports"]
    ]
    assert ports == [
        {"name": "proxy", "protocol": "TCP", "port": 15000, "targetPort": 15000},
        {"name": "http", "protocol": "TCP", "port": 8080, "targetPort": 8080},
        {"name": "udp-5353", "protocol": "UDP", "port": 5353, "targetPort": 5353},
        {"name": "tcp-9100", "protocol": "TCP", "port": 9100, "targetPort": 9100},
    ]


async def test_a_pod_declaring_no_port_gets_no_service(
    monkeypatch: pytest.MonkeyPatch, fake: FakeApi, sleeps: Sleeps
) -> None:
    spec = _spec()
    spec = dataclasses.replace(spec, containers=(dataclasses.replace(spec.main, ports=()),))
    async with _exposing(monkeypatch, fake, sleeps, expose="load-balancer") as adapter:
        created = await adapter.create(spec, _offer())
        _runs(fake, created.instance_id)
        assert (await adapter.get(created.instance_id)).endpoints == ()
    assert fake.services == {}
    assert fake.calls() == [
        f"POST /api/v1/namespaces/{NAMESPACE}/pods",
        f"GET /api/v1/namespaces/{NAMESPACE}/pods/{created.instance_id}",
    ]


async def test_node_port_is_reported_at_one_ready_nodes_address_and_the_assigned_port(
    monkeypatch: pytest.MonkeyPatch, fake: FakeApi, sleeps: Sleeps
) -> None:
    fake.nodes = [
        _b_node("a-down", _address("ExternalIP", "203.0.113.1"), ready=False),
        _b_node("b-cordoned", _address("ExternalIP", "203.0.113.2"), unschedulable=True),
        _b_node("c-internal", _address("InternalIP", "10.0.0.3")),
        _b_node("d-loopback", _address("ExternalIP", "127.0.0.1")),
        _b_node(
            "e-public", _address("InternalIP", "10.0.0.5"), _address("ExternalIP", "203.0.113.5")
        ),
        _b_node("f-public", _address("ExternalIP", "203.0.113.6")),
        _b_node(
            "g-virtual", _address("ExternalIP", "203.0.113.0"), labels={"type": "virtual-kubelet"}
        ),
    ]
    async with _exposing(monkeypatch, fake, sleeps, expose="node-port") as adapter:
        created = await adapter.create(_ported_spec(), _offer())
        name = created.instance_id
        assert created.endpoints == ()
        _runs(fake, name)
        got = await adapter.get(name)
        (listed,) = await adapter.list_ours()
    assigned = {p["targetPort"]: p["nodePort"] for p in fake.services[name]["spec"]["ports"]}
    assert sorted(assigned.values()) == [30001, 30002, 30003, 30004]  # as B assigned them
    expected = {(port, proto, "203.0.113.5", assigned[port]) for port, proto in PORTED}
    assert _reached(got) == _reached(listed) == expected
    nodes = [r for r in fake.requests if r.url.path == "/api/v1/nodes"]
    assert [r.url.params["labelSelector"] for r in nodes] == ["type!=virtual-kubelet"] * 2


@pytest.mark.parametrize(
    ("types", "selector", "address"),
    [
        (["InternalIP"], "", "10.0.0.3"),  # c-internal is first by name
        (["InternalDNS", "ExternalIP"], "", "e.nodes.example"),
        (["ExternalIP"], "", "203.0.113.0"),  # virtual nodes too, when the operator says so
        (["ExternalIP"], "pool=edge", None),  # no Ready node of the selector: nothing
    ],
)
async def test_the_node_address_follows_the_types_and_selector_configured(
    monkeypatch: pytest.MonkeyPatch,
    fake: FakeApi,
    sleeps: Sleeps,
    types: list[str],
    selector: str,
    address: str | None,
) -> None:
    fake.nodes = [
        _b_node("c-internal", _address("InternalIP", "10.0.0.3")),
        _b_node(
            "e-public",
            _address("InternalIP", "10.0.0.5"),
            _address("ExternalIP", "203.0.113.5"),
            _address("InternalDNS", "e.nodes.example"),
        ),
        _b_node(
            "a-virtual", _address("ExternalIP", "203.0.113.0"), labels={"type": "virtual-kubelet"}
        ),
    ]
    config = {"expose": "node-port", "node_address_types": types, "node_selector": selector}
    async with _exposing(monkeypatch, fake, sleeps, **config) as adapter:
        created = await adapter.create(_spec(), _offer())
        _runs(fake, created.instance_id)
        got = await adapter.get(created.instance_id)
    (node_port,) = [p["nodePort"] for p in fake.services[created.instance_id]["spec"]["ports"]]
    assert _reached(got) == ({(8080, "TCP", address, node_port)} if address else set())


async def test_load_balancer_is_listed_once_b_assigns_an_ingress(
    monkeypatch: pytest.MonkeyPatch, fake: FakeApi, sleeps: Sleeps
) -> None:
    async with _exposing(monkeypatch, fake, sleeps, expose="load-balancer") as adapter:
        created = await adapter.create(_ported_spec(), _offer())
        name = created.instance_id
        _runs(fake, name)
        assert fake.services[name]["spec"]["type"] == "LoadBalancer"
        assert (await adapter.get(name)).endpoints == ()  # no ingress yet
        # The cloud controller writes status.loadBalancer (ipMode, per-port status included).
        fake.services[name]["status"] = {
            "loadBalancer": {
                "ingress": [
                    {
                        "ip": "198.51.100.20",
                        "ipMode": "VIP",
                        "ports": [{"port": 5353, "protocol": "UDP", "error": "UDP unsupported"}],
                    }
                ]
            }
        }
        got = await adapter.get(name)
        fake.services[name]["status"] = {
            "loadBalancer": {"ingress": [{"hostname": "a1b2.elb.example.com"}]}
        }
        (by_name,) = await adapter.list_ours()
    assert _reached(got) == {
        (port, proto, "198.51.100.20", port) for port, proto in PORTED if port != 5353
    }
    assert _reached(by_name) == {(p, proto, "a1b2.elb.example.com", p) for p, proto in PORTED}
    assert not [r for r in fake.requests if r.url.path == "/api/v1/nodes"]  # not for an LB


async def test_list_ours_reads_the_services_and_nodes_once_for_all_pods(
    monkeypatch: pytest.MonkeyPatch, fake: FakeApi, sleeps: Sleeps
) -> None:
    fake.nodes = [_b_node("n1", _address("InternalIP", "10.0.0.1"))]
    async with _exposing(monkeypatch, fake, sleeps, expose="node-port") as adapter:
        names = [(await adapter.create(_spec(attempt=a), _offer())).instance_id for a in (0, 1, 2)]
        for name in names[:2]:
            _runs(fake, name)
        fake.requests.clear()
        listed = {i.instance_id: i for i in await adapter.list_ours()}
    base = f"/api/v1/namespaces/{NAMESPACE}"
    assert fake.calls() == [f"GET {base}/pods", f"GET {base}/services", "GET /api/v1/nodes"]
    assert fake.requests[1].url.params["labelSelector"] == f"{LABEL_MANAGED_BY}={PROVIDER}"
    for name in names[:2]:
        (port,) = fake.services[name]["spec"]["ports"]
        assert _reached(listed[name]) == {(8080, "TCP", "10.0.0.1", port["nodePort"])}
    assert listed[names[2]].endpoints == ()  # still Pending


async def test_a_service_of_another_pod_of_that_name_is_not_read_and_is_taken_over(
    monkeypatch: pytest.MonkeyPatch, fake: FakeApi, sleeps: Sleeps
) -> None:
    """An earlier pod of the same name left its Service for B's garbage collector: a create
    makes it this pod's (owner, selector, ports, type); until then it is not this pod's."""
    fake.nodes = [_b_node("n1", _address("InternalIP", "10.0.0.1"))]
    name = pod_name(_spec())
    stale = {
        "metadata": {
            "name": name,
            "labels": {LABEL_MANAGED_BY: PROVIDER},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": "old"}],
        },
        "spec": {
            "type": "ClusterIP",
            "selector": {"app": "x"},
            "ports": [{"port": 1, "targetPort": 1}],
        },
    }
    fake.services[name] = json.loads(json.dumps(stale))
    fake.pods[name] = _remote_pod(name)
    fake.pods[name]["spec"]["containers"][0]["ports"] = [{"containerPort": 8080}]
    _runs(fake, name)
    async with _exposing(monkeypatch, fake, sleeps, expose="node-port") as adapter:
        assert (await adapter.get(name)).endpoints == ()  # owned by "old": not this pod's
        del fake.pods[name]
        created = await adapter.create(_spec(), _offer())
        _runs(fake, name)
        got = await adapter.get(name)
    base = f"/api/v1/namespaces/{NAMESPACE}"
    assert f"PATCH {base}/services/{name}" in fake.calls()
    service = fake.services[name]
    assert [o["uid"] for o in service["metadata"]["ownerReferences"]] == [
        fake.pods[name]["metadata"]["uid"]
    ]
    assert service["spec"]["type"] == "NodePort"
    assert service["spec"]["selector"] == {LABEL_MANAGED_BY: PROVIDER, LABEL_INSTANCE: name}
    (port,) = service["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (8080, 8080)
    assert created.instance_id == name
    assert _reached(got) == {(8080, "TCP", "10.0.0.1", port["nodePort"])}


async def test_a_second_create_keeps_the_service_and_its_node_ports(
    monkeypatch: pytest.MonkeyPatch, fake: FakeApi, sleeps: Sleeps
) -> None:
    async with _exposing(monkeypatch, fake, sleeps, expose="node-port") as adapter:
        first = await adapter.create(_spec(), _offer())
        (before,) = fake.services[first.instance_id]["spec"]["ports"]
        await adapter.create(_spec(), _offer())
    (after,) = fake.services[first.instance_id]["spec"]["ports"]
    assert len(fake.services) == 1
    assert after["nodePort"] == before["nodePort"]


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (
            _status(
                403,
                "Forbidden",
                'services is forbidden: User "system:serviceaccount:vk-work:vk-agent" '
                'cannot create resource "services" in API group "" in the namespace "vk-work"',
            ),
            AuthFailed,
        ),
        (
            _status(
                403,
                "Forbidden",
                'services "vk-x-0" is forbidden: exceeded quota: lbs, requested: '
                "services.loadbalancers=1, used: services.loadbalancers=2, limited: "
                "services.loadbalancers=2",
            ),
            CapacityUnavailable,
        ),
        (
            _status(500, "InternalError", "failed to allocate a nodePort: range is full"),
            Transient,
        ),
    ],
)
async def test_a_service_that_cannot_be_made_fails_the_launch_and_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch,
    fake: FakeApi,
    sleeps: Sleeps,
    answer: httpx.Response,
    error: type[ProviderError],
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response | None:
        if request.method == "POST" and request.url.path.endswith("/services"):
            return answer
        return None

    fake.overrides.append(refuse)
    spec = _spec(env=(EnvVar("API_TOKEN", "hunter2", secret=True),))
    async with _exposing(monkeypatch, fake, sleeps, expose="load-balancer") as adapter:
        with pytest.raises(error) as raised:
            await adapter.create(spec, _offer())
    assert "create service" in str(raised.value)
    assert fake.pods == {} and fake.secrets == {} and fake.services == {}
    name = pod_name(spec)
    assert fake.calls()[-2:] == [
        f"DELETE /api/v1/namespaces/{NAMESPACE}/pods/{name}",
        f"DELETE /api/v1/namespaces/{NAMESPACE}/secrets/{name}",
    ]


async def test_a_service_written_before_its_answer_was_lost_goes_with_the_pod(
    monkeypatch: pytest.MonkeyPatch, fake: FakeApi, sleeps: Sleeps
) -> None:
    """The POST got through but every answer failed: the launch fails, the pod is deleted,
    and the Service, owned by it from the start, goes with it (B's garbage collector)."""

    def lose(request: httpx.Request) -> httpx.Response | None:
        if "/services" in request.url.path:
            fake.serve(request)  # B did it
            return _status(503, "ServiceUnavailable", "the server is shutting down")
        return None

    fake.overrides.append(lose)
    async with _exposing(monkeypatch, fake, sleeps, expose="node-port") as adapter:
        with pytest.raises(Transient):
            await adapter.create(_spec(), _offer())
    assert fake.pods == {} and fake.services == {}


async def test_delete_leaves_the_service_to_bs_garbage_collector(
    monkeypatch: pytest.MonkeyPatch, fake: FakeApi, sleeps: Sleeps
) -> None:
    """No ``delete`` right on services is needed: the pod owns its Service, and a terminating
    pod keeps its traffic until it is gone."""
    async with _exposing(monkeypatch, fake, sleeps, expose="node-port") as adapter:
        created = await adapter.create(_spec(), _offer())
        fake.requests.clear()
        await adapter.delete(created.instance_id, grace_seconds=30)
    assert not [r for r in fake.requests if "/services" in r.url.path]
    assert fake.services == {}  # the fake's garbage collector followed the ownerReference


async def test_a_terminating_pod_is_still_reached_until_it_stops(
    monkeypatch: pytest.MonkeyPatch, fake: FakeApi, sleeps: Sleeps
) -> None:
    async with _exposing(monkeypatch, fake, sleeps, expose="flat") as adapter:
        created = await adapter.create(_spec(), _offer())
        _runs(fake, created.instance_id, "10.244.1.7")
        fake.pods[created.instance_id]["metadata"]["deletionTimestamp"] = "2026-03-13T20:01:00Z"
        got = await adapter.get(created.instance_id)
    assert got.state is InstanceState.TERMINATING
    assert _reached(got) == {(8080, "TCP", "10.244.1.7", 8080)}


async def test_a_failed_read_of_the_services_keeps_the_last_endpoints_and_the_states_flow(
    monkeypatch: pytest.MonkeyPatch,
    fake: FakeApi,
    sleeps: Sleeps,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake.nodes = [_b_node("n1", _address("InternalIP", "10.0.0.1"))]
    failing = False

    def flaky(request: httpx.Request) -> httpx.Response | None:
        if failing and "/services" in request.url.path:
            return _status(500, "InternalError", "etcdserver: request timed out")
        return None

    fake.overrides.append(flaky)
    async with _exposing(monkeypatch, fake, sleeps, expose="node-port") as adapter:
        first = await adapter.create(_spec(), _offer())
        second = await adapter.create(_spec(attempt=1), _offer())
        _runs(fake, first.instance_id)
        (port,) = fake.services[first.instance_id]["spec"]["ports"]
        assert {i.instance_id: _reached(i) for i in await adapter.list_ours()} == {
            first.instance_id: {(8080, "TCP", "10.0.0.1", port["nodePort"])},
            second.instance_id: set(),
        }
        failing = True
        _runs(fake, second.instance_id)
        fake.pods[first.instance_id]["metadata"]["deletionTimestamp"] = "2026-03-13T20:01:00Z"
        listed = {i.instance_id: i for i in await adapter.list_ours()}
        got = await adapter.get(first.instance_id)
    assert listed[first.instance_id].state is InstanceState.TERMINATING  # states flow on
    assert _reached(listed[first.instance_id]) == {(8080, "TCP", "10.0.0.1", port["nodePort"])}
    assert listed[second.instance_id].endpoints == ()  # never read: nothing is invented
    assert _reached(got) == _reached(listed[first.instance_id])
    assert "endpoints not read, the last read stand" in caplog.text


def test_service_ports_name_every_port_uniquely() -> None:
    spec = _spec()
    main = dataclasses.replace(
        spec.main, ports=(Port(80, "TCP", "tcp-81"), Port(81), Port(81, "UDP"), Port(80, "TCP"))
    )
    ports = service_ports(dataclasses.replace(spec, containers=(main,)))
    assert [(p["name"], p["port"], p["protocol"]) for p in ports] == [
        ("tcp-81", 80, "TCP"),
        ("tcp-81-1", 81, "TCP"),  # its own name was taken by a declared one
        ("udp-81", 81, "UDP"),
    ]


@pytest.mark.parametrize(
    ("address", "ok"),
    [
        ("10.1.2.3", True),
        ("2001:db8::1", True),
        ("a1b2.elb.us-east-1.amazonaws.com", True),
        ("127.0.0.1", False),
        ("::1", False),
        ("169.254.1.1", False),
        ("fe80::1", False),
        ("0.0.0.0", False),  # noqa: S104 (an address checked, never bound)
        ("224.0.0.1", False),
        ("Not A Host", False),
    ],
)
def test_only_addresses_another_network_can_reach_are_reported(address: str, ok: bool) -> None:
    assert endpoints.reachable(address) is ok


def test_the_expose_settings_are_checked_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(pydantic.ValidationError, match="expose"):
        _config(monkeypatch, expose="ingress")
    with pytest.raises(pydantic.ValidationError, match="node_address_types"):
        _config(monkeypatch, node_address_types=["InternalIP", "InternalIP"])
    with pytest.raises(pydantic.ValidationError, match="node_address_types"):
        _config(monkeypatch, node_address_types=[])
    config = _config(monkeypatch, expose="node-port")
    assert (config.node_address_types, config.node_selector) == (
        ["ExternalIP", "InternalIP"],
        "type!=virtual-kubelet",
    )


@pytest.mark.parametrize(
    ("expose", "says"),
    [
        ("none", None),
        ("flat", "must route to the remote cluster's pod network"),
        ("node-port", "create/get/list/patch on services"),
        ("load-balancer", "each a cloud load balancer, billed"),
    ],
)
def test_check_config_names_what_each_expose_mode_needs(
    monkeypatch: pytest.MonkeyPatch, expose: str, says: str | None
) -> None:
    notes = requirements(_config(monkeypatch, expose=expose))
    assert len(notes) == (1 if says is None else 2)
    assert says is None or says in notes[1]
