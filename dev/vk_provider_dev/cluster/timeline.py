"""The flip story's timeline: what the demo samples, prints and draws. Pure.

``snapshot`` turns what the API says (the virtual node, the own nodes, the inference and
training pods) into one ``Sample``; ``line`` is the row the demo prints for it; ``render_svg``
draws the whole run as a picture a person can open in a browser: inference replicas by where
they run (at home, on the virtual node, waiting) above, the own GPUs in use below, the time
the overflow was open shaded, and the story's phases marked.

Invariants: no I/O; a sample counts each inference pod exactly once (at home, on the virtual
node, or waiting); the SVG is a standalone, well-formed document.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

JSON = Mapping[str, Any]
OVERFLOW_KEY = "virtual-kubelet.io/provider"


@dataclass(frozen=True, slots=True)
class Sample:
    t: float  # seconds since the story started
    phase: str
    home: int  # inference replicas Ready on own nodes
    virtual: int  # inference replicas Running on the virtual node
    waiting: int  # inference replicas not (yet) running anywhere
    training: int  # training pods bound
    own_gpus_used: float
    own_gpus: float
    overflow: str  # "open", "closed" or "?"
    per_hour: float  # what the virtual node's pods cost now ($/h)


def _gpus(pod: JSON) -> float:
    total = 0.0
    for container in (pod.get("spec") or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        try:
            total += float(limits.get("nvidia.com/gpu", 0))
        except (TypeError, ValueError):
            continue
    return total


def _live(pod: JSON) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase not in ("Succeeded", "Failed") and not (pod.get("metadata") or {}).get(
        "deletionTimestamp"
    )


def _ready(pod: JSON) -> bool:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def overflow_state(node: JSON | None) -> str:
    taints = ((node or {}).get("spec") or {}).get("taints") or []
    effects = {t.get("effect") for t in taints if t.get("key") == OVERFLOW_KEY}
    if effects == {"PreferNoSchedule"}:
        return "open"
    return "closed" if "NoSchedule" in effects else "?"


def snapshot(
    *,
    t: float,
    phase: str,
    virtual_node: JSON | None,
    own_nodes: Iterable[str],
    own_gpus: float,
    inference: Iterable[JSON],
    training: Iterable[JSON],
) -> Sample:
    own = set(own_nodes)
    virtual_name = ((virtual_node or {}).get("metadata") or {}).get("name")
    home = virtual = waiting = 0
    per_hour = 0.0
    used = 0.0
    for pod in inference:
        if not _live(pod):
            continue
        where = (pod.get("spec") or {}).get("nodeName")
        running = (pod.get("status") or {}).get("phase") == "Running"
        if where in own and _ready(pod):
            home += 1
        elif where == virtual_name and running:
            virtual += 1
            price = ((pod.get("metadata") or {}).get("annotations") or {}).get(
                "vk-provider.io/price-per-hour", "0"
            )
            with contextlib.suppress(ValueError):
                per_hour += float(price)
        else:
            waiting += 1
        if where in own:
            used += _gpus(pod)
    bound = 0
    for pod in training:
        if _live(pod) and (pod.get("spec") or {}).get("nodeName"):
            bound += 1
            if pod["spec"]["nodeName"] in own:
                used += _gpus(pod)
    return Sample(
        t=t,
        phase=phase,
        home=home,
        virtual=virtual,
        waiting=waiting,
        training=bound,
        own_gpus_used=used,
        own_gpus=own_gpus,
        overflow=overflow_state(virtual_node),
        per_hour=per_hour,
    )


HEADER = (
    f"{'time':>6}  {'phase':<34} {'inference: home':>15} {'virtual':>7} {'waiting':>7}  "
    f"{'training':>8}  {'own GPUs':>9}  {'overflow':<8} {'$/h':>7}"
)


def line(sample: Sample) -> str:
    """One row of the printed timeline (aligned with ``HEADER``)."""
    return (
        f"{sample.t:5.0f}s  {sample.phase[:34]:<34} {sample.home:>15} {sample.virtual:>7} "
        f"{sample.waiting:>7}  {sample.training:>8}  "
        f"{sample.own_gpus_used:>4.0f}/{sample.own_gpus:<4.0f}  {sample.overflow:<8} "
        f"{sample.per_hour:>7.2f}"
    )


# --------------------------------------------------------------------------- the picture

_W, _H = 960, 520
_LEFT, _RIGHT = 70, 30
_TOP_Y, _TOP_H = 60, 200  # replicas
_BOT_Y, _BOT_H = 320, 140  # own GPUs
_COLOURS = {"home": "#2e7d32", "virtual": "#ef6c00", "waiting": "#9e9e9e", "gpus": "#1565c0"}


def _x(t: float, end: float) -> float:
    return _LEFT + (_W - _LEFT - _RIGHT) * (t / end if end > 0 else 0)


def _band(
    samples: Sequence[Sample],
    end: float,
    base: Sequence[float],
    top: Sequence[float],
    y0: float,
    height: float,
    scale: float,
) -> str:
    """A polygon between two series (stacked areas)."""

    def y(v: float) -> float:
        return y0 + height - height * (v / scale if scale else 0)

    upper = [f"{_x(s.t, end):.1f},{y(v):.1f}" for s, v in zip(samples, top, strict=True)]
    lower = [
        f"{_x(s.t, end):.1f},{y(v):.1f}"
        for s, v in zip(reversed(samples), reversed(base), strict=True)
    ]
    return " ".join(upper + lower)


def render_svg(samples: Sequence[Sample], *, title: str, replicas: int) -> str:
    """The run as an SVG document (see the module docstring)."""
    if not samples:
        samples = [Sample(0, "", 0, 0, 0, 0, 0, 0, "?", 0)]
    end = max(samples[-1].t, 1.0)
    scale_pods = max(replicas, max(s.home + s.virtual + s.waiting for s in samples), 1)
    scale_gpus = max(max(s.own_gpus for s in samples), max(s.own_gpus_used for s in samples), 1)
    parts: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
        f'viewBox="0 0 {_W} {_H}" font-family="sans-serif" font-size="12">',
        f'<rect width="{_W}" height="{_H}" fill="white"/>',
        f'<text x="{_LEFT}" y="28" font-size="16" font-weight="bold">{escape(title)}</text>',
    ]
    # The overflow open: shaded across both charts.
    opened: float | None = None
    for sample in [*samples, Sample(end, "", 0, 0, 0, 0, 0, 0, "closed", 0)]:
        if sample.overflow == "open" and opened is None:
            opened = sample.t
        elif sample.overflow != "open" and opened is not None:
            x0, x1 = _x(opened, end), _x(sample.t, end)
            parts.append(
                f'<rect class="overflow-open" x="{x0:.1f}" y="{_TOP_Y}" width="{x1 - x0:.1f}" '
                f'height="{_BOT_Y + _BOT_H - _TOP_Y}" fill="#fff3e0"/>'
            )
            opened = None
    home = [float(s.home) for s in samples]
    virtual = [float(s.home + s.virtual) for s in samples]
    waiting = [float(s.home + s.virtual + s.waiting) for s in samples]
    zero = [0.0] * len(samples)
    for name, base, top in (
        ("home", zero, home),
        ("virtual", home, virtual),
        ("waiting", virtual, waiting),
    ):
        points = _band(samples, end, base, top, _TOP_Y, _TOP_H, scale_pods)
        parts.append(
            f'<polygon class="{name}" points="{points}" fill="{_COLOURS[name]}" '
            'fill-opacity="0.85" stroke="none"/>'
        )
    gpu_points = " ".join(
        f"{_x(s.t, end):.1f},{_BOT_Y + _BOT_H - _BOT_H * s.own_gpus_used / scale_gpus:.1f}"
        for s in samples
    )
    parts.append(
        f'<polyline class="own-gpus" points="{gpu_points}" fill="none" '
        f'stroke="{_COLOURS["gpus"]}" stroke-width="2"/>'
    )
    # Axes and labels.
    for y0, h, label, top_label in (
        (_TOP_Y, _TOP_H, "inference replicas", f"{scale_pods:.0f}"),
        (_BOT_Y, _BOT_H, "own GPUs in use", f"{scale_gpus:.0f}"),
    ):
        parts.append(
            f'<line x1="{_LEFT}" y1="{y0 + h}" x2="{_W - _RIGHT}" y2="{y0 + h}" stroke="black"/>'
        )
        parts.append(f'<line x1="{_LEFT}" y1="{y0}" x2="{_LEFT}" y2="{y0 + h}" stroke="black"/>')
        parts.append(f'<text x="{_LEFT - 8}" y="{y0 + 4}" text-anchor="end">{top_label}</text>')
        parts.append(f'<text x="{_LEFT - 8}" y="{y0 + h}" text-anchor="end">0</text>')
        parts.append(f'<text x="{_LEFT + 6}" y="{y0 - 6}" font-weight="bold">{label}</text>')
    parts.append(
        f'<text x="{_W - _RIGHT}" y="{_BOT_Y + _BOT_H + 18}" text-anchor="end">{end:.0f} s</text>'
    )
    # Phase marks.
    previous = None
    for sample in samples:
        if sample.phase and sample.phase != previous:
            x = _x(sample.t, end)
            parts.append(
                f'<line class="phase" x1="{x:.1f}" y1="{_TOP_Y}" x2="{x:.1f}" '
                f'y2="{_BOT_Y + _BOT_H}" stroke="#555" stroke-dasharray="3,3"/>'
            )
            parts.append(
                f'<text x="{x + 3:.1f}" y="{_BOT_Y + _BOT_H + 34}" font-size="10" '
                f'transform="rotate(20 {x + 3:.1f} {_BOT_Y + _BOT_H + 34})">'
                f"{escape(sample.phase)}</text>"
            )
            previous = sample.phase
    # Legend.
    legend_y = 46
    for index, (name, text) in enumerate(
        (
            ("home", "at home (own GPU nodes)"),
            ("virtual", "on the virtual node (rented GPUs)"),
            ("waiting", "waiting"),
            ("gpus", "own GPUs in use"),
        )
    ):
        x = _LEFT + 180 + index * 180
        parts.append(
            f'<rect x="{x}" y="{legend_y - 9}" width="10" height="10" fill="{_COLOURS[name]}"/>'
        )
        parts.append(f'<text x="{x + 14}" y="{legend_y}">{escape(text)}</text>')
    parts.append(
        f'<text x="{_W - _RIGHT}" y="{legend_y}" text-anchor="end" fill="#ef6c00">'
        "shaded: overflow open</text>"
    )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
