"""Verdicts on seed claims: the rule on hand-computable cases, the exact interval's coverage
by simulation, every recorded claim's coding audited against synthetic data, and the records."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from sdq.errors import LabError, ParamsError
from sdq.lab import Outputs
from sdq.lab.outputs import collect_verdicts, read_verdicts
from sdq.lab.paths import repo_root
from sdq.lab.verdict import (
    CONTRADICTED,
    INCONCLUSIVE,
    LARGER,
    MIN_N,
    NOT_REPRODUCED,
    NOT_TESTABLE,
    REPRODUCED,
    RULE,
    SMALLER,
    Claim,
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

PARALLEL = Claim(
    "000-§0-parallel",
    "T4",
    "+48.0 % decode tok/s (3.73 -> 5.52)",
    seed=1.48,
    direction="higher",
    metric="decode_tok_s",
    a="serial",
    b="parallel",
)
ADMISSION = Claim(  # admission lowered the hit rate: miss rate 30 % -> 35 %
    "000-§4.3-admission",
    "T7",
    "hit rate 70 % -> 65 %",
    seed=0.35 / 0.30,
    direction="higher",
    metric="miss rate",
    a="lru",
    b="admit 2",
    margin=0.05,
)
FLAT = Claim(  # 000 §1: latency stays flat from 1 to 16 reads in flight
    "000-§1-latency",
    "T1",
    "6.94 -> 7.77 ms (1.12x)",
    seed=7.77 / 6.94,
    direction="equal",
    metric="median read ms",
    a="1 read",
    b="16 reads",
    kind="null",
)
HIT_RATE = Claim(
    "000-§6-hit-rate",
    "T8",
    "LRU hit rate ~70 %",
    seed=0.70,
    direction="higher",
    metric="hit_rate",
    kind="level",
    null=0.4,
)
SPAN = Claim(
    "000-§2-three-reads",
    "T2",
    "three segments at three offsets",
    seed=131.2,
    direction="higher",
    metric="read span / bytes",
    kind="computed",
    null=1.0,
)


def pairs_with_ratios(ratios, a=4.0):
    """Pairs (a, a * r): the per-pair ratios are exactly `ratios` (a is a power of two)."""
    return [(a, a * r) for r in ratios]


# --- the interval ----------------------------------------------------------------------------


def test_the_rank_is_the_largest_with_at_least_95_percent_coverage():
    """By hand: with n = 6 the extremes cover 1 - 2/64; with n = 9, the 2nd from each end
    covers 1 - 2 * 10/512; with 5 even the extremes cover only 1 - 2/32 < 95 %."""
    assert [order_statistic_rank(n) for n in (1, 5, 6, 8, 9, 12, 17, 20)] == [
        0,
        0,
        1,
        1,
        2,
        3,
        5,
        6,
    ]
    assert coverage(6) == pytest.approx(62 / 64) and coverage(9) == pytest.approx(1 - 20 / 512)
    assert coverage(5) is None and MIN_N == 6
    for n in range(6, 60):
        k = order_statistic_rank(n)
        assert coverage(n) >= 0.95
        wider = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
        assert 1 - 2 * wider < 0.95  # k + 1 would fall short


def test_the_interval_is_the_kth_order_statistics():
    x = np.log([0.9, 1.3, 1.1, 0.8, 1.2, 1.0, 1.05, 0.95, 1.15])  # n = 9: k = 2
    lo, hi = interval(x)
    assert (math.exp(lo), math.exp(hi)) == pytest.approx((0.9, 1.2))
    assert interval(x[:5]) is None


@pytest.mark.parametrize("n", [4, 6, 10, 20])
@pytest.mark.parametrize("tails", ["normal", "student-t2", "cauchy"])
def test_the_interval_covers_the_true_median_at_least_93_percent_at_small_n(n, tails):
    """Simulated coverage of the median of log ratios, nominal 95 %: 4,000 samples of n pairs.
    An interval that does not exist (n < 6) cannot cover, so it counts as a miss: at n = 4 the
    method must give no decisive word instead (checked below)."""
    rng = np.random.default_rng(20261206 + n)
    trials, true_median = 4000, 0.3
    draw = {
        "normal": lambda size: rng.normal(0, 0.1, size),
        "student-t2": lambda size: 0.1 * rng.standard_t(2, size),
        "cauchy": lambda size: 0.1 * rng.standard_cauchy(size),
    }[tails]
    samples = true_median + draw((trials, n))  # (trials, n) log ratios
    covered = 0
    for row in samples:
        bounds = interval(row)
        covered += bounds is not None and bounds[0] <= true_median <= bounds[1]
    if n < MIN_N:
        assert covered == 0  # no interval at all: the rule gives no decisive word (next test)
        return
    assert covered / trials >= 0.93, f"coverage {covered / trials:.3f} at n = {n} ({tails})"


@pytest.mark.parametrize("n", [1, 2, 4, 5])
def test_fewer_than_6_pairs_are_never_decisive(n):
    for ratio in (1.48, 1.0, 0.5, 3.0):
        v = judge(PARALLEL, pairs_with_ratios([ratio] * n))
        assert v.verdict == INCONCLUSIVE and v.low is None and v.n_needed == MIN_N
        assert (
            v.reason
            == f"{n} pair{'s' if n > 1 else ''}: an interval with 95% coverage needs at least 6"
        )
    assert judge(FLAT, pairs_with_ratios([1.0] * 5)).verdict == INCONCLUSIVE


# --- the words of an effect --------------------------------------------------------------------


def test_an_effect_of_the_seeds_size_is_reproduced():
    v = judge(PARALLEL, pairs_with_ratios([1.45, 1.50, 1.52, 1.47, 1.55, 1.40]))
    assert v.verdict == REPRODUCED and v.seed_inside is True
    assert (v.low, v.high) == pytest.approx((1.40, 1.55)) and v.confidence == pytest.approx(62 / 64)
    assert v.reason == (
        "96.9% interval 1.4–1.55 excludes 1 on the seed's side and meets the seed's 1.48 ±20%"
    )


def test_a_real_effect_far_smaller_than_the_seeds_is_direction_only():
    v = judge(PARALLEL, pairs_with_ratios([1.10, 1.15, 1.12, 1.22, 1.18, 1.13]))
    assert v.verdict == SMALLER and v.seed_inside is False
    assert v.reason == "96.9% interval 1.1–1.22 excludes 1 and lies below the seed's 1.48 ±20%"
    big = judge(PARALLEL, pairs_with_ratios([2.5, 2.6, 2.4, 2.7, 2.55, 2.45]))
    assert big.verdict == LARGER


def test_an_effect_25_times_smaller_than_the_seeds_is_not_reproduced():
    """000 §0 on this machine: 1.018x [1.0004, 1.030] against the seed's 1.48x."""
    v = judge(PARALLEL, pairs_with_ratios([1.0004, 1.03, 1.018, 1.02, 1.01, 1.025]))
    assert v.verdict == NOT_REPRODUCED
    assert v.reason.endswith("lies inside 1 ±20%")


