"""The flip story's timeline (``cluster.timeline``): samples from API objects, the printed
rows, and the picture."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace
from typing import Any

import pytest

from tests.svg_render import label_boxes, painted_box, render
from vk_provider_dev.cluster.svgtext import Box
from vk_provider_dev.cluster.timeline import (
    HEADER,
    Sample,
    line,
    overflow_state,
    render_svg,
    snapshot,
)

NODE = {"metadata": {"name": "vk-gpu"}, "spec": {"taints": []}}


def pod(
    name: str,
    node: str | None,
    *,
    phase: str = "Running",
    ready: bool = True,
    gpus: int = 1,
    price: str | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "annotations": {}}
    if price is not None:
        metadata["annotations"]["vk-provider.io/price-per-hour"] = price
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {
        "metadata": metadata,
        "spec": {
            "nodeName": node,
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def with_taint(effect: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "vk-gpu"},
        "spec": {"taints": [{"key": "virtual-kubelet.io/provider", "effect": effect}]},
    }


def test_each_inference_pod_is_counted_once_where_it_runs() -> None:
    inference = [
        pod("a", "gpu-node-0"),
        pod("b", "gpu-node-1", ready=False),  # bound at home, not Ready yet: waiting
        pod("c", "vk-gpu", price="1.29"),
        pod("d", "vk-gpu", phase="Pending", price="1.39"),  # placed, not Running: waiting
        pod("e", None, phase="Pending"),
        pod("f", "vk-gpu", deleting=True, price="9"),  # being evicted: not counted
        pod("g", "gpu-node-0", phase="Succeeded"),
    ]
    training = [pod("t0", "gpu-node-0", gpus=8), pod("t1", None, phase="Pending", gpus=8)]
    sample = snapshot(
        t=3.0,
        phase="p",
        virtual_node=with_taint("PreferNoSchedule"),
        own_nodes=["gpu-node-0", "gpu-node-1"],
        own_gpus=16,
        inference=inference,
        training=training,
    )
    assert (sample.home, sample.virtual, sample.waiting) == (1, 1, 3)
    assert sample.ready == 4  # a, c, d, e say Ready; b does not, f is leaving, g is done
    assert sample.training == 1
    assert sample.held == 1
    assert sample.own_gpus_used == 1 + 1 + 8  # a, b and t0 hold own GPUs
    assert sample.per_hour == 1.29
    assert sample.overflow == "open"


def test_overflow_state_from_the_taint() -> None:
    assert overflow_state(with_taint("NoSchedule")) == "closed"
    assert overflow_state(with_taint("PreferNoSchedule")) == "open"
    assert overflow_state(NODE) == "?"
    assert overflow_state(None) == "?"


def test_a_row_lines_up_with_the_header() -> None:
    sample = Sample(12.0, "overflow opens", 0, 6, 0, 4, 32, 32, "open", 8.04, ready=6, held=0)
    row = line(sample)
    assert row.split() == [
        "12s",
        "overflow",
        "opens",
        "0",
        "6",
        "0",
        "6",
        "4",
        "0",
        "32/32",
        "open",
        "8.04",
    ]
    assert len(row) <= len(HEADER) + 2


def story() -> list[Sample]:
    return [
        Sample(0, "inference serves at home", 6, 0, 0, 0, 6, 32, "closed", 0),
        Sample(10, "training arrives", 0, 0, 6, 4, 32, 32, "closed", 0),
        Sample(20, "overflow opens", 0, 6, 0, 4, 32, 32, "open", 8.04),
        Sample(40, "training ends", 0, 6, 0, 0, 0, 32, "open", 8.04),
        Sample(50, "inference moves home", 3, 3, 0, 0, 3, 32, "closed", 4.0),
        Sample(60, "done", 6, 0, 0, 0, 6, 32, "closed", 0),
    ]


def test_the_picture_is_a_standalone_svg_of_the_run() -> None:
    svg = render_svg(story(), title="the story <&>", replicas=6)
    root = ET.fromstring(svg)  # noqa: S314 - our own output
    ns = {"s": "http://www.w3.org/2000/svg"}
    polygons = {p.get("class"): p for p in root.findall("s:polygon", ns)}
    assert set(polygons) == {"home", "virtual", "waiting"}
    assert len(polygons["home"].get("points", "").split()) == 2 * len(story())
    (gpus,) = [p for p in root.findall("s:polyline", ns) if p.get("class") == "own-gpus"]
    assert len(gpus.get("points", "").split()) == len(story())
    # The overflow was open from t=20 to t=50: one shaded band, 30/60 of the width.
    (band,) = [r for r in root.findall("s:rect", ns) if r.get("class") == "overflow-open"]
    width = float(band.get("width", "0"))
    assert abs(width - (960 - 70 - 30) * 30 / 60) < 1
    phases = [t.text for t in root.findall("s:text", ns) if t.get("class") == "phase-name"]
    assert phases == [s.phase for s in story()]
    assert "the story &lt;&amp;&gt;" in svg


def crowded_run() -> list[Sample]:
    """Phases that follow each other within seconds, as in a real run: the names need lanes."""
    return [
        Sample(0, "inference serves at home", 6, 0, 0, 0, 6, 32, "closed", 0, ready=6),
        Sample(2, "training arrives (a gang)", 6, 0, 0, 0, 6, 32, "closed", 0, 6, 4),
        Sample(3, "hand-over: inference moves", 5, 0, 1, 0, 5, 32, "open", 0, 5, 4),
        Sample(60, "training runs", 0, 6, 0, 4, 32, 32, "open", 8.0, 6),
        Sample(61, "overflow opens", 0, 6, 0, 4, 32, 32, "open", 8.0, 6),
        Sample(150, "training ends", 0, 6, 0, 0, 0, 32, "open", 8.0, 6),
        Sample(152, "overflow closes", 0, 6, 0, 0, 0, 32, "closed", 8.0, 6),
        Sample(153, "inference moves home", 3, 3, 0, 0, 3, 32, "closed", 4.0, 6),
        Sample(200, "done", 6, 0, 0, 0, 6, 32, "closed", 0, 6),
    ]


def spread_run() -> list[Sample]:
    """Phases 10 to 20 s apart: names that just fit one lane in Helvetica's widths but not in
    DejaVu Sans' (``training arrives (a gang)`` ran into ``training runs`` when the layout
    measured Helvetica only)."""
    times = (0, 59, 71, 86, 104, 149, 155, 174, 200)
    return [replace(s, t=t) for t, s in zip(times, crowded_run(), strict=True)]


RUNS = {"crowded": crowded_run, "spread": spread_run}


def _picture(run: str) -> str:
    return render_svg(RUNS[run](), title="vk-provider: the story", replicas=6, minimum=5)


def _size(svg: str) -> tuple[float, float]:
    root = ET.fromstring(svg)  # noqa: S314 - our own output
    return float(root.get("width", "0")), float(root.get("height", "0"))


def _estimated_boxes(svg: str) -> list[tuple[str, Box]]:
    root = ET.fromstring(svg)  # noqa: S314 - our own output
    boxes = []
    for element in root.iter("{http://www.w3.org/2000/svg}text"):
        text = element.text or ""
        size = float(element.get("font-size", "12"))
        # 10 % wider than the layout's estimate: room for a font neither Helvetica-like nor
        # DejaVu Sans, the two the estimate measures.
        box = Box.of_text(
            text,
            x=float(element.get("x", "0")),
            y=float(element.get("y", "0")),
            size=size * 1.1,
            anchor=element.get("text-anchor", "start"),
        )
        boxes.append((text, box))
    return boxes


@pytest.mark.parametrize("run", RUNS)
def test_no_two_labels_overlap_by_estimated_metrics(run: str) -> None:
    """The legend, the axes' labels and the phase names never collide, and all stay inside
    the picture, by ``svgtext``'s estimate (whatever fonts this machine has)."""
    svg = _picture(run)
    width, height = _size(svg)
    boxes = _estimated_boxes(svg)
    assert len(boxes) >= 20
    for index, (text, box) in enumerate(boxes):
        assert box.x0 >= 0 and box.x1 <= width and box.y1 <= height, text
        for other, other_box in boxes[index + 1 :]:
            assert not box.overlaps(other_box), f"{text!r} overlaps {other!r}"


