"""The bench's summary over rounds: rotation, min / median / max, met or missed on the median."""

from __future__ import annotations

import math

from bench.figures import Figure, Target, ratio, rotated, table


def test_each_round_starts_with_a_different_subject_and_keeps_the_rest_in_order() -> None:
    subjects = ["raw", "kwok", "memory", "local"]
    orders = [rotated(subjects, r) for r in range(4)]
    assert [order[0] for order in orders] == subjects
    assert orders[1] == ["kwok", "memory", "local", "raw"]
    assert rotated(subjects, 4) == subjects
    assert rotated([], 2) == []


def test_a_target_is_judged_on_the_median_not_on_the_best_round() -> None:
    figure = Figure("memory vs KWOK", "x", Target(">=", 1.0))
    for value in (1.4, 0.8, 0.9):  # one lucky round
        figure.add(value)
    assert figure.median == 0.9
    assert figure.verdict() == "missed"
    assert figure.spread() == "0.800 / 0.900 / 1.400x (3 rounds)"


def test_an_upper_bound_is_met_at_the_bound_and_missed_above_it() -> None:
    assert Target("<=", 5.0).met(5.0)
    assert not Target("<=", 5.0).met(5.01)
    assert Target(">=", 0.5).met(0.5)
    assert not Target(">=", 0.5).met(math.nan)


def test_a_round_that_could_not_take_a_figure_is_left_out_not_counted_as_zero() -> None:
    figure = Figure("p99", " s", Target("<=", 1.0))
    figure.add(math.nan)
    figure.add(0.4)
    assert figure.spread() == "0.400 s (1 round)"
    assert figure.verdict() == "met"
    empty = Figure("never", "", Target("<=", 1.0))
    assert empty.spread() == "not taken"
    assert empty.verdict() == "missed"


def test_a_figure_just_over_its_bound_does_not_print_as_the_bound() -> None:
    figure = Figure("writes per pod", "", Target("<=", 3.0), [3.004])
    assert figure.verdict() == "missed"
    assert figure.spread() == "3.004 (1 round)"
    assert Figure("cpu", " s", None, [0.0137]).spread() == "0.014 s (1 round)"


def test_a_ratio_over_nothing_is_not_a_number() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert math.isnan(ratio(3.0, 0.0))
    assert math.isnan(ratio(math.nan, 2.0))


def test_the_table_has_one_row_per_figure_with_target_and_verdict() -> None:
    figures = [Figure("a", "x", Target(">=", 1.0, "x"), [1.2, 1.1, 1.3]), Figure("b", " MiB")]
    figures[1].add(120.0)
    lines = table(figures)
    assert lines[0] == "| figure | min / median / max | target | median |"
    assert lines[2] == "| a | 1.100 / 1.200 / 1.300x (3 rounds) | >= 1.000x | met |"
    assert lines[3] == "| b | 120 MiB (1 round) | — | — |"
