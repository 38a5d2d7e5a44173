"""The ``lambda`` provider type, as the registry sees it."""

from __future__ import annotations

from vk_provider.sdk import BuildContext, Provider, ProviderType
from vk_provider_adapters.lambda_cloud.config import LambdaProviderConfig


def build(settings: LambdaProviderConfig, context: BuildContext) -> Provider:
    # Imported when used: an agent loads only the adapters it runs.
    from vk_provider_adapters.lambda_cloud.adapter import LambdaCloudProvider

    return LambdaCloudProvider(settings, state_dir=context.state_dir)


PROVIDER_TYPE = ProviderType(
    settings=LambdaProviderConfig,
    build=build,
    description="Lambda Cloud VMs running the pod's image through cloud-init, read over SSH.",
)