@pytest.mark.parametrize("run", RUNS)
def test_no_two_labels_overlap_when_rendered_by_resvg(run: str) -> None:
    """The same, for the pixels a real renderer paints: each label rendered alone by resvg
    with this machine's fonts (``tests.svg_render``); every label paints something (a label
    whose fonts are all missing paints nothing and fails here), inside the picture, and no
    two labels' painted boxes intersect."""
    svg = _picture(run)
    width, height = _size(svg)
    boxes = label_boxes(svg)
    assert len(boxes) >= 20
    family = ET.fromstring(svg).get("font-family")  # noqa: S314 - our own output
    painted: list[tuple[str, Box]] = []
    for text, box in boxes:
        assert box is not None, (
            f"label {text!r} painted nothing: resvg found no installed font for "
            f"font-family={family!r} (on Debian: apt-get install fonts-dejavu-core)"
        )
        assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= width and box.y1 <= height, (
            f"label {text!r} paints outside the {width:g}x{height:g} picture: {box}"
        )
        painted.append((text, box))
    for index, (text, box) in enumerate(painted):
        for other, other_box in painted[index + 1 :]:
            assert not box.overlaps(other_box), f"{text!r} {box} overlaps {other!r} {other_box}"


def test_the_overlap_check_sees_a_collision() -> None:
    a = Box.of_text("own GPUs in use", x=800, y=50, size=12)
    b = Box.of_text("shaded: overflow open", x=930, y=50, size=12, anchor="end")
    assert a.overlaps(b)  # the old legend's last two items
    assert not a.overlaps(Box.of_text("x", x=800, y=80, size=12))


