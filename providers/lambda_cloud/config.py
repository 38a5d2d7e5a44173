"""Configuration of the Lambda Cloud adapter (``type: lambda``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vk_provider.settings.providers import CloudProviderSettings
from vk_provider.settings.secrets import SecretRef


class LambdaProviderConfig(CloudProviderSettings):
    """Lambda Cloud VMs running the pod's image through cloud-init (shared/provider-apis)."""

    type: Literal["lambda"]
    api_key: SecretRef = Field(description="API key, by reference (env:VAR or file:/path).")
    ssh_key_name: str = Field(description="Name of an SSH key registered with Lambda Cloud.")
    firewall_ruleset_ids: list[str] = Field(
        default_factory=list, description="Firewall rulesets to attach to launched instances."
    )
    instance_types: list[str] = Field(
        default_factory=list, description="Instance type names to consider; empty means all."
    )
    base_url: str = Field("https://cloud.lambda.ai/api/v1", description="API base URL.")
