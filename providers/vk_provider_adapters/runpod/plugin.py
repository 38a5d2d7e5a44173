"""The ``runpod`` provider type, as the registry sees it."""

from __future__ import annotations

from vk_provider.sdk import BuildContext, Provider, ProviderType
from vk_provider_adapters.runpod.config import RunPodProviderConfig


def build(settings: RunPodProviderConfig, context: BuildContext) -> Provider:
    # Imported when used: an agent loads only the adapters it runs.
    from vk_provider_adapters.runpod.adapter import RunPodProvider

    return RunPodProvider(settings)


PROVIDER_TYPE = ProviderType(
    settings=RunPodProviderConfig,
    build=build,
    description="RunPod GPU pods (REST v1, GraphQL offers, v2 logs).",
)
