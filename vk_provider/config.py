"""The agent's configuration: one YAML file, validated once, passed explicitly.

Every field has a documented default; unknown keys are errors; credentials are references
(``env:VAR`` or ``file:/path``) resolved only when an adapter needs them, so the configuration
object itself never holds a secret value.

Invariants:
- ``load_config`` either returns a fully valid ``AgentConfig`` or raises ``ConfigError`` whose
  message names every offending field by its dotted path.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class ConfigError(ValueError):
    """The configuration is invalid; the message names each field and why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SecretRef(_Strict):
    """A credential by reference: ``env:VAR`` or ``file:/path``. Never a literal value.

    In YAML it is written as a plain string: ``api_key: env:RUNPOD_API_KEY``.
    """

    ref: str

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: object) -> object:
        return {"ref": value} if isinstance(value, str) else value

    @field_validator("ref")
    @classmethod
    def _check(cls, value: str) -> str:
        if not (value.startswith("env:") and len(value) > 4) and not (
            value.startswith("file:/") and len(value) > 6
        ):
            raise ValueError("must be a reference 'env:VAR' or 'file:/absolute/path', not a value")
        return value

    def resolve(self) -> str:
        """Read the secret now. The error names the reference, never the value."""
        kind, _, target = self.ref.partition(":")
        if kind == "env":
            value = os.environ.get(target)
            if value is None:
                raise ConfigError(f"credential {self.ref}: environment variable is not set")
            return value
        try:
            return Path(target).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"credential {self.ref}: cannot read file ({exc.strerror})") from exc

    def __repr__(self) -> str:
        return f"SecretRef({self.ref!r})"


class Taint(_Strict):
    key: str = Field(description="Taint key.")
    value: str = Field("", description="Taint value.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        "NoSchedule", description="Taint effect."
    )


DEFAULT_TAINT = Taint(key="virtual-kubelet.io/provider", value="vk-provider", effect="NoSchedule")


