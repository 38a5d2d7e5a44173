"""The operator's tables: the REST API's JSON exactly as it is served in, ``rich`` out.

The cells, formats and printing every table shares; the tables themselves are one module per
family: ``tables_catalog`` (``vk-provider providers | offers``), ``tables_spend``
(``spend``), ``tables_placement`` (``place``) and ``tables_node`` (``pods | overflow``). All
are pure functions; the HTTP calls are ``cli/client.py``'s.

Invariant: every cell is plain text (``rich.text.Text``, made by ``cell``), never markup, so
an error message such as ``[Errno 111]`` or a provider name with brackets is shown as it is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text


def format_price(per_hour: float | None) -> str:
    """``$1.3900/h``: four decimals, because cheap CPU offers cost fractions of a cent."""
    if per_hour is None:
        return "-"
    return f"${per_hour:.4f}/h"


def format_age(seconds: float | None) -> str:
    """A duration as kubectl prints ages: ``45s``, ``12m``, ``5h``, ``3d``."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{int(seconds)}s"
    if seconds < 2 * 3600:
        return f"{int(seconds // 60)}m"
    if seconds < 48 * 3600:
        return f"{int(seconds // 3600)}h"
    return f"{int(seconds // 86400)}d"


def format_number(value: Any) -> str:
    """``8``, ``0.5``: as short as the number is; ``-`` when missing."""
    return "-" if value is None else f"{value:g}"


def format_gib(value: Any) -> str:
    """``80 GiB``; ``-`` when missing or zero."""
    return "-" if not value else f"{value:g} GiB"


def format_gpus(count: Any, model: Any) -> str:
    """``8x H100``; ``none`` for an offer without GPUs."""
    return f"{count}x {model}" if count and model else "none"


def cell(value: Any, style: str = "") -> Text:
    """One cell, as plain text (never markup); ``-`` when missing or empty."""
    return Text("-" if value is None or value == "" else str(value), style=style)


def new_table(*columns: tuple[str, str]) -> Table:
    """A table in the style of them all; columns as (header, "l" or "r" for the justification)."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, header_style="bold", pad_edge=False)
    for header, justify in columns:
        table.add_column(header, justify="right" if justify == "r" else "left")
    return table


def print_tables(console: Console, shown: Table | Sequence[Table | Text]) -> None:
    """Print a table, or tables and lines of text in order (each table as ``print_table``)."""
    for item in [shown] if isinstance(shown, Table) else shown:
        if isinstance(item, Table):
            print_table(console, item)
        else:
            console.print(item, highlight=False)


def print_table(console: Console, table: Table) -> None:
    """Print ``table`` at its natural width, one line per row, as kubectl prints its tables.

    Squeezed into a narrow terminal (or into rich's 80 columns when writing to a pipe), rich
    would wrap cells over several lines or cut them with an ellipsis — a price or an instance
    id cut short is wrong, and wrapped rows defeat ``grep``. A long row is left for the
    terminal to wrap instead. ``Console.print(width=...)`` cannot go beyond the console's own
    width, hence a console of the table's width on the same file, with the same colours.
    """
    natural = console.measure(table, options=console.options.update_width(10_000)).maximum
    wide = Console(
        file=console.file,
        width=max(natural, 20),
        force_terminal=console.is_terminal,
        color_system="auto" if console.color_system else None,
        no_color=console.no_color,
        highlight=False,
    )
    wide.print(table)