def test_the_rendered_check_sees_a_collision_an_overflow_and_a_missing_font() -> None:
    """``label_boxes`` is not vacuous: a rectangle's box is exact, two labels on one spot
    overlap, a label past the right edge shows as outside, a font that is not installed
    paints nothing."""
    assert painted_box(
        render(
            '<svg xmlns="http://www.w3.org/2000/svg" width="100" height="50" '
            'viewBox="0 0 100 50"><rect x="10" y="20" width="30" height="5"/></svg>'
        )
    ) == Box(10, 20, 40, 25)
    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg" width="200" height="60" viewBox="0 0 200 60" '
        'font-family="\'DejaVu Sans\', sans-serif" font-size="12">'
        '<text x="10" y="20">own GPUs in use</text>'
        '<text x="60" y="24">shaded</text>'
        '<text x="170" y="50">past the edge</text>'
        '<text x="10" y="50" font-family="no-such-font">gone</text>'
        "</svg>"
    )
    (_, a), (_, b), (_, past), (_, gone) = label_boxes(svg)
    assert a is not None and b is not None and past is not None
    assert a.overlaps(b)
    assert past.x1 > 200
    assert gone is None


def test_the_ready_line_and_the_minimum_are_drawn() -> None:
    root = ET.fromstring(render_svg(story(), title="t", replicas=6, minimum=5))  # noqa: S314
    classes = {e.get("class") for e in root.iter() if e.get("class")}
    assert {"ready", "minimum", "own-gpus"} <= classes


def test_an_empty_run_still_draws() -> None:
    ET.fromstring(render_svg([], title="nothing", replicas=6))  # noqa: S314 - ours


def test_a_suspended_kueue_job_counts_as_held_training() -> None:
    sample = snapshot(
        t=1.0,
        phase="p",
        virtual_node=with_taint("NoSchedule"),
        own_nodes=["gpu-node-0"],
        own_gpus=8,
        inference=[],
        training=[],
        training_queued=4,
    )
    assert (sample.training, sample.held) == (0, 4)