class NodeConfig(_Strict):
    name: str = Field("vk-gpu", description="Name of the virtual node.")
    labels: dict[str, str] = Field(
        default_factory=dict, description="Extra node labels (the standard ones are always set)."
    )
    taints: list[Taint] = Field(
        default_factory=lambda: [DEFAULT_TAINT],
        description="Node taints; default virtual-kubelet.io/provider=vk-provider:NoSchedule.",
    )
    max_pods: int = Field(110, ge=1, le=10000, description="Pods the node admits at most.")
    max_gpus: int = Field(64, ge=0, le=100000, description="Cap on advertised nvidia.com/gpu.")
    max_cpu: int = Field(1024, ge=1, le=1_000_000, description="Cap on advertised vCPUs.")
    max_memory_gib: int = Field(
        8192, ge=1, le=10_000_000, description="Cap on advertised memory (GiB)."
    )
    address: str = Field(
        "", description="InternalIP to advertise; default the kubelet API's listen address."
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NODE_NAME.match(value):
            raise ValueError("must be a DNS subdomain (lowercase letters, digits, '-', '.')")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _LABEL_KEY.match(key) or len(key) > 316:
                raise ValueError(f"label key {key!r} is not a valid Kubernetes label key")
        return value


class LocalOffer(_Strict):
    sku: str = Field(description="Offer name, unique within the provider.")
    gpu_model: str | None = Field(None, description="Canonical GPU model, or none for CPU-only.")
    gpu_count: int = Field(0, ge=0, le=16, description="GPUs per instance.")
    gpu_memory_gib: float = Field(0, ge=0, description="Memory per GPU (GiB).")
    vcpus: float = Field(4, gt=0, description="vCPUs per instance.")
    memory_gib: float = Field(16, gt=0, description="Memory per instance (GiB).")
    price_per_hour: float = Field(ge=0, description="Simulated $/hour for the whole instance.")
    capacity: int = Field(4, ge=0, description="Instances of this offer that can run at once.")
    region: str = Field("local", description="Simulated region.")
    spot: bool = Field(False, description="Simulated interruptible capacity.")
    startup_seconds: float = Field(0, ge=0, le=600, description="Simulated launch latency.")


class LocalFaults(_Strict):
    create_failure_rate: float = Field(
        0, ge=0, le=1, description="Probability that a create fails with CapacityUnavailable."
    )
    api_latency_seconds: float = Field(0, ge=0, le=60, description="Delay added to every call.")
    create_error: Literal["capacity", "transient", "rate_limited", "auth"] = Field(
        "capacity", description="The error class an injected create failure raises."
    )


class LocalProviderConfig(_Strict):
    """Runs each container's command as a local process: development, demo and tests only."""

    type: Literal["local"]
    name: str = Field(description="Provider name, unique in this agent.")
    enabled: bool = Field(
        False, description="Must be true: the local provider refuses to start otherwise."
    )
    state_dir: Path | None = Field(
        None, description="Where instances keep logs and state; default under the state root."
    )
    offers: list[LocalOffer] = Field(description="Simulated offers.")
    faults: LocalFaults = Field(default_factory=LocalFaults, description="Injected faults.")
    priority: int = Field(0, description="Higher is preferred when prices tie.")

    @model_validator(mode="after")
    def _unique_skus(self) -> LocalProviderConfig:
        seen: set[str] = set()
        for offer in self.offers:
            if offer.sku in seen:
                raise ValueError(f"offers: sku {offer.sku!r} appears twice")
            seen.add(offer.sku)
        return self


class _CloudProviderBase(_Strict):
    """Fields every real cloud provider shares."""

    name: str = Field(description="Provider name, unique in this agent.")
    priority: int = Field(0, description="Higher is preferred when prices tie.")
    regions: list[str] = Field(
        default_factory=list, description="Regions (or data centres) to use; empty means all."
    )
    max_price_per_hour: float | None = Field(
        None, ge=0, description="Never launch an instance dearer than this ($/hour)."
    )
    max_gpus: int = Field(64, ge=0, description="Most GPUs to run on this provider at once.")
    timeout_seconds: float = Field(30, gt=0, le=300, description="Per-request timeout.")


class RunPodProviderConfig(_CloudProviderBase):
    """RunPod pods through REST v1, offers through GraphQL (shared/provider-apis)."""

    type: Literal["runpod"]
    api_key: SecretRef = Field(description="API key, by reference (env:VAR or file:/path).")
    cloud_type: Literal["SECURE", "COMMUNITY", "ALL"] = Field(
        "SECURE", description="Secure cloud, community cloud, or both."
    )
    gpu_types: list[str] = Field(
        default_factory=list, description="RunPod GPU type ids to consider; empty means all."
    )
    container_disk_gb: int = Field(20, ge=1, le=2000, description="Container disk per pod (GB).")
    rest_url: str = Field("https://rest.runpod.io/v1", description="REST v1 base URL.")
    graphql_url: str = Field("https://api.runpod.io/graphql", description="GraphQL URL.")
    logs_url: str = Field("https://api.runpod.io/v2", description="REST v2 base URL (logs).")


class LambdaProviderConfig(_CloudProviderBase):
    """Lambda Cloud VMs running the pod's image through cloud-init (shared/provider-apis)."""

    type: Literal["lambda"]
    api_key: SecretRef = Field(description="API key, by reference (env:VAR or file:/path).")
    ssh_key_name: str = Field(description="Name of an SSH key registered with Lambda Cloud.")
    firewall_ruleset_ids: list[str] = Field(
        default_factory=list, description="Firewall rulesets to attach to launched instances."
    )
    instance_types: list[str] = Field(
        default_factory=list, description="Instance type names to consider; empty means all."
    )
    base_url: str = Field("https://cloud.lambda.ai/api/v1", description="API base URL.")


class ModalGpuOffer(_Strict):
    gpu: str = Field(description="Modal GPU name, e.g. H100, A100-80GB, L40S.")
    count: int = Field(1, ge=1, le=8, description="GPUs per sandbox.")
    price_per_hour: float = Field(ge=0, description="Price for the whole sandbox ($/hour).")
    vcpus: float = Field(8, gt=0, description="vCPUs requested.")
    memory_gib: float = Field(32, gt=0, description="Memory requested (GiB).")
    region: str = Field("any", description="Modal region, or 'any'.")


class ModalProviderConfig(_CloudProviderBase):
    """Modal sandboxes through the `modal` SDK (optional dependency, imported when used)."""

    type: Literal["modal"]
    token_id: SecretRef = Field(description="Modal token id, by reference.")
    token_secret: SecretRef = Field(description="Modal token secret, by reference.")
    app_name: str = Field("vk-provider", description="Modal app that holds the sandboxes.")
    sandbox_timeout_seconds: int = Field(
        86400, ge=60, le=7 * 86400, description="Sandbox lifetime limit (Modal's default is 300)."
    )
    offers: list[ModalGpuOffer] = Field(description="What to offer and at which price.")


class KubernetesProviderConfig(_CloudProviderBase):
    """Another Kubernetes cluster: pods run in a namespace there."""

    type: Literal["kubernetes"]
    kubeconfig: SecretRef = Field(description="Kubeconfig of the remote cluster, by reference.")
    namespace: str = Field("vk-provider-workloads", description="Remote namespace for pods.")
    gpu_model: str | None = Field(None, description="Canonical GPU model of the remote nodes.")
    gpu_price_per_hour: float = Field(0, ge=0, description="Price per GPU per hour.")
    cpu_price_per_hour: float = Field(0, ge=0, description="Price per vCPU per hour.")


ProviderConfig = Annotated[
    LocalProviderConfig
    | RunPodProviderConfig
    | LambdaProviderConfig
    | ModalProviderConfig
    | KubernetesProviderConfig,
    Field(discriminator="type"),
]


class IntervalsConfig(_Strict):
    lease_seconds: float = Field(10, gt=0, le=60, description="Node Lease renewal period.")
    lease_duration_seconds: int = Field(40, ge=10, le=600, description="Lease duration.")
    node_status_seconds: float = Field(30, gt=0, le=600, description="Node status refresh.")
    pod_status_seconds: float = Field(2, gt=0, le=60, description="Running pods' status poll.")
    offers_ttl_seconds: float = Field(30, gt=0, le=3600, description="Offer cache lifetime.")
    restart_backoff_seconds: float = Field(
        10, gt=0, le=300, description="First crash-loop back-off; doubles up to 300 s."
    )
    retry_backoff_seconds: float = Field(
        5, gt=0, le=300, description="First retry of an unplaceable pod; doubles up to 300 s."
    )
    orphan_grace_seconds: float = Field(
        20, ge=0, le=3600, description="How long an instance without a pod lives before it goes."
    )
    retry_backoff_max_seconds: float = Field(
        60, gt=0, le=3600, description="Longest wait between retries of an unplaceable pod."
    )
    instance_lost_cooldown_seconds: float = Field(
        300, ge=0, description="How long an offer whose instance was lost is avoided."
    )


class _Listener(_Strict):
    """A server's ``listen: host:port`` (port 0 picks a free one)."""

    listen: str

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        host, _, port = value.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError("must be host:port")
        return value

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0]

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])


