"""Paired comparisons from the runs of a rotated sweep, and status cells with footnotes.

A sweep (sdq.measure.experiments) runs every configuration once per repeat, in an order that
changes from repeat to repeat; two configurations A and B therefore give one pair (a_r, b_r)
per repeat r in which both finished. `pairs` takes them from a table of runs, `ratio_summary`
gives their median ratio B/A and its interval by the lab's verdict rule (sdq.lab.verdict: the
same estimate and exact order-statistic interval, so a table's interval and a verdict's never
disagree; fewer than 6 pairs give no interval).

`run_status` turns the runs of each configuration into one text cell ("6 ok", "5 ok, 1
crashed [1]") and a footnote per error, so a table shows how its rows ended without a column
of error text and without rows that are nothing but dashes.

    runs = runs_frame(rows)                      # sdq.measure.experiments.summary
    p = pairs(runs, "serial x8", "parallel x8", "decode_tok_s")
    s = ratio_summary(p)                         # s.estimate, s.low, s.high, s.n
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sdq.lab.verdict import interval


def _usable(x) -> bool:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return False
    return math.isfinite(v) and v > 0


def pairs(runs, a: str, b: str, metric: str, label: str = "label") -> list[tuple[float, float]]:
    """(a, b) values of `metric` per repeat in which runs `a` and `b` (values of column `label`)
    both finished ("ok", and not marked `cold` False) with a finite value > 0; by repeat.

    runs : DataFrame with columns `label`, repeat, status, `metric` (and optionally cold)."""
    ok = runs[runs["status"] == "ok"]
    if "cold" in ok:
        ok = ok[~ok["cold"].eq(False)]  # a run meant to be cold that found the file cached
    by_repeat: dict[int, dict[str, float]] = {}
    for lab, rep, v in zip(ok[label], ok["repeat"], ok[metric], strict=True):
        if lab in (a, b) and _usable(v):
            by_repeat.setdefault(int(rep), {})[lab] = float(v)
    return [(d[a], d[b]) for _, d in sorted(by_repeat.items()) if a in d and b in d]


@dataclass(frozen=True)
class RatioSummary:
    """Median ratio B/A of n pairs and its interval of >= 95 % coverage (None when n < 6)."""

    n: int
    estimate: float | None
    low: float | None
    high: float | None


def ratio_summary(p: Sequence[tuple[float, float]]) -> RatioSummary:
    """The rule's estimate (median of b/a on the log scale) and interval for pairs `p`."""
    if not p:
        return RatioSummary(0, None, None, None)
    arr = np.asarray(p, dtype=np.float64)  # (n, 2)
    log_r = np.log(arr[:, 1]) - np.log(arr[:, 0])  # (n,)
    est = math.exp(float(np.median(log_r)))
    bounds = interval(log_r)
    if bounds is None:
        return RatioSummary(len(log_r), est, None, None)
    return RatioSummary(len(log_r), est, math.exp(bounds[0]), math.exp(bounds[1]))


def run_status(runs, by: Sequence[str], start: int = 1) -> tuple[dict, list[str]]:
    """One status cell per group of runs, and the footnotes its errors point to.

    runs : DataFrame of runs with columns `by`, repeat, status, error_kind, error (and
        optionally cold). Returns ({group key: "5 ok, 1 crashed [1]"}, ["[1] <label>, repeat 3:
        MemoryError: ..."]); a group key is the tuple of its `by` values. Footnotes are
        numbered from `start`; identical errors share one footnote."""
    cells: dict = {}
    notes: list[str] = []
    seen: dict[str, int] = {}
    for keys, g in runs.groupby(list(by), sort=False, dropna=False):
        keys = keys if isinstance(keys, tuple) else (keys,)
        ok = g["status"] == "ok"
        warm = g["cold"].eq(False) & ok if "cold" in g else ok & False
        parts = [f"{int((ok & ~warm).sum())} ok"]
        if warm.any():
            parts.append(f"{int(warm.sum())} not cold")
        marks = []
        for status, kind, err, rep in zip(
            g["status"], g["error_kind"], g["error"], g["repeat"], strict=True
        ):
            if status == "ok":
                continue
            text = f"{status}: {kind}: {err}".strip(": ")
            if text not in seen:
                seen[text] = start + len(notes)
                notes.append(f"[{seen[text]}] {' '.join(map(str, keys))}, repeat {rep}: {text}")
            marks.append(seen[text])
        bad = g.loc[~ok, "status"].value_counts()
        for status, count in bad.items():
            parts.append(f"{int(count)} {status}")
        marker = " " + " ".join(f"[{m}]" for m in sorted(set(marks))) if marks else ""
        cells[keys] = ", ".join(parts) + marker
    return cells, notes
