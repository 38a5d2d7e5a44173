"""Provider adapters: one package per GPU cloud, each implementing the provider contract.

Adapters speak the domain only (``vk_provider.domain``: models, errors, the ``Provider``
protocol) and their own settings (``vk_provider.settings``); they never import the agent's
Kubernetes client, FastAPI or the controllers (import-linter enforces it). Each package has
a ``plugin.py`` whose ``PROVIDER_TYPE`` the registry lists; third-party adapters publish
theirs through the entry-point group ``vk_provider.providers``.
"""