def test_an_opposite_effect_beyond_the_margin_is_contradicted():
    v = judge(PARALLEL, pairs_with_ratios([0.70, 0.75, 0.80, 0.72, 0.78, 0.74]))
    assert v.verdict == CONTRADICTED


def test_noise_is_inconclusive_with_the_pairs_that_would_settle_it():
    ratios = [0.7, 1.9, 1.1, 1.6, 0.9, 1.3]
    v = judge(PARALLEL, pairs_with_ratios(ratios))
    assert v.verdict == INCONCLUSIVE and (v.low, v.high) == pytest.approx((0.7, 1.9))
    m = (math.log(1.1) + math.log(1.3)) / 2
    lo, hi, d, s = math.log(0.7), math.log(1.9), math.log(1.2), math.log(1.48)
    edges = [0.0, d, -d, s - d]
    by_hand = min(
        6 * (((m - lo) if e < m else (hi - m)) / abs(m - e)) ** 2 for e in edges if e != m
    )
    assert v.n_needed == max(7, math.ceil(by_hand))
    assert v.reason.endswith(f"about {v.n_needed} pairs would settle it")


def test_direction_lower_uses_the_inverse_ratio_and_swapping_arms_keeps_the_word():
    rng = np.random.default_rng(7)
    a = rng.uniform(3, 4, 8)
    b = a * rng.lognormal(0.4, 0.02, 8)
    v = judge(PARALLEL, np.c_[a, b])
    mirror = Claim("000-§0-serial", "T4", "-32 %", 1 / 1.48, "lower", "decode_tok_s")
    w = judge(mirror, np.c_[b, a])
    assert w.verdict == v.verdict == REPRODUCED
    assert (w.estimate, w.low, w.high) == pytest.approx(
        (1 / v.estimate, 1 / v.high, 1 / v.low), rel=1e-12
    )


