"""Configuration of an out-of-process provider (``type: grpc``): where the plugin listens, how
to reach it securely, and how long to wait for it.

Invariants: the address parses (``address``); TCP means TLS that verifies the plugin's
certificate against ``tls.ca_file`` (the workload's secret env values cross the wire, and the
plugin's answers are prices the agent spends by); plain TCP only to a loopback host and only
when ``allow_insecure_loopback: true`` says so, never to another host; a client certificate
comes with its key (`vk-provider plugin serve` on TCP requires one: mutual TLS). Files are
read when the adapter is built (``check-config`` reports an unreadable one by field), never
here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from vk_provider.sdk import ProviderSettings, Strict
from vk_provider_adapters.plugin.address import PluginAddress, parse_address


class PluginTLS(Strict):
    """TLS to the plugin: the CA that signed its certificate, and optionally our own."""

    ca_file: Path = Field(description="PEM bundle of the CA that signed the plugin's certificate.")
    cert_file: Path | None = Field(
        None,
        description="Client certificate (PEM), for a plugin that requires client auth "
        "(`vk-provider plugin serve` on TCP always does).",
    )
    key_file: Path | None = Field(None, description="The client certificate's private key (PEM).")
    server_name: str | None = Field(
        None,
        description="The name to check the plugin's certificate against, when it is not the "
        "address's host.",
    )

    @model_validator(mode="after")
    def _pair(self) -> PluginTLS:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file: give both cert_file and key_file, or neither")
        return self


class GrpcProviderConfig(ProviderSettings):
    """A provider adapter running in its own process, served with `vk-provider plugin serve`
    or any implementation of proto/vkprovider/v1/provider.proto."""

    type: Literal["grpc"]
    address: str = Field(
        description="Where the plugin listens: unix:///path/to.sock, or host:port (TLS "
        "required unless the host is loopback and allow_insecure_loopback is true)."
    )
    tls: PluginTLS | None = Field(None, description="TLS for a TCP address.")
    allow_insecure_loopback: bool = Field(
        False,
        description="Allow plain TCP to a loopback host (tests); never to another host. A Unix "
        "socket needs no TLS: its file permissions guard it.",
    )
    timeout_seconds: float = Field(
        10, gt=0, le=300, description="Deadline of every call but a followed log stream."
    )
    connect_timeout_seconds: float = Field(
        30,
        gt=0,
        le=600,
        description="How long the agent waits at start for the plugin to answer Describe "
        "(its capabilities) before it gives up.",
    )

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        parse_address(value)
        return value

    @model_validator(mode="after")
    def _transport(self) -> GrpcProviderConfig:
        where = self.parsed_address
        if where.unix_path is not None:
            if self.tls is not None:
                raise ValueError("tls: a Unix socket address takes no TLS (file permissions)")
            return self
        if self.tls is None and not where.loopback:
            raise ValueError(
                f"tls: {where.host} is not a loopback host: TLS is required (the workloads' "
                "secret values cross this connection)"
            )
        if self.tls is None and not self.allow_insecure_loopback:
            raise ValueError(
                "tls: plain TCP carries the workloads' secrets unencrypted; give tls, or set "
                "allow_insecure_loopback: true for a loopback host"
            )
        return self

    @property
    def parsed_address(self) -> PluginAddress:
        return parse_address(self.address)
