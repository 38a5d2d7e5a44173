"""Configuration of the Kubernetes-cluster adapter (``type: kubernetes``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vk_provider.sdk import CloudProviderSettings, SecretRef


class KubernetesProviderConfig(CloudProviderSettings):
    """Another Kubernetes cluster: pods run in a namespace there."""

    type: Literal["kubernetes"]
    kubeconfig: SecretRef = Field(description="Kubeconfig of the remote cluster, by reference.")
    namespace: str = Field("vk-provider-workloads", description="Remote namespace for pods.")
    gpu_model: str | None = Field(None, description="Canonical GPU model of the remote nodes.")
    gpu_price_per_hour: float = Field(0, ge=0, description="Price per GPU per hour.")
    cpu_price_per_hour: float = Field(0, ge=0, description="Price per vCPU per hour.")
