"""The JSON Schema of the configuration file, for editors (completion, checks as you type).

The configuration's ``providers`` entries are validated by the settings model of their
``type``, which the provider registry knows (built-in and third-party types alike), so the
schema is built from the registry's models: ``providers`` items are a union discriminated by
``type``, one variant per installed provider type. What the schema cannot say (a credential
file exists, a provider accepts the key) ``vk-provider check-config`` checks.

Invariants: pure (no I/O); the schema is JSON Schema 2020-12 as pydantic writes it, and a file
``parse_config`` accepts is valid against it (unknown keys are refused by both).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, Field, create_model

from vk_provider.settings.agent import AgentConfig
from vk_provider.settings.providers import ProviderSettings

SCHEMA_HINT = (
    "The schema of every field, for your editor: `vk-provider config schema` "
    '(docs/configuration.md, "Editor completion").'
)
DRAFT = "https://json-schema.org/draft/2020-12/schema"


def _variant(name: str, model: type[ProviderSettings]) -> type[BaseModel]:
    """``model`` with ``type`` pinned to ``name``, so the union can be told apart by it."""
    pinned: Any = Literal[name]
    variant: type[BaseModel] = create_model(
        model.__name__,
        __base__=model,
        __module__=model.__module__,
        type=(pinned, Field(description=f"Provider type: {name}.")),
    )
    return variant


def config_schema(provider_types: Mapping[str, type[ProviderSettings]]) -> dict[str, Any]:
    """The JSON Schema of a configuration file whose providers are of ``provider_types``."""
    variants = tuple(_variant(name, provider_types[name]) for name in sorted(provider_types))
    entry: Any
    if not variants:
        entry = ProviderSettings
    elif len(variants) == 1:
        entry = variants[0]
    else:
        entry = Annotated[Union[variants], Field(discriminator="type")]  # noqa: UP007
    description = AgentConfig.model_fields["providers"].description
    document: type[BaseModel] = create_model(
        "AgentConfig",
        __base__=AgentConfig,
        __module__=AgentConfig.__module__,
        providers=(list[entry], Field(min_length=1, description=description)),
    )
    schema = document.model_json_schema()
    return {
        "$schema": DRAFT,
        "title": "vk-provider agent configuration",
        "description": "The YAML file of `vk-provider run --config` and `check-config`.",
        **{k: v for k, v in schema.items() if k not in ("title", "description")},
    }
