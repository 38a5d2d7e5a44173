"""The `vk-provider` commands that query a running agent's REST API and print tables.

``providers``, ``offers``, ``pods``, ``spend``, ``place`` and ``overflow``: each resolves the
URL and token (a token file wins over ``--token`` and ``VK_PROVIDER_TOKEN``), makes its calls
through ``RestClient`` and prints ``cli/tables_*``' tables, or the API's JSON as is (``-o json``).
Usage errors exit 2, an unreachable or refusing agent 1 (docs/reference.md#exit-codes).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from vk_provider.cli.client import (
    DEFAULT_URL,
    OutputFormat,
    RestClient,
    RestClientError,
    check_token,
    read_token_file,
)
from vk_provider.cli.manifests import (
    ManifestError,
    default_kubeconfig,
    fetch_pod,
    parse_reference,
    read_manifest,
)
from vk_provider.cli.output import console, out
from vk_provider.cli.output import fail as _fail
from vk_provider.cli.tables import print_tables
from vk_provider.cli.tables_catalog import gpus_table, offers_table, providers_table
from vk_provider.cli.tables_node import overflow_table, pods_table
from vk_provider.cli.tables_placement import placement_view
from vk_provider.cli.tables_spend import spend_view
from vk_provider.domain.placement import CapacityType
from vk_provider.domain.workload import without_environment

# Rows per GPU model `vk-provider offers` shows unless --all.
OFFERS_PER_GPU = 5

URL_OPTION = typer.Option(
    DEFAULT_URL, "--url", envvar="VK_PROVIDER_URL", help="Base URL of the agent's REST API."
)
TOKEN_OPTION = typer.Option(
    None,
    "--token",
    envvar="VK_PROVIDER_TOKEN",
    show_default=False,
    help="Bearer token for the REST API.",
)
TOKEN_FILE_OPTION = typer.Option(
    None,
    "--token-file",
    exists=True,
    dir_okay=False,
    readable=True,
    help="Read the bearer token from this file (wins over --token and VK_PROVIDER_TOKEN).",
)
OUTPUT_OPTION = typer.Option(
    OutputFormat.TABLE,
    "--output",
    "-o",
    help="table, wide (more columns, where there are), or json (the API's answer as is).",
)

Shown = Table | Sequence[Table | Text]


def _client_args(url: str, token: str | None, token_file: Path | None) -> str | None:
    """Check ``--url``, resolve the token (a file wins); usage errors exit 2."""
    if not url.startswith(("http://", "https://")):
        raise typer.BadParameter("must be an http:// or https:// URL", param_hint="--url")
    if token_file is not None:
        try:
            return read_token_file(token_file)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--token-file") from exc
    if token is not None:
        try:
            return check_token(token)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--token") from exc
    return None


def _query_api(
    *,
    url: str,
    token: str | None,
    token_file: Path | None,
    output: OutputFormat,
    fetch: Callable[[RestClient], Any],
    render: Callable[[Any], Shown],
    nothing: str,
    empty: Callable[[Any], bool] = lambda data: not data,
) -> None:
    """The shared body of the query commands: resolve the token, fetch, print."""
    token = _client_args(url, token, token_file)
    try:
        with RestClient(url, token=token) as client:
            data = fetch(client)
    except RestClientError as exc:
        raise _fail(escape(str(exc))) from exc
    if output is OutputFormat.JSON:
        typer.echo(json.dumps(data, indent=2))
    elif empty(data):
        console.print(nothing, highlight=False)
    else:
        print_tables(out, render(data))


def providers_command(
    url: str = URL_OPTION,
    token: str | None = TOKEN_OPTION,
    token_file: Path | None = TOKEN_FILE_OPTION,
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Show a running agent's providers: health, circuit breaker, capacity, pods, cost."""
    _query_api(
        url=url,
        token=token,
        token_file=token_file,
        output=output,
        fetch=lambda client: client.providers(),
        render=providers_table,
        nothing="the agent has no providers",
    )


