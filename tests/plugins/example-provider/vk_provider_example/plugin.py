"""What the agent's registry loads through the entry point: the type, its settings, a factory."""

from vk_provider.sdk import BuildContext, Provider, ProviderType
from vk_provider_example.adapter import ExampleProvider
from vk_provider_example.config import ExampleSettings


def build(settings: ExampleSettings, context: BuildContext) -> Provider:
    return ExampleProvider(settings)


PROVIDER_TYPE = ProviderType(
    settings=ExampleSettings,
    build=build,
    description="One simulated GPU, kept in memory (an example third-party adapter).",
)
