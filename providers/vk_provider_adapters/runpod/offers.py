"""RunPod offers: the GraphQL ``gpuTypes`` query and what it answers, as ``Offer``\\s.

One request returns every GPU type with on-demand *and* spot prices, and aliased
``lowestPrice(input: {gpuCount, secureCloud, dataCenterId})`` fields give stock per GPU count,
cloud and data centre in the same answer. The v2 catalog
(``GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&count=N``) was the alternative; it is
rejected because it quotes no spot price at all (so no interruptible offers), needs one request
per GPU count and cloud, and is a beta API.

For every GPU type (limited to ``config.gpu_types`` when set), cloud (``cloud_type``: SECURE,
COMMUNITY or both), GPU count in 1, 2, 4, 8 up to ``maxGpuCount`` and data centre
(``config.regions``; none configured means one offer in region ``any`` and RunPod picks the data
centre) there is an on-demand offer and, when RunPod quotes a spot price, a spot one. RunPod
prices are per GPU per hour; an ``Offer`` is priced for the whole pod (price x count), and
offers dearer than ``max_price_per_hour`` are dropped, and so are GPU types create would refuse
(not in ``PodCreateInput.gpuTypeIds``: ``gpus.CREATE_GPU_TYPE_IDS``; the adapter warns once per
type). ``stockStatus`` becomes ``available``:
High 8, Medium 4, Low 1, null (none) 0 — a coarse "how many could start now", not a quota.
The sku carries what create needs: ``<cloud>:<on-demand|spot>:<count>x:<gpu type id>``, e.g.
``secure:spot:2x:NVIDIA H100 80GB HBM3``.

Invariants: pure; a malformed GPU type entry is skipped (and logged), a malformed answer is
``MalformedResponse``.
"""

from __future__ import annotations

import enum
import json
import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from vk_provider.sdk import Offer
from vk_provider_adapters.payload import MalformedResponse, as_number, string
from vk_provider_adapters.runpod.config import RunPodProviderConfig
from vk_provider_adapters.runpod.gpus import CREATE_GPU_TYPE_IDS, canonical_gpu_name

log = logging.getLogger(__name__)

REGION_ANY = "any"
GPU_COUNTS = (1, 2, 4, 8)
STOCK_AVAILABLE: Mapping[str, int] = {"high": 8, "medium": 4, "low": 1, "none": 0}
# RunPod's defaults for GPU pods (PodCreateInput minVCPUPerGPU / minRAMPerGPU).
DEFAULT_VCPU_PER_GPU = 2
DEFAULT_RAM_GB_PER_GPU = 8


class CloudType(enum.Enum):
    SECURE = "SECURE"
    COMMUNITY = "COMMUNITY"


@dataclass(frozen=True, slots=True)
class Sku:
    """What an offer launches; encoded into ``Offer.sku``."""

    gpu_type_id: str
    gpu_count: int
    cloud: CloudType
    spot: bool

    def encode(self) -> str:
        capacity = "spot" if self.spot else "on-demand"
        return f"{self.cloud.value.lower()}:{capacity}:{self.gpu_count}x:{self.gpu_type_id}"

    @classmethod
    def parse(cls, sku: str) -> Sku | None:
        parts = sku.split(":", 3)
        if len(parts) != 4:
            return None
        cloud, capacity, count, gpu = parts
        if capacity not in ("spot", "on-demand") or not re.fullmatch(r"[1-9]\d{0,2}x", count):
            return None
        try:
            cloud_type = CloudType(cloud.upper())
        except ValueError:
            return None
        if not gpu.strip():
            return None
        return cls(gpu, int(count[:-1]), cloud_type, capacity == "spot")


@dataclass(frozen=True, slots=True)
class OfferScope:
    """Which offers the configuration asks for."""

    provider: str
    clouds: tuple[CloudType, ...]
    regions: tuple[str, ...]  # empty: RunPod chooses the data centre (region "any")
    gpu_types: frozenset[str]  # empty: all
    max_price_per_hour: float | None
    # The GPU type ids create accepts; an offer of any other id would be refused.
    create_gpu_ids: frozenset[str] = CREATE_GPU_TYPE_IDS

    @classmethod
    def from_config(cls, config: RunPodProviderConfig) -> OfferScope:
        clouds = (
            (CloudType.SECURE, CloudType.COMMUNITY)
            if config.cloud_type == "ALL"
            else (CloudType(config.cloud_type),)
        )
        return cls(
            provider=config.name,
            clouds=clouds,
            regions=tuple(dict.fromkeys(config.regions)),
            gpu_types=frozenset(config.gpu_types),
            max_price_per_hour=config.max_price_per_hour,
        )

    def region_slots(self) -> tuple[tuple[int, str], ...]:
        if not self.regions:
            return ((0, REGION_ANY),)
        return tuple(enumerate(self.regions))


def _alias(cloud: CloudType, count: int, region_index: int) -> str:
    return f"lp_{cloud.value.lower()}_{count}_{region_index}"


def offers_query(scope: OfferScope) -> str:
    """The GraphQL query: GPU types, list prices, and one aliased ``lowestPrice`` per cloud,
    GPU count and data centre (all in one request)."""
    fields = "uninterruptablePrice minimumBidPrice stockStatus minVcpu minMemory"
    lines = []
    for cloud in scope.clouds:
        for count in GPU_COUNTS:
            for index, region in scope.region_slots():
                arguments = [f"gpuCount: {count}", f"secureCloud: {_graphql_bool(cloud)}"]
                if region != REGION_ANY:
                    arguments.append(f"dataCenterId: {json.dumps(region)}")
                lines.append(
                    f"    {_alias(cloud, count, index)}: lowestPrice(input: "
                    f"{{{', '.join(arguments)}}}) {{ {fields} }}"
                )
    return (
        "query VkProviderOffers {\n  gpuTypes {\n"
        "    id displayName memoryInGb maxGpuCount\n"
        "    securePrice communityPrice secureSpotPrice communitySpotPrice\n"
        + "\n".join(lines)
        + "\n  }\n}\n"
    )


