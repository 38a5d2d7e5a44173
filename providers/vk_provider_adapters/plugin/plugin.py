"""The ``grpc`` provider type, as the registry sees it."""

from __future__ import annotations

from vk_provider.sdk import BuildContext, Provider, ProviderType
from vk_provider_adapters.plugin.config import GrpcProviderConfig


def build(settings: GrpcProviderConfig, context: BuildContext) -> Provider:
    # Imported when used: an agent loads only the adapters it runs.
    from vk_provider_adapters.plugin.client import GrpcProvider

    return GrpcProvider(settings)


def requirements(settings: GrpcProviderConfig) -> list[str]:
    return [
        f"a plugin must listen at {settings.address} when the agent starts (it waits "
        f"{settings.connect_timeout_seconds:g} s for it)"
    ]


PROVIDER_TYPE = ProviderType(
    settings=GrpcProviderConfig,
    build=build,
    description="A provider adapter in its own process, over gRPC (proto/vkprovider/v1).",
    requirements=requirements,
)
