"""Commands the `vk-provider` root loads on first use, never at start-up.

The root group (``PluggableGroup``) knows its own commands (`run`, `check-config`, the REST
queries...) and, by name only, two kinds more:

- the product's heavy ones, listed in ``BUILT_IN`` (`plugin`: the gRPC server kit);
- those other installed distributions declare in the ``vk_provider.commands`` entry-point
  group, each a ``typer.Typer`` (the dev tooling, vk-provider-dev, declares `cluster`,
  `demo` and `local`; a user's own tool may declare more).

Each is a group of subcommands (`vk-provider plugin serve`), unless its ``typer.Typer`` has
just one command of the entry point's own name, which is then the command (`vk-provider demo`).

A command is imported only when the command line names it (or `vk-provider --help` lists
them all), so `vk-provider run` loads none of them: a running agent imports only what it
runs. An entry point that names a command of the product's own is ignored; one that fails
to import is an error of that command alone, naming the distribution.
"""

from __future__ import annotations

import importlib
from functools import cache
from importlib.metadata import entry_points
from typing import Any

import typer
from typer.core import TyperGroup

from vk_provider.cli.output import fail

ENTRY_POINT_GROUP = "vk_provider.commands"
BUILT_IN = {"plugin": "vk_provider.cli.plugin:plugin_app"}


@cache
def declared() -> dict[str, str]:
    """Command name -> ``module:attribute``: the built-in lazy ones, then the entry points."""
    found = dict(BUILT_IN)
    for point in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(point.name, point.value)
    return found


def load(name: str, target: str) -> Any:
    """The (click) command of the ``typer.Typer`` at ``target``, called ``name``; exit 1 with
    a message naming it when it cannot be loaded."""
    module, _, attribute = target.partition(":")
    try:
        app = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise fail(f"command {name!r} ({target}) cannot be loaded: {exc}") from exc
    if not isinstance(app, typer.Typer):
        raise fail(f"command {name!r} ({target}) is not a typer.Typer")
    commands = app.registered_commands
    single = len(commands) == 1 and not app.registered_groups and commands[0].name == name
    command = typer.main.get_command(app) if single else typer.main.get_group(app)
    command.name = name
    return command


# The contexts and commands are typer's own (vendored) click types; typed as Any here.
class PluggableGroup(TyperGroup):
    def list_commands(self, ctx: Any) -> list[str]:
        own = super().list_commands(ctx)
        return own + sorted(name for name in declared() if name not in own)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        own = super().get_command(ctx, cmd_name)
        if own is not None:
            return own
        target = declared().get(cmd_name)
        return load(cmd_name, target) if target is not None else None
