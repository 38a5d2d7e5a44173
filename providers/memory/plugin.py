"""The ``memory`` provider type, as the registry sees it."""

from __future__ import annotations

from providers.memory.config import MemoryProviderConfig
from vk_provider.sdk import BuildContext, Provider, ProviderType


def build(settings: MemoryProviderConfig, context: BuildContext) -> Provider:
    # Imported when used: an agent loads only the adapters it runs.
    from providers.memory.adapter import MemoryProvider

    return MemoryProvider(settings)


PROVIDER_TYPE = ProviderType(
    settings=MemoryProviderConfig,
    build=build,
    description="Simulated instances kept in memory (tests and benchmarks; nothing runs).",
)
