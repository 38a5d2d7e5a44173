"""The Kubernetes adapter: pods of cluster A run as pods in a remote cluster B.

Cluster B is reached through its REST API with ``httpx`` (the Kubernetes client library is
kept for cluster A, in ``vk_provider.kube.client``). The kubeconfig is parsed here
(``parse_kubeconfig``): the current context's server, its CA (``certificate-authority-data``
or ``certificate-authority``, or ``insecure-skip-tls-verify``), and the user's client
certificate and key (``-data`` or file) or bearer token (``token`` or ``tokenFile``); exec and
auth-provider plugins are refused. Relative paths are read beside a ``file:`` kubeconfig.

Identity. Every launch is one Pod in ``config.namespace`` (made when missing) named
``vk-<pod uid>-<attempt>`` — a hash replaces the uid when that name would not be a DNS-1123
label of at most 63 characters — and labelled ``vk-provider.io/managed-by=<provider name>``,
``vk-provider.io/pod-uid`` and ``vk-provider.io/attempt``; annotations under
``remote.vk-provider.io/`` repeat the uid and attempt verbatim (labels may have to hash them)
and carry the offer key, the price and the source pod (distinct from the ``vk-provider.io/``
annotations an agent of ours running in B writes onto the same pods). The name is
deterministic, so a second create of the same request gets 409 AlreadyExists and returns the
existing pod once its annotations prove it was made for that request. ``list_ours`` selects
by the managed-by label, so two agents sharing one namespace of B must use different provider
names.

The remote pod. ``restartPolicy: Never`` (restarts are the agent's job, as attempts),
``automountServiceAccountToken: false`` and ``enableServiceLinks: false`` (a workload from
cluster A gets no credentials or service addresses of B). Image, command, args, workingDir,
ports and env come from the ``WorkloadSpec``. Resources: requests are the workload's own
(cpu, memory; set explicitly, even to 0, so that limits do not become requests), limits are
the offer's shape (vCPUs, memory, ``nvidia.com/gpu``): the pod is guaranteed what it asked
for and may burst to what was paid for. Scheduling: it tolerates every taint with the key
``virtual-kubelet.io/provider`` (so B may itself be a virtual-kubelet burst cluster) and, when
it uses GPUs, every ``nvidia.com/gpu`` taint (the customary taint of GPU node pools); a
required node affinity keeps it in the offer's region (nodes labelled
``topology.kubernetes.io/region=<region>``, plus unlabelled nodes when the region is the
fallback one, see below).

Secrets. Environment values that came from a Secret (``EnvVar.secret``) never appear in the
remote pod spec: they go into a Secret of the same name in B, referenced by ``secretKeyRef``.
The Secret is created first (without owner), then the pod; then the Secret gets an
ownerReference to the pod's uid so B's garbage collector removes it with the pod. When the
pod cannot be created the Secret is deleted again; ``delete`` also deletes it by name (in case
an agent died before the ownerReference was set).

Offers. Read from B's Nodes and its non-terminal Pods (two list calls). A node counts when it
is Ready, not cordoned, and every NoSchedule/NoExecute taint is tolerated by the pods we would
make; its free resources are allocatable minus the requests of the non-terminal pods bound to
it. Its region is its ``topology.kubernetes.io/region`` label, else the first of
``config.regions``, else ``remote`` (the *fallback* region); with ``config.regions`` set only
nodes in those regions count. Per region there are two kinds of shapes, each one offer whose
``available`` sums what fits on every node of that shape:

- GPU shapes: ``n`` GPUs for n in 1..(the node's allocatable GPUs, at most ``max_gpus``), with
  the node's per-GPU share of CPU and memory (allocatable / allocatable GPUs, rounded down to
  whole vCPUs and GiB); ``available`` is how many times ``n`` GPUs are free, and at most what
  ``max_gpus`` leaves beside the GPUs our pods already hold. GPU memory comes from the
  ``nvidia.com/gpu.memory`` label (MiB; the smallest within a shape) or is 0.
- CPU-only shapes: 1, 2, 4, ... vCPUs up to the node's allocatable CPU, with the node's memory
  per vCPU (rounded down to half GiB); ``available`` is how many fit in its free CPU and
  memory. Nodes whose taints only GPU pods tolerate offer none.

The sku encodes the shape (``1gpu.8cpu.32gib``, ``0gpu.2cpu.8gib``), so ``create`` needs no
other state. Price = GPUs x ``gpu_price_per_hour`` + vCPUs x ``cpu_price_per_hour``; offers
dearer than ``max_price_per_hour`` are dropped; ``gpu_model`` is the configured one.

States (``observe``), first match wins:

| remote pod                                                    | instance state      |
|---------------------------------------------------------------|---------------------|
| ``metadata.deletionTimestamp`` set                            | TERMINATING         |
| ``status.reason`` Evicted, Preempting, NodeLost, Shutdown,    | LOST                |
| NodeShutdown, Terminated, UnexpectedAdmissionError, OutOf*;   |                     |
| or condition DisruptionTarget=True                            |                     |
| phase Pending (unscheduled, ContainerCreating, pulling, ...)  | PENDING             |
| phase Running, container running                              | RUNNING (podIP)     |
| phase Running/Succeeded/Failed, container terminated          | EXITED (exit code)  |
| phase Succeeded without a container status                    | EXITED (0)          |
| phase Failed without a terminated container                   | LOST                |
| phase Unknown                                                 | LOST                |

A deleted pod is gone from the API: ``get`` raises ``NotFound`` (never TERMINATED).

Errors are classified in one function, ``classify_failure``: 401 → ``AuthFailed``; 403 →
``CapacityUnavailable`` when a ResourceQuota refused it ("exceeded quota"), ``Transient`` when
the namespace's ServiceAccount is not there yet, else ``AuthFailed``; 404 → ``NotFound``; 400
and 422 → ``InvalidSpec`` naming the field of the Status ``details.causes`` (but ``Transient``
for logs, where 400 means "container not started yet"); 429 → ``RateLimited``
(``Retry-After`` or ``details.retryAfterSeconds``); 409 (other than the AlreadyExists ``create``
handles), 5xx, timeouts, connection errors and malformed answers → ``Transient`` naming what
was wrong. Retries live at the transport (``RetryPolicy``, the tenacity loop of
``providers.transport``): each request is retried on ``Transient`` and short ``RateLimited``;
every write is idempotent by name, so a POST whose answer was lost is answered by 409 on the
retry.

Rights needed in B (what ``tests/contract/harness_kubernetes.py`` grants, and no more):
``list`` nodes and pods cluster-wide (offers), ``create`` namespaces (only when the namespace
may be missing), and in the namespace ``create/get/list/delete`` pods, ``get`` pods/log and
``create/patch/delete`` secrets.

Invariants:
- The kubeconfig, the token and the client key are never logged nor put into a message; the
  token and secret env values are redacted from every message built from a server answer.
- Only ``domain.errors`` escape the public methods (the constructor raises ``ConfigError``).
- Parsers, manifest builders and the offer planner are pure; the HTTP layer is
  ``KubernetesProvider._send``.

Known limits: ``delete`` with ``grace_seconds=0`` asks for 1 second, because 0 would remove the
object at once and leave the container to the node's next sync (as ``kubectl`` does);
``tls-server-name`` and proxy settings of a kubeconfig are ignored; offers assume one container
per pod and count requests, not usage.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import enum
import hashlib
import json
import logging
import math
import os
import re
import ssl
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Final, TypeVar

import httpx
import yaml

from providers.kubernetes.config import KubernetesProviderConfig
from providers.transport import Redactor, log_retries
from providers.transport import RetryPolicy as TransportRetryPolicy
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
    Capabilities,
    Instance,
    InstanceState,
    LogOptions,
    Offer,
    WorkloadSpec,
)
from vk_provider.settings.secrets import ConfigError

log = logging.getLogger(__name__)

T = TypeVar("T")
JSON = dict[str, object]

LABEL_MANAGED_BY: Final = "vk-provider.io/managed-by"
LABEL_POD_UID: Final = "vk-provider.io/pod-uid"
LABEL_ATTEMPT: Final = "vk-provider.io/attempt"
# Annotations have a prefix of their own: when B runs an agent of ours too, that agent writes
# ``vk-provider.io/offer`` and ``vk-provider.io/price-per-hour`` onto the same pods.
ANN_POD_UID: Final = "remote.vk-provider.io/pod-uid"
ANN_ATTEMPT: Final = "remote.vk-provider.io/attempt"
ANN_OFFER: Final = "remote.vk-provider.io/offer"
ANN_PRICE: Final = "remote.vk-provider.io/price-per-hour"
ANN_SOURCE: Final = "remote.vk-provider.io/source-pod"
GPU_RESOURCE: Final = "nvidia.com/gpu"
GPU_MEMORY_LABEL: Final = "nvidia.com/gpu.memory"  # MiB, as GPU feature discovery writes it
REGION_LABEL: Final = "topology.kubernetes.io/region"
VIRTUAL_KUBELET_TAINT: Final = "virtual-kubelet.io/provider"
FALLBACK_REGION: Final = "remote"
FIELD_MANAGER: Final = "vk-provider"
NAME_PREFIX: Final = "vk-"

# Every pod tolerates virtual nodes; GPU pods also the customary GPU node-pool taint.
TOLERATIONS: Final[tuple[Mapping[str, str], ...]] = (
    {"key": VIRTUAL_KUBELET_TAINT, "operator": "Exists"},
)
GPU_TOLERATIONS: Final[tuple[Mapping[str, str], ...]] = (
    *TOLERATIONS,
    {"key": GPU_RESOURCE, "operator": "Exists"},
)
LOST_REASONS: Final = frozenset(
    {
        "Evicted",
        "Preempting",
        "NodeLost",
        "Shutdown",
        "NodeShutdown",
        "Terminated",
        "UnexpectedAdmissionError",
    }
)

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_SKU = re.compile(r"(?P<gpus>\d{1,4})gpu\.(?P<cpu>\d+(?:\.\d+)?)cpu\.(?P<mem>\d+(?:\.\d+)?)gib")
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
_CONTAINER: Final = "spec.containers[0]"
_MAX_CPU_LADDER = 1 << 12


class KubeconfigError(ConfigError):
    """The kubeconfig cannot be used; the message names the field, never a value."""


class MalformedResponse(ValueError):
    """Cluster B answered with a shape this adapter cannot read; becomes ``Transient``."""


# --- kubeconfig ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClusterAccess:
    """How to reach cluster B: the server and the credentials of one kubeconfig context."""

    server: str
    context: str = ""
    ca_pem: bytes | None = field(default=None, repr=False)
    client_cert_pem: bytes | None = field(default=None, repr=False)
    client_key_pem: bytes | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    insecure_skip_tls_verify: bool = False

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS settings: B's CA (or the system's), and the client certificate if any."""
        try:
            if self.ca_pem is not None:
                context = ssl.create_default_context(cadata=self.ca_pem.decode("ascii"))
            else:
                context = ssl.create_default_context()
        except (ssl.SSLError, UnicodeDecodeError, ValueError):
            raise KubeconfigError(
                f"kubeconfig context {self.context!r}: the certificate authority is not PEM"
            ) from None
        if self.insecure_skip_tls_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.client_cert_pem is not None and self.client_key_pem is not None:
            _load_client_certificate(context, self.client_cert_pem, self.client_key_pem)
        return context


