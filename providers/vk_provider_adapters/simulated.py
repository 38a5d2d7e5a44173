"""Simulated offers, shared by the providers that pretend to be a cloud (``local``, ``memory``)."""

from __future__ import annotations

from pydantic import Field

from vk_provider.sdk import Offer, Strict


class SimulatedOffer(Strict):
    """One simulated offer: what it gives, what it costs, how many can run at once."""

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


def simulated_offer(provider: str, offer: SimulatedOffer, *, active: int) -> Offer:
    """The domain ``Offer`` of a simulated one, with ``active`` instances already running."""
    return Offer(
        provider=provider,
        sku=offer.sku,
        region=offer.region,
        gpu_model=offer.gpu_model,
        gpu_count=offer.gpu_count,
        gpu_memory_gib=offer.gpu_memory_gib,
        vcpus=offer.vcpus,
        memory_gib=offer.memory_gib,
        price_per_hour=offer.price_per_hour,
        spot=offer.spot,
        available=max(0, offer.capacity - active),
        startup_seconds=offer.startup_seconds,
    )


def unique_skus(offers: list[SimulatedOffer]) -> None:
    """Raise ``ValueError`` naming the first sku that appears twice."""
    seen: set[str] = set()
    for offer in offers:
        if offer.sku in seen:
            raise ValueError(f"offers: sku {offer.sku!r} appears twice")
        seen.add(offer.sku)
