"""Where an SVG's text labels really land: each ``<text>`` rendered on its own by resvg (the
Rust renderer, through the ``resvg-py`` wheel: no system libraries, system fonts), and the box
of the pixels it painted.

``label_boxes(svg)`` renders, for every ``<text>`` element of the document, a copy of the
document that keeps the root ``<svg>`` element's attributes (so ``font-family``,
``font-size`` and the coordinate system are the picture's) and that one element, nothing else.
The copy's canvas is the picture's grown by ``margin`` pixels on every side (the ``viewBox``
grown by the same amount, so one user unit is still one pixel): a label that runs past the
picture's edge paints outside it instead of being clipped, and shows as outside. The PNG is
decoded here (``zlib`` and ``struct``, no Pillow) to find the bounding box of the pixels with
any coverage (alpha > 0, anti-aliasing included).

Invariants: a returned ``Box`` is in the picture's user units, half-open (``x1``, ``y1`` one
past the last painted pixel), so two boxes that ``overlaps`` share at least one painted pixel
position; a label that paints nothing (its font resolves to no installed font, or its text is
empty) gets ``None``, never an empty box, so a caller cannot pass vacuously.
"""

from __future__ import annotations

import copy
import struct
import xml.etree.ElementTree as ET
import zlib

import resvg_py

from vk_provider_dev.cluster.svgtext import Box

SVG_NS = "http://www.w3.org/2000/svg"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def render(svg: str) -> bytes:
    """The SVG rendered by resvg to PNG bytes, with the system's fonts."""
    return bytes(resvg_py.svg_to_bytes(svg_string=svg))


def painted_box(png: bytes) -> Box | None:
    """The bounding box, in pixels, of the pixels with alpha > 0 in an 8-bit RGBA,
    non-interlaced PNG (what resvg writes); ``None`` when nothing is painted."""
    if not png.startswith(_PNG_SIGNATURE):
        raise ValueError("not a PNG")
    pos, idat, header = len(_PNG_SIGNATURE), bytearray(), None
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos : pos + 8])
        data = png[pos + 8 : pos + 8 + length]
        pos += 12 + length  # length, type, data, CRC
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", data)
        elif kind == b"IDAT":
            idat += data
        elif kind == b"IEND":
            break
    if header is None:
        raise ValueError("PNG without IHDR")
    width, height, depth, colour, _, _, interlace = header
    if (depth, colour, interlace) != (8, 6, 0):
        raise ValueError(f"only 8-bit RGBA non-interlaced PNGs: {depth=} {colour=} {interlace=}")
    raw = zlib.decompress(bytes(idat))
    bpp, stride = 4, width * 4
    blank, blank_alpha = bytes(stride), bytes(width)
    prior = bytearray(stride)
    x0, y0, x1, y1 = width, height, -1, -1
    for row in range(height):
        start = row * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        # Any filter over an all-zero previous row turns all-zero bytes into an all-zero
        # row: the fully transparent rows (most of them) need no unfiltering.
        if not (prior == blank and line == blank):
            _unfilter(kind, line, prior, bpp)
        prior = line
        alpha = line[3::4]
        if alpha == blank_alpha:
            continue
        first = len(alpha) - len(alpha.lstrip(b"\0"))
        last = len(alpha.rstrip(b"\0")) - 1
        x0, x1 = min(x0, first), max(x1, last)
        y0, y1 = min(y0, row), row
    if x1 < 0:
        return None
    return Box(float(x0), float(y0), float(x1 + 1), float(y1 + 1))


def _unfilter(kind: int, line: bytearray, prior: bytearray, bpp: int) -> None:
    """Undo one scanline's PNG filter (PNG specification, section 9) in place."""
    n = len(line)
    if kind == 0:  # None
        return
    if kind == 1:  # Sub
        for i in range(bpp, n):
            line[i] = (line[i] + line[i - bpp]) & 0xFF
    elif kind == 2:  # Up
        line[:] = bytes((a + b) & 0xFF for a, b in zip(line, prior, strict=True))
    elif kind == 3:  # Average
        for i in range(n):
            left = line[i - bpp] if i >= bpp else 0
            line[i] = (line[i] + ((left + prior[i]) >> 1)) & 0xFF
    elif kind == 4:  # Paeth
        for i in range(n):
            if i < bpp:
                line[i] = (line[i] + prior[i]) & 0xFF
                continue
            left, up, corner = line[i - bpp], prior[i], prior[i - bpp]
            p = left + up - corner
            pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
            predictor = left if pa <= pb and pa <= pc else up if pb <= pc else corner
            line[i] = (line[i] + predictor) & 0xFF
    else:
        raise ValueError(f"unknown PNG filter type {kind}")


def label_boxes(svg: str, *, margin: int = 64) -> list[tuple[str, Box | None]]:
    """Each ``<text>`` element's text and the box (in the picture's user units) of what it
    paints when rendered alone (see the module docstring); document order."""
    root = ET.fromstring(svg)  # noqa: S314 - the caller's own picture
    min_x, min_y, view_w, view_h = (float(v) for v in root.attrib["viewBox"].split())
    width, height = float(root.attrib["width"]), float(root.attrib["height"])
    if (width, height) != (view_w, view_h):
        raise ValueError("label_boxes needs one user unit per pixel (viewBox size = size)")
    boxes: list[tuple[str, Box | None]] = []
    for element in root.iter(f"{{{SVG_NS}}}text"):
        alone = ET.Element(root.tag, dict(root.attrib))
        alone.set("width", f"{width + 2 * margin:g}")
        alone.set("height", f"{height + 2 * margin:g}")
        alone.set(
            "viewBox",
            f"{min_x - margin:g} {min_y - margin:g} {view_w + 2 * margin:g} "
            f"{view_h + 2 * margin:g}",
        )
        alone.append(copy.deepcopy(element))
        box = painted_box(render(ET.tostring(alone, encoding="unicode")))
        if box is not None:
            box = Box(
                box.x0 + min_x - margin,
                box.y0 + min_y - margin,
                box.x1 + min_x - margin,
                box.y1 + min_y - margin,
            )
        boxes.append(("".join(element.itertext()), box))
    return boxes
