"""The settings of a provider entry with ``type: example``."""

from typing import Literal

from pydantic import Field

from vk_provider.sdk import ProviderSettings


class ExampleSettings(ProviderSettings):
    type: Literal["example"]
    gpu_model: str = Field("A100-80GB", description="The GPU the simulated machine has.")
    price_per_hour: float = Field(1.10, ge=0, description="What it costs per hour.")
