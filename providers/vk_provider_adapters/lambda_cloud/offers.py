"""Lambda offers: ``GET /instance-types`` as ``Offer``\\s, and Lambda's GPU names as canonical ones.

One offer per (instance type, region with capacity), priced per instance (Lambda quotes cents
per hour for the whole VM; it sells no spot capacity). ``instance_types`` and ``regions`` of the
configuration narrow the list; ``max_price_per_hour`` drops dearer types.

Invariants: pure; a malformed entry is skipped with a warning (a new kind of type must not hide
the others), unless every entry is, which is ``MalformedResponse``.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Collection, Mapping
from typing import Final

from vk_provider.sdk import Offer
from vk_provider_adapters.payload import MalformedResponse, array, field, number, obj, string

log = logging.getLogger(__name__)

# A VM boots, pulls the image and starts it: minutes, not seconds.
STARTUP_SECONDS_ESTIMATE: Final = 300.0
_TYPE_NAME: Final = re.compile(r"gpu_(?P<count>\d+)x_(?P<rest>[a-z0-9_]+)")
_STATED_MEMORY: Final = re.compile(r"(\d+(?:\.\d+)?)\s*GB", re.IGNORECASE)
_VENDOR_WORDS: Final = frozenset({"NVIDIA", "TESLA", "QUADRO", "GEFORCE"})
# Per-GPU memory when neither the description nor the type name states it.
_KNOWN_MEMORY_GIB: Final[Mapping[str, float]] = {
    "A10": 24,
    "A6000": 48,
    "RTX6000": 24,
    "V100": 16,
    "H100": 80,
    "GH200": 96,
    "B200": 180,
}


def _type_tokens(type_name: str) -> list[str]:
    match = _TYPE_NAME.fullmatch(type_name.lower())
    return match.group("rest").split("_") if match else []


def _stated_memory_gib(type_name: str, gpu_description: str) -> float | None:
    match = _STATED_MEMORY.search(gpu_description)
    stated = match.group(1) if match else None
    for token in _type_tokens(type_name):
        if stated is None and re.fullmatch(r"\d+gb", token):
            stated = token[:-2]
    if stated is None or not math.isfinite(float(stated)):
        return None
    return float(stated)


def _family(type_name: str, gpu_description: str) -> str | None:
    tokens = _type_tokens(type_name)
    if tokens:
        family = re.sub(r"[^A-Z0-9]", "", tokens[0].upper())
        if family:
            return family
    # Not a gpu_<n>x_<model> name: the model is what the description says before "(".
    words = gpu_description.split("(")[0].upper().split()
    family = "".join(re.sub(r"[^A-Z0-9]", "", w) for w in words if w not in _VENDOR_WORDS)
    return family or None


def canonical_gpu(type_name: str, gpu_description: str) -> str | None:
    """The canonical GPU model (``H100-SXM``, ``A100-80GB``, ``GH200``...) of a Lambda type.

    The model comes from the type name (``gpu_8x_h100_sxm5``), the variant and memory from it
    and the description (``H100 (80 GB SXM5)``). Unknown models come back normalised
    (upper case, letters and digits), never as an error; None when nothing names a GPU.
    """
    family = _family(type_name, gpu_description)
    if family is None:
        return None
    tokens = _type_tokens(type_name)
    description = gpu_description.upper()
    if family == "H100":
        if any(t.startswith("sxm") for t in tokens) or "SXM" in description:
            return "H100-SXM"
        if "pcie" in tokens or "PCIE" in description:
            return "H100-PCIE"
        if "nvl" in tokens or "NVL" in description:
            return "H100-NVL"
        return "H100"
    if family == "A100":
        memory = _stated_memory_gib(type_name, gpu_description)
        if memory is None:
            return "A100"
        return "A100-80GB" if memory >= 80 else "A100-40GB"
    return family


def gpu_memory_gib(type_name: str, gpu_description: str) -> float:
    """Memory per GPU: as stated (``80 GB``, ``_80gb``), else known for the model, else 0."""
    stated = _stated_memory_gib(type_name, gpu_description)
    if stated is not None:
        return stated
    family = _family(type_name, gpu_description)
    return float(_KNOWN_MEMORY_GIB.get(family or "", 0.0))


def parse_offers(
    data: object,
    *,
    provider: str,
    instance_types: Collection[str] = (),
    regions: Collection[str] = (),
    max_price_per_hour: float | None = None,
) -> list[Offer]:
    """One ``Offer`` per (instance type, region with capacity) of ``GET /instance-types``.

    Empty ``instance_types``/``regions`` mean all. A malformed entry is skipped with a
    warning (a new kind of type must not hide the others), unless every entry is.
    """
    entries = obj(data, "data")
    offers: list[Offer] = []
    problems: list[str] = []
    for key, entry in entries.items():
        try:
            offers.extend(
                _type_offers(
                    entry,
                    where=f"data[{key!r}]",
                    provider=provider,
                    instance_types=instance_types,
                    regions=regions,
                    max_price_per_hour=max_price_per_hour,
                )
            )
        except MalformedResponse as exc:
            log.warning("%s: ignoring instance type %r: %s", provider, key, exc)
            problems.append(str(exc))
    if problems and len(problems) == len(entries):
        raise MalformedResponse(f"every instance type is malformed, first: {problems[0]}")
    return sorted(offers, key=lambda offer: (offer.price_per_hour, offer.key))


def _type_offers(
    entry: object,
    *,
    where: str,
    provider: str,
    instance_types: Collection[str],
    regions: Collection[str],
    max_price_per_hour: float | None,
) -> list[Offer]:
    item = obj(entry, where)
    kind = obj(field(item, "instance_type", where), f"{where}.instance_type")
    kind_where = f"{where}.instance_type"
    name = string(kind, "name", kind_where)
    if instance_types and name not in instance_types:
        return []
    description = string(kind, "gpu_description", kind_where)
    price = number(kind, "price_cents_per_hour", kind_where) / 100
    if max_price_per_hour is not None and price > max_price_per_hour:
        return []
    specs = obj(field(kind, "specs", kind_where), f"{kind_where}.specs")
    gpus = int(number(specs, "gpus", f"{kind_where}.specs"))
    vcpus = number(specs, "vcpus", f"{kind_where}.specs")
    memory = number(specs, "memory_gib", f"{kind_where}.specs")
    available = array(
        field(item, "regions_with_capacity_available", where),
        f"{where}.regions_with_capacity_available",
    )
    offers = []
    for index, raw_region in enumerate(available):
        region_where = f"{where}.regions_with_capacity_available[{index}]"
        region = string(obj(raw_region, region_where), "name", region_where)
        if regions and region not in regions:
            continue
        offers.append(
            Offer(
                provider=provider,
                sku=name,
                region=region,
                gpu_model=canonical_gpu(name, description) if gpus > 0 else None,
                gpu_count=gpus,
                gpu_memory_gib=gpu_memory_gib(name, description) if gpus > 0 else 0.0,
                vcpus=vcpus,
                memory_gib=memory,
                price_per_hour=price,
                spot=False,
                available=1,
                startup_seconds=STARTUP_SECONDS_ESTIMATE,
            )
        )
    return offers