def _load_client_certificate(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    # ``ssl`` loads certificate chains from files only: write them into a private directory
    # (0700, files 0600) and remove it at once; the context keeps the loaded key in memory.
    with tempfile.TemporaryDirectory(prefix="vk-kube-") as directory:
        cert_path = Path(directory) / "client.crt"
        key_path = Path(directory) / "client.key"
        for path, content in ((cert_path, cert), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(content)
        try:
            context.load_cert_chain(str(cert_path), str(key_path))
        except ssl.SSLError:
            raise KubeconfigError(
                "kubeconfig: the client certificate and key cannot be loaded together"
            ) from None


def _named(document: Mapping[str, object], section: str, name: str) -> Mapping[str, object]:
    """The body of the entry called ``name`` in ``clusters``/``users``/``contexts``."""
    entries = document.get(section)
    if not isinstance(entries, list):
        raise KubeconfigError(f"kubeconfig: '{section}' is missing or not a list")
    key = section[:-1]  # clusters -> cluster
    for entry in entries:
        if isinstance(entry, dict) and entry.get("name") == name:
            body = entry.get(key)
            if not isinstance(body, dict):
                raise KubeconfigError(f"kubeconfig: {section}[{name!r}].{key} is not a mapping")
            return body
    raise KubeconfigError(f"kubeconfig: no entry {name!r} in '{section}'")


def _material(
    body: Mapping[str, object], what: str, data_key: str, file_key: str, base_dir: Path | None
) -> bytes | None:
    """``<x>-data`` (base64) or ``<x>`` (a file path); None when neither is set."""
    data = body.get(data_key)
    if data is not None:
        if not isinstance(data, str):
            raise KubeconfigError(f"kubeconfig: {what}.{data_key} is not a string")
        try:
            return base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise KubeconfigError(f"kubeconfig: {what}.{data_key} is not base64") from None
    path = body.get(file_key)
    if path is None:
        return None
    if not isinstance(path, str) or not path:
        raise KubeconfigError(f"kubeconfig: {what}.{file_key} is not a path")
    return _read_file(path, f"{what}.{file_key}", base_dir)


def _read_file(path: str, what: str, base_dir: Path | None) -> bytes:
    resolved = Path(path).expanduser()
    if not resolved.is_absolute() and base_dir is not None:
        resolved = base_dir / resolved
    try:
        return resolved.read_bytes()
    except OSError as exc:
        raise KubeconfigError(f"kubeconfig: {what}: cannot read {path} ({exc.strerror})") from None


def parse_kubeconfig(
    text: str, *, base_dir: Path | None = None, context: str | None = None
) -> ClusterAccess:
    """The ``ClusterAccess`` of ``context`` (default: ``current-context``) in ``text``.

    Raises ``KubeconfigError`` naming the offending field; the document's content is never
    quoted (it holds credentials)."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise KubeconfigError(f"kubeconfig: not valid YAML{where}") from None
    if not isinstance(document, dict):
        raise KubeconfigError("kubeconfig: expected a mapping at the top level")
    name = context or document.get("current-context")
    if not isinstance(name, str) or not name:
        raise KubeconfigError("kubeconfig: 'current-context' is not set")
    chosen = _named(document, "contexts", name)
    cluster_name = chosen.get("cluster")
    if not isinstance(cluster_name, str):
        raise KubeconfigError(f"kubeconfig: contexts[{name!r}].cluster is not set")
    cluster = _named(document, "clusters", cluster_name)
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise KubeconfigError(f"kubeconfig: clusters[{cluster_name!r}].server is not a URL")
    where = f"clusters[{cluster_name!r}]"
    ca = _material(cluster, where, "certificate-authority-data", "certificate-authority", base_dir)
    insecure = cluster.get("insecure-skip-tls-verify") is True
    user_name = chosen.get("user")
    user: Mapping[str, object] = {}
    if isinstance(user_name, str) and user_name:
        user = _named(document, "users", user_name)
    who = f"users[{user_name!r}]"
    for unsupported in ("exec", "auth-provider", "username"):
        if user.get(unsupported) is not None:
            raise KubeconfigError(
                f"kubeconfig: {who}.{unsupported} is not supported; use a token or a client "
                "certificate"
            )
    cert = _material(user, who, "client-certificate-data", "client-certificate", base_dir)
    key = _material(user, who, "client-key-data", "client-key", base_dir)
    if (cert is None) != (key is None):
        raise KubeconfigError(f"kubeconfig: {who} needs both a client certificate and its key")
    token = user.get("token")
    if token is not None and not isinstance(token, str):
        raise KubeconfigError(f"kubeconfig: {who}.token is not a string")
    token_file = user.get("tokenFile")
    if not token and isinstance(token_file, str) and token_file:
        token = _read_file(token_file, f"{who}.tokenFile", base_dir).decode().strip()
    return ClusterAccess(
        server=server.rstrip("/"),
        context=name,
        ca_pem=ca,
        client_cert_pem=cert,
        client_key_pem=key,
        token=token or None,
        insecure_skip_tls_verify=insecure,
    )


def kubeconfig_base_dir(config: KubernetesProviderConfig) -> Path | None:
    """Where relative paths of a ``file:`` kubeconfig are read from."""
    kind, _, target = config.kubeconfig.ref.partition(":")
    return Path(target).parent if kind == "file" else None


def build_transport(access: ClusterAccess) -> httpx.AsyncHTTPTransport:
    """The TLS transport to B (tests wrap it to inject network faults)."""
    if access.server.startswith("http://"):
        return httpx.AsyncHTTPTransport()
    return httpx.AsyncHTTPTransport(verify=access.ssl_context())


# --- quantities ---------------------------------------------------------------------------

_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>[eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?"
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(value: object) -> Decimal:
    """A Kubernetes quantity (``500m``, ``64Gi``, ``1e3``, ``2``) as a number of base units."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise MalformedResponse(f"quantity {value!r} is not a string")
    match = _QUANTITY.fullmatch(str(value).strip())
    if match is None:
        raise MalformedResponse(f"quantity {value!r} cannot be read")
    try:
        number = Decimal(match["number"])
    except InvalidOperation:
        raise MalformedResponse(f"quantity {value!r} cannot be read") from None
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * (Decimal(1024) ** _BINARY[suffix])
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    return number.scaleb(int(suffix[1:]))


def cpu_quantity(vcpus: float) -> str:
    """vCPUs as millicores (``1500m``), rounded up."""
    return f"{math.ceil(round(vcpus * 1000, 6))}m"


def memory_quantity(gib: float) -> str:
    """GiB as MiB (``1536Mi``), rounded up."""
    return f"{math.ceil(round(gib * 1024, 6))}Mi"


def _compact(number: float) -> str:
    return f"{number:g}" if number != int(number) else str(int(number))


# --- names and labels ---------------------------------------------------------------------


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def label_value(text: str) -> str:
    """``text`` if it is a valid label value, else a readable prefix and a hash of it."""
    if len(text) <= 63 and _LABEL_VALUE.fullmatch(text):
        return text
    prefix = re.sub(r"[^-A-Za-z0-9_.]", "-", text)[:40].strip("-_.")
    return f"{prefix}-{_digest(text, 16)}" if prefix else _digest(text, 16)


def pod_name(spec: WorkloadSpec) -> str:
    """``vk-<pod uid>-<attempt>``; a hash of the request id stands in for a uid that would not
    make a DNS-1123 label of at most 63 characters."""
    name = f"{NAME_PREFIX}{spec.pod_uid}-{spec.attempt}"
    if len(name) <= 63 and _DNS_LABEL.fullmatch(name):
        return name
    return f"{NAME_PREFIX}{_digest(spec.request_id, 32)}-{spec.attempt}"


def is_pod_name(text: str) -> bool:
    return len(text) <= 63 and _DNS_LABEL.fullmatch(text) is not None


def secret_keys(spec: WorkloadSpec) -> dict[str, str]:
    """The Secret key of each secret env var: its name when that is a valid key, else
    ``env-<index>``."""
    keys: dict[str, str] = {}
    for index, var in enumerate(spec.env):
        if var.secret:
            keys[var.name] = var.name if _SECRET_KEY.fullmatch(var.name) else f"env-{index}"
    return keys


def owner_labels(spec: WorkloadSpec, *, provider: str) -> dict[str, str]:
    return {
        LABEL_MANAGED_BY: label_value(provider),
        LABEL_POD_UID: label_value(spec.pod_uid),
        LABEL_ATTEMPT: str(spec.attempt),
    }


# --- offers -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class Shape:
    """What one instance may use: GPUs, vCPUs and memory; encoded into ``Offer.sku``."""

    gpus: int
    vcpus: float
    memory_gib: float

    @property
    def sku(self) -> str:
        return f"{self.gpus}gpu.{_compact(self.vcpus)}cpu.{_compact(self.memory_gib)}gib"

    @classmethod
    def parse(cls, sku: str) -> Shape | None:
        match = _SKU.fullmatch(sku)
        if match is None:
            return None
        shape = cls(int(match["gpus"]), float(match["cpu"]), float(match["mem"]))
        return shape if shape.vcpus > 0 and shape.memory_gib > 0 else None


@dataclass(frozen=True, slots=True)
class OfferScope:
    """What the configuration says about offers."""

    provider: str
    regions: tuple[str, ...]
    gpu_model: str | None
    gpu_price_per_hour: float
    cpu_price_per_hour: float
    max_gpus: int
    max_price_per_hour: float | None

    @classmethod
    def from_config(cls, config: KubernetesProviderConfig) -> OfferScope:
        return cls(
            provider=config.name,
            regions=tuple(dict.fromkeys(config.regions)),
            gpu_model=config.gpu_model,
            gpu_price_per_hour=config.gpu_price_per_hour,
            cpu_price_per_hour=config.cpu_price_per_hour,
            max_gpus=config.max_gpus,
            max_price_per_hour=config.max_price_per_hour,
        )

    @property
    def fallback_region(self) -> str:
        """The region of nodes without a region label."""
        return self.regions[0] if self.regions else FALLBACK_REGION

    def price(self, shape: Shape) -> float:
        return round(
            shape.gpus * self.gpu_price_per_hour + shape.vcpus * self.cpu_price_per_hour, 6
        )


@dataclass(frozen=True, slots=True)
class Resources:
    gpus: Decimal = Decimal(0)
    cpu: Decimal = Decimal(0)
    memory: Decimal = Decimal(0)  # bytes

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.gpus + other.gpus, self.cpu + other.cpu, self.memory + other.memory)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.gpus - other.gpus, self.cpu - other.cpu, self.memory - other.memory)

    @classmethod
    def of(cls, values: object, where: str) -> Resources:
        """From a ``resources``-style mapping (``allocatable``, ``requests``); absent is 0."""
        if values is None:
            return cls()
        if not isinstance(values, dict):
            raise MalformedResponse(f"{where} is not an object")

        def amount(name: str) -> Decimal:
            raw = values.get(name)
            return Decimal(0) if raw is None else parse_quantity(raw)

        return cls(amount(GPU_RESOURCE), amount("cpu"), amount("memory"))

    def fits(self, other: Resources) -> int:
        """How many times ``other`` fits into this (``other`` has some non-zero dimension)."""
        pairs = (
            (self.gpus, other.gpus),
            (self.cpu, other.cpu),
            (self.memory, other.memory),
        )
        counts = [int(mine // theirs) for mine, theirs in pairs if theirs > 0]
        return max(0, min(counts)) if counts else 0


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    """One node of B as the offer planner sees it."""

    name: str
    region: str
    allocatable: Resources
    free: Resources
    gpu_memory_gib: float
    takes_cpu_pods: bool  # its taints are tolerated without the GPU toleration


def _mapping(value: object, where: str) -> Mapping[str, object]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MalformedResponse(f"{where} is not an object")
    return value


def _items(body: object, what: str) -> list[Mapping[str, object]]:
    if not isinstance(body, dict) or not isinstance(body.get("items"), list):
        raise MalformedResponse(f"{what}: 'items' is missing or not a list")
    return [item for item in body["items"] if isinstance(item, dict)]


def tolerated(taint: Mapping[str, object], tolerations: Iterable[Mapping[str, str]]) -> bool:
    """Kubernetes' toleration matching, for the tolerations this adapter sets."""
    for toleration in tolerations:
        effect = toleration.get("effect", "")
        if effect and effect != taint.get("effect"):
            continue
        if toleration.get("operator") == "Exists":
            if not toleration.get("key") or toleration["key"] == taint.get("key"):
                return True
        elif toleration.get("key") == taint.get("key") and toleration.get("value", "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def _ready(status: Mapping[str, object]) -> bool:
    conditions = status.get("conditions")
    if not isinstance(conditions, list):
        return False
    return any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in conditions
    )


def _container_request(container: object, where: str) -> Resources:
    """A container's requests; a resource with only a limit requests its limit (as the API
    server defaults it)."""
    body = _mapping(container, where)
    resources = _mapping(body.get("resources"), f"{where}.resources")
    requests = _mapping(resources.get("requests"), f"{where}.resources.requests")
    limits = _mapping(resources.get("limits"), f"{where}.resources.limits")

    def amount(name: str) -> Decimal:
        raw = requests.get(name, limits.get(name))
        return Decimal(0) if raw is None else parse_quantity(raw)

    return Resources(amount(GPU_RESOURCE), amount("cpu"), amount("memory"))


def _larger(a: Resources, b: Resources) -> Resources:
    return Resources(max(a.gpus, b.gpus), max(a.cpu, b.cpu), max(a.memory, b.memory))


def pod_requests(pod: Mapping[str, object]) -> Resources:
    """What a pod holds on its node: its containers (and sidecars) or its largest init
    container, whichever is more, plus its overhead."""
    spec = _mapping(pod.get("spec"), "pod spec")
    total = Resources()
    containers = spec.get("containers")
    for index, container in enumerate(containers if isinstance(containers, list) else []):
        total = total + _container_request(container, f"spec.containers[{index}]")
    init_peak = Resources()
    inits = spec.get("initContainers")
    for index, container in enumerate(inits if isinstance(inits, list) else []):
        request = _container_request(container, f"spec.initContainers[{index}]")
        if isinstance(container, dict) and container.get("restartPolicy") == "Always":
            total = total + request  # a sidecar runs beside the containers
        else:
            init_peak = _larger(init_peak, request)
    overhead = Resources.of(spec.get("overhead"), "spec.overhead")
    return _larger(total, init_peak) + overhead


def _node_name(pod: Mapping[str, object]) -> str:
    spec = pod.get("spec")
    name = spec.get("nodeName") if isinstance(spec, dict) else None
    return name if isinstance(name, str) else ""


def _phase(pod: Mapping[str, object]) -> str:
    status = pod.get("status")
    phase = status.get("phase") if isinstance(status, dict) else None
    return phase if isinstance(phase, str) else ""


def node_capacities(nodes: object, pods: object, scope: OfferScope) -> list[NodeCapacity]:
    """The nodes of B our pods may run on, with what is free on each (see the module
    docstring); a node or pod that cannot be read is skipped and logged."""
    used: dict[str, Resources] = {}
    for pod in _items(pods, "pod list"):
        bound_to = _node_name(pod)
        if not bound_to or _phase(pod) in _TERMINAL_PHASES:
            continue
        try:
            used[bound_to] = used.get(bound_to, Resources()) + pod_requests(pod)
        except MalformedResponse as exc:
            log.warning("provider %s: ignoring a pod on node %s: %s", scope.provider, bound_to, exc)
    found: list[NodeCapacity] = []
    for node in _items(nodes, "node list"):
        try:
            capacity = _node_capacity(node, used, scope)
        except MalformedResponse as exc:
            log.warning("provider %s: ignoring a node: %s", scope.provider, exc)
            continue
        if capacity is not None:
            found.append(capacity)
    return found


def _node_capacity(
    node: Mapping[str, object], used: Mapping[str, Resources], scope: OfferScope
) -> NodeCapacity | None:
    metadata = _mapping(node.get("metadata"), "node metadata")
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise MalformedResponse("a node has no name")
    spec = _mapping(node.get("spec"), f"node {name} spec")
    status = _mapping(node.get("status"), f"node {name} status")
    if spec.get("unschedulable") is True or not _ready(status):
        return None
    taints = spec.get("taints")
    hard = [
        t
        for t in (taints if isinstance(taints, list) else [])
        if isinstance(t, dict) and t.get("effect") in ("NoSchedule", "NoExecute")
    ]
    if not all(tolerated(t, GPU_TOLERATIONS) for t in hard):
        return None
    labels = _mapping(metadata.get("labels"), f"node {name} labels")
    region = labels.get(REGION_LABEL)
    region = region if isinstance(region, str) and region else scope.fallback_region
    if scope.regions and region not in scope.regions:
        return None
    allocatable = Resources.of(status.get("allocatable"), f"node {name} allocatable")
    free = allocatable - used.get(name, Resources())
    free = Resources(
        max(free.gpus, Decimal(0)), max(free.cpu, Decimal(0)), max(free.memory, Decimal(0))
    )
    gpu_memory = 0.0
    raw_memory = labels.get(GPU_MEMORY_LABEL)
    if isinstance(raw_memory, str) and raw_memory.isdigit():
        gpu_memory = int(raw_memory) / 1024
    return NodeCapacity(
        name=name,
        region=region,
        allocatable=allocatable,
        free=free,
        gpu_memory_gib=gpu_memory,
        takes_cpu_pods=all(tolerated(t, TOLERATIONS) for t in hard),
    )


def gpus_in_use(pods: object, *, namespace: str, provider: str) -> int:
    """The GPUs our non-terminal pods hold (for ``max_gpus``)."""
    ours = label_value(provider)
    total = Decimal(0)
    for pod in _items(pods, "pod list"):
        metadata = pod.get("metadata")
        if not isinstance(metadata, dict) or metadata.get("namespace") != namespace:
            continue
        labels = metadata.get("labels")
        if not isinstance(labels, dict) or labels.get(LABEL_MANAGED_BY) != ours:
            continue
        if _phase(pod) in _TERMINAL_PHASES:
            continue
        with contextlib.suppress(MalformedResponse):
            total += pod_requests(pod).gpus
    return int(total)


def _share(total: Decimal, parts: int) -> float:
    """``total / parts`` rounded down to a whole number, or to tenths below 1."""
    share = total / parts
    if share >= 1:
        return float(math.floor(share))
    return math.floor(share * 10) / 10


def _node_shapes(node: NodeCapacity, scope: OfferScope) -> Iterator[tuple[Shape, int]]:
    """Every shape the node offers and how many of it are free now."""
    alloc = node.allocatable
    memory_gib = alloc.memory / 2**30
    gpus = int(alloc.gpus)
    if gpus > 0:
        cpu_share, memory_share = _share(alloc.cpu, gpus), _share(memory_gib, gpus)
        if cpu_share > 0 and memory_share > 0:
            for count in range(1, min(gpus, scope.max_gpus) + 1):
                shape = Shape(count, round(count * cpu_share, 3), round(count * memory_share, 3))
                yield shape, int(node.free.gpus // count)
    if node.takes_cpu_pods and alloc.cpu >= 1:
        per_cpu = math.floor(memory_gib / alloc.cpu * 2) / 2
        vcpus = 1
        while per_cpu > 0 and vcpus <= alloc.cpu and vcpus <= _MAX_CPU_LADDER:
            memory = vcpus * per_cpu
            need = Resources(cpu=Decimal(vcpus), memory=Decimal(memory) * 2**30)
            yield Shape(0, float(vcpus), memory), node.free.fits(need)
            vcpus *= 2


def plan_offers(nodes: Iterable[NodeCapacity], scope: OfferScope, *, gpus_used: int) -> list[Offer]:
    """Offers per region and shape (pure; see the module docstring)."""
    available: dict[tuple[str, Shape], int] = {}
    gpu_memory: dict[tuple[str, Shape], float] = {}
    for node in nodes:
        for shape, count in _node_shapes(node, scope):
            key = (node.region, shape)
            available[key] = available.get(key, 0) + count
            known = gpu_memory.get(key)
            gpu_memory[key] = (
                node.gpu_memory_gib if known is None else min(known, node.gpu_memory_gib)
            )
    budget = max(0, scope.max_gpus - gpus_used)
    offers: list[Offer] = []
    for (region, shape), count in sorted(available.items()):
        if shape.gpus:
            count = min(count, budget // shape.gpus)
        price = scope.price(shape)
        if scope.max_price_per_hour is not None and price > scope.max_price_per_hour:
            continue
        offers.append(
            Offer(
                provider=scope.provider,
                sku=shape.sku,
                region=region,
                gpu_model=scope.gpu_model if shape.gpus else None,
                gpu_count=shape.gpus,
                gpu_memory_gib=gpu_memory[(region, shape)] if shape.gpus else 0.0,
                vcpus=shape.vcpus,
                memory_gib=shape.memory_gib,
                price_per_hour=price,
                available=count,
            )
        )
    return offers


# --- manifests ----------------------------------------------------------------------------


def build_secret(spec: WorkloadSpec, *, name: str, namespace: str, provider: str) -> JSON | None:
    """The Secret holding the workload's secret env values; None when it has none."""
    keys = secret_keys(spec)
    if not keys:
        return None
    data = {
        keys[var.name]: base64.b64encode(var.value.encode()).decode()
        for var in spec.env
        if var.secret
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": owner_labels(spec, provider=provider),
        },
        "type": "Opaque",
        "data": data,
    }


def region_affinity(region: str, *, fallback: bool) -> JSON:
    """Nodes labelled with ``region``, and unlabelled ones when it is the fallback region."""
    terms: list[JSON] = [
        {"matchExpressions": [{"key": REGION_LABEL, "operator": "In", "values": [region]}]}
    ]
    if fallback:
        terms.append({"matchExpressions": [{"key": REGION_LABEL, "operator": "DoesNotExist"}]})
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }


def build_pod(
    spec: WorkloadSpec,
    shape: Shape,
    *,
    name: str,
    namespace: str,
    provider: str,
    offer: Offer,
    fallback_region: str,
    secret_name: str | None,
) -> JSON:
    """The remote Pod for ``spec`` on ``shape``; raises ``InvalidSpec`` for what B can never
    run (everything else is left to B's validation, whose 422 names the field)."""
    if not spec.image.strip():
        raise InvalidSpec("a pod needs an image", field=f"{_CONTAINER}.image")
    keys = secret_keys(spec)
    env: list[JSON] = []
    for var in spec.env:
        if var.secret:
            if secret_name is None:
                raise ValueError("secret env values need a Secret")  # a bug, not a spec error
            ref = {"name": secret_name, "key": keys[var.name]}
            env.append({"name": var.name, "valueFrom": {"secretKeyRef": ref}})
        else:
            env.append({"name": var.name, "value": var.value})
    container: JSON = {"name": spec.container_name or "main", "image": spec.image}
    if spec.command:
        container["command"] = list(spec.command)
    if spec.args:
        container["args"] = list(spec.args)
    if spec.working_dir:
        container["workingDir"] = spec.working_dir
    if env:
        container["env"] = env
    if spec.ports:
        container["ports"] = [
            {"containerPort": p.container_port, "protocol": p.protocol}
            | ({"name": p.name} if p.name else {})
            for p in spec.ports
        ]
    limits: dict[str, str] = {
        "cpu": cpu_quantity(shape.vcpus),
        "memory": memory_quantity(shape.memory_gib),
    }
    if shape.gpus:
        limits[GPU_RESOURCE] = str(shape.gpus)
    container["resources"] = {
        # Explicit requests, even 0: without them the API server would copy the limits.
        "requests": {"cpu": cpu_quantity(spec.cpu), "memory": str(max(0, spec.memory_bytes))},
        "limits": limits,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": owner_labels(spec, provider=provider),
            "annotations": {
                ANN_POD_UID: spec.pod_uid,
                ANN_ATTEMPT: str(spec.attempt),
                ANN_OFFER: offer.key,
                ANN_PRICE: f"{offer.price_per_hour:.6f}",
                ANN_SOURCE: f"{spec.namespace}/{spec.pod_name}",
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "tolerations": [dict(t) for t in (GPU_TOLERATIONS if shape.gpus else TOLERATIONS)],
            "affinity": region_affinity(offer.region, fallback=offer.region == fallback_region),
            "containers": [container],
        },
    }


def owner_reference(pod: Mapping[str, object]) -> JSON:
    """The ownerReference that makes B's garbage collector delete a Secret with its pod."""
    metadata = _mapping(pod.get("metadata"), "pod metadata")
    name, uid = metadata.get("name"), metadata.get("uid")
    if not isinstance(name, str) or not isinstance(uid, str) or not uid:
        raise MalformedResponse("the created pod has no name or uid")
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid, "controller": True}


# --- states -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Observation:
    """What a remote pod says about its instance."""

    state: InstanceState
    message: str = ""
    exit_code: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


def _timestamp(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _container_state(status: Mapping[str, object]) -> Mapping[str, object]:
    statuses = status.get("containerStatuses")
    if not isinstance(statuses, list) or not statuses or not isinstance(statuses[0], dict):
        return {}
    state = statuses[0].get("state")
    return state if isinstance(state, dict) else {}


def _disrupted(status: Mapping[str, object]) -> str | None:
    """Why B took the pod away (eviction, preemption, node loss), if it did."""
    reason = status.get("reason")
    if isinstance(reason, str) and (reason in LOST_REASONS or reason.startswith("OutOf")):
        return reason
    conditions = status.get("conditions")
    for condition in conditions if isinstance(conditions, list) else []:
        if (
            isinstance(condition, dict)
            and condition.get("type") == "DisruptionTarget"
            and condition.get("status") == "True"
        ):
            return str(condition.get("reason") or "DisruptionTarget")
    return None


def _text(mapping: Mapping[str, object], key: str) -> str:
    value = mapping.get(key)
    return value if isinstance(value, str) else ""


def observe(pod: Mapping[str, object]) -> Observation:
    """The state table of the module docstring; raises ``MalformedResponse`` for a phase it
    does not know."""
    metadata = _mapping(pod.get("metadata"), "pod metadata")
    status = _mapping(pod.get("status"), "pod status")
    state = _container_state(status)
    running = _mapping(state.get("running"), "container state running")
    terminated = _mapping(state.get("terminated"), "container state terminated")
    waiting = _mapping(state.get("waiting"), "container state waiting")
    started = _timestamp(running.get("startedAt")) or _timestamp(terminated.get("startedAt"))
    finished = _timestamp(terminated.get("finishedAt"))
    exit_code = terminated.get("exitCode") if terminated else None
    code = exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None
    if metadata.get("deletionTimestamp"):
        return Observation(InstanceState.TERMINATING, "deletion requested", code, started, finished)
    message = _text(status, "message")
    disruption = _disrupted(status)
    if disruption is not None:
        text = f"{disruption}: {message}" if message else disruption
        return Observation(InstanceState.LOST, f"pod taken away by the cluster ({text})")
    phase = _text(status, "phase")
    if phase == "Pending":
        why = _text(waiting, "reason") or _pending_reason(status)
        detail = _text(waiting, "message")
        return Observation(InstanceState.PENDING, f"{why}: {detail}" if detail else why)
    if phase in ("Running", "Succeeded", "Failed") and terminated:
        text = _text(terminated, "reason")
        return Observation(
            InstanceState.EXITED, text, code if code is not None else 1, started, finished
        )
    if phase == "Running":
        return Observation(
            InstanceState.RUNNING, "", None, started or _timestamp(status.get("startTime"))
        )
    if phase == "Succeeded":
        return Observation(InstanceState.EXITED, "Completed", 0, started, finished)
    if phase == "Failed":
        why = _text(status, "reason") or "Failed"
        return Observation(InstanceState.LOST, f"pod failed before its container ran ({why})")
    if phase == "Unknown":
        return Observation(InstanceState.LOST, "the cluster lost contact with the pod's node")
    raise MalformedResponse(f"pod phase {phase!r} is not a Kubernetes pod phase")


def _pending_reason(status: Mapping[str, object]) -> str:
    conditions = status.get("conditions")
    for condition in conditions if isinstance(conditions, list) else []:
        if (
            isinstance(condition, dict)
            and condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
        ):
            reason = _text(condition, "reason") or "Unschedulable"
            detail = _text(condition, "message")
            return f"{reason}: {detail}" if detail else reason
    return "Pending"


def parse_instance(pod: object, *, provider: str) -> Instance | None:
    """The ``Instance`` of a remote pod; None when it is not ours (label and annotations);
    raises ``MalformedResponse`` for a pod of ours that cannot be read."""
    if not isinstance(pod, dict):
        raise MalformedResponse("pod is not a JSON object")
    metadata = _mapping(pod.get("metadata"), "pod metadata")
    labels = _mapping(metadata.get("labels"), "pod labels")
    if labels.get(LABEL_MANAGED_BY) != label_value(provider):
        return None
    annotations = _mapping(metadata.get("annotations"), "pod annotations")
    pod_uid = annotations.get(ANN_POD_UID)
    attempt = annotations.get(ANN_ATTEMPT)
    if not isinstance(pod_uid, str) or not isinstance(attempt, str) or not attempt.isdigit():
        return None  # labelled ours but not made by this adapter: not provably ours
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise MalformedResponse("pod has no name")
    seen = observe(pod)
    status = _mapping(pod.get("status"), "pod status")
    ip = status.get("podIP")
    price = annotations.get(ANN_PRICE)
    try:
        price_per_hour = float(price) if isinstance(price, str) else 0.0
    except ValueError:
        price_per_hour = 0.0
    offer_key = annotations.get(ANN_OFFER)
    return Instance(
        provider=provider,
        instance_id=name,
        pod_uid=pod_uid,
        attempt=int(attempt),
        state=seen.state,
        offer_key=offer_key if isinstance(offer_key, str) else "",
        exit_code=seen.exit_code,
        message=seen.message,
        started_at=seen.started_at,
        finished_at=seen.finished_at,
        ip=ip if isinstance(ip, str) and ip else None,
        price_per_hour=price_per_hour,
    )


def made_for(instance: Instance, spec: WorkloadSpec) -> bool:
    return instance.pod_uid == spec.pod_uid and instance.attempt == spec.attempt


# --- logs ---------------------------------------------------------------------------------


def _container_name(pod: object) -> str:
    """The name of the remote pod's (only) container."""
    spec = _mapping(_mapping(pod, "pod").get("spec"), "pod spec")
    containers = spec.get("containers")
    first = containers[0] if isinstance(containers, list) and containers else None
    name = _text(_mapping(first, "pod container"), "name")
    if not name:
        raise MalformedResponse("the pod has no named container")
    return name


def log_params(container: str, options: LogOptions) -> dict[str, str]:
    """The query of ``GET .../pods/{name}/log``."""
    params = {"container": container}
    if options.follow:
        params["follow"] = "true"
    if options.timestamps:
        params["timestamps"] = "true"
    if options.tail_lines is not None:
        params["tailLines"] = str(max(0, options.tail_lines))
    if options.since_seconds is not None:
        params["sinceSeconds"] = str(max(1, options.since_seconds))
    if options.limit_bytes is not None:
        params["limitBytes"] = str(max(1, options.limit_bytes))
    return params


@dataclass(slots=True)
class LineSplitter:
    """Bytes in, whole lines out (each ending with a newline)."""

    _pending: bytes = b""

    def feed(self, data: bytes) -> list[bytes]:
        data = self._pending + data
        lines = data.split(b"\n")
        self._pending = lines.pop()
        return [line + b"\n" for line in lines]

    def flush(self, *, terminate: bool = True) -> bytes:
        rest, self._pending = self._pending, b""
        return rest + b"\n" if rest and terminate else rest


# --- errors -------------------------------------------------------------------------------


class Call(enum.Enum):
    """What kind of request failed; a 400 means different things to different calls."""

    READ = "read"
    WRITE = "write"
    LOGS = "logs"


@dataclass(frozen=True, slots=True)
class ApiFailure:
    """A failed request: HTTP status (None: no usable answer) and the Kubernetes ``Status``."""

    status: int | None
    reason: str = ""
    message: str = ""
    kind: str = ""  # details.kind: what was not found, refused, invalid
    fields: tuple[str, ...] = ()  # details.causes[].field
    retry_after: float | None = None


def api_failure(response: httpx.Response) -> ApiFailure:
    """The ``Status`` of an error answer (or its text when it is not one)."""
    retry_after: float | None = None
    header = response.headers.get("Retry-After")
    # Delta-seconds only, read as Python reads a float: not ``transport.parse_retry_after``,
    # which also takes HTTP dates and refuses non-finite values ("nan" is 0 here, "inf" inf).
    if header:
        with contextlib.suppress(ValueError):
            retry_after = max(0.0, float(header))
    try:
        body = json.loads(response.content)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        text = " ".join(response.text.split())[:300]
        return ApiFailure(response.status_code, message=text, retry_after=retry_after)
    details = body.get("details")
    details = details if isinstance(details, dict) else {}
    causes = details.get("causes")
    fields = tuple(
        c["field"]
        for c in (causes if isinstance(causes, list) else [])
        if isinstance(c, dict) and isinstance(c.get("field"), str) and c["field"]
    )
    seconds = details.get("retryAfterSeconds")
    if retry_after is None and isinstance(seconds, int) and not isinstance(seconds, bool):
        retry_after = float(max(0, seconds))
    return ApiFailure(
        response.status_code,
        reason=_text(body, "reason"),
        message=" ".join(_text(body, "message").split())[:500],
        kind=_text(details, "kind"),
        fields=fields,
        retry_after=retry_after,
    )


def classify_failure(failure: ApiFailure, *, provider: str, what: str, call: Call) -> ProviderError:
    """The one place failures of cluster B become ``domain.errors`` (module docstring).

    ``failure.message`` must already be redacted."""
    status = failure.status
    head = f"HTTP {status}" + (f" {failure.reason}" if failure.reason else "")
    message = (
        f"Kubernetes {what}: "
        + (f"{head}: " if status is not None else "")
        + (failure.message or failure.reason or "(no message)")
    )
    text = failure.message.lower()
    if status is None:
        return Transient(message, provider=provider)
    if status == 401:
        return AuthFailed(message, provider=provider)
    if status == 403:
        if "exceeded quota" in text:
            return CapacityUnavailable(message, provider=provider)
        if "service account" in text and "not found" in text:
            return Transient(message, provider=provider)  # the namespace is brand new
        return AuthFailed(message, provider=provider)
    if status == 404:
        return NotFound(message, provider=provider)
    if status == 429:
        return RateLimited(message, provider=provider, retry_after=failure.retry_after)
    if status in (400, 422):
        if call is Call.LOGS:
            return Transient(message, provider=provider)  # "container ... is waiting to start"
        return InvalidSpec(message, provider=provider, field=_pod_field(failure))
    return Transient(message, provider=provider)


def _pod_field(failure: ApiFailure) -> str:
    if failure.fields:
        return failure.fields[0]
    match = re.search(r"is invalid: ([A-Za-z0-9_.\[\]]+):", failure.message)
    return match[1] if match else ""


# --- retries ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryPolicy(TransportRetryPolicy):
    """``providers.transport.RetryPolicy`` with this adapter's shorter backoff: from 0.25 s,
    doubling, up to 2 s."""

    backoff_seconds: float = 0.25
    max_backoff_seconds: float = 2.0


# --- the provider -------------------------------------------------------------------------


class KubernetesProvider:
    """``domain.contract.Provider`` on a remote Kubernetes cluster (module docstring)."""

    def __init__(
        self,
        config: KubernetesProviderConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        """``transport`` is the test seam: when given it also carries the TLS settings (see
        ``build_transport``); credentials travel in headers either way. Raises
        ``ConfigError`` when the kubeconfig cannot be read or used."""
        self._config = config
        self._scope = OfferScope.from_config(config)
        self._namespace = config.namespace
        access = parse_kubeconfig(config.kubeconfig.resolve(), base_dir=kubeconfig_base_dir(config))
        self._redact = Redactor((access.token,) if access.token else ())
        self._retry = retry or RetryPolicy()
        self._client = httpx.AsyncClient(
            base_url=access.server,
            transport=transport or build_transport(access),
            timeout=config.timeout_seconds,
            headers={**access.headers(), "Accept": "application/json"},
        )

    @property
    def name(self) -> str:
        return self._config.name

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(logs=True, follow_logs=True, log_timestamps=True)

    async def offers(self) -> list[Offer]:
        nodes = await self._json("GET", "/api/v1/nodes", what="list nodes", call=Call.READ)
        pods = await self._json(
            "GET",
            "/api/v1/pods",
            what="list pods",
            call=Call.READ,
            params={"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"},
        )
        with self._readable("offers"):
            capacities = node_capacities(nodes, pods, self._scope)
            used = gpus_in_use(pods, namespace=self._namespace, provider=self.name)
        return plan_offers(capacities, self._scope, gpus_used=used)

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        shape = Shape.parse(offer.sku)
        if shape is None or offer.provider != self.name:
            raise CapacityUnavailable(
                f"offer {offer.key} is not an offer of this cluster", provider=self.name
            )
        self._check_fits(spec, shape, offer)
        name = pod_name(spec)
        secret = build_secret(spec, name=name, namespace=self._namespace, provider=self.name)
        try:
            body = build_pod(
                spec,
                shape,
                name=name,
                namespace=self._namespace,
                provider=self.name,
                offer=offer,
                fallback_region=self._scope.fallback_region,
                secret_name=name if secret is not None else None,
            )
        except InvalidSpec as exc:
            raise InvalidSpec(str(exc), provider=self.name, field=exc.field) from None
        redact = self._redact.with_secrets(var.value for var in spec.env if var.secret)
        if secret is not None:
            await self._put_secret(secret, redact)
        try:
            pod = await self._create_pod(spec, body, redact)
            with self._readable(f"create pod {name}"):
                instance = parse_instance(pod, provider=self.name)
            if instance is None or not made_for(instance, spec):
                raise CapacityUnavailable(
                    f"pod {self._namespace}/{name} in the cluster was not made for "
                    f"{spec.request_id}",
                    provider=self.name,
                )
        except ProviderError:
            if secret is not None:
                await self._forget_secret(name, quietly=True)
            raise
        if secret is not None:
            await self._own_secret(secret, pod, redact)
        return instance

    async def get(self, instance_id: str) -> Instance:
        what = f"get pod {instance_id!r}"
        pod = await self._json("GET", self._pod_path(instance_id), what=what, call=Call.READ)
        with self._readable(what):
            instance = parse_instance(pod, provider=self.name)
        if instance is None:
            raise NotFound(f"pod {instance_id!r} in the cluster is not ours", provider=self.name)
        return instance

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        if not is_pod_name(instance_id):
            return  # no pod of ours can have that name: nothing to delete
        # 0 would remove the object at once and leave the container to the kubelet's next
        # sync; 1 lets B's kubelet stop it (as `kubectl delete --grace-period=0` does).
        grace = max(1, math.ceil(max(0.0, grace_seconds)))
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": grace,
            "propagationPolicy": "Background",
        }
        with contextlib.suppress(NotFound):
            await self._send(
                "DELETE",
                self._pod_path(instance_id),
                what=f"delete pod {instance_id}",
                call=Call.WRITE,
                json_body=options,
            )
            log.info(
                "provider %s: deleting pod %s/%s (grace %ds)",
                self.name,
                self._namespace,
                instance_id,
                grace,
            )
        # Normally B's garbage collector removes the Secret with its pod; this covers an
        # agent that died before the Secret got its ownerReference. Quietly: the pod's
        # deletion is what was asked for, and it succeeded.
        await self._forget_secret(instance_id, quietly=True)

    async def list_ours(self) -> list[Instance]:
        what = "list our pods"
        body = await self._json(
            "GET",
            f"/api/v1/namespaces/{self._namespace}/pods",
            what=what,
            call=Call.READ,
            params={"labelSelector": f"{LABEL_MANAGED_BY}={label_value(self.name)}"},
        )
        found: list[Instance] = []
        with self._readable(what):
            for pod in _items(body, what):
                try:
                    instance = parse_instance(pod, provider=self.name)
                except MalformedResponse as exc:
                    log.warning("provider %s: skipping an unreadable pod: %s", self.name, exc)
                    continue
                if instance is not None:
                    found.append(instance)
        return found

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        what = f"logs of pod {instance_id!r}"
        pod = await self._json("GET", self._pod_path(instance_id), what=what, call=Call.LOGS)
        with self._readable(what):
            if parse_instance(pod, provider=self.name) is None:
                raise NotFound(
                    f"pod {instance_id!r} in the cluster is not ours", provider=self.name
                )
            container = _container_name(pod)
        response = await self._retrying(
            lambda: self._open_logs(instance_id, container, options, what=what)
        )
        splitter = LineSplitter()
        try:
            try:
                async for data in response.aiter_bytes():
                    for line in splitter.feed(data):
                        yield line
            except httpx.HTTPError as exc:
                raise Transient(
                    f"Kubernetes {what}: the stream broke ({type(exc).__name__})",
                    provider=self.name,
                ) from exc
            rest = splitter.flush(terminate=options.limit_bytes is None)
            if rest:
                yield rest
        finally:
            await response.aclose()

    async def close(self) -> None:
        await self._client.aclose()

    # --- internals ------------------------------------------------------------------------

    def _check_fits(self, spec: WorkloadSpec, shape: Shape, offer: Offer) -> None:
        too_small = (
            spec.gpu_count > shape.gpus
            or spec.cpu > shape.vcpus + 1e-9
            or spec.memory_bytes > shape.memory_gib * 2**30
        )
        if too_small:
            raise CapacityUnavailable(
                f"offer {offer.key} is smaller than the workload of {spec.request_id}",
                provider=self.name,
            )

    def _pod_path(self, name: str) -> str:
        if not is_pod_name(name):
            raise NotFound(f"no pod of ours is called {name!r}", provider=self.name)
        return f"/api/v1/namespaces/{self._namespace}/pods/{name}"

    def _secret_path(self, name: str) -> str:
        return f"/api/v1/namespaces/{self._namespace}/secrets/{name}"

    async def _create_pod(self, spec: WorkloadSpec, body: JSON, redact: Redactor) -> JSON:
        """POST the pod; an existing pod of that name is returned (the caller checks it was
        made for this request)."""
        name = str(pod_name(spec))
        what = f"create pod {self._namespace}/{name}"
        response = await self._create_object("pods", body, what=what, redact=redact)
        if response.status_code == 409:
            existing = await self._json("GET", self._pod_path(name), what=what, call=Call.READ)
            log.info("provider %s: pod %s exists already; reusing it", self.name, name)
            if not isinstance(existing, dict):
                raise self._malformed(what, "the pod is not a JSON object")
            return existing
        created = self._decode(response, what)
        if not isinstance(created, dict):
            raise self._malformed(what, "the pod is not a JSON object")
        log.info(
            "provider %s: created pod %s/%s for %s",
            self.name,
            self._namespace,
            name,
            spec.request_id,
        )
        return created

    async def _put_secret(self, secret: JSON, redact: Redactor) -> None:
        """Create the Secret, or bring an existing one (an earlier try) up to date."""
        name = str(_mapping(secret.get("metadata"), "secret")["name"])
        what = f"create secret {self._namespace}/{name}"
        response = await self._create_object("secrets", secret, what=what, redact=redact)
        if response.status_code == 409:
            await self._send(
                "PATCH",
                self._secret_path(name),
                what=f"update secret {self._namespace}/{name}",
                call=Call.WRITE,
                json_body={"data": secret["data"]},
                merge_patch=True,
                redact=redact,
            )

    async def _own_secret(self, secret: JSON, pod: JSON, redact: Redactor) -> None:
        """Make the pod the Secret's owner, so B deletes the Secret with the pod."""
        name = str(_mapping(secret.get("metadata"), "secret")["name"])
        what = f"set the owner of secret {self._namespace}/{name}"
        with self._readable(what):
            owner = owner_reference(pod)
        patch = {"metadata": {"ownerReferences": [owner]}}
        try:
            await self._send(
                "PATCH",
                self._secret_path(name),
                what=what,
                call=Call.WRITE,
                json_body=patch,
                merge_patch=True,
                redact=redact,
            )
        except NotFound:
            # Gone meanwhile (a concurrent delete): make it again, owned from the start.
            owned = {
                **secret,
                "metadata": {**_mapping(secret["metadata"], "secret"), **patch["metadata"]},
            }
            await self._create_object("secrets", owned, what=what, redact=redact)

    async def _forget_secret(self, name: str, *, quietly: bool = False) -> None:
        """Delete the Secret of pod ``name`` if there is one; ``quietly`` logs a failure
        instead of raising it (cleanup after another error, which matters more)."""
        try:
            await self._send(
                "DELETE",
                self._secret_path(name),
                what=f"delete secret {self._namespace}/{name}",
                call=Call.WRITE,
            )
        except NotFound:
            return
        except ProviderError as exc:
            if not quietly:
                raise
            log.warning("provider %s: secret %s not cleaned up: %s", self.name, name, exc)

    async def _create_object(
        self, collection: str, body: JSON, *, what: str, redact: Redactor
    ) -> httpx.Response:
        """POST into the namespace, creating the namespace when it is missing; 409 is
        returned, not raised."""
        path = f"/api/v1/namespaces/{self._namespace}/{collection}"
        for _ in range(2):
            response = await self._send(
                "POST",
                path,
                what=what,
                call=Call.WRITE,
                json_body=body,
                accept=frozenset({404, 409}),
                redact=redact,
            )
            if response.status_code != 404:
                return response
            failure = api_failure(response)
            if failure.kind != "namespaces":
                raise self._failure(failure, what, Call.WRITE, redact)
            await self._create_namespace()
        raise Transient(
            f"Kubernetes {what}: namespace {self._namespace} vanished", provider=self.name
        )

    async def _create_namespace(self) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": self._namespace,
                "labels": {LABEL_MANAGED_BY: label_value(self.name)},
            },
        }
        response = await self._send(
            "POST",
            "/api/v1/namespaces",
            what=f"create namespace {self._namespace}",
            call=Call.WRITE,
            json_body=body,
            accept=frozenset({409}),
        )
        if response.status_code != 409:
            log.info("provider %s: created namespace %s", self.name, self._namespace)
        await self._await_default_service_account()

    async def _await_default_service_account(self, *, within_seconds: float = 30.0) -> None:
        """Pods are refused until the namespace's ``default`` ServiceAccount exists.

        The remote controller-manager creates it shortly after the namespace; waiting here
        (bounded) keeps the first create from failing for a reason nobody can act on.
        """
        path = f"/api/v1/namespaces/{self._namespace}/serviceaccounts/default"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_seconds
        while True:
            response = await self._send(
                "GET",
                path,
                what=f"read serviceaccount {self._namespace}/default",
                call=Call.READ,
                accept=frozenset({404}),
            )
            if response.status_code != 404 or loop.time() > deadline:
                return
            await asyncio.sleep(0.2)

    async def _open_logs(
        self, instance_id: str, container: str, options: LogOptions, *, what: str
    ) -> httpx.Response:
        """One attempt at opening the log stream (the caller retries)."""
        seconds = self._config.timeout_seconds
        request = self._client.build_request(
            "GET",
            f"{self._pod_path(instance_id)}/log",
            params=log_params(container, options),
            headers={"Accept": "*/*"},
            # A followed stream may stay quiet for as long as the container does.
            timeout=httpx.Timeout(seconds, read=None if options.follow else seconds),
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise self._transport_failure(exc, what, self._redact) from exc
        if response.is_success:
            return response
        try:
            with contextlib.suppress(httpx.HTTPError):
                await response.aread()
        finally:
            await response.aclose()
        raise self._failure(api_failure(response), what, Call.LOGS, self._redact)

    async def _json(
        self,
        method: str,
        path: str,
        *,
        what: str,
        call: Call,
        params: Mapping[str, str] | None = None,
    ) -> object:
        response = await self._send(method, path, what=what, call=call, params=params)
        return self._decode(response, what)

    async def _send(
        self,
        method: str,
        path: str,
        *,
        what: str,
        call: Call,
        params: Mapping[str, str] | None = None,
        json_body: Mapping[str, object] | None = None,
        merge_patch: bool = False,
        accept: frozenset[int] = frozenset(),
        redact: Redactor | None = None,
    ) -> httpx.Response:
        """One request, retried by the ``RetryPolicy``; statuses in ``accept`` are returned,
        other failures raised classified."""
        redact = redact or self._redact
        headers: dict[str, str] = {}
        content: bytes | None = None
        query = dict(params or {})
        if json_body is not None:
            content = json.dumps(json_body).encode()
            headers["Content-Type"] = (
                "application/merge-patch+json" if merge_patch else "application/json"
            )
        if method in ("POST", "PATCH", "PUT"):
            query["fieldManager"] = FIELD_MANAGER

        async def attempt() -> httpx.Response:
            try:
                response = await self._client.request(
                    method, path, params=query, content=content, headers=headers
                )
            except httpx.HTTPError as exc:
                raise self._transport_failure(exc, what, redact) from exc
            if response.is_success or response.status_code in accept:
                return response
            raise self._failure(api_failure(response), what, call, redact)

        return await self._retrying(attempt)

    def _failure(
        self, failure: ApiFailure, what: str, call: Call, redact: Redactor
    ) -> ProviderError:
        redacted = ApiFailure(
            failure.status,
            reason=failure.reason,
            message=redact(failure.message),
            kind=failure.kind,
            fields=failure.fields,
            retry_after=failure.retry_after,
        )
        return classify_failure(redacted, provider=self.name, what=what, call=call)

    def _transport_failure(
        self, exc: httpx.HTTPError, what: str, redact: Redactor
    ) -> ProviderError:
        if isinstance(exc, httpx.TimeoutException):
            reason = f"no answer within {self._config.timeout_seconds:g}s"
        else:
            reason = f"{type(exc).__name__}: {redact(str(exc))}"
        return classify_failure(
            ApiFailure(None, message=reason), provider=self.name, what=what, call=Call.READ
        )

    def _malformed(self, what: str, detail: str) -> ProviderError:
        return classify_failure(
            ApiFailure(None, reason="MalformedResponse", message=f"unexpected answer: {detail}"),
            provider=self.name,
            what=what,
            call=Call.READ,
        )

    def _decode(self, response: httpx.Response, what: str) -> object:
        try:
            return json.loads(response.content)
        except ValueError as exc:
            raise self._malformed(what, f"malformed JSON ({exc})") from None

    @contextlib.contextmanager
    def _readable(self, what: str) -> Iterator[None]:
        """A payload this adapter cannot read is a ``Transient`` naming what was wrong."""
        try:
            yield
        except MalformedResponse as exc:
            raise self._malformed(what, self._redact(str(exc))) from None

    async def _retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        return await self._retry.run(call, before_sleep=log_retries(log, self.name))
