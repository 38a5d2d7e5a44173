"""The agent's configuration: one YAML file, validated once, passed explicitly.

Every field has a documented default; unknown keys are errors; credentials are references
(``env:VAR`` or ``file:/path``) resolved only when an adapter needs them, so the configuration
object itself never holds a secret value.

Invariants:
- ``load_config`` either returns a fully valid ``AgentConfig`` or raises ``ConfigError`` whose
  message names every offending field by its dotted path, or the file when it cannot be read
  as YAML within ``configfile``'s limits (size, UTF-8, depth, aliases).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field, SerializeAsAny, ValidationError, field_validator, model_validator

from vk_provider.domain.budget import BudgetCaps
from vk_provider.domain.node import VIRTUAL_NODE_TAINT_KEY, VIRTUAL_NODE_TAINT_VALUE, NodeCaps
from vk_provider.domain.placement import PlacementPolicy
from vk_provider.settings.configfile import read_yaml
from vk_provider.settings.identity import IdentityConfig
from vk_provider.settings.leader import LeaderElectionConfig
from vk_provider.settings.overflow import OverflowConfig
from vk_provider.settings.providers import ProviderSettings
from vk_provider.settings.secrets import ConfigError, SecretRef, Strict

_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class Taint(Strict):
    key: str = Field(description="Taint key.")
    value: str = Field("", description="Taint value.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        "NoSchedule", description="Taint effect."
    )


DEFAULT_TAINT = Taint(
    key=VIRTUAL_NODE_TAINT_KEY, value=VIRTUAL_NODE_TAINT_VALUE, effect="NoSchedule"
)


class NodeConfig(Strict):
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
        "",
        description="InternalIP to advertise; default the kubelet API's listen address (this "
        "host's when it listens on all). The API server refuses to proxy nodes/<node>/proxy "
        "to a loopback address, and metrics-server scrapes this address: use one they reach.",
    )

    @property
    def caps(self) -> NodeCaps:
        return NodeCaps(
            max_gpus=self.max_gpus,
            max_cpu=self.max_cpu,
            max_memory_gib=self.max_memory_gib,
            max_pods=self.max_pods,
        )

    def taint_objects(self) -> list[dict[str, str]]:
        """The configured taints as the Node API writes them."""
        return [taint.model_dump() for taint in self.taints]

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


class IntervalsConfig(Strict):
    lease_seconds: float = Field(10, gt=0, le=60, description="Node Lease renewal period.")
    lease_duration_seconds: int = Field(40, ge=10, le=600, description="Lease duration.")
    node_status_seconds: float = Field(30, gt=0, le=600, description="Node status refresh.")
    pod_status_seconds: float = Field(2, gt=0, le=60, description="Running pods' status poll.")
    pod_start_poll_seconds: float = Field(
        0.25,
        gt=0,
        le=60,
        description="First status poll after a launch; doubles while the instance is "
        "pending, up to pod_status_seconds.",
    )
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
    pod_watch_timeout_seconds: int = Field(
        60, ge=5, le=3600, description="Server-side timeout of one pod watch request."
    )
    deletion_slack_seconds: float = Field(
        5,
        ge=0,
        le=600,
        description="How far past its grace period a deleted pod may stay while its instance "
        "stops; then the pod is deleted and reconciliation finishes the termination.",
    )
    termination_deadline_seconds: float = Field(
        120,
        gt=0,
        le=86400,
        description="A termination the provider has not confirmed after this long is overdue: "
        "reconciliation asks again, with back-off, and counts it.",
    )
    unplaceable_fail_seconds: float | None = Field(
        300,
        gt=0,
        le=86400,
        description="A pod with a controller owner that no provider can run for this long is "
        "failed (reason NoCapacity) so its controller recreates it and the scheduler chooses "
        "again; null: such pods wait for ever.",
    )


class _Listener(Strict):
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


class ServingCertificateConfig(Strict):
    """Where the kubelet API's serving certificate comes from (``kube.servingcert``)."""

    source: Literal["self-signed", "cluster"] | None = Field(
        None,
        description="cluster (the default unless tls_cert_file is given): a "
        "CertificateSigningRequest to the kubernetes.io/kubelet-serving signer, as a kubelet's "
        "serverTLSBootstrap (the API server can verify it with --kubelet-certificate-authority; "
        "an approver must approve it); self-signed: made by the agent, only when configured "
        "(the API server cannot verify it).",
    )
    self_approve: bool = Field(
        False,
        description="With source cluster: approve our own request (deploy/rbac-serving.yaml); "
        "otherwise an approver (kubectl certificate approve, kubelet-csr-approver) must.",
    )
    certificate_seconds: int = Field(
        2_592_000, ge=3600, le=31_536_000, description="Lifetime asked for (expirationSeconds)."
    )
    renew_fraction: float = Field(
        0.7, ge=0.1, le=0.9, description="Renew once this fraction of its life has passed."
    )
    approval_timeout_seconds: float = Field(
        300, gt=0, le=86400, description="How long to wait for approval and signing at start."
    )


