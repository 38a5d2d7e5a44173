"""`vk-provider plugin serve`: run one provider adapter as its own process over gRPC.

    vk-provider plugin serve --type local --config local.yaml --listen unix:///run/vk/local.sock
    vk-provider plugin serve --type local --config local.yaml --listen 127.0.0.1:7443 \\
        --tls-cert server.crt --tls-key server.key --client-ca agents-ca.crt

Whoever can call the plugin spends the account its configuration holds, so it serves only
callers it authenticates: mutual TLS (``--tls-cert``, ``--tls-key`` and ``--client-ca``) or a
Unix socket (mode 0600, in a directory owned by this user or root that neither group nor
others may write; ``server.exposure``). Anything else exits 2 naming the flags to give, unless
``--insecure``, which serves anyway and logs a WARNING at start naming what is exposed. Plain
TCP on a host that is not loopback is refused even then.

``--config`` is one provider entry (what would be one item of ``providers:`` in the agent's
configuration; its ``type`` may be left out, ``--type`` says it). Any registered provider type
can be served, third-party ones too. The agent reaches it with a ``type: grpc`` entry
(docs/configuration.md). Once listening, the command prints ``listening on ADDRESS`` (the port
chosen when ``:0`` was asked) on standard output; SIGTERM or SIGINT stops it and closes the
adapter. Exit 2 for a bad configuration (the message names the field), 1 when serving fails.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from vk_provider.runtime.preflight import close_all
from vk_provider.runtime.registry import Registry
from vk_provider.settings.configfile import read_yaml
from vk_provider.settings.secrets import ConfigError
from vk_provider_adapters.plugin.address import PluginAddress, parse_address
from vk_provider_adapters.plugin.server import Exposure, ServerTLS, exposure, serve

plugin_app = typer.Typer(
    help="Serve a provider adapter as its own process over gRPC (the agent's `grpc` type).",
    no_args_is_help=True,
)
_err = Console(stderr=True, soft_wrap=True, emoji=False)


def _fail(message: str, code: int) -> typer.Exit:
    _err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)


def _entry(path: Path, kind: str) -> dict[str, object]:
    data = read_yaml(path)  # not UTF-8, too large or too deep: a ConfigError naming the file
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected one provider entry (a mapping) at the top level")
    given = data.get("type", kind)
    if given != kind:
        raise ConfigError(f"type: the file says {given!r}, --type says {kind!r}")
    return {**data, "type": kind}


def _tls(cert: Path | None, key: Path | None, client_ca: Path | None) -> ServerTLS | None:
    if cert is None and key is None:
        if client_ca is not None:
            raise ConfigError("--client-ca: needs --tls-cert and --tls-key")
        return None
    if cert is None or key is None:
        raise ConfigError("--tls-cert: give both --tls-cert and --tls-key")
    for flag, path in (("--tls-cert", cert), ("--tls-key", key), ("--client-ca", client_ca)):
        if path is not None and not path.is_file():
            raise ConfigError(f"{flag}: {path} is not a readable file")
    return ServerTLS(cert_file=cert, key_file=key, client_ca_file=client_ca)


def _refusal(listen: str, exposed: Exposure) -> ConfigError:
    if exposed.kind == "socket-directory":
        return ConfigError(
            f"--listen: {listen}: {exposed.problem} ({exposed.consequence}): put the socket in "
            "a directory of this user that neither group nor others may write (mode 0700), "
            "or pass --insecure to serve anyway"
        )
    flag = "--client-ca" if exposed.kind == "no-client-ca" else "--listen"
    return ConfigError(
        f"{flag}: {listen}: {exposed.problem} ({exposed.consequence}): give --tls-cert, "
        "--tls-key and --client-ca (mutual TLS), or listen on unix:///path.sock, or pass "
        "--insecure to serve anyway"
    )


def _listening(bound: PluginAddress) -> None:
    print(f"listening on {bound}", flush=True)


async def _serve(
    kind: str, config: Path, listen: str, tls: ServerTLS | None, state: Path, *, insecure: bool
) -> None:
    registry = Registry.default()
    settings = registry.parse_provider(_entry(config, kind))
    providers = {settings.name: registry.build(settings, state_dir=state)}
    provider = providers[settings.name]
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await serve(provider, listen, tls=tls, insecure=insecure, on_listening=_listening)
    except asyncio.CancelledError:
        pass  # a signal: stop cleanly
    finally:
        await close_all(providers)


@plugin_app.command("serve")
def serve_command(
    kind: str = typer.Option(..., "--type", help="Provider type to serve (local, runpod, ...)."),
    config: Path = typer.Option(..., "--config", help="One provider entry (YAML)."),
    listen: str = typer.Option(
        ..., "--listen", help="unix:///path/to.sock, or host:port (port 0: any free port)."
    ),
    tls_cert: Path | None = typer.Option(None, "--tls-cert", help="Server certificate (PEM)."),
    tls_key: Path | None = typer.Option(None, "--tls-key", help="Its private key (PEM)."),
    client_ca: Path | None = typer.Option(
        None, "--client-ca", help="Require client certificates signed by this CA (PEM)."
    ),
    insecure: bool = typer.Option(
        False,
        "--insecure",
        help="Serve callers without authenticating them (plain TCP on loopback, TLS without "
        "--client-ca, a socket in a directory others may write); logged as a WARNING.",
    ),
    state_dir: Path | None = typer.Option(
        None, "--state-dir", help="State of the adapter (the local provider's instances)."
    ),
) -> None:
    """Serve one provider adapter over gRPC until SIGTERM/SIGINT."""
    from vk_provider.settings.paths import state_root

    try:
        where = parse_address(listen, server=True)
        tls = _tls(tls_cert, tls_key, client_ca)
        if tls is not None and where.unix_path is not None:
            raise ConfigError("--tls-cert: TLS is for TCP; a Unix socket has file permissions")
        if tls is None and where.unix_path is None and not where.loopback:
            raise ConfigError(
                f"--listen: {listen} is reachable from other hosts: give --tls-cert, --tls-key "
                "and --client-ca"
            )
        exposed = exposure(where, tls)
        if exposed is not None and not insecure:
            raise _refusal(listen, exposed)
    except ValueError as exc:  # ConfigError is a ValueError too
        raise _fail(str(exc) if isinstance(exc, ConfigError) else f"--listen: {exc}", 2) from exc
    state = state_dir or state_root() / "plugins"
    logging.basicConfig(  # the --insecure WARNING, and the adapter's own lines, on stderr
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        asyncio.run(_serve(kind, config, listen, tls, state, insecure=insecure))
    except ConfigError as exc:
        raise _fail(f"invalid provider configuration:\n{exc}", 2) from exc
    except (OSError, RuntimeError, ValueError) as exc:
        raise _fail(f"cannot serve: {type(exc).__name__}: {exc}", 1) from exc
    sys.stdout.flush()
