"""The REST API's response models of the operator's view: offers by GPU model and the
placement dry run (``GET /v1/gpus``, ``POST /v1/placements``).

Same rules as ``api/schemas``: built from frozen snapshots that hold no configuration, every
model frozen and carrying an example for the OpenAPI document.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from vk_provider.api.schemas import OFFER_EXAMPLE, ApiModel, OfferOut
from vk_provider.controllers.preview import Preview, RankedOffer, Refusal
from vk_provider.domain.catalog import Catalog, CatalogGroup, CatalogRow
from vk_provider.domain.placement import PlacementRequest

# --------------------------------------------------------------------------- GPU catalogue

_GPU_ROW_EXAMPLE: dict[str, Any] = {
    "gpu_model": "H100-SXM",
    "gpu_count": 8,
    "gpu_memory_gib": 80.0,
    "vcpus": 208.0,
    "memory_gib": 1800.0,
    "provider": "lambda",
    "sku": "gpu_8x_h100_sxm5",
    "region": "us-east-1",
    "offer": "lambda/gpu_8x_h100_sxm5/us-east-1",
    "price_per_hour": 23.92,
    "price_per_gpu_hour": 2.99,
    "spot_price_per_hour": None,
    "spot_price_per_gpu_hour": None,
    "available": 2,
    "spot_available": None,
    "startup_seconds": 300.0,
}


class GpuRowOut(ApiModel):
    """One instance type in one region: on-demand and spot prices side by side."""

    model_config = ConfigDict(frozen=True, json_schema_extra={"examples": [_GPU_ROW_EXAMPLE]})

    gpu_model: str | None = Field(description="Canonical GPU model; null for CPU-only offers.")
    gpu_count: int = Field(description="GPUs per instance.")
    gpu_memory_gib: float = Field(description="Memory per GPU (GiB).")
    vcpus: float = Field(description="vCPUs per instance.")
    memory_gib: float = Field(description="Host memory per instance (GiB).")
    provider: str = Field(description="Provider name, as configured.")
    sku: str = Field(description="The provider's name for the instance type.")
    region: str = Field(description="Region or data centre.")
    offer: str = Field(description="Offer key (provider/sku/region), shared by spot and on-demand.")
    price_per_hour: float | None = Field(description="On-demand $/hour; null: no on-demand offer.")
    price_per_gpu_hour: float | None = Field(
        description="On-demand $/hour per GPU (the whole price for CPU-only offers)."
    )
    spot_price_per_hour: float | None = Field(description="Spot $/hour; null: no spot offer.")
    spot_price_per_gpu_hour: float | None = Field(description="Spot $/hour per GPU.")
    available: int | None = Field(description="On-demand instances the provider can start now.")
    spot_available: int | None = Field(description="Spot instances the provider can start now.")
    startup_seconds: float = Field(description="Typical time from launch to running (s).")

    @classmethod
    def of(cls, row: CatalogRow) -> GpuRowOut:
        o, od, sp = row.offer, row.on_demand, row.spot
        return cls(
            gpu_model=o.gpu_model,
            gpu_count=o.gpu_count,
            gpu_memory_gib=o.gpu_memory_gib,
            vcpus=o.vcpus,
            memory_gib=o.memory_gib,
            provider=o.provider,
            sku=o.sku,
            region=o.region,
            offer=o.key,
            price_per_hour=od.price_per_hour if od else None,
            price_per_gpu_hour=row.per_gpu(od),
            spot_price_per_hour=sp.price_per_hour if sp else None,
            spot_price_per_gpu_hour=row.per_gpu(sp),
            available=od.available if od else None,
            spot_available=sp.available if sp else None,
            startup_seconds=o.startup_seconds,
        )


class GpuGroupOut(ApiModel):
    gpu_model: str | None = Field(description="The GPU model; null: CPU-only offers.")
    total: int = Field(description="Rows of this model that match the filters.")
    rows: list[GpuRowOut] = Field(description="The rows shown, cheapest per GPU first.")

    @classmethod
    def of(cls, group: CatalogGroup) -> GpuGroupOut:
        return cls(
            gpu_model=group.gpu_model,
            total=group.total,
            rows=[GpuRowOut.of(row) for row in group.rows],
        )


class GpuCatalogOut(ApiModel):
    """The offers grouped by GPU model, as ``vk-provider offers`` prints them."""

    model_config = ConfigDict(
        frozen=True,
        json_schema_extra={
            "examples": [
                {
                    "total": 14,
                    "shown": 1,
                    "limit": 1,
                    "gpus": [{"gpu_model": "H100-SXM", "total": 4, "rows": [_GPU_ROW_EXAMPLE]}],
                }
            ]
        },
    )

    total: int = Field(description="Rows (instance types per region) that match the filters.")
    shown: int = Field(description="Rows in this answer (at most `limit` per GPU model).")
    limit: int | None = Field(description="Rows shown per GPU model at most; null: all.")
    gpus: list[GpuGroupOut] = Field(
        description="GPU models, cheapest per GPU first; CPU-only offers last."
    )

    @classmethod
    def of(cls, found: Catalog) -> GpuCatalogOut:
        return cls(
            total=found.total,
            shown=found.shown,
            limit=found.limit,
            gpus=[GpuGroupOut.of(group) for group in found.groups],
        )


# --------------------------------------------------------------------------- placement dry run


class PodRefOut(ApiModel):
    namespace: str = Field(description="The pod's namespace (default when the manifest has none).")
    name: str = Field(description="The pod's name (its generateName, or dry-run, when none).")


class PlacementRequestOut(ApiModel):
    """What placement filters offers by, as read from the pod."""

    gpu_count: int = Field(description="GPUs (resources.limits nvidia.com/gpu).")
    gpu_models: list[str] = Field(description="Allowed GPU models (vk-provider.io/gpu).")
    min_gpu_memory_gib: float = Field(description="vk-provider.io/min-gpu-memory (GiB).")
    cpu: float = Field(description="vCPUs requested (effective, as kubelet sums them).")
    memory_gib: float = Field(description="Memory requested (GiB).")
    regions: list[str] = Field(description="Allowed regions (vk-provider.io/regions).")
    max_price_per_hour: float | None = Field(description="vk-provider.io/max-price ($/hour).")
    capacity_type: Literal["on-demand", "spot", "any"] = Field(
        description="vk-provider.io/capacity-type."
    )
    providers: list[str] = Field(description="Allowed providers (vk-provider.io/providers).")
    shape: str = Field(description="The pod's containers, as providers must be able to run them.")

    @classmethod
    def of(cls, request: PlacementRequest) -> PlacementRequestOut:
        return cls(
            gpu_count=request.gpu_count,
            gpu_models=list(request.gpu_models),
            min_gpu_memory_gib=request.min_gpu_memory_gib,
            cpu=request.cpu,
            memory_gib=request.memory_gib,
            regions=list(request.regions),
            max_price_per_hour=request.max_price_per_hour,
            capacity_type=request.capacity_type.value,
            providers=list(request.providers),
            shape=request.shape.describe(),
        )


class PenaltiesOut(ApiModel):
    low_availability: float = Field(description="Fraction added: the offer's last instance.")
    startup: float = Field(description="Fraction added for slow start-up.")
    recent_failures: float = Field(description="Fraction added for the provider's failures.")


class CandidateOut(ApiModel):
    rank: int = Field(description="1 is tried first.")
    offer: OfferOut = Field(description="The offer.")
    score: float = Field(description="Price after penalties ($/hour): what the ranking sorts.")
    penalties: PenaltiesOut = Field(description="Why the score exceeds the price.")

    @classmethod
    def of(cls, rank: int, ranked: RankedOffer) -> CandidateOut:
        p = ranked.penalties
        return cls(
            rank=rank,
            offer=OfferOut.of(ranked.offer),
            score=ranked.score,
            penalties=PenaltiesOut(
                low_availability=p.low_availability,
                startup=p.startup,
                recent_failures=p.recent_failures,
            ),
        )


class FilterCountOut(ApiModel):
    filter: str = Field(description="A placement filter, in the order they apply.")
    removed: int = Field(description="Offers it removed.")


class RefusalOut(ApiModel):
    offer: OfferOut = Field(description="The offer.")
    filter: str = Field(description="The first filter it failed.")
    reason: str = Field(description="What the offer has against what the pod asks.")

    @classmethod
    def of(cls, refusal: Refusal) -> RefusalOut:
        return cls(offer=OfferOut.of(refusal.offer), filter=refusal.filter, reason=refusal.reason)


class PlacementOut(ApiModel):
    """Where the pod would be placed now, and why; nothing was launched or reserved."""

    model_config = ConfigDict(
        frozen=True,
        json_schema_extra={
            "examples": [
                {
                    "pod": {"namespace": "inference", "name": "llama"},
                    "outcome": "placed",
                    "message": "placed on runpod offer NVIDIA H100 80GB HBM3 (1x H100-SXM) in "
                    "US-TX-3 at $2.6900/h; 0 cheaper offer(s) skipped; 12 offer(s) considered, "
                    "removed 11 by gpu-model",
                    "chosen": OFFER_EXAMPLE,
                    "why": "the only offer that fits (score 2.8514)",
                    "request": {
                        "gpu_count": 1,
                        "gpu_models": ["H100"],
                        "min_gpu_memory_gib": 0.0,
                        "cpu": 1.0,
                        "memory_gib": 4.0,
                        "regions": [],
                        "max_price_per_hour": None,
                        "capacity_type": "on-demand",
                        "providers": [],
                        "shape": "1 app container(s)",
                    },
                    "offers_considered": 12,
                    "tries_at_most": 5,
                    "candidates": [
                        {
                            "rank": 1,
                            "offer": OFFER_EXAMPLE,
                            "score": 2.8514,
                            "penalties": {
                                "low_availability": 0.0,
                                "startup": 0.015,
                                "recent_failures": 0.0,
                            },
                        }
                    ],
                    "filters": [{"filter": "gpu-model", "removed": 11}],
                    "refused": [],
                    "unable_providers": [],
                    "invalid_field": None,
                }
            ]
        },
    )

    pod: PodRefOut = Field(description="The pod placed.")
    outcome: Literal["placed", "no_capacity", "budget_exceeded", "invalid"] = Field(
        description="placed: `chosen` would be launched; no_capacity / budget_exceeded: the pod "
        "would wait (NoCapacity / BudgetExceeded); invalid: no provider can ever run it "
        "(InvalidSpec)."
    )
    message: str = Field(description="What the agent's Event would say.")
    chosen: OfferOut | None = Field(description="The offer a launch would try first.")
    why: str = Field(description="Why the chosen offer ranks first.")
    request: PlacementRequestOut | None = Field(description="The pod as placement reads it.")
    offers_considered: int = Field(description="Offers known now, before the filters.")
    tries_at_most: int = Field(
        description="A launch tries this many candidates, in order, before it gives up."
    )
    candidates: list[CandidateOut] = Field(description="Every offer that fits, ranked.")
    filters: list[FilterCountOut] = Field(description="Each filter and how many it removed.")
    refused: list[RefusalOut] = Field(
        description="Every offer that does not fit, by filter order, with the reason."
    )
    unable_providers: list[str] = Field(description="Providers that cannot run the pod's shape.")
    invalid_field: str | None = Field(description="The pod field at fault, when invalid.")

    @classmethod
    def of(cls, preview: Preview) -> PlacementOut:
        chosen = preview.chosen
        return cls(
            pod=PodRefOut(namespace=preview.namespace, name=preview.name),
            outcome=preview.outcome.value,
            message=preview.message,
            chosen=OfferOut.of(chosen) if chosen else None,
            why=preview.why,
            request=PlacementRequestOut.of(preview.request) if preview.request else None,
            offers_considered=preview.offers_seen,
            tries_at_most=preview.tries_at_most,
            candidates=[CandidateOut.of(i, r) for i, r in enumerate(preview.ranked, start=1)],
            filters=[FilterCountOut(filter=n, removed=c) for n, c in preview.removed],
            refused=[RefusalOut.of(r) for r in preview.refused],
            unable_providers=list(preview.unable),
            invalid_field=preview.invalid_field or None,
        )
