"""Settings: the agent's configuration as pydantic models, validated once and passed as is.

``agent`` holds ``AgentConfig`` and its parts, ``providers`` the base of every provider
type's settings and the ``ProviderType`` a provider package registers, ``secrets`` credential
references. Nothing here does I/O except ``load_config`` (reading the file) and
``SecretRef.resolve`` (reading a credential when an adapter is built).
"""
