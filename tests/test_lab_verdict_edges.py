"""The verdict rule at its edges: every branch's word, seed_inside, reason and recorded fields,
the interval's edges at exact zero, the settling projection's arithmetic, a claim's refusals
word for word, and every committed record redone from its data."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np
import pytest
from test_lab_verdict import PARALLEL, pairs_with_ratios

from sdq.errors import LabError, ParamsError
from sdq.lab.outputs import collect_verdicts
from sdq.lab.paths import repo_root
from sdq.lab.verdict import (
    CONTRADICTED,
    INCONCLUSIVE,
    MIN_N,
    NOT_REPRODUCED,
    NOT_TESTABLE,
    REPRODUCED,
    RULE,
    SMALLER,
    Claim,
    _n_needed,
    coverage,
    distinct_numbers,
    from_record,
    interval,
    judge,
    judge_computed,
    judge_level,
    judge_not_testable,
    order_statistic_rank,
    rejudge,
    to_record,
)

WAIT = Claim("000-§3-io-wait", "T4", "12.6 -> 7.57 ms", seed=0.5, direction="lower",
             metric="expert_io_ms_per_token", a="serial", b="parallel")  # fmt: skip
FLAT = Claim("000-§2-threads-flat", "T3", "16 vs 24 threads", seed=1.0, direction="equal",
             metric="layer_ms", kind="null")  # fmt: skip
HITS = Claim("000-§6-arena-hits", "T10", "69.25 % -> 70.58 %", seed=0.7, direction="higher",
             metric="hit_rate", kind="computed", null=0.4)  # fmt: skip
RSS = Claim("000-§5.2-fits", "T9", "fits at 900 MB", seed=0.98, direction="equal",
            metric="peak_rss / limit", kind="level", null=1.0)  # fmt: skip


# --- every branch: word, seed_inside, reason, recorded fields ----------------------------------


def test_an_effect_in_each_region_gets_its_word_its_overlap_and_its_reason():
    inside = judge(PARALLEL, pairs_with_ratios([1.45, 1.5, 1.4, 1.55, 1.48, 1.46]))
    assert (inside.verdict, inside.seed_inside) == (REPRODUCED, True)
    assert "excludes 1 on the seed's side and meets the seed's 1.48 ±20%" in inside.reason
    smaller = judge(
        PARALLEL, pairs_with_ratios([1.05, 1.06, 1.07, 1.05, 1.06, 1.07])
    )  # > 1, below 1.23
    assert (smaller.verdict, smaller.seed_inside) == (NOT_REPRODUCED, False)
    below = judge(PARALLEL, pairs_with_ratios([1.21, 1.22, 1.21, 1.22, 1.21, 1.22]))
    assert (below.verdict, below.seed_inside) == (SMALLER, False)
    assert "lies below the seed's 1.48 ±20%" in below.reason
    above = judge(PARALLEL, pairs_with_ratios([2.5, 2.6, 2.7, 2.5, 2.6, 2.7]))
    assert above.seed_inside is False and "lies above the seed's 1.48 ±20%" in above.reason
    opposite = judge(PARALLEL, pairs_with_ratios([0.5, 0.6, 0.55, 0.5, 0.6, 0.55]))
    assert (opposite.verdict, opposite.seed_inside) == (CONTRADICTED, False)
    assert "excludes 1 on the side opposite the seed's, beyond ±20%" in opposite.reason
    unsure = judge(PARALLEL, pairs_with_ratios([0.9, 1.6, 1.5, 1.4, 1.3, 1.0]))
    assert (unsure.verdict, unsure.seed_inside) == (INCONCLUSIVE, True)
    assert re.search(r"contains 1 and reaches beyond ±20%; about \d+ pairs would", unsure.reason)


def test_a_null_claim_in_each_region_gets_its_word_and_its_overlap():
    flat = judge(FLAT, pairs_with_ratios([1.0, 1.05, 0.95, 1.02, 0.98, 1.01]))
    assert (flat.verdict, flat.seed_inside) == (REPRODUCED, True)
    assert "lies inside 1 ±20%" in flat.reason
    steep = judge(FLAT, pairs_with_ratios([2.0, 2.1, 1.9, 2.2, 2.0, 2.05]))
    assert (steep.verdict, steep.seed_inside) == (CONTRADICTED, False)
    assert "lies outside 1 ±20%" in steep.reason
    low = judge(
        FLAT, pairs_with_ratios([0.5, 0.52, 0.48, 0.5, 0.51, 0.49])
    )  # outside on the low side
    assert low.verdict == CONTRADICTED
    edge = judge(FLAT, pairs_with_ratios([1.0, 1.1, 1.3, 1.15, 1.05, 1.0]))
    assert (edge.verdict, edge.seed_inside) == (INCONCLUSIVE, True)
    assert edge.reason.endswith(f"straddles the edge of 1 ±20%; about {edge.n_needed} pairs would "
                                "settle it")  # fmt: skip


def test_an_interval_that_touches_zero_is_not_a_decision():
    """lo = 0 exactly is not 'no effect excluded', and hi = 0 exactly not 'the other side'."""
    up = judge(PARALLEL, pairs_with_ratios([1.0, 1.0, 1.0, 1.5, 1.5, 1.5]))
    assert (up.low, up.verdict) == (1.0, INCONCLUSIVE)
    down = judge(PARALLEL, pairs_with_ratios([0.7, 0.7, 0.7, 1.0, 1.0, 1.0]))
    assert (down.high, down.verdict) == (1.0, INCONCLUSIVE)


def test_a_lower_claim_that_its_regime_rules_out_says_at_least_and_keeps_the_regime():
    """'lower' claims show the regime's cap as a ratio B/A (1 / ceiling) and say 'at least'."""
    v = judge(
        WAIT, pairs_with_ratios([0.9] * 6), ceiling=1.25, regime="I/O wait 20 % of token time"
    )
    assert v.verdict == NOT_TESTABLE
    assert v.reason == (
        "I/O wait 20 % of token time: at least 0.8× here, short of the seed's 0.5× by more "
        "than its 20% margin"
    )
    assert (v.ceiling, v.regime) == (1.25, "I/O wait 20 % of token time")
    higher = judge(PARALLEL, pairs_with_ratios([1.0] * 6), ceiling=1.1, regime="I/O 9 %")
    assert higher.reason.startswith("I/O 9 %: at most 1.1× here, short of the seed's 1.48×")