def offers_command(
    gpu: str | None = typer.Option(
        None, "--gpu", help="GPU models, comma-separated; H100 matches every H100 variant."
    ),
    region: str | None = typer.Option(None, "--region", help="Regions, comma-separated."),
    provider: str | None = typer.Option(None, "--provider", help="Providers, comma-separated."),
    spot: bool = typer.Option(False, "--spot", help="Only offers with a spot price, sorted by it."),
    capacity_type: CapacityType = typer.Option(
        CapacityType.ANY, "--capacity-type", help="on-demand, spot or any (--spot is spot)."
    ),
    show_all: bool = typer.Option(
        False, "--all", help=f"Every row, not only the {OFFERS_PER_GPU} cheapest per GPU model."
    ),
    flat: bool = typer.Option(
        False, "--flat", help="One row per offer, as GET /v1/offers (the former table)."
    ),
    url: str = URL_OPTION,
    token: str | None = TOKEN_OPTION,
    token_file: Path | None = TOKEN_FILE_OPTION,
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Show the offers a running agent knows, by GPU model, cheapest per GPU first: per-GPU
    and instance prices, on-demand and spot side by side (GET /v1/gpus; -o json is its
    answer, documented in docs/operating.md)."""
    kind = CapacityType.SPOT if spot else capacity_type
    if flat:
        _query_api(
            url=url,
            token=token,
            token_file=token_file,
            output=output,
            fetch=lambda client: client.offers(
                gpu=gpu, region=region, provider=provider, capacity_type=kind.value
            ),
            render=offers_table,
            nothing="no offers match",
        )
        return
    _query_api(
        url=url,
        token=token,
        token_file=token_file,
        output=output,
        fetch=lambda client: client.gpus(
            gpu=gpu,
            region=region,
            provider=provider,
            capacity_type=kind.value,
            limit=0 if show_all else OFFERS_PER_GPU,
        ),
        render=lambda found: gpus_table(found, wide=output is OutputFormat.WIDE),
        nothing="no offers match",
        empty=lambda found: not found.get("shown"),
    )


def pods_command(
    url: str = URL_OPTION,
    token: str | None = TOKEN_OPTION,
    token_file: Path | None = TOKEN_FILE_OPTION,
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Show where a running agent's pods run, since when, and at what price."""
    _query_api(
        url=url,
        token=token,
        token_file=token_file,
        output=output,
        fetch=lambda client: client.pods(),
        render=pods_table,
        nothing="the agent runs no pods",
    )


def spend_command(
    url: str = URL_OPTION,
    token: str | None = TOKEN_OPTION,
    token_file: Path | None = TOKEN_FILE_OPTION,
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Show what a running agent's pods cost: $/hour now and $ spent, in all, per namespace
    and per provider, against the budget caps and what is left under each."""
    _query_api(
        url=url,
        token=token,
        token_file=token_file,
        output=output,
        fetch=lambda client: client.spend(),
        render=spend_view,
        nothing="",
        empty=lambda _spend: False,
    )


def place_command(
    pod: str | None = typer.Argument(
        None, metavar="[NAMESPACE/NAME]", help="An existing pod, read with your kubeconfig."
    ),
    filename: str | None = typer.Option(
        None,
        "--filename",
        "-f",
        help="A manifest (YAML or JSON, - for stdin): a Pod, or a workload's pod template.",
    ),
    namespace: str | None = typer.Option(
        None, "--namespace", "-n", help="The pod's namespace (what budgets count it against)."
    ),
    kubeconfig: Path | None = typer.Option(
        None,
        "--kubeconfig",
        help="For NAMESPACE/NAME: default the first file of $KUBECONFIG, then ~/.kube/config.",
    ),
    url: str = URL_OPTION,
    token: str | None = TOKEN_OPTION,
    token_file: Path | None = TOKEN_FILE_OPTION,
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Where would this pod go, and why? Runs the agent's own placement on its live offers,
    budgets and breaker states (POST /v1/placements) and prints the ranked candidates and,
    for every other offer, the filter that refused it. Nothing is launched or reserved."""
    if (pod is None) == (filename is None):
        raise typer.BadParameter("give either NAMESPACE/NAME or -f FILE", param_hint="POD")
    try:
        if filename is not None:
            manifest = read_manifest(filename, namespace=namespace)
        else:
            assert pod is not None
            ns, name = parse_reference(pod, namespace=namespace)
            manifest = fetch_pod(ns, name, kubeconfig=kubeconfig or default_kubeconfig())
    except ManifestError as exc:
        raise _fail(str(exc), code=2 if filename is not None else 1) from exc
    # Placement does not read the environment: it does not leave this machine either.
    body = without_environment(manifest)
    _query_api(
        url=url,
        token=token,
        token_file=token_file,
        output=output,
        fetch=lambda client: client.place(body),
        render=placement_view,
        nothing="",
        empty=lambda _result: False,
    )


def overflow_command(
    url: str = URL_OPTION,
    token: str | None = TOKEN_OPTION,
    token_file: Path | None = TOKEN_FILE_OPTION,
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Show a running agent's overflow flip: open or closed, since when, and why."""
    _query_api(
        url=url,
        token=token,
        token_file=token_file,
        output=output,
        fetch=lambda client: client.overflow(),
        render=overflow_table,
        nothing="",
    )


def register_queries(app: typer.Typer) -> None:
    """Add the query commands to the ``vk-provider`` command."""
    app.command("providers")(providers_command)
    app.command("offers")(offers_command)
    app.command("pods")(pods_command)
    app.command("spend")(spend_command)
    app.command("place")(place_command)
    app.command("overflow")(overflow_command)
