"""The ``modal`` provider type, as the registry sees it."""

from __future__ import annotations

from providers.modal.config import ModalProviderConfig
from vk_provider.sdk import BuildContext, Provider, ProviderType


def build(settings: ModalProviderConfig, context: BuildContext) -> Provider:
    # Imported when used: an agent loads only the adapters it runs.
    from providers.modal.adapter import ModalProvider

    return ModalProvider(settings)


PROVIDER_TYPE = ProviderType(
    settings=ModalProviderConfig,
    build=build,
    description="Modal sandboxes through the modal SDK (imported only when used).",
)
