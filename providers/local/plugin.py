"""The ``local`` provider type, as the registry sees it."""

from __future__ import annotations

from providers.local.config import LocalProviderConfig
from vk_provider.sdk import BuildContext, Provider, ProviderType


def build(settings: LocalProviderConfig, context: BuildContext) -> Provider:
    # Imported when used: an agent loads only the adapters it runs.
    from providers.local.adapter import LocalProvider

    return LocalProvider(settings, state_dir=context.state_dir)


PROVIDER_TYPE = ProviderType(
    settings=LocalProviderConfig,
    build=build,
    description="Runs each container's command as a local process (development, demo, tests).",
)
