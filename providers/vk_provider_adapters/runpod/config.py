"""Configuration of the RunPod adapter (``type: runpod``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vk_provider.sdk import CloudProviderSettings, SecretRef


# The API's shapes: tests/fixtures/provider-apis/runpod-rest-v1-openapi.json (and v2).
class RunPodProviderConfig(CloudProviderSettings):
    """RunPod pods through REST v1, offers through GraphQL."""

    type: Literal["runpod"]
    api_key: SecretRef = Field(description="API key, by reference (env:VAR or file:/path).")
    cloud_type: Literal["SECURE", "COMMUNITY", "ALL"] = Field(
        "SECURE", description="Secure cloud, community cloud, or both."
    )
    gpu_types: list[str] = Field(
        default_factory=list, description="RunPod GPU type ids to consider; empty means all."
    )
    container_disk_gb: int = Field(20, ge=1, le=2000, description="Container disk per pod (GB).")
    expose: Literal["tcp", "http"] = Field(
        "tcp",
        description="How declared TCP ports are exposed: tcp, on the pod's public IP at the "
        "port RunPod maps (reachable through kube-proxy; plain TCP over the internet); http, "
        "through RunPod's HTTPS proxy (<pod>-<port>.proxy.runpod.net:443, a hostname: for "
        "ingress controllers and gateways, not kube-proxy).",
    )
    rest_url: str = Field("https://rest.runpod.io/v1", description="REST v1 base URL.")
    graphql_url: str = Field("https://api.runpod.io/graphql", description="GraphQL URL.")
    logs_url: str = Field("https://api.runpod.io/v2", description="REST v2 base URL (logs).")
