"""The ``grpc`` provider type, as the registry sees it."""

from __future__ import annotations

from providers.plugin.config import GrpcProviderConfig
from vk_provider.sdk import BuildContext, Provider, ProviderType


def build(settings: GrpcProviderConfig, context: BuildContext) -> Provider:
    # Imported when used: an agent loads only the adapters it runs.
    from providers.plugin.client import GrpcProvider

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
