"""The ``local`` provider: runs each container's command as a process on this machine
(development, demo, tests). ``runner`` is started as ``python -m vk_provider_adapters.local.runner``
and imports only the standard library, so this package's ``__init__`` imports nothing.
"""
