"""How much room a line of SVG text takes, so the demo's picture can lay labels out without
collisions. Pure.

Widths use Helvetica's advance widths (per 1000 units of the font size; Arial has the same
metrics), the font a browser picks for ``font-family="sans-serif"`` or one of its metric
twins (Liberation Sans, Nimbus Sans). Characters outside the table count as the widest
lowercase letter, so an estimate errs towards more room.

Invariants: ``width`` is monotone in the text (appending never shrinks it); a ``Box`` is the
text's extent for its anchor (start, middle, end), baseline at ``y``.
"""

from __future__ import annotations

from dataclasses import dataclass

_WIDTHS = {
    **dict.fromkeys("ijl'", 222),
    **dict.fromkeys(" ftI.,:;/!", 278),
    **dict.fromkeys("r()-[]", 333),
    **dict.fromkeys("cksvxyzJ", 500),
    **dict.fromkeys("abdeghnopqu0123456789$_L", 556),
    **dict.fromkeys("FTZ", 611),
    **dict.fromkeys("ABEKPSVXY&", 667),
    **dict.fromkeys("CDHNRUw", 722),
    **dict.fromkeys("GOQ", 778),
    **dict.fromkeys("mM", 833),
    "%": 889,
    "W": 944,
    '"': 355,
    "<": 584,
    ">": 584,
    "=": 584,
    "+": 584,
    "~": 584,
}
_UNKNOWN = 833


def width(text: str, size: float) -> float:
    """The advance width of ``text`` at font ``size`` (pixels)."""
    return sum(_WIDTHS.get(ch, _UNKNOWN) for ch in text) * size / 1000


@dataclass(frozen=True, slots=True)
class Box:
    x0: float
    y0: float
    x1: float
    y1: float

    @staticmethod
    def of_text(text: str, *, x: float, y: float, size: float, anchor: str = "start") -> Box:
        w = width(text, size)
        left = {"start": x, "middle": x - w / 2, "end": x - w}[anchor]
        # Ascent about 0.75 em above the baseline, descent about 0.25 em below.
        return Box(left, y - 0.75 * size, left + w, y + 0.25 * size)

    def overlaps(self, other: Box, *, gap: float = 0.0) -> bool:
        return not (
            self.x1 + gap <= other.x0
            or other.x1 + gap <= self.x0
            or self.y1 + gap <= other.y0
            or other.y1 + gap <= self.y0
        )
