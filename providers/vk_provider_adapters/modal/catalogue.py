"""The Modal offers: configured, since Modal has no price or capacity API.

Offers and prices come from the configuration (``ModalProviderConfig.offers``), with canonical
GPU names (``MODAL_GPUS``: Modal's ``H100`` is ``H100-SXM``, ``A100`` is ``A100-40GB``),
``gpu=`` strings spelled ``H100`` / ``A100-80GB:2``, and ``regions`` / ``max_price_per_hour`` /
``max_gpus`` applied.

Invariants: pure; two configured offers with the same key are a ``ConfigError``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from vk_provider.sdk import ConfigError, Offer
from vk_provider_adapters.modal.config import ModalGpuOffer, ModalProviderConfig

ANY_REGION: Final = "any"

# Modal GPU names (modal.com/docs/guide/gpu) -> (canonical model, memory per GPU in GiB).
# Where Modal may upgrade (A100 -> 80 GB, H100 -> H200), the floor is what we promise.
# Modal's H100s are SXM parts.
MODAL_GPUS: Final[Mapping[str, tuple[str, float]]] = {
    "T4": ("T4", 16),
    "L4": ("L4", 24),
    "A10": ("A10", 24),
    "A10G": ("A10G", 24),
    "L40S": ("L40S", 48),
    "A100": ("A100-40GB", 40),
    "A100-40GB": ("A100-40GB", 40),
    "A100-80GB": ("A100-80GB", 80),
    "RTX-PRO-6000": ("RTX-PRO-6000", 96),
    "H100": ("H100-SXM", 80),
    "H100!": ("H100-SXM", 80),
    "H200": ("H200", 141),
    "B200": ("B200", 180),
    "B200+": ("B200", 180),
}


def modal_gpu_string(gpu: str, count: int) -> str:
    """Modal's ``gpu=`` argument: ``H100`` for one GPU, ``A100-80GB:2`` for several."""
    return gpu if count == 1 else f"{gpu}:{count}"


def offer_sku(gpu: str, count: int) -> str:
    """``h100-x1``, ``a100-80gb-x2``, ``h100-exact-x1`` (for ``H100!``)."""
    slug = gpu.strip().lower().replace("!", "-exact").replace("+", "-plus")
    slug = re.sub(r"[^a-z0-9.]+", "-", slug).strip("-")
    return f"{slug}-x{count}"


@dataclass(frozen=True, slots=True)
class Catalogued:
    """One configured offer and how to launch it."""

    offer: Offer
    gpu: str  # Modal's spelling, with the count
    regions: tuple[str, ...]


def catalogue(config: ModalProviderConfig) -> dict[str, Catalogued]:
    """The configured offers allowed by ``regions`` and ``max_price_per_hour``, by offer key."""
    entries: dict[str, Catalogued] = {}
    for configured in config.offers:
        entry = _catalogued(config, configured)
        if entry is None:
            continue
        if entry.offer.key in entries:
            raise ConfigError(
                f"providers[{config.name}].offers: two offers of {configured.gpu} x"
                f"{configured.count} in region {configured.region!r}"
            )
        entries[entry.offer.key] = entry
    return entries


def _catalogued(config: ModalProviderConfig, configured: ModalGpuOffer) -> Catalogued | None:
    if config.max_price_per_hour is not None and configured.price_per_hour > (
        config.max_price_per_hour
    ):
        return None
    if configured.region == ANY_REGION:
        regions = tuple(config.regions)  # Modal may place it in any of the allowed regions
    elif not config.regions or configured.region in config.regions:
        regions = (configured.region,)
    else:
        return None
    gpu = configured.gpu.strip()
    canonical, memory = MODAL_GPUS.get(gpu.upper(), (gpu.upper(), 0.0))
    offer = Offer(
        provider=config.name,
        sku=offer_sku(gpu, configured.count),
        region=configured.region,
        gpu_model=canonical,
        gpu_count=configured.count,
        gpu_memory_gib=memory,
        vcpus=configured.vcpus,
        memory_gib=configured.memory_gib,
        price_per_hour=configured.price_per_hour,
        available=config.max_gpus // configured.count,
    )
    return Catalogued(offer, modal_gpu_string(gpu, configured.count), regions)
