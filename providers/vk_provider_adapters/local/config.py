"""Configuration of the local provider (``type: local``): development, demo and tests only."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from vk_provider.sdk import ProviderSettings, Strict
from vk_provider_adapters.simulated import SimulatedOffer, unique_skus


class LocalFaults(Strict):
    create_failure_rate: float = Field(
        0, ge=0, le=1, description="Probability that a create fails with CapacityUnavailable."
    )
    api_latency_seconds: float = Field(0, ge=0, le=60, description="Delay added to every call.")
    create_error: Literal["capacity", "transient", "rate_limited", "auth"] = Field(
        "capacity", description="The error class an injected create failure raises."
    )


class LocalProviderConfig(ProviderSettings):
    """Runs each container of a pod as a local process: development, demo and tests only."""

    type: Literal["local"]
    enabled: bool = Field(
        False, description="Must be true: the local provider refuses to start otherwise."
    )
    state_dir: Path | None = Field(
        None, description="Where instances keep logs and state; default under the state root."
    )
    offers: list[SimulatedOffer] = Field(description="Simulated offers.")
    faults: LocalFaults = Field(default_factory=LocalFaults, description="Injected faults.")
    restart_backoff_seconds: float = Field(
        10,
        gt=0,
        le=300,
        description="First crash-loop back-off of a restarting container (doubled per "
        "restart, at most five minutes), as kubelet's.",
    )

    address: str | None = Field(
        None,
        description="The address the cluster reaches this machine's processes at: each "
        "declared containerPort is exposed there (the process listens on it, or on every "
        "address). A non-loopback IP; none: ports are not exposed.",
    )
    network_namespace: str | None = Field(
        None,
        description="An existing network namespace (``ip netns``) every process of this "
        "provider runs in, so its pods listen apart from this machine's and from other "
        "providers' (two pods declaring the same port need two namespaces). Needs "
        "``address``, the namespace's address the agent and the cluster reach, and "
        "CAP_SYS_ADMIN. None: this machine's own network.",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
    )
    pod_network: str | None = Field(
        None,
        description="An IPv4 CIDR of this machine's own choosing (overlapping none of its "
        "networks): each pod gets a /30 of it and a network namespace of its own, joined to "
        "this machine by a veth pair, and listens at its own address, where its declared "
        "ports are exposed (as a CNI plugin gives pods addresses). Needs iproute2 and "
        "CAP_NET_ADMIN and CAP_SYS_ADMIN. Excludes address and network_namespace.",
    )

    @field_validator("pod_network")
    @classmethod
    def _a_cidr(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            network = ipaddress.IPv4Network(value)
        except ValueError as exc:
            raise ValueError(f"{value!r} is not an IPv4 network in CIDR notation ({exc})") from None
        if network.prefixlen > 30:
            raise ValueError(f"{value}: each pod needs a /30, so at most a /30")
        if network.is_loopback or network.is_link_local:
            raise ValueError(f"{value} cannot be reached from the cluster")
        return str(network)

    @field_validator("address")
    @classmethod
    def _reachable(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            parsed = ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address") from None
        if parsed.is_loopback or parsed.is_link_local or parsed.is_unspecified:
            raise ValueError(
                f"{value} cannot be reached from the cluster (EndpointSlices refuse loopback, "
                "link-local and unspecified addresses)"
            )
        return value

    @model_validator(mode="after")
    def _unique_skus(self) -> LocalProviderConfig:
        unique_skus(self.offers)
        return self

    @model_validator(mode="after")
    def _one_network(self) -> LocalProviderConfig:
        if self.pod_network is not None and (self.address or self.network_namespace):
            raise ValueError(
                "pod_network gives each pod an address of its own: leave address and "
                "network_namespace unset with it"
            )
        return self

    @model_validator(mode="after")
    def _namespace_has_an_address(self) -> LocalProviderConfig:
        if self.network_namespace is not None and self.address is None:
            raise ValueError(
                "network_namespace needs address: the namespace's IP, where the agent's "
                "probes and the cluster reach its processes"
            )
        return self
