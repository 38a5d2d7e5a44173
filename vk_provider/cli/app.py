"""The `vk-provider` command line.

Exit codes (docs/reference.md): 0 success, 2 usage or configuration error, 1 runtime failure.
Commands only parse arguments and print; the work lives in the modules they call.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import typer

from vk_provider.cli.output import fail as _fail
from vk_provider.cli.output import out
from vk_provider.cli.plugins import PluggableGroup
from vk_provider.cli.query import register_queries
from vk_provider.runtime.registry import Registry
from vk_provider.settings.schema import SCHEMA_HINT
from vk_provider.settings.secrets import ConfigError

# Commands beyond these load on first use (``cli.plugins``): `plugin ...` (the gRPC server
# kit) and whatever another distribution declares, such as the dev tooling's `cluster`,
# `demo` and `local`.
app = typer.Typer(
    cls=PluggableGroup,
    help="vk-provider: a virtual Kubernetes node backed by rented GPU clouds.",
    no_args_is_help=True,
    add_completion=False,
)
config_app = typer.Typer(help="The agent's configuration file.", no_args_is_help=True)
app.add_typer(config_app, name="config")
register_queries(app)


@app.command("run")
def run(
    config: Path = typer.Option(..., "--config", help="Agent configuration (YAML)."),
    kubeconfig: Path | None = typer.Option(
        None, "--kubeconfig", help="Kubeconfig file; in-cluster configuration when absent."
    ),
    state_dir: Path | None = typer.Option(
        None, "--state-dir", help="Where local state (TLS material, local instances) lives."
    ),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning, error."),
    log_format: str = typer.Option(
        "text", "--log-format", help="text (for people) or json (one object per line)."
    ),
) -> None:
    """Run the agent: register the virtual node and run its pods through the providers."""
    from vk_provider.runtime.agent import run_agent
    from vk_provider.runtime.logs import LOG_FORMATS, setup_logging
    from vk_provider.runtime.supervisor import AgentFailed

    if log_format not in LOG_FORMATS:
        raise _fail(f"--log-format must be text or json, not {log_format!r}", code=2)

    try:
        registry = Registry.default()
        settings = registry.load_config(config)
    except ConfigError as exc:
        raise _fail(f"invalid configuration:\n{exc}", code=2) from exc
    setup_logging(log_level, "json" if log_format == "json" else "text")
    try:
        asyncio.run(
            run_agent(settings, registry=registry, kubeconfig=kubeconfig, state_dir=state_dir)
        )
    except ConfigError as exc:  # what check-config reports, found before the cluster is asked
        raise _fail(f"invalid configuration:\n{exc}", code=2) from exc
    except AgentFailed as exc:
        raise _fail(str(exc)) from exc
    except Exception as exc:
        raise _fail(f"the agent stopped: {type(exc).__name__}: {exc}") from exc


@app.command("check-config")
def check_config(
    path: Path = typer.Argument(..., help="Configuration file to validate."),
    state_dir: Path | None = typer.Option(
        None, "--state-dir", help="The state directory `run` would use (for local providers)."
    ),
) -> None:
    """Validate a configuration as `run` would before it talks to a cluster: the file, every
    provider built with its credentials, TLS files and tokens read. Every error names the
    field and why (exit 2 if invalid)."""
    from vk_provider.runtime.agent import default_state_dir
    from vk_provider.runtime.preflight import preflight

    try:
        registry = Registry.default()
        settings = registry.load_config(path)
        state = state_dir or default_state_dir(settings)
        asyncio.run(preflight(settings, registry, state_dir=state))
    except ConfigError as exc:
        raise _fail(f"{path} is invalid:\n{exc}\n{SCHEMA_HINT}", code=2) from exc
    names = ", ".join(f"{p.name} ({p.type})" for p in settings.providers)
    out.print(f"{path}: valid. Node {settings.node.name}; providers: {names}", highlight=False)
    for note in registry.requirements(settings):
        out.print(f"note: {note}", highlight=False, markup=False)


@config_app.command("schema")
def config_schema() -> None:
    """Print the JSON Schema of the configuration file, every installed provider type
    included: point your editor at it for completion and checks (docs/configuration.md)."""
    try:
        schema = Registry.default().config_schema()
    except ConfigError as exc:
        raise _fail(str(exc), code=2) from exc
    typer.echo(json.dumps(schema, indent=2))


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
