"""The flip story's timeline: what the demo samples, prints and draws. Pure.

``snapshot`` turns what the API says (the virtual node, the own nodes, the inference and
training pods) into one ``Sample``; ``line`` is the row the demo prints for it; ``render_svg``
draws the whole run as a picture a person can open in a browser: inference replicas by where
they run (at home, on the virtual node, waiting) above, with the Ready ones as a line over
the PodDisruptionBudget's minimum (dashed); the own GPUs in use below, with the time the
training was held by the hand-over; the time the overflow was open shaded; and the story's
phases marked. Labels are laid out with ``svgtext`` widths, which cover each font the
picture names (Helvetica-like, DejaVu Sans), so no two overlap.

Invariants: no I/O; a sample counts each inference pod exactly once (at home, on the virtual
node, or waiting); the SVG is a standalone, well-formed document.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

from vk_provider_dev.cluster.svgtext import width

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
    ready: int = 0  # inference replicas Ready anywhere: what serves
    held: int = 0  # training pods that exist but are not bound (held by the hand-over)


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
    training_queued: int = 0,
) -> Sample:
    """One sample; ``training_queued``: training pods held before they exist (a Kueue Job
    still suspended), counted as held."""
    own = set(own_nodes)
    virtual_name = ((virtual_node or {}).get("metadata") or {}).get("name")
    home = virtual = waiting = ready = 0
    per_hour = 0.0
    used = 0.0
    for pod in inference:
        if not _live(pod):
            continue
        if _ready(pod):
            ready += 1
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
    bound, held = 0, training_queued
    for pod in training:
        if _live(pod) and not (pod.get("spec") or {}).get("nodeName"):
            held += 1
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
        ready=ready,
        held=held,
    )


HEADER = (
    f"{'time':>6}  {'phase':<34} {'inference: home':>15} {'virtual':>7} {'waiting':>7} "
    f"{'ready':>5}  {'training':>8} {'held':>4}  {'own GPUs':>9}  {'overflow':<8} {'$/h':>7}"
)


def line(sample: Sample) -> str:
    """One row of the printed timeline (aligned with ``HEADER``)."""
    return (
        f"{sample.t:5.0f}s  {sample.phase[:34]:<34} {sample.home:>15} {sample.virtual:>7} "
        f"{sample.waiting:>7} {sample.ready:>5}  {sample.training:>8} {sample.held:>4}  "
        f"{sample.own_gpus_used:>4.0f}/{sample.own_gpus:<4.0f}  {sample.overflow:<8} "
        f"{sample.per_hour:>7.2f}"
    )


# --------------------------------------------------------------------------- the picture

_W = 960
_LEFT, _RIGHT = 70, 30
_TOP_H, _GAP, _BOT_H = 200, 60, 140  # replicas chart, space, own GPUs chart
# The fonts ``svgtext`` measures (Helvetica, Arial and its metric twin Liberation Sans) first,
# then DejaVu Sans, which most Linux machines have: a bare ``sans-serif`` resolves to no font
# at all in renderers that map it to an absent Arial (resvg does), and the labels vanish.
_FONTS = "Helvetica, Arial, 'Liberation Sans', 'DejaVu Sans', sans-serif"
_COLOURS = {
    "home": "#2e7d32",
    "virtual": "#ef6c00",
    "waiting": "#9e9e9e",
    "gpus": "#1565c0",
    "ready": "#000000",
    "minimum": "#c62828",
    "held": "#6a1b9a",
}
_LEGEND = (
    ("home", "at home (own GPU nodes)"),
    ("virtual", "on the virtual node (rented GPUs)"),
    ("waiting", "waiting"),
    ("ready", "Ready (serving)"),
    ("minimum", "PDB minimum"),
    ("gpus", "own GPUs in use"),
    ("held", "training held (hand-over)"),
    ("open", "shaded: overflow open"),
)


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


def _text(
    x: float, y: float, text: str, *, size: float = 12, anchor: str = "start", **attrs: str
) -> str:
    extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items())
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size:g}" text-anchor="{anchor}"{extra}>'
        f"{escape(text)}</text>"
    )


def _legend(y: float) -> tuple[list[str], float]:
    """The legend laid out in rows that fit the width; its elements and its bottom."""
    parts: list[str] = []
    x, right = float(_LEFT), _W - _RIGHT
    for name, label in _LEGEND:
        needed = 14 + width(label, 12)
        if x + needed > right and x > _LEFT:
            x, y = float(_LEFT), y + 18
        colour = "#fff3e0" if name == "open" else _COLOURS[name]
        parts.append(
            f'<rect x="{x:.1f}" y="{y - 9:.1f}" width="10" height="10" fill="{colour}" '
            'stroke="#999" stroke-width="0.5"/>'
        )
        parts.append(_text(x + 14, y, label))
        x += needed + 24
    return parts, y + 6


def _phase_labels(samples: Sequence[Sample], end: float, y: float) -> tuple[list[str], float]:
    """Each phase's name under the charts, horizontal, in as many lanes as it takes for no
    two names to overlap; the elements and the bottom of the last lane."""
    parts: list[str] = []
    lanes: list[float] = []  # the right end of the last label in each lane
    previous = None
    for sample in samples:
        if not sample.phase or sample.phase == previous:
            continue
        previous = sample.phase
        w = width(sample.phase, 10)
        x = min(_x(sample.t, end) + 3, _W - _RIGHT - w)
        lane = next((i for i, used in enumerate(lanes) if used + 8 <= x), len(lanes))
        if lane == len(lanes):
            lanes.append(0.0)
        lanes[lane] = x + w
        parts.append(_text(x, y + 14 * lane, sample.phase, size=10, **{"class": "phase-name"}))
    return parts, y + 14 * max(len(lanes), 1)


def render_svg(
    samples: Sequence[Sample], *, title: str, replicas: int, minimum: int | None = None
) -> str:
    """The run as an SVG document (see the module docstring); ``minimum``: the inference's
    PodDisruptionBudget minimum, drawn as a dashed line under the Ready replicas."""
    if not samples:
        samples = [Sample(0, "", 0, 0, 0, 0, 0, 0, "?", 0)]
    end = max(samples[-1].t, 1.0)
    scale_pods = max(replicas, max(s.home + s.virtual + s.waiting for s in samples), 1)
    scale_gpus = max(max(s.own_gpus for s in samples), max(s.own_gpus_used for s in samples), 1)
    legend, legend_bottom = _legend(50)
    top_y = legend_bottom + 34
    bot_y = top_y + _TOP_H + _GAP
    phases, bottom = _phase_labels(samples, end, bot_y + _BOT_H + 36)
    height = bottom + 12
    parts: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height:.0f}" '
        f'viewBox="0 0 {_W} {height:.0f}" font-family="{_FONTS}" font-size="12">',
        f'<rect width="{_W}" height="{height:.0f}" fill="white"/>',
        _text(_LEFT, 28, title, size=16, font_weight="bold"),
        *legend,
    ]
    # The overflow open: shaded across both charts; the training held: under the GPUs.
    spans: tuple[tuple[str, str, Callable[[Sample], bool]], ...] = (
        ("overflow-open", "#fff3e0", lambda s: s.overflow == "open"),
        ("training-held", _COLOURS["held"], lambda s: s.held > 0),
    )
    for kind, colour, on in spans:
        began: float | None = None
        for sample in [*samples, Sample(end, "", 0, 0, 0, 0, 0, 0, "closed", 0)]:
            if on(sample) and began is None:
                began = sample.t
            elif not on(sample) and began is not None:
                x0, x1 = _x(began, end), _x(sample.t, end)
                if kind == "overflow-open":
                    y0, h, extra = top_y, bot_y + _BOT_H - top_y, ""
                else:
                    y0, h, extra = bot_y + _BOT_H - 8, 8.0, ' fill-opacity="0.6"'
                parts.append(
                    f'<rect class="{kind}" x="{x0:.1f}" y="{y0:.1f}" width="{x1 - x0:.1f}" '
                    f'height="{h:.1f}" fill="{colour}"{extra}/>'
                )
                began = None
    home = [float(s.home) for s in samples]
    virtual = [float(s.home + s.virtual) for s in samples]
    waiting = [float(s.home + s.virtual + s.waiting) for s in samples]
    zero = [0.0] * len(samples)
    for name, base, top in (
        ("home", zero, home),
        ("virtual", home, virtual),
        ("waiting", virtual, waiting),
    ):
        points = _band(samples, end, base, top, top_y, _TOP_H, scale_pods)
        parts.append(
            f'<polygon class="{name}" points="{points}" fill="{_COLOURS[name]}" '
            'fill-opacity="0.85" stroke="none"/>'
        )

    def pods_y(v: float) -> float:
        return top_y + _TOP_H - _TOP_H * v / scale_pods

    ready_points = " ".join(f"{_x(s.t, end):.1f},{pods_y(s.ready):.1f}" for s in samples)
    parts.append(
        f'<polyline class="ready" points="{ready_points}" fill="none" '
        f'stroke="{_COLOURS["ready"]}" stroke-width="2"/>'
    )
    if minimum is not None:
        y = pods_y(minimum)
        parts.append(
            f'<line class="minimum" x1="{_LEFT}" y1="{y:.1f}" x2="{_W - _RIGHT}" y2="{y:.1f}" '
            f'stroke="{_COLOURS["minimum"]}" stroke-dasharray="6,4" stroke-width="1.5"/>'
        )
    gpu_points = " ".join(
        f"{_x(s.t, end):.1f},{bot_y + _BOT_H - _BOT_H * s.own_gpus_used / scale_gpus:.1f}"
        for s in samples
    )
    parts.append(
        f'<polyline class="own-gpus" points="{gpu_points}" fill="none" '
        f'stroke="{_COLOURS["gpus"]}" stroke-width="2"/>'
    )
    # Axes and labels.
    for y0, h, label, top_label in (
        (top_y, _TOP_H, "inference replicas", f"{scale_pods:.0f}"),
        (bot_y, _BOT_H, "own GPUs in use", f"{scale_gpus:.0f}"),
    ):
        parts.append(
            f'<line x1="{_LEFT}" y1="{y0 + h}" x2="{_W - _RIGHT}" y2="{y0 + h}" stroke="black"/>'
        )
        parts.append(f'<line x1="{_LEFT}" y1="{y0}" x2="{_LEFT}" y2="{y0 + h}" stroke="black"/>')
        parts.append(_text(_LEFT - 8, y0 + 4, top_label, anchor="end"))
        parts.append(_text(_LEFT - 8, y0 + h, "0", anchor="end"))
        parts.append(_text(_LEFT + 6, y0 - 8, label, font_weight="bold"))
    parts.append(_text(_W - _RIGHT, bot_y + _BOT_H + 16, f"{end:.0f} s", anchor="end"))
    # Phase marks, their names in lanes below.
    previous = None
    for sample in samples:
        if sample.phase and sample.phase != previous:
            x = _x(sample.t, end)
            parts.append(
                f'<line class="phase" x1="{x:.1f}" y1="{top_y}" x2="{x:.1f}" '
                f'y2="{bot_y + _BOT_H}" stroke="#555" stroke-dasharray="3,3"/>'
            )
            previous = sample.phase
    parts.extend(phases)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
