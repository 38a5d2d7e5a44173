"""The ``modal`` provider type, as the registry sees it."""

from __future__ import annotations

from vk_provider.sdk import BuildContext, Provider, ProviderType
from vk_provider_adapters.modal.config import ModalProviderConfig


def build(settings: ModalProviderConfig, context: BuildContext) -> Provider:
    # Imported when used: an agent loads only the adapters it runs.
    from vk_provider_adapters.modal.adapter import ModalProvider

    return ModalProvider(settings)


PROVIDER_TYPE = ProviderType(
    settings=ModalProviderConfig,
    build=build,
    description="Modal sandboxes through the modal SDK (imported only when used).",
)
