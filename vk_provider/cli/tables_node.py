"""What the node does now, as tables: ``vk-provider pods`` and ``overflow``.

``GET /v1/pods`` (which pod runs where, since when, at what price) and ``GET /v1/overflow``
(the flip: open or closed, since when, the numbers behind it).

Invariants: times are shown in UTC with their age against ``now`` (injected, for tests); a
time the API sent that does not parse is shown as it came; every cell is ``tables.cell``,
plain text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.table import Table

from vk_provider.cli.tables import cell, format_age, format_number, format_price, new_table

_PHASE_STYLES = {"Running": "green", "Pending": "yellow", "Failed": "red", "Succeeded": "dim"}


def pods_table(pods: Sequence[Mapping[str, Any]], *, now: datetime | None = None) -> Table:
    """``GET /v1/pods`` as a table: which pod runs where, since when, at what price."""
    moment = now or datetime.now(UTC)
    table = new_table(
        ("NAMESPACE", "l"),
        ("NAME", "l"),
        ("PHASE", "l"),
        ("PROVIDER", "l"),
        ("OFFER", "l"),
        ("INSTANCE", "l"),
        ("PRICE", "r"),
        ("SINCE", "l"),
        ("ENDPOINTS", "l"),
    )
    total = 0.0
    for pod in pods:
        phase = str(pod.get("phase", "?"))
        price = pod.get("price_per_hour")
        total += float(price or 0)
        table.add_row(
            cell(pod.get("namespace")),
            cell(pod.get("name"), "bold"),
            cell(phase, _PHASE_STYLES.get(phase, "")),
            cell(pod.get("provider")),
            cell(pod.get("offer")),
            cell(pod.get("instance_id")),
            cell(format_price(price)),
            cell(_since(pod.get("since"), moment)),
            cell(_endpoints(pod.get("endpoints") or [])),
        )
    table.caption = f"{len(pods)} pods, {format_price(total)} in all"
    return table


def _endpoints(endpoints: Sequence[Mapping[str, Any]]) -> str:
    """``8000/TCP 10.1.2.3:8000`` per exposed port; ``-`` when none is."""
    shown = [
        f"{e.get('container_port')}/{e.get('protocol')} {e.get('address')}:{e.get('port')}"
        for e in endpoints
    ]
    return ", ".join(shown) or "-"


def overflow_table(flip: Mapping[str, Any], *, now: datetime | None = None) -> Table:
    """``GET /v1/overflow`` as a table of fields: the state, why, and the numbers behind it."""
    moment = now or datetime.now(UTC)
    table = new_table(("FIELD", "l"), ("VALUE", "l"))
    if not flip.get("enabled"):
        table.add_row(cell("enabled"), cell("no (overflow.enabled is false)"))
        return table
    state = str(flip.get("state") or "unknown")
    table.add_row(cell("state"), cell(state, "bold green" if state == "open" else "bold"))
    table.add_row(cell("since"), cell(_since(flip.get("since"), moment)))
    taint = flip.get("taint") or {}
    table.add_row(
        cell("taint"),
        cell(f"{taint.get('key')}={taint.get('value')}:{taint.get('effect')}" if taint else "-"),
    )
    signal = "ok" if flip.get("signal_ok") else f"UNAVAILABLE: {flip.get('signal_error')}"
    table.add_row(cell("signal"), cell(signal, "" if flip.get("signal_ok") else "bold red"))
    reading = flip.get("reading")
    if isinstance(reading, Mapping):
        table.add_row(
            cell("own GPUs"),
            cell(
                f"{format_number(reading.get('requested'))} of "
                f"{format_number(reading.get('allocatable'))} requested, "
                f"{format_number(reading.get('free'))} free"
            ),
        )
        table.add_row(cell("unscheduled GPUs"), cell(format_number(reading.get("unscheduled"))))
    table.add_row(cell("enough free to close"), cell(f"{flip.get('needed_free_gpus')} GPU(s)"))
    for key, label in (("full_for_seconds", "full for"), ("free_for_seconds", "free for")):
        if flip.get(key) is not None:
            table.add_row(cell(label), cell(format_age(flip.get(key))))
    table.add_row(cell("last evaluation"), cell(_since(flip.get("last_evaluation"), moment)))
    table.add_row(cell("transitions"), cell(flip.get("transitions")))
    if flip.get("held_open_for"):
        table.add_row(cell("held open for"), cell(str(flip["held_open_for"]), "bold"))
    for handover in flip.get("handovers") or []:
        nodes = ", ".join(handover.get("nodes") or []) or "-"
        table.add_row(
            cell(f"hand-over {handover.get('gang')}"),
            cell(
                f"{handover.get('step')}: {handover.get('reason')} "
                f"(nodes {nodes}; {len(handover.get('displaced') or [])} displaced; "
                f"{format_age(handover.get('for_seconds'))})"
            ),
        )
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
