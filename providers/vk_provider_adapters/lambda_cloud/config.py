"""Configuration of the Lambda Cloud adapter (``type: lambda``)."""

from __future__ import annotations

import ipaddress
from typing import Final, Literal

from pydantic import Field, field_validator, model_validator

from vk_provider.sdk import CloudProviderSettings, SecretRef, Strict

# From the spec: FirewallRulesetCreateRequest.name maxLength.
RULESET_NAME_MAX: Final = 64
RULESET_PREFIX: Final = "vk-provider-"


def _ipv4_networks(values: list[str] | None) -> list[str] | None:
    """Each entry an IPv4 network in CIDR notation (a bare address is /32, as Lambda reads
    it), normalised to ``a.b.c.d/n``; host bits set are refused rather than guessed at."""
    if values is None:
        return None
    networks = []
    for index, value in enumerate(values):
        try:
            network = ipaddress.IPv4Network(value.strip())
        except ValueError as exc:
            raise ValueError(f"[{index}] {value[:60]!r} is not an IPv4 CIDR: {exc}") from None
        networks.append(network.with_prefixlen)
    return networks


class LambdaFirewall(Strict):
    """The adapter's own firewall ruleset per region (``lambda_cloud.firewall``)."""

    source_cidrs: list[str] = Field(
        min_length=1,
        description="Sources (IPv4 CIDRs) let in to every port the pods declare, TCP or UDP as "
        "declared: the cluster's egress (its nodes' public addresses or its NAT's).",
    )
    ssh_source_cidrs: list[str] | None = Field(
        None,
        min_length=1,
        description="Sources (IPv4 CIDRs) let in to ssh_port: where the agent connects from, "
        "and people of authorized_keys. None: source_cidrs (the agent runs in the cluster). "
        "Leaving the agent out locks it out: its VMs are reported lost.",
    )
    ruleset_name: str | None = Field(
        None,
        min_length=1,
        max_length=RULESET_NAME_MAX,
        description="Name of the adapter's ruleset in each region. None: vk-provider-<provider "
        "name>. Two agents sharing a Lambda account need different names (as their providers).",
    )

    _cidrs = field_validator("source_cidrs", "ssh_source_cidrs")(_ipv4_networks)

    @property
    def ssh_sources(self) -> list[str]:
        return self.source_cidrs if self.ssh_source_cidrs is None else self.ssh_source_cidrs

    def name_for(self, provider: str) -> str:
        return self.ruleset_name or f"{RULESET_PREFIX}{provider}"


# The API's shapes: tests/fixtures/provider-apis/lambda-cloud-openapi-1.8.3.json.
class LambdaProviderConfig(CloudProviderSettings):
    """Lambda Cloud VMs running the pod's image through cloud-init."""

    type: Literal["lambda"]
    api_key: SecretRef = Field(description="API key, by reference (env:VAR or file:/path).")
    ssh_key_name: str = Field(
        min_length=1,
        max_length=64,
        description="Name of the Lambda SSH key that launches name: the agent's own public key. "
        "Registered by the agent when no key has this name; a key of this name with another "
        "public key is refused (give its private key as ssh_private_key, or another name).",
    )
    ssh_private_key: SecretRef | None = Field(
        None,
        description="The agent's SSH private key (OpenSSH or PEM, unencrypted), by reference. "
        "Unset: an ed25519 key generated once into the provider's state directory. Set it "
        "(from a Secret) when the state directory does not survive the agent's pod: VMs "
        "launched with a lost key cannot be read any more.",
    )
    ssh_user: str = Field("ubuntu", min_length=1, description="User the agent logs in as.")
    ssh_port: int = Field(22, ge=1, le=65535, description="SSH port of the VMs.")
    # A poll reads every VM within connect + command timeout; the agent gives one
    # list_ours 20 s (InstanceTracker), so the defaults leave room for the API call.
    ssh_connect_timeout_seconds: float = Field(
        5, gt=0, le=60, description="Opening one SSH connection (TCP, handshake, login)."
    )
    ssh_command_timeout_seconds: float = Field(
        10, gt=0, le=60, description="One command over an open SSH connection."
    )
    ssh_unreachable_seconds: float = Field(
        900,
        ge=60,
        description="An active VM the agent cannot read over SSH for this long is reported "
        "lost (its pod fails, the VM is terminated): an unobservable VM must not bill forever.",
    )
    ssh_concurrency: int = Field(
        16, ge=1, le=256, description="Most VMs read over SSH at once in one poll."
    )
    authorized_keys: list[str] = Field(
        default_factory=list,
        description="Public keys (authorized_keys lines) of people who may log in to the VMs; "
        "launches name only the agent's key, so these go in through cloud-init.",
    )
    firewall_ruleset_ids: list[str] = Field(
        default_factory=list,
        description="Firewall rulesets (ids, each in one region) to attach to launched "
        "instances, beside the adapter's own ruleset when firewall is set.",
    )
    firewall: LambdaFirewall | None = Field(
        None,
        description="Manage a firewall ruleset of the adapter's own in each region, letting "
        "source_cidrs in to the pods' declared ports and ssh_source_cidrs to SSH. None: no "
        "firewall is touched; the account's rules (and firewall_ruleset_ids) decide.",
    )
    instance_types: list[str] = Field(
        default_factory=list, description="Instance type names to consider; empty means all."
    )
    pause_image: str = Field(
        "registry.k8s.io/pause:3.10",
        min_length=1,
        description="Image of each pod's sandbox container on its VM: it holds the network "
        "namespace the pod's containers share and publishes their ports (a mirror of "
        "Kubernetes' pause image for registries the VMs must use instead).",
    )
    base_url: str = Field("https://cloud.lambda.ai/api/v1", description="API base URL.")

    @model_validator(mode="after")
    def _ruleset_name_fits(self) -> LambdaProviderConfig:
        if self.firewall is not None and len(self.firewall.name_for(self.name)) > RULESET_NAME_MAX:
            raise ValueError(
                f"firewall.ruleset_name: {RULESET_PREFIX}{self.name} is longer than Lambda's "
                f"{RULESET_NAME_MAX} characters; set a shorter ruleset_name"
            )
        return self
