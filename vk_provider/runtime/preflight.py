"""What the agent checks before it talks to a cluster: the same for `check-config` and `run`.

``build_providers`` builds every configured adapter (resolving its credentials, loading an
SDK, reading a kubeconfig, refusing a local provider that is not enabled) and
``check_local_files`` reads the TLS files and the REST token the configuration names. Every
problem is reported, each naming its field, in one ``ConfigError`` — `check-config` and
`run` both exit 2 with exactly those lines.

``start_providers`` is `run`'s one step beyond that: it starts the providers that must start
before they are used (an out-of-process plugin reads its capabilities), after the checks.

Invariants: no network call is made by the checks (only by ``start_providers``); a
credential's value never appears in a message (``SecretRef.resolve`` names the reference
only); adapters built only to check them are closed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path

from vk_provider.domain.contract import Provider, SupportsStart
from vk_provider.domain.errors import ProviderError
from vk_provider.runtime.registry import Registry
from vk_provider.settings.agent import AgentConfig
from vk_provider.settings.secrets import ConfigError

_BUILD_ERRORS = (ConfigError, ValueError, RuntimeError, ImportError, OSError)


def build_providers(
    config: AgentConfig, registry: Registry, *, state_dir: Path
) -> dict[str, Provider]:
    """Every configured adapter, or one ``ConfigError`` naming each that cannot be built."""
    built: dict[str, Provider] = {}
    errors: list[str] = []
    for index, entry in enumerate(config.providers):
        try:
            built[entry.name] = registry.build(entry, state_dir=state_dir)
        except _BUILD_ERRORS as exc:
            errors.append(f"providers[{index}] ({entry.name}, type {entry.type}): {exc}")
    if errors:
        raise ConfigError("\n".join(errors))
    return built


def _readable(path: Path | None, field: str, errors: list[str]) -> None:
    if path is None:
        return
    try:
        path.read_bytes()
    except OSError as exc:
        errors.append(f"{field}: cannot read {path} ({exc.strerror})")


def check_local_files(config: AgentConfig) -> None:
    """TLS material and the REST token, as ``run`` will read them."""
    errors: list[str] = []
    api = config.kubelet_api
    if (api.tls_cert_file is None) != (api.tls_key_file is None):
        errors.append("kubelet_api.tls_cert_file: give both tls_cert_file and tls_key_file")
    _readable(api.tls_cert_file, "kubelet_api.tls_cert_file", errors)
    _readable(api.tls_key_file, "kubelet_api.tls_key_file", errors)
    _readable(api.client_ca_file, "kubelet_api.client_ca_file", errors)
    if api.tls_cert_file and api.tls_key_file and not errors:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(api.tls_cert_file, api.tls_key_file)
        except (ssl.SSLError, ValueError) as exc:
            errors.append(f"kubelet_api.tls_cert_file: not a usable certificate and key ({exc})")
    if api.client_ca_file and not errors:
        try:
            ssl.create_default_context(cafile=str(api.client_ca_file))
        except (ssl.SSLError, ValueError) as exc:
            errors.append(f"kubelet_api.client_ca_file: not a CA bundle ({exc})")
    token = config.rest.static_token
    if token is not None:
        try:
            if not token.resolve():
                errors.append(f"rest.static_token: credential {token.ref} is empty")
        except ConfigError as exc:
            errors.append(f"rest.static_token: {exc}")
    if errors:
        raise ConfigError("\n".join(errors))


async def close_all(providers: dict[str, Provider]) -> None:
    for provider in providers.values():
        with contextlib.suppress(Exception):
            await provider.close()


async def checked_providers(
    config: AgentConfig, registry: Registry, *, state_dir: Path
) -> dict[str, Provider]:
    """Everything `run` checks before it talks to a cluster, then the adapters it built.

    One ``ConfigError`` lists every problem (files and providers alike).
    """
    errors: list[str] = []
    providers: dict[str, Provider] = {}
    try:
        providers = build_providers(config, registry, state_dir=state_dir)
    except ConfigError as exc:
        errors.append(str(exc))
    try:
        check_local_files(config)
    except ConfigError as exc:
        errors.append(str(exc))
    if errors:
        await close_all(providers)
        raise ConfigError("\n".join(errors))
    return providers


class ProviderStartFailed(RuntimeError):
    """A provider that must start before the agent wires it (``SupportsStart``) could not."""


async def start_providers(providers: dict[str, Provider]) -> None:
    """``start()`` every provider that has it (an out-of-process plugin: connect, read its
    capabilities), all at once; one error lists each that failed. `run` only: this talks to
    the plugins, which `check-config` does not."""
    starting = {n: p for n, p in providers.items() if isinstance(p, SupportsStart)}
    results = await asyncio.gather(*(p.start() for p in starting.values()), return_exceptions=True)
    errors = []
    for name, result in zip(starting, results, strict=True):
        if isinstance(result, ProviderError):
            errors.append(f"provider {name} cannot start: {result}")
        elif isinstance(result, BaseException):
            raise result
    if errors:
        raise ProviderStartFailed("\n".join(errors))


async def preflight(config: AgentConfig, registry: Registry, *, state_dir: Path) -> None:
    """`check-config`: the checks of ``checked_providers``, nothing kept."""
    await close_all(await checked_providers(config, registry, state_dir=state_dir))
