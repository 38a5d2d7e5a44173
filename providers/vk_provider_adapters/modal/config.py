"""Configuration of the Modal adapter (``type: modal``); importing it never imports the SDK."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vk_provider.sdk import CloudProviderSettings, SecretRef, Strict


class ModalGpuOffer(Strict):
    gpu: str = Field(description="Modal GPU name, e.g. H100, A100-80GB, L40S.")
    count: int = Field(1, ge=1, le=8, description="GPUs per sandbox.")
    price_per_hour: float = Field(ge=0, description="Price for the whole sandbox ($/hour).")
    vcpus: float = Field(8, gt=0, description="vCPUs requested.")
    memory_gib: float = Field(32, gt=0, description="Memory requested (GiB).")
    region: str = Field("any", description="Modal region, or 'any'.")


class ModalProviderConfig(CloudProviderSettings):
    """Modal sandboxes through the `modal` SDK (optional dependency, imported when used)."""

    type: Literal["modal"]
    token_id: SecretRef = Field(description="Modal token id, by reference.")
    token_secret: SecretRef = Field(description="Modal token secret, by reference.")
    app_name: str = Field("vk-provider", description="Modal app that holds the sandboxes.")
    sandbox_timeout_seconds: int = Field(
        86400, ge=60, le=7 * 86400, description="Sandbox lifetime limit (Modal's default is 300)."
    )
    offers: list[ModalGpuOffer] = Field(description="What to offer and at which price.")
    expose: Literal["tcp", "tls"] = Field(
        "tcp",
        description="How declared TCP ports are exposed, through Modal's public tunnels: tcp, "
        "as unencrypted_ports, a raw TCP tunnel (Modal's host and a port it assigns) that "
        "carries the container's own protocol unchanged, like a pod port; tls, as "
        "encrypted_ports, where Modal terminates TLS on <host>:443 and the client must speak "
        "TLS with that host name (for ingress controllers and gateways). Either way the "
        "endpoint is a hostname (an FQDN EndpointSlice) and open to the internet.",
    )