class KubeletApiConfig(_Listener):
    listen: str = Field("0.0.0.0:10250", description="host:port of the kubelet API (TLS).")
    tls_cert_file: Path | None = Field(
        None, description="Serving certificate; a self-signed one is made when absent."
    )
    tls_key_file: Path | None = Field(None, description="Key of the serving certificate.")
    client_ca_file: Path | None = Field(
        None,
        description="CA for client certificates; default the in-cluster service-account CA.",
    )


class RestApiConfig(_Listener):
    """The REST API (provider status, offers, pods, spend, metrics)."""

    listen: str = Field("0.0.0.0:8080", description="host:port of the REST API (HTTP).")
    static_token: SecretRef | None = Field(
        None,
        description="Development: a bearer token, by reference. Without it, tokens are "
        "checked with a Kubernetes TokenReview.",
    )
    open_metrics: bool = Field(True, description="Serve /metrics without a token.")


class BudgetConfig(_Strict):
    """Caps on what the virtual node may cost, in $/hour of running instances."""

    global_per_hour: float | None = Field(None, ge=0, description="Cap for everything; none.")
    namespaces: dict[str, float] = Field(
        default_factory=dict, description="Cap per namespace ($/hour); unlisted use the default."
    )
    default_namespace_per_hour: float | None = Field(
        None, ge=0, description="Cap for namespaces not listed; none means no cap."
    )

    @field_validator("namespaces")
    @classmethod
    def _non_negative(cls, value: dict[str, float]) -> dict[str, float]:
        for namespace, cap in value.items():
            if cap < 0:
                raise ValueError(f"cap of namespace {namespace!r} must be zero or more")
        return value


