"""The ``kubernetes`` provider type, as the registry sees it."""

from __future__ import annotations

from vk_provider.sdk import BuildContext, Provider, ProviderType
from vk_provider_adapters.kubernetes.config import KubernetesProviderConfig


def build(settings: KubernetesProviderConfig, context: BuildContext) -> Provider:
    # Imported when used: an agent loads only the adapters it runs.
    from vk_provider_adapters.kubernetes.adapter import KubernetesProvider

    return KubernetesProvider(settings)


def requirements(settings: KubernetesProviderConfig) -> list[str]:
    needs = [
        f"namespace {settings.namespace!r} must exist in the remote cluster, and the "
        "kubeconfig's identity must hold the Role of deploy/remote-cluster-rbac.yaml there: "
        "the adapter never creates it"
    ]
    if settings.expose in ("node-port", "load-balancer"):
        needs.append(
            f"expose: {settings.expose} makes a Service per pod in {settings.namespace!r}: the "
            "identity also needs create/get/list/patch on services there"
            + (
                " (each a cloud load balancer, billed)"
                if settings.expose == "load-balancer"
                else ""
            )
        )
    elif settings.expose == "flat":
        needs.append(
            "expose: flat reports the remote pods' IPs: cluster A must route to the remote "
            "cluster's pod network (and the two must not overlap)"
        )
    return needs


PROVIDER_TYPE = ProviderType(
    settings=KubernetesProviderConfig,
    build=build,
    description="Pods in another Kubernetes cluster.",
    requirements=requirements,
)
