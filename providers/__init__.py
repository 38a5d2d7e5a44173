"""Provider adapters: one module per GPU cloud, each implementing the provider contract.

Adapters speak vk-provider's domain models only; they never import the Kubernetes client,
FastAPI or the controllers. Third-party adapters register through the entry-point group
``vk_provider.providers``.
"""
