"""The adapter SDK: everything a provider adapter may import from vk-provider, and nothing else.

A provider adapter (the ones in ``providers/`` and any third-party distribution, see
docs/adding-a-provider.md) imports from the core only this module: the domain types it
speaks (offers, the workload, instances, container specs and statuses, log options), the
errors it raises, the ``Provider`` protocol and its optional operations, the settings base
classes and secret references its configuration is made of, and the few helpers adapters
share (quantities, redaction, credential URL checks). An import-linter contract holds every
adapter package to it (``.importlinter``: adapters-use-the-sdk).

Stability: these names are the public surface. They change only together with the
adapter-facing documentation; anything else in ``vk_provider`` may change at any time.
"""

from __future__ import annotations

from vk_provider.domain.containers import (
    ContainerSpec,
    ContainerState,
    ContainerStatus,
    ContainerUsage,
    Probe,
    Termination,
    VolumeMount,
)
from vk_provider.domain.contract import (
    ExecSession,
    PortStream,
    Provider,
    SupportsContainerRestart,
    SupportsUsage,
)
from vk_provider.domain.errors import (
    AuthFailed,
    CapacityUnavailable,
    InvalidSpec,
    NotFound,
    NotSent,
    ProviderError,
    RateLimited,
    Transient,
)
from vk_provider.domain.models import (
    Capabilities,
    EnvVar,
    Instance,
    InstanceState,
    LogOptions,
    Offer,
    Port,
    PortEndpoint,
    WorkloadSpec,
)
from vk_provider.domain.node import VIRTUAL_NODE_TAINT_KEY
from vk_provider.domain.quantity import parse_quantity
from vk_provider.domain.redact import Redactor
from vk_provider.settings.configfile import parse_yaml
from vk_provider.settings.providers import (
    BuildContext,
    CloudProviderSettings,
    ProviderSettings,
    ProviderType,
    check_credential_url,
)
from vk_provider.settings.secrets import ConfigError, SecretRef, Strict

__all__ = [
    "VIRTUAL_NODE_TAINT_KEY",
    "AuthFailed",
    "BuildContext",
    "Capabilities",
    "CapacityUnavailable",
    "CloudProviderSettings",
    "ConfigError",
    "ContainerSpec",
    "ContainerState",
    "ContainerStatus",
    "ContainerUsage",
    "EnvVar",
    "ExecSession",
    "Instance",
    "InstanceState",
    "InvalidSpec",
    "LogOptions",
    "NotFound",
    "NotSent",
    "Offer",
    "Port",
    "PortEndpoint",
    "PortStream",
    "Probe",
    "Provider",
    "ProviderError",
    "ProviderSettings",
    "ProviderType",
    "RateLimited",
    "Redactor",
    "SecretRef",
    "Strict",
    "SupportsContainerRestart",
    "SupportsUsage",
    "Termination",
    "Transient",
    "VolumeMount",
    "WorkloadSpec",
    "check_credential_url",
    "parse_quantity",
    "parse_yaml",
]
