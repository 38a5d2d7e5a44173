"""The ``kubernetes`` provider type, as the registry sees it."""

from __future__ import annotations

from providers.kubernetes.adapter import KubernetesProvider
from providers.kubernetes.config import KubernetesProviderConfig
from vk_provider.domain.contract import Provider
from vk_provider.settings.providers import BuildContext, ProviderType


def build(settings: KubernetesProviderConfig, context: BuildContext) -> Provider:
    return KubernetesProvider(settings)


PROVIDER_TYPE = ProviderType(
    name="kubernetes",
    settings=KubernetesProviderConfig,
    build=build,
    description="Pods in another Kubernetes cluster.",
)
