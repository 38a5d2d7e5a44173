"""Configuration of the local provider (``type: local``): development, demo and tests only."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from vk_provider.sdk import ProviderSettings, Strict
from vk_provider_adapters.simulated import SimulatedOffer, unique_skus


class LocalFaults(Strict):
    create_failure_rate: float = Field(
        0, ge=0, le=1, description="Probability that a create fails with CapacityUnavailable."
    )
    api_latency_seconds: float = Field(0, ge=0, le=60, description="Delay added to every call.")
    create_error: Literal["capacity", "transient", "rate_limited", "auth"] = Field(
        "capacity", description="The error class an injected create failure raises."
    )


class LocalProviderConfig(ProviderSettings):
    """Runs each container of a pod as a local process: development, demo and tests only."""

    type: Literal["local"]
    enabled: bool = Field(
        False, description="Must be true: the local provider refuses to start otherwise."
    )
    state_dir: Path | None = Field(
        None, description="Where instances keep logs and state; default under the state root."
    )
    offers: list[SimulatedOffer] = Field(description="Simulated offers.")
    faults: LocalFaults = Field(default_factory=LocalFaults, description="Injected faults.")
    restart_backoff_seconds: float = Field(
        10,
        gt=0,
        le=300,
        description="First crash-loop back-off of a restarting container (doubled per "
        "restart, at most five minutes), as kubelet's.",
    )

    @model_validator(mode="after")
    def _unique_skus(self) -> LocalProviderConfig:
        unique_skus(self.offers)
        return self
