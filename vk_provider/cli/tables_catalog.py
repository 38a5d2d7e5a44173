"""What the agent can launch on, as tables: ``vk-provider providers`` and ``offers``.

``GET /v1/providers`` (health, breaker, capacity, cost, failures), ``GET /v1/gpus`` (what
``offers`` prints: grouped by GPU model, per-GPU prices first, on-demand and spot side by
side) and ``GET /v1/offers`` (``offers --flat``: one row per offer).

Invariants: rows keep the API's order (cheapest first), never re-sorted here; a CPU-only row
shows no per-GPU price; every cell is ``tables.cell``, plain text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from vk_provider.cli.tables import (
    cell,
    format_age,
    format_gib,
    format_gpus,
    format_number,
    format_price,
    new_table,
)

_BREAKER_STYLES = {"closed": "green", "half-open": "yellow", "open": "bold red"}


def providers_table(providers: Sequence[Mapping[str, Any]]) -> Table:
    """``GET /v1/providers`` as a table: health first, then capacity and cost, then failures."""
    table = new_table(
        ("NAME", "l"),
        ("TYPE", "l"),
        ("HEALTHY", "l"),
        ("BREAKER", "l"),
        ("OFFERS", "r"),
        ("GPUS FREE", "r"),
        ("PODS", "r"),
        ("COST", "r"),
        ("FAILURES", "r"),
        ("LAST ANSWER", "r"),
        ("LAST ERROR", "l"),
    )
    for p in providers:
        state = str(p.get("breaker_state", "?"))
        healthy = bool(p.get("healthy"))
        consecutive, recent = p.get("consecutive_failures", 0), p.get("recent_failures", 0)
        failures = f"{consecutive} ({recent} recent)" if consecutive or recent else "0"
        age = p.get("last_answer_age_seconds")
        table.add_row(
            cell(p.get("name"), "bold"),
            cell(p.get("type")),
            Text("yes", style="green") if healthy else Text("no", style="red"),
            cell(state, _BREAKER_STYLES.get(state, "")),
            cell(p.get("offer_count")),
            cell(p.get("gpus_available")),
            cell(p.get("running_pods")),
            cell(format_price(p.get("spend_per_hour"))),
            cell(failures, "red" if consecutive else ""),
            cell("never" if age is None else f"{format_age(age)} ago"),
            cell(p.get("last_error"), "dim"),
        )
    return table


def offers_table(offers: Sequence[Mapping[str, Any]]) -> Table:
    """``GET /v1/offers`` as a table, in the API's order (cheapest first)."""
    table = new_table(
        ("PROVIDER", "l"),
        ("SKU", "l"),
        ("GPUS", "l"),
        ("GPU MEMORY", "r"),
        ("VCPUS", "r"),
        ("MEMORY", "r"),
        ("REGION", "l"),
        ("CAPACITY", "l"),
        ("AVAIL", "r"),
        ("STARTUP", "r"),
        ("PRICE", "r"),
    )
    for o in offers:
        spot = bool(o.get("spot"))
        table.add_row(
            cell(o.get("provider"), "bold"),
            cell(o.get("sku")),
            cell(format_gpus(o.get("gpu_count"), o.get("gpu_model"))),
            cell(format_gib(o.get("gpu_memory_gib"))),
            cell(format_number(o.get("vcpus"))),
            cell(format_gib(o.get("memory_gib"))),
            cell(o.get("region")),
            Text("spot", style="yellow") if spot else Text("on-demand"),
            cell(o.get("available")),
            cell(format_age(o.get("startup_seconds"))),
            cell(format_price(o.get("price_per_hour")), "bold"),
        )
    table.caption = f"{len(offers)} offers, cheapest first"
    return table


def _per_gpu(value: Any) -> str:
    return "-" if value is None else format_price(value)


def gpus_table(found: Mapping[str, Any], *, wide: bool = False) -> Table:
    """``GET /v1/gpus`` as a table: one section per GPU model, cheapest per GPU first, the
    per-GPU price first (so 1x and 8x compare), on-demand and spot side by side."""
    columns = [
        ("GPU", "l"),
        ("QTY", "r"),
        ("$/GPU/H", "r"),
        ("SPOT $/GPU/H", "r"),
        ("$/H", "r"),
        ("SPOT $/H", "r"),
        ("GPU MEM", "r"),
        ("VCPUS", "r"),
        ("MEMORY", "r"),
        ("REGION", "l"),
        ("PROVIDER", "l"),
    ]
    if wide:
        columns += [("SKU", "l"), ("AVAIL", "r"), ("SPOT AVAIL", "r"), ("STARTUP", "r")]
    table = new_table(*columns)
    groups = [g for g in found.get("gpus") or [] if isinstance(g, Mapping)]
    for index, group in enumerate(groups):
        if index:
            table.add_section()
        for row in group.get("rows") or []:
            gpus = bool(row.get("gpu_count"))  # CPU-only rows have no per-GPU price
            cells = [
                cell(row.get("gpu_model") or "CPU only", "bold"),
                cell(row.get("gpu_count")),
                cell(_per_gpu(row.get("price_per_gpu_hour") if gpus else None), "bold"),
                cell(_per_gpu(row.get("spot_price_per_gpu_hour") if gpus else None), "yellow"),
                cell(_per_gpu(row.get("price_per_hour"))),
                cell(_per_gpu(row.get("spot_price_per_hour"))),
                cell(format_gib(row.get("gpu_memory_gib"))),
                cell(format_number(row.get("vcpus"))),
                cell(format_gib(row.get("memory_gib"))),
                cell(row.get("region")),
                cell(row.get("provider")),
            ]
            if wide:
                cells += [
                    cell(row.get("sku")),
                    cell(row.get("available")),
                    cell(row.get("spot_available")),
                    cell(format_age(row.get("startup_seconds"))),
                ]
            table.add_row(*cells)
    shown, total, limit = found.get("shown"), found.get("total"), found.get("limit")
    caption = f"{shown} of {total} offers shown, cheapest per GPU first"
    if limit and shown != total:
        caption += f" (at most {limit} per GPU model; --all shows every one)"
    table.caption = caption
    return table
