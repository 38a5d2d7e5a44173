"""What the agent spends, as a table: ``vk-provider spend`` (``GET /v1/spend``).

One table: the total, then each namespace against its cap, then each provider — now ($/hour)
and accumulated ($) — with the line that explains the cap columns.

Invariants: a namespace with a cap but no pods is listed all the same (its room matters); a
scope without a cap says ``none``, never a number; every cell is ``tables.cell``, plain text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table
from rich.text import Text

from vk_provider.cli.tables import cell, format_price, new_table


def spend_view(spend: Mapping[str, Any]) -> list[Table | Text]:
    """``spend_table`` and the line that explains its columns."""
    default = (spend.get("budget") or {}).get("default_namespace_per_hour")
    note = "HELD: running and launching pods; ROOM: what one more pod may cost"
    if default is not None:
        note += f"; namespaces not listed: a cap of {format_price(default)} each"
    return [spend_table(spend), Text(note, style="dim")]


def spend_table(spend: Mapping[str, Any]) -> Table:
    """``GET /v1/spend`` as a table: now and accumulated, in all, per namespace against its
    cap, per provider."""
    table = new_table(
        ("SCOPE", "l"),
        ("NAME", "l"),
        ("NOW", "r"),
        ("SPENT", "r"),
        ("CAP", "r"),
        ("HELD", "r"),
        ("ROOM", "r"),
        ("USE", "r"),
    )
    budget = spend.get("budget") or {}
    caps = {n.get("namespace"): n for n in budget.get("namespaces") or []}

    def cap_cells(cap: Mapping[str, Any] | None) -> list[Text]:
        cap = cap or {}
        limit, held, room = (
            cap.get("cap_per_hour"),
            cap.get("used_per_hour"),
            cap.get("room_per_hour"),
        )
        if limit is None:
            return [
                cell("none"),
                cell(format_price(held) if held is not None else None),
                cell(None),
                cell(None),
            ]
        share = f"{100 * held / limit:.0f}%" if limit and held is not None else "-"
        full = room is not None and room <= 0
        return [
            cell(format_price(limit)),
            cell(format_price(held)),
            cell(format_price(room), "bold red" if full else ""),
            cell(share, "bold red" if full else ""),
        ]

    total = spend.get("total") or {}
    table.add_row(
        cell("total", "bold"),
        cell("-"),
        cell(format_price(total.get("per_hour")), "bold"),
        cell(_dollars(total.get("accumulated"))),
        *cap_cells(budget.get("global_cap")),
    )
    namespaces = {n.get("namespace"): n for n in spend.get("namespaces") or []}
    if namespaces or caps:
        table.add_section()
    for name in sorted(set(namespaces) | set(caps), key=str):
        row = namespaces.get(name) or {}
        table.add_row(
            cell("namespace"),
            cell(name, "bold"),
            cell(format_price(row.get("per_hour", 0.0))),
            cell(_dollars(row.get("accumulated", 0.0))),
            *cap_cells(caps.get(name)),
        )
    providers = spend.get("providers") or []
    if providers:
        table.add_section()
    for row in providers:
        table.add_row(
            cell("provider"),
            cell(row.get("provider"), "bold"),
            cell(format_price(row.get("per_hour"))),
            cell(_dollars(row.get("accumulated"))),
            cell("-"),
            cell("-"),
            cell("-"),
            cell("-"),
        )
    return table


def _dollars(value: Any) -> str:
    return "-" if value is None else f"${value:.2f}"
