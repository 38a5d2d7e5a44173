"""Figures over rounds: each a value per round, printed as min / median / max, with its target.

A benchmark round measures every subject once (the raw client, KWOK, the agent with each
provider), in an order rotated from round to round (``rotated``), so no subject always runs
first on a cold server or last on a tired one. A figure is computed *within* a round — a
ratio of two subjects measured minutes apart on the same server — and only then summarised
over rounds: the spread says how much a single round can be trusted.

A target is met when the **median** over rounds meets it (the issue's definition); min and
max are printed beside it so a target met by one lucky round is visible as such.

Pure: no I/O; ``bench.__main__`` feeds it and prints what it returns.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

T = TypeVar("T")


def rotated(subjects: Sequence[T], round_index: int) -> list[T]:
    """``subjects`` starting at ``round_index`` (mod its length): round 0 keeps the order."""
    if not subjects:
        return []
    shift = round_index % len(subjects)
    return [*subjects[shift:], *subjects[:shift]]


@dataclass(frozen=True, slots=True)
class Target:
    """``value <op> bound``: ``>=`` for throughput ratios, ``<=`` for latencies and costs."""

    op: Literal[">=", "<="]
    bound: float
    unit: str = ""

    def met(self, value: float) -> bool:
        if math.isnan(value):
            return False
        return value >= self.bound if self.op == ">=" else value <= self.bound

    def __str__(self) -> str:
        return f"{self.op} {_number(self.bound)}{self.unit}"


@dataclass(slots=True)
class Figure:
    """One measured figure: its value in each round (NaN where a round could not take it)."""

    name: str
    unit: str = ""
    target: Target | None = None
    values: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.values.append(value)

    @property
    def taken(self) -> list[float]:
        return [v for v in self.values if not math.isnan(v)]

    @property
    def median(self) -> float:
        taken = self.taken
        return statistics.median(taken) if taken else math.nan

    def verdict(self) -> str:
        """``met`` / ``missed`` on the median, or ``—`` for a figure without a target."""
        if self.target is None:
            return "—"
        return "met" if self.target.met(self.median) else "missed"

    def spread(self) -> str:
        """``min / median / max`` over the rounds that took it (one value when only one did)."""
        taken = self.taken
        if not taken:
            return "not taken"
        if len(taken) == 1:
            return f"{_number(taken[0])}{self.unit} (1 round)"
        low, mid, high = min(taken), self.median, max(taken)
        return f"{_number(low)} / {_number(mid)} / {_number(high)}{self.unit} ({len(taken)} rounds)"

    def row(self) -> tuple[str, str, str, str]:
        """(figure, min / median / max, target, met/missed) for the summary table."""
        return (self.name, self.spread(), str(self.target or "—"), self.verdict())


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, NaN when the denominator is not a positive number."""
    if math.isnan(numerator) or math.isnan(denominator) or denominator <= 0:
        return math.nan
    return numerator / denominator


def table(figures: Sequence[Figure]) -> list[str]:
    """The Markdown table of ``figures`` (header included)."""
    lines = ["| figure | min / median / max | target | median |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(f.row()) + " |" for f in figures]
    return lines


def _number(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if value == 0:
        return "0"
    if abs(value) >= 0.1:
        return f"{value:.3f}"  # 3.004 is not 3.00: a bound of 3 is missed, and shown so
    return f"{value:.2g}"  # CPU-seconds per pod and the like: two significant digits