def _graphql_bool(cloud: CloudType) -> str:
    return "true" if cloud is CloudType.SECURE else "false"


def stock_to_available(stock: object) -> int:
    """``stockStatus`` as a count of pods that could start now: High 8, Medium 4, Low 1,
    null or None 0; an unknown non-empty value counts as 1 (some stock, amount unknown)."""
    if not isinstance(stock, str) or not stock.strip():
        return 0
    return STOCK_AVAILABLE.get(stock.strip().lower(), 1)


def parse_offers(data: object, scope: OfferScope) -> list[Offer]:
    """Offers from the ``data`` of the GraphQL answer; raises ``MalformedResponse`` when
    ``gpuTypes`` is not a list. A malformed GPU type entry is skipped (and logged)."""
    if not isinstance(data, dict) or not isinstance(data.get("gpuTypes"), list):
        raise MalformedResponse("GraphQL gpuTypes: 'data.gpuTypes' is missing or not a list")
    offers: list[Offer] = []
    for entry in data["gpuTypes"]:
        try:
            offers.extend(_gpu_type_offers(entry, scope))
        except MalformedResponse as exc:
            log.warning("provider %s: skipping a GPU type: %s", scope.provider, exc)
    return offers


def refused_gpu_types(data: object, scope: OfferScope) -> list[str]:
    """The GPU type ids of the answer (within ``config.gpu_types``) that create would refuse,
    so ``parse_offers`` offers none of them."""
    entries = data.get("gpuTypes") if isinstance(data, dict) else None
    refused = {
        entry["id"]
        for entry in (entries if isinstance(entries, list) else [])
        if isinstance(entry, dict)
        and isinstance(entry.get("id"), str)
        and entry["id"]
        and (not scope.gpu_types or entry["id"] in scope.gpu_types)
        and entry["id"] not in scope.create_gpu_ids
    }
    return sorted(refused)


def _gpu_type_offers(entry: object, scope: OfferScope) -> Iterator[Offer]:
    if not isinstance(entry, dict):
        raise MalformedResponse("GraphQL gpuTypes: an entry is not an object")
    gpu_id = string(entry, "id", "GraphQL gpuTypes entry", nonempty=True)
    if scope.gpu_types and gpu_id not in scope.gpu_types:
        return
    if gpu_id not in scope.create_gpu_ids:
        return  # create would refuse it (see ``refused_gpu_types``)
    max_count = as_number(entry.get("maxGpuCount"))
    memory = as_number(entry.get("memoryInGb")) or 0.0
    for cloud in scope.clouds:
        for count in GPU_COUNTS:
            if max_count is None or count > max_count:
                continue
            for index, region in scope.region_slots():
                lowest = entry.get(_alias(cloud, count, index))
                yield from _priced_offers(
                    entry,
                    lowest if isinstance(lowest, dict) else {},
                    Sku(gpu_id, count, cloud, spot=False),
                    region,
                    memory,
                    scope,
                )


def _priced_offers(
    entry: Mapping[str, object],
    lowest: Mapping[str, object],
    on_demand: Sku,
    region: str,
    gpu_memory: float,
    scope: OfferScope,
) -> Iterator[Offer]:
    secure = on_demand.cloud is CloudType.SECURE
    list_price = entry.get("securePrice" if secure else "communityPrice")
    list_spot = entry.get("secureSpotPrice" if secure else "communitySpotPrice")
    count = on_demand.gpu_count
    available = stock_to_available(lowest.get("stockStatus"))
    vcpus = as_number(lowest.get("minVcpu")) or float(DEFAULT_VCPU_PER_GPU * count)
    memory = as_number(lowest.get("minMemory")) or float(DEFAULT_RAM_GB_PER_GPU * count)
    variants = (
        (on_demand, _positive(lowest.get("uninterruptablePrice"), list_price)),
        (
            Sku(on_demand.gpu_type_id, count, on_demand.cloud, spot=True),
            _positive(lowest.get("minimumBidPrice"), list_spot),
        ),
    )
    for sku, per_gpu in variants:
        if per_gpu is None:
            continue  # no price quoted: not offered (spot is often unquoted)
        price = round(per_gpu * count, 6)
        if scope.max_price_per_hour is not None and price > scope.max_price_per_hour:
            continue
        yield Offer(
            provider=scope.provider,
            sku=sku.encode(),
            region=region,
            gpu_model=canonical_gpu_name(sku.gpu_type_id),
            gpu_count=count,
            gpu_memory_gib=gpu_memory,
            vcpus=vcpus,
            memory_gib=memory,
            price_per_hour=price,
            spot=sku.spot,
            available=available,
        )


def _positive(*candidates: object) -> float | None:
    """The first candidate that is a positive number (RunPod uses 0 and null for "none")."""
    for candidate in candidates:
        number = as_number(candidate)
        if number is not None and number > 0:
            return number
    return None


def graphql_data(body: object) -> tuple[object, list[Mapping[str, object]]]:
    """``(data, errors)`` of a GraphQL answer; raises ``MalformedResponse`` for other shapes."""
    if not isinstance(body, dict):
        raise MalformedResponse("GraphQL answer is not a JSON object")
    errors = body.get("errors")
    if errors is not None and not isinstance(errors, list):
        raise MalformedResponse("GraphQL answer: 'errors' is not a list")
    found: list[Mapping[str, object]] = [
        e if isinstance(e, dict) else {"message": str(e)} for e in errors or []
    ]
    return body.get("data"), found
