"""The placement dry run for a person: ``vk-provider place`` (``POST /v1/placements``).

The verdict and why, what the pod asks for, the ranked candidates with their penalties, and
every refused offer with the filter that refused it.

Invariants: shows the API's answer as it is — the ranking and the refusals are the agent's
(``controllers.preview``), never recomputed here; every cell is ``tables.cell``, plain text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table
from rich.text import Text

from vk_provider.cli.tables import cell, format_gpus, format_number, format_price, new_table


def _capacity(offer: Mapping[str, Any]) -> Text:
    return Text("spot", style="yellow") if offer.get("spot") else Text("on-demand")


def _penalties(penalties: Mapping[str, Any]) -> str:
    parts = [
        f"+{100 * float(penalties.get(key) or 0):.3g}% {label}"
        for key, label in (
            ("low_availability", "last instance"),
            ("startup", "slow start-up"),
            ("recent_failures", "recent failures"),
        )
        if penalties.get(key)
    ]
    return ", ".join(parts) or "none"


def _wanted(request: Mapping[str, Any]) -> str:
    models = ",".join(request.get("gpu_models") or []) or "any model"
    parts = [
        f"{request.get('gpu_count')} GPU ({models})",
        f"{format_number(request.get('cpu'))} vCPU",
        f"{format_number(request.get('memory_gib'))} GiB",
        str(request.get("capacity_type")),
    ]
    if request.get("max_price_per_hour") is not None:
        parts.append(f"at most {format_price(request.get('max_price_per_hour'))}")
    if request.get("regions"):
        parts.append("regions " + ",".join(request["regions"]))
    if request.get("providers"):
        parts.append("providers " + ",".join(request["providers"]))
    parts.append(str(request.get("shape")))
    return ", ".join(parts)


_OUTCOMES = {
    "placed": ("would be placed", "bold green"),
    "no_capacity": ("fits no offer now (NoCapacity: it would wait and retry)", "bold yellow"),
    "budget_exceeded": ("is held back by a budget cap (BudgetExceeded)", "bold yellow"),
    "invalid": ("can never run as it is (InvalidSpec)", "bold red"),
}


def placement_view(result: Mapping[str, Any]) -> list[Table | Text]:
    """``POST /v1/placements`` for a person: the verdict and why, the ranked candidates, and
    every refused offer with the filter that refused it."""
    pod = result.get("pod") or {}
    outcome = str(result.get("outcome"))
    verdict, style = _OUTCOMES.get(outcome, (outcome, "bold"))
    shown: list[Table | Text] = []
    head = Text(f"pod {pod.get('namespace')}/{pod.get('name')} ")
    head.append(verdict, style=style)
    chosen = result.get("chosen")
    if isinstance(chosen, Mapping):
        head.append(f" on {chosen.get('key')} at {format_price(chosen.get('price_per_hour'))}")
    shown.append(head)
    request = result.get("request")
    if isinstance(request, Mapping):
        shown.append(Text(f"  asks for: {_wanted(request)}"))
    if result.get("why"):
        shown.append(Text(f"  why: {result.get('why')}"))
    shown.append(Text(f"  event: {result.get('message')}", style="dim"))
    candidates = [c for c in result.get("candidates") or [] if isinstance(c, Mapping)]
    if candidates:
        table = new_table(
            ("RANK", "r"),
            ("OFFER", "l"),
            ("GPUS", "l"),
            ("REGION", "l"),
            ("CAPACITY", "l"),
            ("PRICE", "r"),
            ("SCORE", "r"),
            ("PENALTIES", "l"),
        )
        for candidate in candidates:
            offer = candidate.get("offer") or {}
            table.add_row(
                cell(candidate.get("rank")),
                cell(offer.get("key"), "bold" if candidate.get("rank") == 1 else ""),
                cell(format_gpus(offer.get("gpu_count"), offer.get("gpu_model"))),
                cell(offer.get("region")),
                _capacity(offer),
                cell(format_price(offer.get("price_per_hour"))),
                cell(f"{float(candidate.get('score') or 0):.4f}"),
                cell(_penalties(candidate.get("penalties") or {}), "dim"),
            )
        table.caption = (
            f"a launch tries at most {result.get('tries_at_most')} of these, in this order "
            "(score: price after penalties)"
        )
        shown.append(table)
    refused = [r for r in result.get("refused") or [] if isinstance(r, Mapping)]
    if refused:
        table = new_table(("REFUSED OFFER", "l"), ("PRICE", "r"), ("FILTER", "l"), ("WHY", "l"))
        for refusal in refused:
            offer = refusal.get("offer") or {}
            table.add_row(
                cell(offer.get("key")),
                cell(format_price(offer.get("price_per_hour"))),
                cell(refusal.get("filter"), "bold"),
                cell(refusal.get("reason")),
            )
        removed = [
            f"{f.get('removed')} by {f.get('filter')}"
            for f in result.get("filters") or []
            if isinstance(f, Mapping) and f.get("removed")
        ]
        table.caption = f"{len(refused)} of {result.get('offers_considered')} offers refused: " + (
            ", ".join(removed)
        )
        shown.append(table)
    elif outcome != "invalid":
        shown.append(Text(f"  every one of the {result.get('offers_considered')} offers fits"))
    if result.get("invalid_field"):
        shown.append(Text(f"  field: {result.get('invalid_field')}", style="bold red"))
    return shown
