"""An example provider adapter for vk-provider, shipped as its own package."""
