"""The ``kubernetes`` provider type, as the registry sees it."""

from __future__ import annotations

from vk_provider.sdk import BuildContext, Provider, ProviderType
from vk_provider_adapters.kubernetes.config import KubernetesProviderConfig


def build(settings: KubernetesProviderConfig, context: BuildContext) -> Provider:
    # Imported when used: an agent loads only the adapters it runs.
    from vk_provider_adapters.kubernetes.adapter import KubernetesProvider

    return KubernetesProvider(settings)


def requirements(settings: KubernetesProviderConfig) -> list[str]:
    return [
        f"namespace {settings.namespace!r} must exist in the remote cluster, and the "
        "kubeconfig's identity must hold the Role of deploy/remote-cluster-rbac.yaml there: "
        "the adapter never creates it"
    ]


PROVIDER_TYPE = ProviderType(
    settings=KubernetesProviderConfig,
    build=build,
    description="Pods in another Kubernetes cluster.",
    requirements=requirements,
)
