"""What a provider type brings to the agent: its settings model and a factory.

A provider *type* (``local``, ``runpod``, or a third party's ``acme``) is one ``ProviderType``:
the pydantic model its configuration entries are validated with, and a function that builds
the adapter from a validated entry. Built-in types and third-party ones are registered the
same way (``vk_provider.runtime.registry``); third-party packages publish their
``ProviderType`` under the entry-point group ``vk_provider.providers``::

    [project.entry-points."vk_provider.providers"]
    acme = "acme_vk.plugin:PROVIDER_TYPE"

Invariants:
- Every settings model derives from ``ProviderSettings``: ``type``, ``name`` and ``priority``
  mean the same for every provider, everything else is the type's own.
- Building an adapter is the only place a credential is resolved (``SecretRef.resolve``);
  the settings object itself never holds a secret value.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from pydantic import Field, field_validator, model_validator

from vk_provider.domain.contract import Provider
from vk_provider.settings.secrets import Strict

# Provider names appear in pod annotations, metric labels and instance names/tags at the
# providers: a DNS label (RFC 1123) fits everywhere.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class ProviderSettings(Strict):
    """Fields every provider entry has, whatever its type."""

    type: str = Field(description="Provider type (local, runpod, lambda, modal, kubernetes, ...).")
    name: str = Field(description="Provider name, unique in this agent.")
    priority: int = Field(0, description="Higher is preferred when prices tie.")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _DNS_LABEL.fullmatch(value):
            raise ValueError(
                "must be a DNS label: 1-63 lowercase letters, digits and '-', "
                "starting and ending with a letter or digit"
            )
        return value


def check_credential_url(url: str, *, allow_insecure_loopback: bool) -> None:
    """Credentials travel only over https; plain http only to a loopback host, and only when
    the configuration says so (``allow_insecure_loopback``: a test or a local proxy)."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme == "https" and parsed.hostname:
        return
    if parsed.scheme != "http" or not parsed.hostname:
        raise ValueError(f"{url!r} is not an https:// URL")
    try:
        loopback = ipaddress.ip_address(parsed.hostname).is_loopback
    except ValueError:
        loopback = parsed.hostname == "localhost"
    if not loopback:
        raise ValueError(f"{url!r}: credentials are sent only over https")
    if not allow_insecure_loopback:
        raise ValueError(
            f"{url!r}: plain http carries the credentials unencrypted; set "
            "allow_insecure_loopback: true to allow it to a loopback host"
        )


class CloudProviderSettings(ProviderSettings):
    """Fields every real cloud provider shares.

    Every field named ``*_url`` is an address the adapter sends its credentials to: it must be
    https (``check_credential_url``).
    """

    regions: list[str] = Field(
        default_factory=list, description="Regions (or data centres) to use; empty means all."
    )
    max_price_per_hour: float | None = Field(
        None, ge=0, description="Never launch an instance dearer than this ($/hour)."
    )
    max_gpus: int = Field(64, ge=0, description="Most GPUs to run on this provider at once.")
    timeout_seconds: float = Field(30, gt=0, le=300, description="Per-request timeout.")
    allow_insecure_loopback: bool = Field(
        False,
        description="Allow plain http to a loopback host (tests, a local proxy); never to "
        "another host.",
    )

    @model_validator(mode="after")
    def _credential_urls(self) -> CloudProviderSettings:
        for name in type(self).model_fields:
            value = getattr(self, name)
            if name.endswith("_url") and isinstance(value, str):
                try:
                    check_credential_url(
                        value, allow_insecure_loopback=self.allow_insecure_loopback
                    )
                except ValueError as exc:
                    raise ValueError(f"{name}: {exc}") from None
        return self


def type_name(settings: type[ProviderSettings]) -> str:
    """The one name of ``settings``' ``type`` field: ``type: Literal["runpod"]`` -> runpod."""
    field_info = settings.model_fields.get("type")
    names = get_args(field_info.annotation) if field_info is not None else ()
    if len(names) != 1 or not isinstance(names[0], str):
        raise TypeError(f"{settings.__name__}.type must be a Literal of one provider type name")
    return names[0]


@dataclass(frozen=True, slots=True)
class BuildContext:
    """What the agent gives a factory besides the provider's own settings."""

    state_dir: Path  # a directory of this provider's own, for anything it keeps on disk


@dataclass(frozen=True, slots=True)
class ProviderType:
    """One provider type: its settings, its factory, and the ``type`` name in the
    configuration, which is the settings' own ``type: Literal["<name>"]`` (spelled there only).

    ``build`` is called only with an instance of ``settings`` (``create`` checks it), so a
    factory may be typed on its own settings class.
    """

    settings: type[ProviderSettings]
    build: Callable[[Any, BuildContext], Provider]
    description: str = ""
    # What must hold outside the agent for an entry to work, that the agent cannot check
    # before it runs (a namespace in a remote cluster, a firewall rule): `check-config`
    # prints these as notes.
    requirements: Callable[[Any], list[str]] = field(default=lambda _settings: [])

    def __post_init__(self) -> None:
        type_name(self.settings)  # a settings class without one Literal type name is refused

    @property
    def name(self) -> str:
        return type_name(self.settings)

    def create(self, settings: ProviderSettings, context: BuildContext) -> Provider:
        """Build the adapter for ``settings`` (an instance of ``self.settings``)."""
        if not isinstance(settings, self.settings):
            raise TypeError(f"{self.name}: settings of type {type(settings).__name__}")
        return self.build(settings, context)
