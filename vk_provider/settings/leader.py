"""Configuration of leader election (``leader_election:``): two replicas, one leader.

Defaults are kube-controller-manager's (15 s lease, 10 s renew deadline, 2 s retry), the
Lease's name derives from the node name and its namespace from where the agent runs, so a
``replicas: 2`` Deployment works without any of it being set.

Invariants: ``retry_period_seconds < renew_deadline_seconds < lease_duration_seconds``
(checked with the offending field named), so a leader always gives up before a follower may
take over; the Lease name and namespace are valid Kubernetes names.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pydantic import Field, ValidationInfo, field_validator

from vk_provider.domain.leader import Timing, lease_name
from vk_provider.settings.secrets import Strict

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
FALLBACK_NAMESPACE = "kube-node-lease"


class LeaderElectionConfig(Strict):
    """Lease-based leader election between replicas of one agent (docs/operating.md)."""

    enabled: bool = Field(
        True,
        description="Elect a leader before touching the node, pods or providers. One replica "
        "alone simply wins; turn off only when a single process is guaranteed.",
    )
    lease_duration_seconds: int = Field(
        15,
        ge=2,
        le=3600,
        description="How long followers wait after the Lease last changed before taking it "
        "over: the longest hand-over after a leader dies.",
    )
    renew_deadline_seconds: float = Field(
        10,
        gt=0,
        le=3600,
        description="A leader that has not renewed for this long stops all leader work and "
        "exits non-zero; must be less than lease_duration_seconds.",
    )
    retry_period_seconds: float = Field(
        2,
        gt=0,
        le=600,
        description="How often the leader renews and followers read the Lease; must be less "
        "than renew_deadline_seconds.",
    )
    namespace: str = Field(
        "",
        description="Namespace of the election Lease; default the agent's own ($POD_NAMESPACE, "
        "else the service account's namespace), and kube-node-lease outside a cluster.",
    )
    lease_name: str = Field(
        "",
        description="Name of the election Lease; default vk-provider-leader-<node.name>.",
    )
    identity: str = Field(
        "",
        description="This replica's holderIdentity; default $POD_NAME, else <hostname>_<id> "
        "with an id kept in the state directory (the same after a restart). Must differ "
        "between live replicas.",
    )

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if value and not _DNS_LABEL.match(value):
            raise ValueError("must be a namespace name (DNS label: lowercase, digits, '-')")
        return value

    @field_validator("lease_name")
    @classmethod
    def _lease_name(cls, value: str) -> str:
        if value and not _DNS_SUBDOMAIN.match(value):
            raise ValueError("must be a DNS subdomain (lowercase letters, digits, '-', '.')")
        return value

    # Field validators (fields are validated in order), so each error names its field.
    @field_validator("renew_deadline_seconds")
    @classmethod
    def _before_expiry(cls, value: float, info: ValidationInfo) -> float:
        return _less_than(
            value,
            info,
            "lease_duration_seconds",
            "a follower could take over while the leader still acts",
        )

    @field_validator("retry_period_seconds")
    @classmethod
    def _before_deadline(cls, value: float, info: ValidationInfo) -> float:
        return _less_than(value, info, "renew_deadline_seconds", "the leader cannot renew in time")

    @property
    def timing(self) -> Timing:
        return Timing(
            lease_duration=float(self.lease_duration_seconds),
            renew_deadline=self.renew_deadline_seconds,
            retry_period=self.retry_period_seconds,
        )

    def name_for(self, node_name: str) -> str:
        return self.lease_name or lease_name(node_name)

    def resolved_namespace(self) -> str:
        """The configured namespace, else where the agent runs (read once, at start)."""
        if self.namespace:
            return self.namespace
        from_env = os.environ.get("POD_NAMESPACE", "").strip()
        if from_env:
            return from_env
        try:
            return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or FALLBACK_NAMESPACE
        except OSError:
            return FALLBACK_NAMESPACE


def _less_than(value: float, info: ValidationInfo, other: str, why: str) -> float:
    """``value`` if it is less than the already validated field ``other``; else why not."""
    bound = info.data.get(other)
    if bound is not None and value >= bound:
        raise ValueError(f"must be less than {other} ({bound:g}), or {why}")
    return value
