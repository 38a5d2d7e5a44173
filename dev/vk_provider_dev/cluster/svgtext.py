"""How much room a line of SVG text takes, so the demo's picture can lay labels out without
collisions. Pure.

A character's width is the wider of its advance widths (per 1000 units of the font size) in
the two families the demo's picture names: Helvetica (Arial and its metric twins Liberation
Sans and Nimbus Sans have the same metrics), what a browser on macOS or Windows picks, and
DejaVu Sans, what most Linux machines have (wider: ``a`` by 10 %, ``n`` by 14 %, ``t`` by
41 %). So a layout fits whichever of them renders. Characters outside a font's table count
as its widest lowercase letter, so an estimate errs towards more room.

Invariants: ``width`` is monotone in the text (appending never shrinks it); a ``Box`` is the
text's extent for its anchor (start, middle, end), baseline at ``y``.
"""

from __future__ import annotations

from dataclasses import dataclass

_HELVETICA = {
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
# DejaVu Sans (Book), printable ASCII, read from DejaVuSans.ttf's hmtx (2048 units per em).
_DEJAVU = {
    "'": 275,
    **dict.fromkeys("ijl", 278),
    **dict.fromkeys("IJ", 295),
    **dict.fromkeys(" ,.", 318),
    **dict.fromkeys("/:;\\|", 337),
    "f": 352,
    "-": 361,
    **dict.fromkeys("()[]", 390),
    "t": 392,
    "!": 401,
    "r": 411,
    '"': 460,
    **dict.fromkeys("*_`", 500),
    "s": 521,
    "z": 525,
    "?": 531,
    "c": 550,
    "L": 557,
    "F": 575,
    "k": 579,
    **dict.fromkeys("vxy", 592),
    "P": 603,
    **dict.fromkeys("TY", 611),
    "o": 612,
    "a": 613,
    "e": 615,
    "E": 632,
    **dict.fromkeys("hnu", 634),
    **dict.fromkeys("Sbdgpq", 635),
    **dict.fromkeys("$0123456789{}", 636),
    "K": 656,
    **dict.fromkeys("AV", 684),
    **dict.fromkeys("XZ", 685),
    "B": 686,
    "R": 695,
    "C": 698,
    "U": 732,
    "N": 748,
    "H": 752,
    "D": 770,
    "G": 775,
    "&": 780,
    **dict.fromkeys("OQ", 787),
    "w": 818,
    **dict.fromkeys("#+<=>^~", 838),
    "M": 863,
    "%": 950,
    "m": 974,
    "W": 989,
    "@": 1000,
}
_WIDTHS = {
    ch: max(_HELVETICA.get(ch, _HELVETICA["m"]), _DEJAVU.get(ch, _DEJAVU["m"]))
    for ch in _HELVETICA.keys() | _DEJAVU.keys()
}
_UNKNOWN = max(_HELVETICA["m"], _DEJAVU["m"])


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
