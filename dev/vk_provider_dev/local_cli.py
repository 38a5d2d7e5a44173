"""`vk-provider local ...`: steer the `local` provider by hand (development, the demo).

Faults are overrides in the provider's state directory, read by the running agent on every
call (``vk_provider_adapters.local.faults``), so they take effect at once and without a restart:

    vk-provider local faults DIR --fail-creates 3 --create-error capacity
    vk-provider local faults DIR --call-failure-rate 0.3      # a flaky cloud
    vk-provider local faults DIR --clear
    vk-provider local lose DIR INSTANCE_ID                    # the cloud reclaims one
    vk-provider local instances DIR

``DIR`` is the provider's ``state_dir`` (the demo prints its providers' directories).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from vk_provider.cli.tables import print_table
from vk_provider_adapters.local.adapter import LocalProvider
from vk_provider_adapters.local.config import LocalProviderConfig
from vk_provider_adapters.local.faults import clear_faults, inject_loss, set_faults

local_app = typer.Typer(
    help="Steer the local provider by hand: inject and clear faults, lose instances.",
    no_args_is_help=True,
)
_out = Console(soft_wrap=True, emoji=False)
_err = Console(stderr=True, soft_wrap=True, emoji=False)

DIR_ARGUMENT = typer.Argument(
    ..., exists=True, file_okay=False, help="The local provider's state directory."
)


@local_app.command("faults")
def faults(
    state_dir: Path = DIR_ARGUMENT,
    call_failure_rate: float | None = typer.Option(
        None, help="Share of all calls that fail like a real API (429, 503, timeouts)."
    ),
    create_failure_rate: float | None = typer.Option(None, help="Share of creates that fail."),
    fail_creates: int | None = typer.Option(None, help="The next N creates fail."),
    create_error: str | None = typer.Option(
        None, help="How a failing create fails: capacity, transient, rate_limited, auth."
    ),
    api_latency_seconds: float | None = typer.Option(None, help="Delay added to every call."),
    clear: bool = typer.Option(False, "--clear", help="Drop every override."),
) -> None:
    """Set (or clear) the faults of a running local provider; they apply at once."""
    if clear:
        clear_faults(state_dir)
        _out.print(f"faults of {state_dir} cleared: the configured ones apply", markup=False)
        return
    try:
        set_faults(
            state_dir,
            call_failure_rate=call_failure_rate,
            create_failure_rate=create_failure_rate,
            fail_creates=fail_creates,
            create_error=create_error,
            api_latency_seconds=api_latency_seconds,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    _out.print(f"faults of {state_dir} set", markup=False)


@local_app.command("lose")
def lose(
    state_dir: Path = DIR_ARGUMENT,
    instance_id: str = typer.Argument(
        ..., help="The instance to lose (vk-provider.io/instance-id)."
    ),
    message: str = typer.Option("lost by hand", help="What the provider will say happened."),
) -> None:
    """Make the provider lose one instance, as a cloud reclaiming it: its pod fails
    (InstanceLost) and its controller replaces it."""
    try:
        inject_loss(state_dir, instance_id, message)
    except FileNotFoundError as exc:
        _err.print(f"error: {exc}", markup=False)
        raise typer.Exit(1) from exc
    _out.print(f"{instance_id} lost", markup=False)


@local_app.command("instances")
def instances(state_dir: Path = DIR_ARGUMENT) -> None:
    """What the provider runs: every instance in its state directory, with its state."""
    provider = LocalProvider(
        LocalProviderConfig(type="local", name="inspect", enabled=True, offers=[]),
        state_dir=state_dir,
    )
    table = Table("INSTANCE", "POD UID", "ATTEMPT", "STATE", "OFFER", "MESSAGE", box=None)
    for found in asyncio.run(provider.list_ours()):
        table.add_row(
            found.instance_id,
            found.pod_uid,
            str(found.attempt),
            found.state.value,
            found.offer_key,
            found.message,
        )
    print_table(_out, table)  # whole ids, never cut to the terminal's width
