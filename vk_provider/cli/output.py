"""Where the command line writes: results on stdout, messages and errors on stderr.

No emoji: a message like "credential env:KEY:" must not turn into a picture of a key; no
markup from data: every message is escaped before it is printed.
"""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

console = Console(stderr=True, soft_wrap=True, emoji=False)
out = Console(soft_wrap=True, emoji=False)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``error: message`` on stderr; the caller raises the ``typer.Exit`` returned."""
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)
