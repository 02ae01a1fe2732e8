"""sdq.lab.paired: pairs by repeat from a rotated sweep, their ratio by the verdict rule, and
status cells with footnotes."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from sdq.lab.paired import pairs, ratio_summary, run_status
from sdq.lab.verdict import Claim, judge


def _runs(rows):
    cols = ["label", "repeat", "status", "error_kind", "error", "cold", "v"]
    return pd.DataFrame(rows, columns=cols)


RUNS = _runs(
    [
        ("A", 0, "ok", "", "", True, 2.0),
        ("B", 0, "ok", "", "", True, 3.0),
        ("B", 1, "ok", "", "", True, 4.0),  # B ran first in repeat 1
        ("A", 1, "ok", "", "", True, 2.0),
        ("A", 2, "crashed", "MemoryError", "MemoryError: x", True, None),
        ("B", 2, "ok", "", "", True, 5.0),
        ("A", 3, "ok", "", "", False, 1.0),  # found the file cached: not cold
        ("B", 3, "ok", "", "", True, 9.0),
        ("A", 4, "ok", "", "", True, 4.0),
        ("B", 4, "ok", "", "", True, 2.0),
        ("A", 5, "crashed", "MemoryError", "MemoryError: x", True, None),
        ("B", 5, "timeout", "timeout", "killed after the time limit", None, None),
    ]
)


def test_pairs_are_repeats_in_which_both_finished_cold():
    assert pairs(RUNS, "A", "B", "v") == [(2.0, 3.0), (2.0, 4.0), (4.0, 2.0)]
    assert pairs(RUNS, "B", "A", "v") == [(3.0, 2.0), (4.0, 2.0), (2.0, 4.0)]
    assert pairs(RUNS, "A", "C", "v") == []


def test_ratio_summary_is_the_verdict_rules_estimate_and_interval():
    p = [(2.0, 3.0), (2.0, 4.0), (4.0, 2.0), (1.0, 1.3), (2.0, 2.2), (1.0, 1.7)]
    s = ratio_summary(p)
    v = judge(Claim("x-§1-y", "T4", "x", seed=1.5, direction="higher", metric="m"), p)
    assert (s.n, s.estimate, s.low, s.high) == (6, v.estimate, v.low, v.high)
    assert s.estimate == pytest.approx(math.sqrt(1.3 * 1.5))  # middle two, geometric mean
    assert (s.low, s.high) == pytest.approx((0.5, 2.0))  # n = 6: smallest to largest
    five = ratio_summary(p[:5])
    assert (five.n, five.low, five.high) == (5, None, None)
    assert ratio_summary([]) == ratio_summary(())
    assert ratio_summary([]).estimate is None


def test_status_cells_count_runs_and_point_to_one_footnote_per_error():
    cells, notes = run_status(RUNS, ["label"])
    assert cells[("A",)] == "3 ok, 1 not cold, 2 crashed [1]"
    assert cells[("B",)] == "5 ok, 1 timeout [2]"
    assert notes == [
        "[1] A, repeat 2: crashed: MemoryError: MemoryError: x",
        "[2] B, repeat 5: timeout: timeout: killed after the time limit",
    ]
    cells, notes = run_status(RUNS[RUNS["status"] == "ok"], ["label"], start=3)
    assert cells == {("A",): "3 ok, 1 not cold", ("B",): "5 ok"} and notes == []
