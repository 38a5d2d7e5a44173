"""The ``memory`` provider type, as the registry sees it."""

from __future__ import annotations

from vk_provider.sdk import BuildContext, Provider, ProviderType
from vk_provider_adapters.memory.config import MemoryProviderConfig


def build(settings: MemoryProviderConfig, context: BuildContext) -> Provider:
    # Imported when used: an agent loads only the adapters it runs.
    from vk_provider_adapters.memory.adapter import MemoryProvider

    return MemoryProvider(settings)


PROVIDER_TYPE = ProviderType(
    settings=MemoryProviderConfig,
    build=build,
    description="Simulated instances kept in memory (tests and benchmarks; nothing runs).",
)