def test_a_regime_that_reaches_the_seeds_band_leaves_the_claim_testable():
    v = judge(
        PARALLEL, pairs_with_ratios([1.45, 1.5, 1.4, 1.55, 1.48, 1.46]), ceiling=1.48, regime="cap"
    )
    assert v.verdict == REPRODUCED and (v.ceiling, v.regime) == (1.48, "cap")


def test_a_null_claim_holds_trivially_when_the_cap_is_the_margin_itself():
    flat = replace(FLAT, margin=0.25)
    assert math.log(1.25) == math.log1p(0.25)  # 1.25 is exact: the cap is the band's edge
    v = judge(flat, pairs_with_ratios([1.0] * 6), ceiling=1.25, regime="I/O < 1 %")
    assert v.verdict == NOT_TESTABLE and "holds trivially" in v.reason
    assert (
        judge(flat, pairs_with_ratios([1.0] * 6), ceiling=1.3, regime="I/O 30 %").verdict
        == REPRODUCED
    )


def test_defaults_record_no_why_and_no_regime():
    for v in (
        judge(PARALLEL, pairs_with_ratios([1.5] * 6)),
        judge_level(RSS, [0.97] * 6),
        judge_computed(HITS, 0.7),
        judge_not_testable(PARALLEL, "another machine's absolute tok/s"),
    ):
        assert v.why == "" and v.ceiling is None
    assert judge_level(RSS, [0.97] * 6).regime == "" and judge_computed(HITS, 0.7).regime == ""
    assert judge_computed(HITS, 0.7, why="one trace").why == "one trace"
    level = judge_level(RSS, [0.97] * 6, why="cgroup", ceiling=1.01, regime="r")
    assert (level.why, level.ceiling, level.regime) == ("cgroup", 1.01, "r")
    assert level.data == (0.97,) * 6
    assert judge_not_testable(PARALLEL, "r", why="w").data == ()


def test_no_pairs_at_all_is_inconclusive_asking_for_six():
    v = judge(PARALLEL, [])
    assert (v.verdict, v.n, v.estimate, v.n_needed, v.data) == (INCONCLUSIVE, 0, None, MIN_N, ())
    assert v.reason == "0 pairs: an interval with 95% coverage needs at least 6"


def test_measurements_of_the_wrong_kind_or_shape_are_named():
    with pytest.raises(ParamsError, match=r"^claim 000-§0-parallel: a computed claim is not "):
        judge(replace(HITS, id="000-§0-parallel"), pairs_with_ratios([1.0]))
    with pytest.raises(LabError, match=r"^claim 000-§5.2-fits: values must have shape \(n,\), "):
        judge_level(RSS, [[0.9, 0.9]])
    with pytest.raises(LabError, match=r"^claim 000-§5.2-fits: run 1 is nan: every measurement"):
        judge_level(RSS, [0.9, float("nan")])
    with pytest.raises(LabError, match=r"^claim 000-§6-arena-hits: value 0 is -1.0: every "):
        judge_computed(HITS, -1.0)


# --- the interval and the projection --------------------------------------------------------


def test_the_rank_and_coverage_follow_the_confidence_asked_for():
    assert order_statistic_rank(10, 0.8) == 3 and order_statistic_rank(10) == 2
    assert coverage(10, 0.8) == pytest.approx(1 - 2 * 56 / 1024)
    assert interval(np.arange(10.0), 0.8) == (2.0, 7.0)
    assert order_statistic_rank(6, 1 - 2 / 64) == 1  # exactly at the bound: included
    assert order_statistic_rank(5, 0.5) == 2  # [x(2), x(4)]: P(Bin(5, 1/2) < 3) = 1/2


