"""The operator's tables: the REST API's JSON exactly as it is served in, ``rich`` out.

Pure functions for ``vk-provider providers | offers | pods | spend | place | overflow``; the
HTTP calls are ``cli/client.py``'s.

Invariant: every cell is plain text (``rich.text.Text``), never markup, so an error message
such as ``[Errno 111]`` or a provider name with brackets is shown as it is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

_BREAKER_STYLES = {"closed": "green", "half-open": "yellow", "open": "bold red"}
_PHASE_STYLES = {"Running": "green", "Pending": "yellow", "Failed": "red", "Succeeded": "dim"}


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


def _number(value: Any) -> str:
    return "-" if value is None else f"{value:g}"


def _gib(value: Any) -> str:
    return "-" if not value else f"{value:g} GiB"


def _gpus(count: Any, model: Any) -> str:
    return f"{count}x {model}" if count and model else "none"


def _text(value: Any, style: str = "") -> Text:
    return Text("-" if value is None or value == "" else str(value), style=style)


def _table(*columns: tuple[str, str]) -> Table:
    """Columns as (header, "l" or "r" for the justification)."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, header_style="bold", pad_edge=False)
    for header, justify in columns:
        table.add_column(header, justify="right" if justify == "r" else "left")
    return table


def providers_table(providers: Sequence[Mapping[str, Any]]) -> Table:
    """``GET /v1/providers`` as a table: health first, then capacity and cost, then failures."""
    table = _table(
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
            _text(p.get("name"), "bold"),
            _text(p.get("type")),
            Text("yes", style="green") if healthy else Text("no", style="red"),
            _text(state, _BREAKER_STYLES.get(state, "")),
            _text(p.get("offer_count")),
            _text(p.get("gpus_available")),
            _text(p.get("running_pods")),
            _text(format_price(p.get("spend_per_hour"))),
            _text(failures, "red" if consecutive else ""),
            _text("never" if age is None else f"{format_age(age)} ago"),
            _text(p.get("last_error"), "dim"),
        )
    return table


