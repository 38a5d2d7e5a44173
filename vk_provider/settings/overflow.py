"""Configuration of the overflow flip (``overflow:``, docs/overflow.md#configuration).

The flip opens the virtual node to the cluster's overflow while its own GPUs are full and
closes it when they are free again, reading both from Prometheus. Off unless
``enabled: true``; every field has a default that fits the rules shipped in
``deploy/prometheus/flip-rules.yaml``.

Invariants: the overflow taint can never be configured with effect NoExecute (it would evict
every pod at once); a Prometheus URL is http(s) with a host; credentials are references.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from vk_provider.domain.node import VIRTUAL_NODE_TAINT_KEY, VIRTUAL_NODE_TAINT_VALUE
from vk_provider.domain.overflow import OverflowPolicy, OverflowQueries
from vk_provider.settings.secrets import SecretRef, Strict


class PrometheusConfig(Strict):
    url: str = Field(
        "http://prometheus-operated.monitoring.svc:9090",
        description="Base URL of the Prometheus HTTP API (…/api/v1/query is appended).",
    )
    bearer_token: SecretRef | None = Field(
        None, description="Bearer token for Prometheus (env:VAR or file:/path); none."
    )
    ca_file: str | None = Field(None, description="CA bundle for an https URL; system CAs.")
    timeout_seconds: float = Field(5, gt=0, le=60, description="Per-query timeout.")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        return value.rstrip("/")


class QueriesConfig(Strict):
    """PromQL returning one number each; defaults are the shipped recording rules."""

    allocatable: str = Field(
        "flip:own_gpu_allocatable:sum", description="GPUs the own nodes have (allocatable)."
    )
    requested: str = Field(
        "flip:own_gpu_requested:sum",
        description="GPUs requested by Pending/Running pods bound to the own nodes.",
    )
    unscheduled: str = Field(
        "flip:unscheduled_gpu_requested:sum",
        description="GPUs requested by pods no node has taken yet (shown, not decisive).",
    )
    unfit: str = Field(
        "flip:unscheduled_gpu_unfit:sum",
        description="GPUs requested by pending pods that fit no single own node (fragmented "
        'or full): demand the own GPUs cannot take, which opens the overflow; "" for none.',
    )

    def to_queries(self) -> OverflowQueries:
        return OverflowQueries(self.allocatable, self.requested, self.unscheduled, self.unfit)


class HandoverConfig(Strict):
    """The hand-over (docs/overflow.md#the-hand-over): a training gang held by the
    ``vk-provider.io/handover`` scheduling gate or Kueue AdmissionCheck is released only once
    the inference it displaces runs elsewhere."""

    enabled: bool = Field(False, description="Run the hand-over controller (needs the flip).")
    policy: Literal["wait", "force"] = Field(
        "wait",
        description="When the hand-over cannot be done (no room elsewhere, timeout): wait keeps "
        "the training held and says why; force releases it to preempt as it would without.",
    )
    timeout_seconds: float = Field(
        900, gt=0, le=86400, description="A hand-over under way this long has failed (policy)."
    )
    evictions_without_budget: int = Field(
        1,
        ge=1,
        le=1000,
        description="Displaced pods no PodDisruptionBudget covers that may be leaving at once.",
    )
    interval_seconds: float = Field(2, gt=0, le=300, description="How often to evaluate.")
    kueue_retry_seconds: int = Field(
        30,
        ge=0,
        le=86400,
        description="A Kueue check that cannot pass now is set to Retry: Kueue releases the "
        "Workload's quota and asks again after this long (requeueAfterSeconds).",
    )


class MoveHomeConfig(Strict):
    """The way home, dearest first (docs/overflow.md#the-way-home-dearest-first): while the
    overflow is closed, the agent evicts its rented pods, the most expensive first, where
    they fit at home. Off: the descheduler's policy moves them, in its own order."""

    enabled: bool = Field(False, description="Move rented pods home, dearest first.")
    interval_seconds: float = Field(5, gt=0, le=3600, description="How often to look.")
    evictions_without_budget: int = Field(
        1, ge=1, le=1000, description="Pods no PodDisruptionBudget covers leaving at once."
    )


class OverflowConfig(Strict):
    enabled: bool = Field(False, description="Run the overflow flip in this agent.")
    prometheus: PrometheusConfig = Field(
        default_factory=PrometheusConfig, description="Where the GPU-usage signal comes from."
    )
    queries: QueriesConfig = Field(default_factory=QueriesConfig, description="The signal.")
    taint_key: str = Field(
        VIRTUAL_NODE_TAINT_KEY, description="Key of the overflow taint (owned by the flip)."
    )
    taint_value: str = Field(VIRTUAL_NODE_TAINT_VALUE, description="Value of the overflow taint.")
    interval_seconds: float = Field(5, gt=0, le=300, description="How often to evaluate.")
    open_after_seconds: float = Field(
        10, ge=0, le=3600, description="Own GPUs full this long: open the overflow."
    )
    close_after_seconds: float = Field(
        60, ge=0, le=86400, description="Enough own GPUs free this long: close it."
    )
    max_sample_age_seconds: float = Field(
        180,
        gt=0,
        le=3600,
        description="A signal whose newest sample (its timestamp in Prometheus) is older than "
        "this is lost, not read: the flip keeps its state. Three evaluations of Prometheus' "
        "default 1-minute interval; the shipped rules evaluate every 5 s.",
    )
    handover: HandoverConfig = Field(
        default_factory=HandoverConfig,
        description="Move displaced inference to the virtual node before training takes the GPUs.",
    )
    move_home: MoveHomeConfig = Field(
        default_factory=MoveHomeConfig, description="Bring rented pods home, dearest first."
    )
    close_min_free_gpus: int | None = Field(
        None,
        ge=1,
        le=100000,
        description="Free own GPUs that count as enough to close; default the smallest GPU "
        "request among the virtual node's pods (at least 1).",
    )

    def policy(self) -> OverflowPolicy:
        return OverflowPolicy(
            open_after=self.open_after_seconds,
            close_after=self.close_after_seconds,
            close_min_free_gpus=self.close_min_free_gpus,
            max_sample_age=self.max_sample_age_seconds,
        )
