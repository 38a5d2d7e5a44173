"""The provider registry: provider type name -> settings model and factory.

Built-in types are listed here; third-party types are found through the entry-point group
``vk_provider.providers`` (each entry point names a ``ProviderType``). Adding a provider never
needs an edit of the agent: install the package that publishes its entry point, and the
configuration accepts ``type: <its name>``.

Invariants:
- A type name is registered once: an entry point that reuses a built-in's (or another entry
  point's) name is refused with an error naming both, never silently preferred.
- Loading entry points happens once per ``Registry``; a broken third-party package fails the
  start with its name in the message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from vk_provider.domain.contract import Provider
from vk_provider.settings.agent import AgentConfig, load_config, parse_config, parse_provider
from vk_provider.settings.providers import BuildContext, ProviderSettings, ProviderType
from vk_provider.settings.schema import config_schema
from vk_provider.settings.secrets import ConfigError
from vk_provider_adapters.kubernetes.plugin import PROVIDER_TYPE as KUBERNETES
from vk_provider_adapters.lambda_cloud.plugin import PROVIDER_TYPE as LAMBDA
from vk_provider_adapters.local.plugin import PROVIDER_TYPE as LOCAL
from vk_provider_adapters.memory.plugin import PROVIDER_TYPE as MEMORY
from vk_provider_adapters.modal.plugin import PROVIDER_TYPE as MODAL
from vk_provider_adapters.plugin.plugin import PROVIDER_TYPE as GRPC
from vk_provider_adapters.runpod.plugin import PROVIDER_TYPE as RUNPOD

ENTRY_POINT_GROUP = "vk_provider.providers"

BUILT_IN: tuple[ProviderType, ...] = (
    LOCAL,
    MEMORY,
    RUNPOD,
    LAMBDA,
    MODAL,
    KUBERNETES,
    GRPC,
)


class Registry:
    """Every provider type this agent can run."""

    def __init__(self, types: Iterable[ProviderType]) -> None:
        self._types: dict[str, ProviderType] = {}
        for kind in types:
            self.add(kind, origin="built in")

    def add(self, kind: ProviderType, *, origin: str) -> None:
        existing = self._types.get(kind.name)
        if existing is not None:
            raise ConfigError(
                f"provider type {kind.name!r} from {origin} is already registered "
                f"({existing.settings.__module__})"
            )
        self._types[kind.name] = kind

    @classmethod
    def default(cls) -> Registry:
        """The built-in types plus every installed ``vk_provider.providers`` entry point."""
        registry = cls(BUILT_IN)
        for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                kind = entry.load()
            except Exception as exc:
                raise ConfigError(
                    f"provider plugin {entry.name!r} ({entry.value}) cannot be loaded: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            if not isinstance(kind, ProviderType):
                raise ConfigError(
                    f"provider plugin {entry.name!r} ({entry.value}) is not a ProviderType"
                )
            registry.add(kind, origin=f"entry point {entry.value}")
        return registry

    @property
    def types(self) -> Mapping[str, ProviderType]:
        return dict(self._types)

    def settings_models(self) -> dict[str, type[ProviderSettings]]:
        return {name: kind.settings for name, kind in self._types.items()}

    def config_schema(self) -> dict[str, Any]:
        """The configuration's JSON Schema, with every registered provider type."""
        return config_schema(self.settings_models())

    def parse_config(self, data: object) -> AgentConfig:
        return parse_config(data, self.settings_models())

    def parse_provider(self, data: object) -> ProviderSettings:
        """One provider entry, validated by the model of its ``type``."""
        return parse_provider(data, self.settings_models())

    def load_config(self, path: Path) -> AgentConfig:
        return load_config(path, self.settings_models())

    def build(self, settings: ProviderSettings, *, state_dir: Path) -> Provider:
        """The adapter for one validated provider entry."""
        kind = self._types.get(settings.type)
        if kind is None:  # parse_config refuses unknown types; a hand-made entry may not
            raise ConfigError(f"provider {settings.name!r}: unknown type {settings.type!r}")
        return kind.create(
            settings, BuildContext(state_dir=state_dir / settings.type / settings.name)
        )

    def requirements(self, config: AgentConfig) -> list[str]:
        """What each entry needs outside the agent, as its type says (``check-config``)."""
        notes = []
        for index, entry in enumerate(config.providers):
            kind = self._types.get(entry.type)
            for note in kind.requirements(entry) if kind else []:
                notes.append(f"providers[{index}] ({entry.name}): {note}")
        return notes

    def build_all(self, config: AgentConfig, *, state_dir: Path) -> dict[str, Provider]:
        return {p.name: self.build(p, state_dir=state_dir) for p in config.providers}
