"""The REST API's response models: what each route returns, field by field, documented.

Built from the ``AgentView``'s frozen snapshots (which hold no configuration), so nothing
secret can be serialised by accident; every model is frozen and carries an example for the
OpenAPI document.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vk_provider.api.view import AgentView, CapStatus, ProviderStatus
from vk_provider.controllers.overflow import OverflowView
from vk_provider.domain.models import Offer, PortEndpoint
from vk_provider.domain.node import VIRTUAL_NODE_TAINT_KEY, VIRTUAL_NODE_TAINT_VALUE
from vk_provider.domain.podview import PodPlacement


class ApiModel(BaseModel):
    model_config = ConfigDict(frozen=True)


class ErrorDetail(ApiModel):
    code: str = Field(
        description="Stable machine-readable code: unauthorized, forbidden, not_found, "
        "method_not_allowed, invalid_request, internal_error or unavailable.",
        examples=["not_found"],
    )
    message: str = Field(
        description="What went wrong, for a person.", examples=["no provider named 'acme'"]
    )


class ErrorBody(ApiModel):
    error: ErrorDetail = Field(description="The error.")


OFFER_EXAMPLE: dict[str, Any] = {
    "key": "runpod/NVIDIA H100 80GB HBM3/US-TX-3",
    "provider": "runpod",
    "sku": "NVIDIA H100 80GB HBM3",
    "region": "US-TX-3",
    "gpu_model": "H100-SXM",
    "gpu_count": 1,
    "gpu_memory_gib": 80.0,
    "vcpus": 16.0,
    "memory_gib": 125.0,
    "price_per_hour": 2.69,
    "spot": False,
    "available": 3,
    "startup_seconds": 90.0,
}


class OfferOut(ApiModel):
    model_config = ConfigDict(frozen=True, json_schema_extra={"examples": [OFFER_EXAMPLE]})

    key: str = Field(description="provider/sku/region: what pods' `offer` field refers to.")
    provider: str = Field(description="Provider name, as configured.")
    sku: str = Field(description="The provider's name for the instance type.")
    region: str = Field(description="Region or data centre.")
    gpu_model: str | None = Field(description="Canonical GPU model; null for CPU-only offers.")
    gpu_count: int = Field(description="GPUs per instance.")
    gpu_memory_gib: float = Field(description="Memory per GPU (GiB).")
    vcpus: float = Field(description="vCPUs per instance.")
    memory_gib: float = Field(description="Memory per instance (GiB).")
    price_per_hour: float = Field(description="Price of the whole instance ($/hour).")
    spot: bool = Field(description="Interruptible (spot) capacity.")
    available: int = Field(description="Instances of this offer the provider says it can start.")
    startup_seconds: float = Field(description="Typical time from launch to running (s).")

    @classmethod
    def of(cls, offer: Offer) -> OfferOut:
        return cls(
            key=offer.key,
            provider=offer.provider,
            sku=offer.sku,
            region=offer.region,
            gpu_model=offer.gpu_model,
            gpu_count=offer.gpu_count,
            gpu_memory_gib=offer.gpu_memory_gib,
            vcpus=offer.vcpus,
            memory_gib=offer.memory_gib,
            price_per_hour=offer.price_per_hour,
            spot=offer.spot,
            available=offer.available,
            startup_seconds=offer.startup_seconds,
        )


_PROVIDER_EXAMPLE: dict[str, Any] = {
    "name": "runpod",
    "type": "runpod",
    "healthy": True,
    "breaker_state": "closed",
    "consecutive_failures": 0,
    "recent_failures": 1,
    "last_error": None,
    "last_answer_age_seconds": 4.2,
    "offer_count": 12,
    "gpus_available": 20,
    "running_pods": 2,
    "spend_per_hour": 5.38,
    "terminations_overdue": 0,
}


class ProviderSummary(ApiModel):
    model_config = ConfigDict(frozen=True, json_schema_extra={"examples": [_PROVIDER_EXAMPLE]})

    name: str = Field(description="Provider name, as configured.")
    type: str = Field(description="Adapter type (runpod, lambda, modal, kubernetes, local, ...).")
    healthy: bool = Field(
        description="The circuit breaker is closed and the last offers query succeeded."
    )
    breaker_state: Literal["closed", "open", "half-open"] = Field(
        description="Circuit breaker: closed (calls flow), open (calls refused while cooling "
        "down) or half-open (one probe in flight)."
    )
    consecutive_failures: int = Field(description="Failures in a row since the last success.")
    recent_failures: int = Field(description="Failures in the breaker's recent window.")
    last_error: str | None = Field(description="The last failure, if any (class: message).")
    last_answer_age_seconds: float | None = Field(
        description="Seconds since the provider last answered an offers query; null if never."
    )
    offer_count: int = Field(description="Offers in the last answer.")
    gpus_available: int = Field(description="GPUs the provider could start now (sum of offers).")
    running_pods: int = Field(description="Pods placed on this provider.")
    spend_per_hour: float = Field(description="Cost of this provider's running instances ($/hour).")
    terminations_overdue: int = Field(
        description="Instances asked to terminate longer ago than the termination deadline "
        "that the provider still lists: reconciliation asks again; they may still bill."
    )

    @classmethod
    def of(cls, status: ProviderStatus) -> ProviderSummary:
        return cls(**_summary_fields(status))


class ProviderDetail(ProviderSummary):
    model_config = ConfigDict(
        frozen=True,
        json_schema_extra={"examples": [{**_PROVIDER_EXAMPLE, "offers": [OFFER_EXAMPLE]}]},
    )

    offers: list[OfferOut] = Field(description="The provider's offers, cheapest first.")

    @classmethod
    def of(cls, status: ProviderStatus) -> ProviderDetail:
        offers = sorted(status.offers, key=lambda o: (o.price_per_hour, o.key))
        return cls(**_summary_fields(status), offers=[OfferOut.of(o) for o in offers])


def _summary_fields(status: ProviderStatus) -> dict[str, Any]:
    return {
        "name": status.name,
        "type": status.type,
        "healthy": status.healthy,
        "breaker_state": status.breaker_state,
        "consecutive_failures": status.consecutive_failures,
        "recent_failures": status.recent_failures,
        "last_error": status.last_error,
        "last_answer_age_seconds": status.last_answer_age_seconds,
        "offer_count": len(status.offers),
        "gpus_available": status.gpus_available,
        "running_pods": status.running_pods,
        "spend_per_hour": status.spend_per_hour,
        "terminations_overdue": status.terminations_overdue,
    }


class EndpointOut(ApiModel):
    """Where the cluster reaches one declared container port of the pod."""

    model_config = ConfigDict(frozen=True)

    container_port: int = Field(description="The container port the pod declares.")
    protocol: str = Field(description="TCP, UDP or SCTP.")
    address: str = Field(description="The address its provider exposes it at (IP or hostname).")
    port: int = Field(description="The port there (a provider may map it to another number).")


class PodOut(ApiModel):
    model_config = ConfigDict(
        frozen=True,
        json_schema_extra={
            "examples": [
                {
                    "namespace": "inference",
                    "name": "llama-7d9f-x2x4q",
                    "uid": "3f1c2a9e-8d7b-4c6a-9e2f-1b0a5c4d3e2f",
                    "provider": "runpod",
                    "instance_id": "x1y2z3",
                    "offer": "runpod/NVIDIA H100 80GB HBM3/US-TX-3",
                    "price_per_hour": 2.69,
                    "phase": "Running",
                    "since": "2025-01-31T09:12:00Z",
                }
            ]
        },
    )

    namespace: str = Field(description="Pod namespace.")
    name: str = Field(description="Pod name.")
    uid: str = Field(description="Pod UID (every provider instance carries it).")
    provider: str = Field(description="Provider the pod runs on.")
    instance_id: str = Field(description="The provider's id of the instance.")
    offer: str = Field(description="Offer key (provider/sku/region).")
    price_per_hour: float = Field(description="Price of the instance ($/hour).")
    phase: str = Field(description="Pod phase (Pending, Running, Succeeded, Failed).")
    since: datetime | None = Field(description="When the pod was placed there; null if unknown.")
    endpoints: list[EndpointOut] = Field(
        default_factory=list,
        description="Where each declared port is reached (docs/networking.md); empty when "
        "its provider exposes none.",
    )

    @classmethod
    def of(cls, pod: PodPlacement, endpoints: Sequence[PortEndpoint] = ()) -> PodOut:
        return cls(
            endpoints=[
                EndpointOut(
                    container_port=e.container_port,
                    protocol=e.protocol,
                    address=e.address,
                    port=e.port,
                )
                for e in endpoints
            ],
            namespace=pod.namespace,
            name=pod.name,
            uid=pod.uid,
            provider=pod.provider,
            instance_id=pod.instance_id,
            offer=pod.offer,
            price_per_hour=pod.price_per_hour,
            phase=pod.phase,
            since=pod.since,
        )


class SpendTotal(ApiModel):
    per_hour: float = Field(description="Current cost of running instances ($/hour).")
    accumulated: float = Field(description="Spent since the agent started ($).")


class ProviderSpend(SpendTotal):
    provider: str = Field(description="Provider name.")


class NamespaceSpend(SpendTotal):
    namespace: str = Field(description="Pod namespace.")


class SpendEntry(SpendTotal):
    provider: str = Field(description="Provider name.")
    namespace: str = Field(description="Pod namespace.")


class CapOut(ApiModel):
    cap_per_hour: float | None = Field(description="The cap ($/hour); null: no cap.")
    used_per_hour: float = Field(
        description="Held against the cap now ($/hour): running pods and pods being launched."
    )
    room_per_hour: float | None = Field(
        description="What a new pod may still cost ($/hour); null without a cap. Negative "
        "when the cap was lowered below what runs (running pods are never stopped for it)."
    )

    @classmethod
    def of(cls, cap: CapStatus) -> CapOut:
        return cls(
            cap_per_hour=cap.cap_per_hour,
            used_per_hour=cap.used_per_hour,
            room_per_hour=cap.room_per_hour,
        )


class NamespaceCapOut(ApiModel):
    namespace: str = Field(description="Pod namespace.")
    cap_per_hour: float | None = Field(description="The cap that applies to it ($/hour).")
    used_per_hour: float = Field(description="Held against it now ($/hour).")
    room_per_hour: float | None = Field(description="What a new pod there may still cost.")


class BudgetOut(ApiModel):
    global_cap: CapOut = Field(description="budget.global_per_hour: everything together.")
    default_namespace_per_hour: float | None = Field(
        description="budget.default_namespace_per_hour: the cap of namespaces not listed."
    )
    namespaces: list[NamespaceCapOut] = Field(
        description="Every namespace that spends or has a cap of its own, by name, with the "
        "cap that applies to it."
    )


class SpendReport(ApiModel):
    model_config = ConfigDict(
        frozen=True,
        json_schema_extra={
            "examples": [
                {
                    "total": {"per_hour": 5.38, "accumulated": 41.7},
                    "providers": [{"provider": "runpod", "per_hour": 5.38, "accumulated": 41.7}],
                    "namespaces": [
                        {"namespace": "inference", "per_hour": 5.38, "accumulated": 41.7}
                    ],
                    "entries": [
                        {
                            "provider": "runpod",
                            "namespace": "inference",
                            "per_hour": 5.38,
                            "accumulated": 41.7,
                        }
                    ],
                    "budget": {
                        "global_cap": {
                            "cap_per_hour": 20.0,
                            "used_per_hour": 5.38,
                            "room_per_hour": 14.62,
                        },
                        "default_namespace_per_hour": None,
                        "namespaces": [
                            {
                                "namespace": "inference",
                                "cap_per_hour": 10.0,
                                "used_per_hour": 5.38,
                                "room_per_hour": 4.62,
                            }
                        ],
                    },
                }
            ]
        },
    )

    total: SpendTotal = Field(description="Everything the virtual node costs.")
    providers: list[ProviderSpend] = Field(description="Per provider, by name.")
    namespaces: list[NamespaceSpend] = Field(description="Per namespace, by name.")
    entries: list[SpendEntry] = Field(description="Per provider and namespace.")
    budget: BudgetOut = Field(description="The budget caps and what is left under each.")


class OverflowReadingOut(ApiModel):
    allocatable: float = Field(description="GPUs the own nodes have.")
    requested: float = Field(description="GPUs requested by Pending/Running pods on them.")
    free: float = Field(description="Own GPUs free (allocatable - requested, at least 0).")
    unscheduled: float = Field(description="GPUs wanted by pods no node has taken yet.")


class OverflowTaintOut(ApiModel):
    key: str = Field(description="Taint key.")
    value: str = Field(description="Taint value.")
    effect: str = Field(description="NoSchedule while closed, PreferNoSchedule while open.")


class HandoverOut(ApiModel):
    model_config = ConfigDict(frozen=True)

    gang: str = Field(description='The held training: "PodGroup ns/name", "Workload ns/name".')
    gpus: int = Field(description="GPUs its members ask for in all.")
    members: int = Field(description="Pods that bind together.")
    step: Literal["hold", "claim", "evict", "wait", "release", "unclaim"] = Field(
        description="What the hand-over did last: hold (cannot be done now, says why), claim "
        "(own nodes reserved), evict, wait (evicted pods leaving), release."
    )
    reason: str = Field(description="The plan and its numbers, or what is missing.")
    nodes: list[str] = Field(description="Own nodes the training takes.")
    displaced: list[str] = Field(description="Pods (namespace/name) moved to make room.")
    for_seconds: float = Field(description="How long this hand-over has been under way.")


class OverflowOut(ApiModel):
    model_config = ConfigDict(
        frozen=True,
        json_schema_extra={
            "examples": [
                {
                    "enabled": True,
                    "state": "open",
                    "since": "2026-12-01T10:02:11Z",
                    "signal_ok": True,
                    "signal_error": "",
                    "reading": {"allocatable": 32, "requested": 32, "free": 0, "unscheduled": 5},
                    "last_evaluation": "2026-12-01T10:05:01Z",
                    "needed_free_gpus": 1,
                    "full_for_seconds": 170.0,
                    "free_for_seconds": None,
                    "taint": {
                        "key": VIRTUAL_NODE_TAINT_KEY,
                        "value": VIRTUAL_NODE_TAINT_VALUE,
                        "effect": "PreferNoSchedule",
                    },
                    "transitions": 1,
                }
            ]
        },
    )

    enabled: bool = Field(description="Whether this agent runs the overflow flip.")
    state: Literal["open", "closed"] | None = Field(
        description="open: the node takes overflow; closed: only pods tolerating its taint."
    )
    since: datetime | None = Field(description="Last transition (kept across restarts).")
    signal_ok: bool | None = Field(description="Whether the last reading of the signal worked.")
    signal_error: str = Field(description="Why the signal could not be read, if it could not.")
    reading: OverflowReadingOut | None = Field(description="The last successful reading.")
    last_evaluation: datetime | None = Field(description="When the flip last evaluated.")
    needed_free_gpus: int | None = Field(description="Free own GPUs that count as enough.")
    full_for_seconds: float | None = Field(description="How long the own GPUs have been full.")
    free_for_seconds: float | None = Field(description="How long enough own GPUs are free.")
    taint: OverflowTaintOut | None = Field(description="The overflow taint as it is now.")
    transitions: int = Field(description="Transitions made since this agent started.")
    held_open_for: str = Field("", description="The hand-over holding the overflow open, if any.")
    handovers: list[HandoverOut] = Field(
        default_factory=list, description="Training gangs held for their hand-over now."
    )

    @classmethod
    def of(cls, view: OverflowView | None, *, enabled: bool) -> OverflowOut:
        if view is None:
            return cls(
                enabled=enabled,
                state=None,
                since=None,
                signal_ok=None,
                signal_error="",
                reading=None,
                last_evaluation=None,
                needed_free_gpus=None,
                full_for_seconds=None,
                free_for_seconds=None,
                taint=None,
                transitions=0,
            )
        r = view.reading
        return cls(
            enabled=enabled,
            state="open" if view.state.value == "open" else "closed",
            since=view.since,
            signal_ok=view.signal_ok,
            signal_error=view.signal_error,
            reading=None
            if r is None
            else OverflowReadingOut(
                allocatable=r.allocatable,
                requested=r.requested,
                free=r.free,
                unscheduled=r.unscheduled,
            ),
            last_evaluation=view.last_evaluation,
            needed_free_gpus=view.needed_free_gpus,
            full_for_seconds=view.full_for_seconds,
            free_for_seconds=view.free_for_seconds,
            taint=OverflowTaintOut(**view.taint),
            transitions=view.transitions,
            held_open_for=view.held_open_for,
            handovers=[
                HandoverOut(
                    gang=h.gang,
                    gpus=h.gpus,
                    members=h.members,
                    step=h.step,
                    reason=h.reason,
                    nodes=list(h.nodes),
                    displaced=list(h.displaced),
                    for_seconds=round(h.for_seconds, 1),
                )
                for h in view.handovers
            ],
        )


class ReadinessOut(ApiModel):
    model_config = ConfigDict(
        frozen=True,
        json_schema_extra={
            "examples": [{"ready": False, "reasons": ["the node is not registered yet"]}]
        },
    )

    ready: bool = Field(description="Whether the agent serves its node.")
    reasons: list[str] = Field(description="Why not, when not ready.")


def spend_report(view: AgentView) -> SpendReport:
    rows = view.spend()
    by_provider: dict[str, tuple[float, float]] = {}
    by_namespace: dict[str, tuple[float, float]] = {}
    for row in rows:
        rate, spent = by_provider.get(row.provider, (0.0, 0.0))
        by_provider[row.provider] = (rate + row.per_hour, spent + row.accumulated)
        rate, spent = by_namespace.get(row.namespace, (0.0, 0.0))
        by_namespace[row.namespace] = (rate + row.per_hour, spent + row.accumulated)
    return SpendReport(
        total=SpendTotal(
            per_hour=sum(r.per_hour for r in rows), accumulated=sum(r.accumulated for r in rows)
        ),
        providers=[
            ProviderSpend(provider=name, per_hour=rate, accumulated=spent)
            for name, (rate, spent) in sorted(by_provider.items())
        ],
        namespaces=[
            NamespaceSpend(namespace=name, per_hour=rate, accumulated=spent)
            for name, (rate, spent) in sorted(by_namespace.items())
        ],
        entries=[
            SpendEntry(
                provider=r.provider,
                namespace=r.namespace,
                per_hour=r.per_hour,
                accumulated=r.accumulated,
            )
            for r in rows
        ],
        budget=_budget(view),
    )


def _budget(view: AgentView) -> BudgetOut:
    status = view.budget()
    return BudgetOut(
        global_cap=CapOut.of(status.global_cap),
        default_namespace_per_hour=status.default_namespace_per_hour,
        namespaces=[
            NamespaceCapOut(
                namespace=cap.scope,
                cap_per_hour=cap.cap_per_hour,
                used_per_hour=cap.used_per_hour,
                room_per_hour=cap.room_per_hour,
            )
            for cap in status.namespaces
        ],
    )