# --- null, level, computed, applicability ---------------------------------------------------------


def test_a_null_claim_is_judged_by_equivalence():
    assert judge(FLAT, pairs_with_ratios([1.0, 1.05, 0.97, 1.1, 1.02, 0.99])).verdict == REPRODUCED
    rise = judge(FLAT, pairs_with_ratios([9.0, 9.4, 9.6, 8.5, 10.2, 9.3]))  # page 01's 9.38x
    assert rise.verdict == CONTRADICTED and rise.reason.endswith("lies outside 1 ±20%")
    slower = judge(FLAT, pairs_with_ratios([0.5, 0.55, 0.6, 0.52, 0.58, 0.54]))
    assert slower.verdict == CONTRADICTED
    edge = judge(FLAT, pairs_with_ratios([1.1, 1.3, 1.15, 1.25, 1.2, 1.18]))
    assert edge.verdict == INCONCLUSIVE and edge.n_needed >= 7


def test_a_level_claim_is_judged_against_its_no_effect_level():
    v = judge_level(HIT_RATE, [0.69, 0.71, 0.70, 0.72, 0.70, 0.68])
    assert v.verdict == REPRODUCED and v.estimate == pytest.approx(0.70)
    assert "excludes the no-effect value 0.4" in v.reason
    assert judge_level(HIT_RATE, [0.42, 0.38, 0.40, 0.41, 0.39, 0.40]).verdict == NOT_REPRODUCED


def test_a_computed_value_is_judged_once_and_never_bootstrapped():
    v = judge_computed(SPAN, 130.78)
    assert v.verdict == REPRODUCED and v.n == 1 and v.low == v.high == pytest.approx(130.78)
    assert v.confidence == 1.0 and v.data == (130.78,)
    assert v.reason.startswith("130.8 excludes the no-effect value 1")
    assert judge_computed(SPAN, 3.0).verdict == SMALLER
    assert judge_computed(SPAN, 1.1).verdict == NOT_REPRODUCED
    with pytest.raises(ParamsError, match="not one computed value"):
        judge_computed(PARALLEL, 1.2)
    with pytest.raises(ParamsError, match="not judged from runs"):
        judge_level(SPAN, [130.0] * 6)


def test_a_regime_that_caps_the_gain_below_the_seeds_makes_it_not_testable():
    """Reads are 17.6 % of the token: removing all I/O could gain at most 1.21x."""
    regime = "I/O wait 9.3 of 53 ms per token (17.6 %)"
    v = judge(PARALLEL, pairs_with_ratios([1.02] * 6), ceiling=1 / (1 - 0.176), regime=regime)
    assert v.verdict == NOT_TESTABLE and v.estimate == pytest.approx(1.02)
    assert (
        v.reason
        == f"{regime}: at most 1.21× here, short of the seed's 1.48× by more than its 20% margin"
    )
    open_ = judge(PARALLEL, pairs_with_ratios([1.45] * 6), ceiling=3.0, regime=regime)
    assert open_.verdict == REPRODUCED
    split = Claim("000-§4.1-split", "T5", "+1.6 %", 1.016, "equal", "decode_tok_s", kind="null",
                  margin=0.1)  # fmt: skip
    trivial = judge(split, pairs_with_ratios([1.0] * 6), ceiling=1.004, regime="I/O < 1 %")
    assert trivial.verdict == NOT_TESTABLE and "holds trivially" in trivial.reason
    with pytest.raises(LabError, match="needs a positive value and a regime"):
        judge(PARALLEL, pairs_with_ratios([1.0] * 6), ceiling=2.0)