class KubeletApiConfig(_Listener):
    listen: str = Field("0.0.0.0:10250", description="host:port of the kubelet API (TLS).")
    tls_cert_file: Path | None = Field(
        None,
        description="Serving certificate (with tls_key_file); else serving.source says.",
    )
    tls_key_file: Path | None = Field(None, description="Key of the serving certificate.")
    client_ca_file: Path | None = Field(
        None,
        description="CA for client certificates; default the in-cluster service-account CA.",
    )
    serving: ServingCertificateConfig = Field(
        default_factory=ServingCertificateConfig,
        description="The serving certificate when tls_cert_file is not given.",
    )

    @property
    def serving_source(self) -> Literal["files", "self-signed", "cluster"]:
        """Where the serving certificate comes from: the given files, else ``serving.source``
        (cluster when unset)."""
        if self.tls_cert_file or self.tls_key_file:
            return "files"
        return self.serving.source or "cluster"

    @model_validator(mode="after")
    def _one_source(self) -> KubeletApiConfig:
        if self.serving.source is not None and (self.tls_cert_file or self.tls_key_file):
            raise ValueError(
                f"serving.source: {self.serving.source} and tls_cert_file/tls_key_file exclude "
                "each other: the certificate is given, made, or signed by the cluster"
            )
        return self


class RestApiConfig(_Listener):
    """The REST API (provider status, offers, pods, spend, metrics)."""

    listen: str = Field("0.0.0.0:8080", description="host:port of the REST API (HTTP).")
    static_token: SecretRef | None = Field(
        None,
        description="Development: a bearer token, by reference. Without it, tokens are "
        "checked with a Kubernetes TokenReview.",
    )
    open_metrics: bool = Field(True, description="Serve /metrics without a token.")


class BudgetConfig(Strict):
    """Caps on what the virtual node may cost, in $/hour of running instances."""

    global_per_hour: float | None = Field(None, ge=0, description="Cap for everything; none.")
    namespaces: dict[str, float] = Field(
        default_factory=dict, description="Cap per namespace ($/hour); unlisted use the default."
    )
    default_namespace_per_hour: float | None = Field(
        None, ge=0, description="Cap for namespaces not listed; none means no cap."
    )

    @property
    def caps(self) -> BudgetCaps:
        return BudgetCaps(
            global_per_hour=self.global_per_hour,
            per_namespace=dict(self.namespaces),
            default_namespace_per_hour=self.default_namespace_per_hour,
        )

    @field_validator("namespaces")
    @classmethod
    def _non_negative(cls, value: dict[str, float]) -> dict[str, float]:
        for namespace, cap in value.items():
            if cap < 0:
                raise ValueError(f"cap of namespace {namespace!r} must be zero or more")
        return value


class PlacementConfig(Strict):
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

    @property
    def policy(self) -> PlacementPolicy:
        """The ranking penalties, as the pure ``place()`` takes them."""
        return PlacementPolicy(
            low_availability_penalty=self.low_availability_penalty,
            startup_penalty_per_minute=self.startup_penalty_per_minute,
            failure_penalty=self.failure_penalty,
        )


class EndpointSlicesConfig(Strict):
    """Traffic follows the pods (docs/networking.md): EndpointSlices for the Services that
    select pods on the virtual node, at the addresses their providers expose."""

    enabled: bool = Field(
        False,
        description="Write EndpointSlices for Services over this node's pods "
        "(deploy/rbac-traffic.yaml).",
    )
    resync_seconds: float = Field(
        2,
        ge=0.1,
        le=300,
        description="How often the pods' reported endpoints are looked at; a change of a "
        "Service or a slice (watched) is acted on at once.",
    )


class EventsConfig(Strict):
    """How fast the agent writes its Events, as a kubelet's ``eventRecordQPS`` and
    ``eventBurst`` (their defaults): past the burst, Events wait their turn instead of taking
    the API server from the pods' status writes when hundreds of pods start at once."""

    qps: float = Field(
        50, ge=0, le=10_000, description="Event writes per second after the burst; 0: no limit."
    )
    burst: int = Field(100, ge=1, le=10_000, description="Event writes at once before the rate.")


