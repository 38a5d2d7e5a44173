"""Settings: the agent's configuration as pydantic models, validated once and passed as is.

``agent`` holds ``AgentConfig`` and its parts, ``providers`` the base of every provider
type's settings and the ``ProviderType`` a provider package registers, ``secrets`` credential
references, ``configfile`` the bounded reading of YAML (configuration files, manifests,
kubeconfigs). Nothing here does I/O except ``configfile.read_text``/``read_yaml`` (reading a
file, for ``load_config`` and the command line) and ``SecretRef.resolve`` (reading a
credential when an adapter is built).
"""