def test_a_claim_this_machine_cannot_test_says_what_rules_it_out():
    v = judge_not_testable(PARALLEL, "absolute tok/s of another machine")
    assert v.verdict == NOT_TESTABLE and v.n == 0 and v.reason == v.regime
    assert rejudge(PARALLEL, v) == v
    with pytest.raises(LabError, match="needs the regime"):
        judge_not_testable(PARALLEL, " ")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"seed": 0.9}, "seed 0.9 is not higher than the no-effect value 1 by more than twice"),
        ({"seed": 1.3}, "by more than twice the margin 0.2"),
        ({"table": "T13"}, "table 'T13' is not one of"),
        ({"direction": "up"}, "direction 'up' is not one of"),
        ({"direction": "equal"}, "a finding of no difference is kind 'null'"),
        ({"kind": "null"}, "a null claim has direction 'equal'"),
        ({"kind": "null", "direction": "equal"}, "lies outside its no-effect band"),
        ({"seed": float("nan")}, "seed nan must be a finite number > 0"),
        ({"margin": 0}, "margin 0 must be a finite number > 0"),
        ({"null": 0.5}, "null=0.5 is for level and computed claims"),
        ({"kind": "level"}, "a level claim needs null"),
        ({"basis": "guess"}, "basis 'guess' is not one of"),
        ({"id": "a|b"}, "must be one printable line without '|'"),
    ],
)
def test_bad_claims_are_params_errors(changes, message):
    fields = {
        "id": "x",
        "table": "T4",
        "seed_figure": "+48 %",
        "seed": 1.48,
        "direction": "higher",
        "metric": "decode_tok_s",
    }
    fields.update(changes)
    with pytest.raises(ParamsError, match=re.escape(message)):
        Claim(**fields)


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        ([(3.0, 4.0), (float("nan"), 5.2)], r"pair 1 is \(nan, 5.2\).*\(1 of 2 pairs are not\)"),
        ([(3.0, 0.0), (3.0, 4.0)], r"pair 0 is \(3.0, 0.0\)"),
        ([(1.0, 2.0, 3.0)], r"pairs must have shape \(n, 2\), got \(1, 3\)"),
    ],
)
def test_bad_measurements_are_lab_errors_with_the_numbers(pairs, message):
    with pytest.raises(LabError, match=message):
        judge(PARALLEL, pairs)


def test_the_rule_text_names_every_word():
    for word in ("*reproduced*", "*not reproduced*", "*contradicted*", "*inconclusive*",
                 "*not testable here*", "*reproduced in direction only (smaller)*"):  # fmt: skip
        assert word in RULE


def test_numbers_side_by_side_get_the_digits_that_tell_them_apart():
    assert distinct_numbers(1.48, 1.0, 0.855) == ["1.48", "1", "0.855"]
    assert distinct_numbers(1.0086, 1.0148, 1.0) == ["1.009", "1.015", "1"]
    assert distinct_numbers(None, 2841.3) == ["—", "2,841"]


# --- the coding audit: every recorded claim against synthetic data ----------------------------


def committed_claims() -> list[Claim]:
    claims = []
    for _, record in collect_verdicts(repo_root() / "outputs", "default"):
        claims.append(from_record(record)[0])
    return claims


def synthetic(claim: Claim, aligned: float, n: int = 20) -> list:
    """Data whose aligned log effect is `aligned` (the seed's side positive), with a spread of
    1 % of the margin: pairs, runs or one value, as the claim's kind is judged."""
    sign = -1.0 if claim.direction == "lower" else 1.0
    rng = np.random.default_rng(0)
    logs = sign * aligned + rng.normal(0, 0.01 * claim.band, n)  # (n,)
    if claim.kind in ("effect", "null"):
        return [(2.0, 2.0 * math.exp(x)) for x in logs]
    if claim.kind == "level":
        return [claim.reference * math.exp(x) for x in logs]
    return [claim.reference * math.exp(sign * aligned)]


def judged(claim: Claim, data: list):
    if claim.kind in ("effect", "null"):
        return judge(claim, data).verdict
    if claim.kind == "level":
        return judge_level(claim, data).verdict
    return judge_computed(claim, data[0]).verdict


def test_every_committed_claim_is_coded_so_that_the_seeds_effect_reproduces_it():
    """At the seed's own effect a claim must read "reproduced", at no effect "not reproduced"
    ("reproduced" for a claim of no difference), and at the opposite effect "contradicted":
    a claim coded in the wrong direction, kind or margin fails here."""
    claims = committed_claims()
    assert claims, "no verdicts under outputs/*/default/"
    for claim in claims:
        seed = math.log(claim.seed / claim.reference) * (-1 if claim.direction == "lower" else 1)
        if claim.direction == "equal":
            assert judged(claim, synthetic(claim, 0.0)) == REPRODUCED, claim.id
            assert judged(claim, synthetic(claim, 3 * claim.band)) == CONTRADICTED, claim.id
            continue
        assert judged(claim, synthetic(claim, seed)) == REPRODUCED, claim.id
        assert judged(claim, synthetic(claim, 0.0)) == NOT_REPRODUCED, claim.id
        assert judged(claim, synthetic(claim, -seed)) == CONTRADICTED, claim.id


