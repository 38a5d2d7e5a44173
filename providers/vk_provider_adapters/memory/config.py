"""Configuration of the in-memory provider (``type: memory``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from vk_provider.sdk import ProviderSettings
from vk_provider_adapters.simulated import SimulatedOffer, unique_skus


class MemoryProviderConfig(ProviderSettings):
    """Instances that exist only in the agent's memory: nothing runs, nothing is paid.

    For benchmarks and tests of the agent itself (the provider answers instantly). Every
    instance runs until it is deleted; after an agent restart they are gone, so pods that
    name one are failed as lost, as a real cloud losing them would make them.
    """

    type: Literal["memory"]
    enabled: bool = Field(
        False, description="Must be true: pods on this provider only pretend to run."
    )
    offers: list[SimulatedOffer] = Field(description="Simulated offers.")
    whole_pods: bool = Field(
        False,
        description="Run whole pods (several containers, init containers, sidecars) and "
        "report each container, as a provider that restarts containers itself does.",
    )
    probes: Literal["none", "agent", "provider"] = Field(
        "none", description="Who probes this provider's containers (its capabilities)."
    )

    @model_validator(mode="after")
    def _unique_skus(self) -> MemoryProviderConfig:
        unique_skus(self.offers)
        return self
