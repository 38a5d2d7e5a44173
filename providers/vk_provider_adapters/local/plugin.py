"""The ``local`` provider type, as the registry sees it."""

from __future__ import annotations

from vk_provider.sdk import BuildContext, Provider, ProviderType
from vk_provider_adapters.local.config import LocalProviderConfig


def build(settings: LocalProviderConfig, context: BuildContext) -> Provider:
    # Imported when used: an agent loads only the adapters it runs.
    from vk_provider_adapters.local.adapter import LocalProvider

    return LocalProvider(settings, state_dir=context.state_dir)


PROVIDER_TYPE = ProviderType(
    settings=LocalProviderConfig,
    build=build,
    description="Runs each container's command as a local process (development, demo, tests).",
)