def test_no_committed_verdict_overstates_the_reproduction():
    """The issue's "done when" on the committed outputs: no "reproduced" outside the seed's band,
    no interval from fewer than 6 measurements, no computed value repeated, no empty claim."""
    for _, record in collect_verdicts(repo_root() / "outputs", "default"):
        claim, v = from_record(record)
        assert v.n > 0, f"{claim.id}: no data (n = 0)"
        if claim.kind == "computed":
            assert v.n == 1, f"{claim.id}: a computed value judged {v.n} times"
        if v.verdict in (REPRODUCED, SMALLER, LARGER, NOT_REPRODUCED, CONTRADICTED):
            assert claim.kind == "computed" or v.n >= MIN_N, f"{claim.id}: decisive from {v.n}"
        if v.verdict == REPRODUCED and claim.direction != "equal":
            lo, hi = sorted((v.low, v.high))
            widen = 1 + claim.margin
            assert lo / widen <= claim.seed <= hi * widen, f"{claim.id}: seed outside"


# --- records ---------------------------------------------------------------------------------


def test_outputs_records_one_verdict_per_claim(tmp_path):
    out = Outputs("03_demo", "smoke", root=tmp_path)
    v = judge(PARALLEL, pairs_with_ratios([1.45, 1.50, 1.52]), why="NVMe here, Apple SSD there")
    out.verdict(PARALLEL, v)
    out.verdict(ADMISSION, judge(ADMISSION, pairs_with_ratios([0.9, 0.95]), why="synthetic"))
    again = judge(PARALLEL, pairs_with_ratios([1.45, 1.50, 1.52, 1.49, 1.4, 1.6]), why="six")
    out.verdict(PARALLEL, again)  # replaces the first record
    records = json.loads((out.dir / "verdicts.json").read_text())
    assert [r["claim"] for r in records] == ["000-§0-parallel", "000-§4.3-admission"]
    first = records[0]
    assert first["verdict"] == REPRODUCED and first["n"] == 6 and first["why"] == "six"
    assert first["data"][0] == [4.0, 5.8] and first["seed"] == 1.48 and first["table"] == "T4"
    assert first["margin"] == 0.2 and first["basis"] == "measured" and first["kind"] == "effect"
    assert first["confidence"] == pytest.approx(62 / 64)
    assert from_record(first) == (PARALLEL, again)
    assert read_verdicts(out.dir / "verdicts.json") == records
    assert [(nb, r["claim"]) for nb, r in collect_verdicts(tmp_path, "smoke")] == [
        ("03_demo", "000-§0-parallel"),
        ("03_demo", "000-§4.3-admission"),
    ]


def test_a_verdict_needs_its_why_and_its_own_claim(tmp_path):
    out = Outputs("03_demo", "smoke", root=tmp_path)
    v = judge(PARALLEL, pairs_with_ratios([1.45, 1.50]))
    with pytest.raises(LabError, match="`why` is empty"):
        out.verdict(PARALLEL, v)
    with pytest.raises(LabError, match="recorded under claim 000-§4.3-admission"):
        out.verdict(ADMISSION, judge(PARALLEL, pairs_with_ratios([1.45]), why="x"))
    assert not (out.dir / "verdicts.json").exists()


def test_a_malformed_verdicts_file_is_a_lab_error_naming_it(tmp_path):
    path = tmp_path / "verdicts.json"
    record = to_record(PARALLEL, judge(PARALLEL, pairs_with_ratios([1.5, 1.4]), why="x"))
    path.write_text(json.dumps([{**record, "verdict": "confirmed"}]))
    with pytest.raises(LabError, match="verdict 'confirmed' is not one of"):
        read_verdicts(path)
    path.write_text(json.dumps([{k: v for k, v in record.items() if k != "n"}]))
    with pytest.raises(LabError, match=f"{path}: verdict record '000-§0-parallel': no field 'n'"):
        read_verdicts(path)
    path.write_text(json.dumps([record, record]))
    with pytest.raises(LabError, match="recorded twice"):
        read_verdicts(path)