class AgentConfig(Strict):
    node: NodeConfig = Field(default_factory=NodeConfig, description="The virtual node.")
    identity: IdentityConfig = Field(
        default_factory=IdentityConfig,
        description="The agent's Kubernetes identity: its ServiceAccount, or a node's.",
    )
    providers: list[SerializeAsAny[ProviderSettings]] = Field(
        description="Provider adapters, at least one; each entry is validated by the settings "
        "model of its `type` (see the provider registry)."
    )
    intervals: IntervalsConfig = Field(default_factory=IntervalsConfig, description="Timings.")
    kubelet_api: KubeletApiConfig = Field(
        default_factory=KubeletApiConfig, description="The kubelet API (logs)."
    )
    workers: int = Field(16, ge=1, le=256, description="Pods synchronised concurrently.")
    events: EventsConfig = Field(
        default_factory=EventsConfig, description="The rate of the agent's Event writes."
    )
    budget: BudgetConfig = Field(default_factory=BudgetConfig, description="Spending caps.")
    rest: RestApiConfig = Field(default_factory=RestApiConfig, description="The REST API.")
    placement: PlacementConfig = Field(
        default_factory=PlacementConfig, description="Ranking and failover."
    )
    overflow: OverflowConfig = Field(
        default_factory=OverflowConfig,
        description="The overflow flip (docs/overflow.md): the node takes the cluster's overflow "
        "while its own GPUs are full.",
    )
    leader_election: LeaderElectionConfig = Field(
        default_factory=LeaderElectionConfig,
        description="Lease-based leader election: of several replicas one runs the node.",
    )
    endpoint_slices: EndpointSlicesConfig = Field(
        default_factory=EndpointSlicesConfig,
        description="Services reach the node's pods where their providers expose them.",
    )

    @model_validator(mode="after")
    def _lease_name_fits(self) -> AgentConfig:
        name = self.leader_election.name_for(self.node.name)
        if len(name) > 253:
            raise ValueError(
                f"leader_election.lease_name: the default {name[:40]}… is longer than 253 "
                "characters (node.name is long); set a shorter name"
            )
        return self

    @model_validator(mode="after")
    def _overflow_taint(self) -> AgentConfig:
        if not self.overflow.enabled:
            return self
        for index, taint in enumerate(self.node.taints):
            if taint.key == self.overflow.taint_key and taint.effect == "NoExecute":
                raise ValueError(
                    f"node.taints[{index}].effect: the overflow taint must never be NoExecute "
                    "(it would evict every pod on the node at once)"
                )
        return self

    @model_validator(mode="after")
    def _unique_providers(self) -> AgentConfig:
        if not self.providers:
            raise ValueError("providers: at least one provider is required")
        names = [p.name for p in self.providers]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"providers: name {name!r} appears more than once")
        return self


def _field_path(location: tuple[int | str, ...]) -> str:
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "(top level)"


def format_validation_error(
    error: ValidationError, *, prefix: tuple[int | str, ...] = ()
) -> list[str]:
    """One line per error, each naming its field by dotted path (``providers[0].api_key``)."""
    lines = []
    for item in error.errors():
        location = (*prefix, *item["loc"])
        if location and location[-1] == "ref":  # SecretRef's inner field: name the outer one
            location = location[:-1]
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key"
        if not item["loc"] and re.match(r"^[\w.\[\]]+: ", message):
            # A model-level check that already names its field (relative to the model).
            head = _field_path(prefix)
            lines.append(message if not prefix else f"{head}.{message}")
        else:
            lines.append(f"{_field_path(location)}: {message}")
    return lines


ProviderTypes = Mapping[str, type[ProviderSettings]]
"""Provider type name -> its settings model (from the provider registry)."""


def _provider_entries(raw: object, types: ProviderTypes) -> tuple[list[object], list[str]]:
    """Each provider entry validated by the model of its ``type``; errors name the field."""
    if not isinstance(raw, list):
        return ([] if raw is None else [raw]), []  # AgentConfig reports the shape
    entries: list[object] = []
    errors: list[str] = []
    known = ", ".join(sorted(types)) or "none"
    for index, entry in enumerate(raw):
        where = f"providers[{index}]"
        if not isinstance(entry, Mapping):
            errors.append(f"{where}: must be a mapping with a type and a name")
            continue
        kind = entry.get("type")
        if not isinstance(kind, str) or not kind:
            errors.append(f"{where}.type: is required (one of {known})")
            continue
        model = types.get(kind)
        if model is None:
            errors.append(
                f"{where}.type: unknown provider type {kind!r} (known: {known}; a third-party "
                "type is found once its package is installed)"
            )
            continue
        try:
            entries.append(model.model_validate(entry))
        except ValidationError as exc:
            errors.extend(format_validation_error(exc, prefix=("providers", index)))
    return entries, errors


def parse_provider(data: object, provider_types: ProviderTypes) -> ProviderSettings:
    """One provider entry on its own (``vk-provider plugin serve``); errors name the field."""
    if not isinstance(data, Mapping):
        raise ConfigError("(top level): must be a mapping with a type and a name")
    entries, errors = _provider_entries([data], provider_types)
    if errors:
        raise ConfigError("\n".join(e.removeprefix("providers[0].") for e in errors))
    entry = entries[0]
    assert isinstance(entry, ProviderSettings)
    return entry


def parse_config(data: object, provider_types: ProviderTypes) -> AgentConfig:
    """Validate a whole configuration; ``ConfigError`` lists every offending field."""
    if not isinstance(data, Mapping):
        raise ConfigError("expected a mapping at the top level")
    entries, errors = _provider_entries(data.get("providers"), provider_types)
    try:
        config = AgentConfig.model_validate({**data, "providers": entries})
    except ValidationError as exc:
        # Provider entries that failed their own model are already reported above.
        errors.extend(
            line
            for line in format_validation_error(exc)
            if not (errors and line.startswith("providers: at least one"))
        )
        raise ConfigError("\n".join(errors)) from None
    if errors:
        raise ConfigError("\n".join(errors))
    return config


def load_config(path: Path, provider_types: ProviderTypes) -> AgentConfig:
    """The configuration in the file at ``path``, read within ``configfile``'s bounds."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return parse_config(data, provider_types)