class PlacementConfig(_Strict):
    """How offers are ranked and how launch failures are handled."""

    max_candidates: int = Field(5, ge=1, le=50, description="Offers tried per placement.")
    capacity_block_seconds: float = Field(
        120, ge=0, description="How long an offer that reported no capacity is skipped."
    )
    auth_block_seconds: float = Field(
        600, ge=0, description="How long a provider that refused credentials is skipped."
    )
    breaker_threshold: int = Field(
        5, ge=1, le=100, description="Consecutive provider failures that open its breaker."
    )
    breaker_cooldown_seconds: float = Field(
        30, gt=0, le=3600, description="How long an open breaker waits before probing."
    )
    low_availability_penalty: float = Field(0.05, ge=0, le=1, description="Price penalty.")
    startup_penalty_per_minute: float = Field(0.01, ge=0, le=1, description="Price penalty.")
    failure_penalty: float = Field(0.10, ge=0, le=1, description="Per recent failure.")


class AgentConfig(_Strict):
    node: NodeConfig = Field(default_factory=NodeConfig, description="The virtual node.")
    providers: list[ProviderConfig] = Field(description="Provider adapters, at least one.")
    intervals: IntervalsConfig = Field(default_factory=IntervalsConfig, description="Timings.")
    kubelet_api: KubeletApiConfig = Field(
        default_factory=KubeletApiConfig, description="The kubelet API (logs)."
    )
    workers: int = Field(16, ge=1, le=256, description="Pods synchronised concurrently.")
    budget: BudgetConfig = Field(default_factory=BudgetConfig, description="Spending caps.")
    rest: RestApiConfig = Field(default_factory=RestApiConfig, description="The REST API.")
    placement: PlacementConfig = Field(
        default_factory=PlacementConfig, description="Ranking and failover."
    )

    @model_validator(mode="after")
    def _unique_providers(self) -> AgentConfig:
        if not self.providers:
            raise ValueError("providers: at least one provider is required")
        names = [p.name for p in self.providers]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"providers: name {name!r} appears more than once")
        return self


_PROVIDER_TAGS = ("local", "runpod", "lambda", "modal", "kubernetes")


def _field_path(location: tuple[int | str, ...]) -> str:
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "(top level)"


def format_validation_error(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        # Discriminated unions add the tag to the location; it is not a field the user wrote.
        location = tuple(p for p in item["loc"] if p not in _PROVIDER_TAGS)
        if location and location[-1] == "ref":  # SecretRef's inner field: name the outer one
            location = location[:-1]
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key"
        if not location and re.match(r"^[\w.\[\]]+: ", message):
            lines.append(message)  # a model-level check that already names its field
        else:
            lines.append(f"{_field_path(location)}: {message}")
    return "\n".join(lines)


def parse_config(data: object) -> AgentConfig:
    try:
        return AgentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


def load_config(path: Path) -> AgentConfig:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return parse_config(data)