def test_the_settling_projection_by_hand():
    """n · (half-width on the edge's side / distance to the edge)², at least n + 1 and 6."""
    assert _n_needed(10, 0.25, 0.125, 1.25, [0.5]) == 160  # half = hi - m = 1, gap 0.25
    assert _n_needed(10, 0.25, 0.0, 2.25, [0.0]) == 11  # half = m - lo: 10 · 1 = 10 -> n + 1
    assert _n_needed(10, 0.25, 0.0, 0.5, [0.25]) == 11  # an edge at the estimate: no option
    assert _n_needed(10, 0.25, 0.0, 0.5, [2.25]) == 11  # 10 / 64 -> n + 1
    assert _n_needed(2, 0.25, 0.0, 0.5, [2.25]) == MIN_N


def test_numbers_shown_side_by_side():
    assert distinct_numbers(1000.0) == ["1,000"]
    assert distinct_numbers(999.5) == ["1e+03"]
    assert distinct_numbers(1.000001, 1.000002) == ["1", "1"]  # 6 digits at most


# --- a claim's refusals, word for word ------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"metric": " "}, "claim '000-§0-parallel': metric must be a non-empty string"),
        ({"metric": 3}, "claim '000-§0-parallel': metric must be a non-empty string"),
        ({"a": 3}, "claim '000-§0-parallel': a 3 must be one printable line without '|'"),
        (
            {"kind": "guess"},
            "claim 000-§0-parallel: kind 'guess' is not one of "
            "('effect', 'null', 'level', 'computed')",
        ),  # fmt: skip
        (
            {"kind": "level"},
            "claim 000-§0-parallel: a level claim needs null, the value at which "
            "the finding would not hold",
        ),  # fmt: skip
        (
            {"kind": "level", "null": -1.0},
            "claim 000-§0-parallel: null -1.0 must be a finite number > 0",
        ),  # fmt: skip
        (
            {"seed": 1.3, "margin": 0.2},
            "claim 000-§0-parallel: seed 1.3 is not higher than the no-effect value 1 by more "
            "than twice the margin 0.2 (its band would meet the no-effect band): a smaller "
            "margin, or a null claim",
        ),  # fmt: skip
        (
            {"kind": "null", "direction": "equal", "seed": 1.3},
            "claim 000-§0-parallel: the seed's own 1.3 lies outside its no-effect band "
            "(margin 0.2): the seed saw a difference; widen the margin or code the claim as "
            "an effect",
        ),  # fmt: skip
    ],
)
def test_a_claim_refuses_with_the_whole_reason(fields, message):
    with pytest.raises(ParamsError) as err:
        replace(PARALLEL, **fields)
    assert str(err.value) == message


def test_a_seed_exactly_twice_the_margin_away_is_refused_and_one_inside_its_band_is_kept():
    """The bands may not meet (strictly more than 2d); an equal claim's seed may sit on its
    band's edge (1.25 is exact, so log 1.25 is the band's edge d to the last bit)."""
    assert math.log(1.5625) == 2 * math.log1p(0.25)
    with pytest.raises(ParamsError, match="by more than twice the margin"):
        replace(PARALLEL, seed=1.5625, margin=0.25)
    assert replace(FLAT, seed=1.25, margin=0.25).seed == 1.25


def test_the_rule_section_is_the_docstring_between_its_heading_and_the_end():
    assert RULE.startswith("**What a claim says.**")
    assert RULE.endswith("no spread to project from, and 6 is reported.\n")
    assert not RULE.endswith("\n\n")


# --- records ---------------------------------------------------------------------------------


def committed_records():
    return [record for _, record in collect_verdicts(repo_root() / "outputs", "default")]


def test_every_committed_record_is_what_its_data_give_and_reads_back_as_written():
    """Each record of outputs/*/default/ judged again from its data gives the same verdict in
    every field but the reason's wording, and record -> (claim, verdict) -> record is exact."""
    records = committed_records()
    kinds = {r["kind"] for r in records}
    assert kinds == {"effect", "null", "level", "computed"}, kinds
    assert any(r["ceiling"] is not None for r in records)
    for record in records:
        claim, recorded = from_record(record)
        assert to_record(claim, recorded) == record, claim.id
        again = rejudge(claim, recorded)
        assert replace(again, reason=recorded.reason) == recorded, claim.id


def test_a_not_testable_record_without_data_is_redone_as_it_was():
    v = judge_not_testable(PARALLEL, "the seed's absolute tok/s", why="another machine")
    record = to_record(PARALLEL, v)
    claim, back = from_record(record)
    assert back == v and rejudge(claim, back) == v


def test_a_broken_record_names_the_claim_and_the_problem():
    record = to_record(PARALLEL, judge(PARALLEL, pairs_with_ratios([1.5] * 6)))
    missing = {k: v for k, v in record.items() if k != "claim"}
    with pytest.raises(LabError) as err:
        from_record(missing)
    assert str(err.value) == "verdict record '?': no field 'claim'"
    with pytest.raises(LabError) as err:
        from_record({**record, "margin": "wide"})
    assert str(err.value) == (
        "verdict record '000-§0-parallel': claim 000-§0-parallel: margin 'wide' must be a finite "
        "number > 0"
    )