def offers_table(offers: Sequence[Mapping[str, Any]]) -> Table:
    """``GET /v1/offers`` as a table, in the API's order (cheapest first)."""
    table = _table(
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
            _text(o.get("provider"), "bold"),
            _text(o.get("sku")),
            _text(_gpus(o.get("gpu_count"), o.get("gpu_model"))),
            _text(_gib(o.get("gpu_memory_gib"))),
            _text(_number(o.get("vcpus"))),
            _text(_gib(o.get("memory_gib"))),
            _text(o.get("region")),
            Text("spot", style="yellow") if spot else Text("on-demand"),
            _text(o.get("available")),
            _text(format_age(o.get("startup_seconds"))),
            _text(format_price(o.get("price_per_hour")), "bold"),
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
    table = _table(*columns)
    groups = [g for g in found.get("gpus") or [] if isinstance(g, Mapping)]
    for index, group in enumerate(groups):
        if index:
            table.add_section()
        for row in group.get("rows") or []:
            gpus = bool(row.get("gpu_count"))  # CPU-only rows have no per-GPU price
            cells = [
                _text(row.get("gpu_model") or "CPU only", "bold"),
                _text(row.get("gpu_count")),
                _text(_per_gpu(row.get("price_per_gpu_hour") if gpus else None), "bold"),
                _text(_per_gpu(row.get("spot_price_per_gpu_hour") if gpus else None), "yellow"),
                _text(_per_gpu(row.get("price_per_hour"))),
                _text(_per_gpu(row.get("spot_price_per_hour"))),
                _text(_gib(row.get("gpu_memory_gib"))),
                _text(_number(row.get("vcpus"))),
                _text(_gib(row.get("memory_gib"))),
                _text(row.get("region")),
                _text(row.get("provider")),
            ]
            if wide:
                cells += [
                    _text(row.get("sku")),
                    _text(row.get("available")),
                    _text(row.get("spot_available")),
                    _text(format_age(row.get("startup_seconds"))),
                ]
            table.add_row(*cells)
    shown, total, limit = found.get("shown"), found.get("total"), found.get("limit")
    caption = f"{shown} of {total} offers shown, cheapest per GPU first"
    if limit and shown != total:
        caption += f" (at most {limit} per GPU model; --all shows every one)"
    table.caption = caption
    return table


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
    table = _table(
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
                _text("none"),
                _text(format_price(held) if held is not None else None),
                _text(None),
                _text(None),
            ]
        share = f"{100 * held / limit:.0f}%" if limit and held is not None else "-"
        full = room is not None and room <= 0
        return [
            _text(format_price(limit)),
            _text(format_price(held)),
            _text(format_price(room), "bold red" if full else ""),
            _text(share, "bold red" if full else ""),
        ]

    total = spend.get("total") or {}
    table.add_row(
        _text("total", "bold"),
        _text("-"),
        _text(format_price(total.get("per_hour")), "bold"),
        _text(_dollars(total.get("accumulated"))),
        *cap_cells(budget.get("global_cap")),
    )
    namespaces = {n.get("namespace"): n for n in spend.get("namespaces") or []}
    if namespaces or caps:
        table.add_section()
    for name in sorted(set(namespaces) | set(caps), key=str):
        row = namespaces.get(name) or {}
        table.add_row(
            _text("namespace"),
            _text(name, "bold"),
            _text(format_price(row.get("per_hour", 0.0))),
            _text(_dollars(row.get("accumulated", 0.0))),
            *cap_cells(caps.get(name)),
        )
    providers = spend.get("providers") or []
    if providers:
        table.add_section()
    for row in providers:
        table.add_row(
            _text("provider"),
            _text(row.get("provider"), "bold"),
            _text(format_price(row.get("per_hour"))),
            _text(_dollars(row.get("accumulated"))),
            _text("-"),
            _text("-"),
            _text("-"),
            _text("-"),
        )
    return table


def _dollars(value: Any) -> str:
    return "-" if value is None else f"${value:.2f}"


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
        f"{_number(request.get('cpu'))} vCPU",
        f"{_number(request.get('memory_gib'))} GiB",
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
        table = _table(
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
                _text(candidate.get("rank")),
                _text(offer.get("key"), "bold" if candidate.get("rank") == 1 else ""),
                _text(_gpus(offer.get("gpu_count"), offer.get("gpu_model"))),
                _text(offer.get("region")),
                _capacity(offer),
                _text(format_price(offer.get("price_per_hour"))),
                _text(f"{float(candidate.get('score') or 0):.4f}"),
                _text(_penalties(candidate.get("penalties") or {}), "dim"),
            )
        table.caption = (
            f"a launch tries at most {result.get('tries_at_most')} of these, in this order "
            "(score: price after penalties)"
        )
        shown.append(table)
    refused = [r for r in result.get("refused") or [] if isinstance(r, Mapping)]
    if refused:
        table = _table(("REFUSED OFFER", "l"), ("PRICE", "r"), ("FILTER", "l"), ("WHY", "l"))
        for refusal in refused:
            offer = refusal.get("offer") or {}
            table.add_row(
                _text(offer.get("key")),
                _text(format_price(offer.get("price_per_hour"))),
                _text(refusal.get("filter"), "bold"),
                _text(refusal.get("reason")),
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


def pods_table(pods: Sequence[Mapping[str, Any]], *, now: datetime | None = None) -> Table:
    """``GET /v1/pods`` as a table: which pod runs where, since when, at what price."""
    moment = now or datetime.now(UTC)
    table = _table(
        ("NAMESPACE", "l"),
        ("NAME", "l"),
        ("PHASE", "l"),
        ("PROVIDER", "l"),
        ("OFFER", "l"),
        ("INSTANCE", "l"),
        ("PRICE", "r"),
        ("SINCE", "l"),
    )
    total = 0.0
    for pod in pods:
        phase = str(pod.get("phase", "?"))
        price = pod.get("price_per_hour")
        total += float(price or 0)
        table.add_row(
            _text(pod.get("namespace")),
            _text(pod.get("name"), "bold"),
            _text(phase, _PHASE_STYLES.get(phase, "")),
            _text(pod.get("provider")),
            _text(pod.get("offer")),
            _text(pod.get("instance_id")),
            _text(format_price(price)),
            _text(_since(pod.get("since"), moment)),
        )
    table.caption = f"{len(pods)} pods, {format_price(total)} in all"
    return table


def overflow_table(flip: Mapping[str, Any], *, now: datetime | None = None) -> Table:
    """``GET /v1/overflow`` as a table of fields: the state, why, and the numbers behind it."""
    moment = now or datetime.now(UTC)
    table = _table(("FIELD", "l"), ("VALUE", "l"))
    if not flip.get("enabled"):
        table.add_row(_text("enabled"), _text("no (overflow.enabled is false)"))
        return table
    state = str(flip.get("state") or "unknown")
    table.add_row(_text("state"), _text(state, "bold green" if state == "open" else "bold"))
    table.add_row(_text("since"), _text(_since(flip.get("since"), moment)))
    taint = flip.get("taint") or {}
    table.add_row(
        _text("taint"),
        _text(f"{taint.get('key')}={taint.get('value')}:{taint.get('effect')}" if taint else "-"),
    )
    signal = "ok" if flip.get("signal_ok") else f"UNAVAILABLE: {flip.get('signal_error')}"
    table.add_row(_text("signal"), _text(signal, "" if flip.get("signal_ok") else "bold red"))
    reading = flip.get("reading")
    if isinstance(reading, Mapping):
        table.add_row(
            _text("own GPUs"),
            _text(
                f"{_number(reading.get('requested'))} of {_number(reading.get('allocatable'))} "
                f"requested, {_number(reading.get('free'))} free"
            ),
        )
        table.add_row(_text("unscheduled GPUs"), _text(_number(reading.get("unscheduled"))))
    table.add_row(_text("enough free to close"), _text(f"{flip.get('needed_free_gpus')} GPU(s)"))
    for key, label in (("full_for_seconds", "full for"), ("free_for_seconds", "free for")):
        if flip.get(key) is not None:
            table.add_row(_text(label), _text(format_age(flip.get(key))))
    table.add_row(_text("last evaluation"), _text(_since(flip.get("last_evaluation"), moment)))
    table.add_row(_text("transitions"), _text(flip.get("transitions")))
    return table


def _since(value: Any, now: datetime) -> str:
    if not isinstance(value, str) or not value:
        return "-"
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    moment = moment.astimezone(UTC)
    age = format_age((now - moment).total_seconds())
    return f"{moment:%Y-%m-%d %H:%M}Z ({age} ago)"


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
