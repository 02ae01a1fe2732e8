"""Verdicts on seed claims: the rule on hand-computable cases, the bootstrap against brute
force, the records, and docs/index.md showing only verdicts that come from outputs/."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from lab_support import make_repo

from sdq.errors import LabError, ParamsError
from sdq.lab import Outputs
from sdq.lab.catalogue import CATALOGUE
from sdq.lab.docs import NO_SEED_CLAIM, NOT_JUDGED, render
from sdq.lab.outputs import collect_verdicts, read_verdicts
from sdq.lab.paths import repo_root
from sdq.lab.verdict import (
    BOOTSTRAP_SEED,
    CONTRADICTED,
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    RESAMPLES,
    RULE,
    TAIL,
    VERDICTS,
    Claim,
    distinct_numbers,
    from_record,
    judge,
    judge_level,
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
ADMISSION = Claim(  # admission lowered the hit rate: 70 % -> 65 %
    "000-§4.3-admission",
    "T7",
    "hit rate 70 % -> 65 %",
    seed=0.65 / 0.70,
    direction="lower",
    metric="hit_rate",
    a="no admission",
    b="min hits 2",
)
HIT_RATE = Claim(
    "000-§6-hit-rate",
    "T8",
    "LRU hit rate ~70 %",
    seed=0.70,
    direction="higher",
    metric="hit_rate",
    kind="level",
    null=0.5,
)


def pairs_with_ratios(ratios, a=4.0):
    """Pairs (a, a * r): the per-pair ratios are exactly `ratios` (a is a power of two)."""
    return [(a, a * r) for r in ratios]


# --- the rule on cases computable by hand --------------------------------------------------
# With n = 5 pairs, the bootstrap median is the smallest ratio with probability
# P(at least 3 of 5 draws are it) = 0.058 > 0.025, so the 250th smallest of 10,000 resampled
# medians is the smallest ratio, and the 250th largest the largest: the interval is [min, max].


def test_clear_effect_in_the_seeds_direction_is_reproduced():
    v = judge(PARALLEL, pairs_with_ratios([1.45, 1.50, 1.52, 1.47, 1.55]))
    assert v.verdict == REPRODUCED
    assert (v.estimate, v.low, v.high) == pytest.approx((1.50, 1.45, 1.55), rel=1e-12)
    assert v.seed_inside is True and v.n == 5 and v.n_needed is None
    assert v.reason == "95 % interval 1.45–1.55 excludes 1 on the seed's side"


def test_clear_effect_in_the_opposite_direction_is_contradicted():
    v = judge(PARALLEL, pairs_with_ratios([0.80, 0.85, 0.90, 0.82, 0.88]))
    assert v.verdict == CONTRADICTED
    assert (v.low, v.high) == pytest.approx((0.80, 0.90), rel=1e-12)
    assert v.seed_inside is False


def test_a_small_precise_effect_below_the_seeds_is_not_reproduced_here():
    v = judge(PARALLEL, pairs_with_ratios([0.98, 1.03, 1.01, 0.99, 1.02]))
    assert v.verdict == NOT_REPRODUCED
    assert (v.low, v.high) == pytest.approx((0.98, 1.03), rel=1e-12)
    assert v.reason == "95 % interval 0.98–1.03 contains 1 but not the seed's 1.48"


def test_an_interval_touching_1_contains_it():
    v = judge(PARALLEL, pairs_with_ratios([1.0, 1.2, 1.3, 1.25, 1.1]))
    assert v.low == 1.0 and v.verdict == NOT_REPRODUCED


def test_noise_is_inconclusive_with_a_finite_number_of_pairs_that_would_settle_it():
    ratios = [0.7, 1.9, 1.1, 1.6, 0.9]
    v = judge(PARALLEL, pairs_with_ratios(ratios))
    assert v.verdict == INCONCLUSIVE
    assert (v.estimate, v.low, v.high) == pytest.approx((1.1, 0.7, 1.9), rel=1e-12)
    m, lo, hi, t = (math.log(x) for x in (1.1, 0.7, 1.9, 1.48))
    by_hand = min(5 * ((m - lo) / m) ** 2, 5 * ((hi - m) / (t - m)) ** 2)  # 112.5 and 16.96
    assert v.n_needed == math.ceil(by_hand) == 17
    assert v.reason.endswith("contains both 1 and the seed's 1.48; about 17 pairs would settle it")


def test_direction_lower_uses_the_inverse_ratio():
    v = judge(ADMISSION, pairs_with_ratios([0.92, 0.94, 0.93, 0.95, 0.91], a=0.5))
    assert v.verdict == REPRODUCED and v.high == pytest.approx(0.95)
    up = judge(ADMISSION, pairs_with_ratios([1.02, 1.05, 1.03, 1.04, 1.06], a=0.5))
    assert up.verdict == CONTRADICTED


def test_swapping_the_arms_inverts_estimate_and_interval_and_keeps_the_verdict():
    rng = np.random.default_rng(7)
    a = rng.uniform(3, 4, 6)  # an even n: the median is the geometric mean of the middle two
    b = a * rng.lognormal(0.2, 0.15, 6)
    v = judge(PARALLEL, np.c_[a, b])
    mirror = Claim("000-§0-serial", "T4", "-32 %", 1 / 1.48, "lower", "decode_tok_s")
    w = judge(mirror, np.c_[b, a])
    assert w.verdict == v.verdict
    assert (w.estimate, w.low, w.high) == pytest.approx(
        (1 / v.estimate, 1 / v.high, 1 / v.low), rel=1e-12
    )


def test_a_level_claim_is_judged_against_its_no_effect_level():
    v = judge_level(HIT_RATE, [0.69, 0.71, 0.70, 0.72, 0.70])
    assert v.verdict == REPRODUCED
    assert (v.estimate, v.low, v.high) == pytest.approx((0.70, 0.69, 0.72), rel=1e-12)
    assert v.reason == "95 % interval 0.69–0.72 excludes the no-effect level 0.5 on the seed's side"
    low = judge_level(HIT_RATE, [0.45, 0.55, 0.52, 0.48, 0.50])
    assert low.verdict == NOT_REPRODUCED


@pytest.mark.parametrize("pairs", [[], [(3.0, 4.5)]])
def test_fewer_than_two_pairs_is_inconclusive_with_the_reason(pairs):
    v = judge(PARALLEL, pairs)
    assert v.verdict == INCONCLUSIVE and v.n == len(pairs)
    assert (v.low, v.high, v.seed_inside, v.n_needed) == (None, None, None, None)
    assert v.estimate == (1.5 if pairs else None)
    assert v.reason.endswith("a verdict needs at least 2")


def test_zero_spread_gives_a_point_interval():
    v = judge(PARALLEL, pairs_with_ratios([1.25] * 4))
    assert v.low == v.high == pytest.approx(1.25, rel=1e-12) and v.verdict == REPRODUCED


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        ([(3.0, 4.0), (float("nan"), 5.2)], r"pair 1 is \(nan, 5.2\).*\(1 of 2 pairs are not\)"),
        ([(3.0, 0.0), (3.0, 4.0)], r"pair 0 is \(3.0, 0.0\)"),
        ([(3.0, 4.0), (-1.0, 4.0), (3.0, float("inf"))], r"\(2 of 3 pairs are not\)"),
        ([(1.0, 2.0, 3.0)], r"pairs must have shape \(n, 2\), got \(1, 3\)"),
    ],
)
def test_bad_measurements_are_lab_errors_with_the_numbers(pairs, message):
    with pytest.raises(LabError, match=message):
        judge(PARALLEL, pairs)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"seed": 0.9}, "seed 0.9 is not higher than the no-effect value 1.0"),
        ({"table": "T13"}, "table 'T13' is not one of"),
        ({"direction": "up"}, "direction 'up' is not one of"),
        ({"seed": float("nan")}, "seed nan must be a finite number > 0"),
        ({"null": 0.5}, "null=0.5 is for level claims"),
        ({"kind": "level"}, "a level claim needs null"),
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


def test_each_kind_has_its_own_judge():
    with pytest.raises(ParamsError, match="judged by judge_level"):
        judge(HIT_RATE, [(1.0, 2.0)])
    with pytest.raises(ParamsError, match="judged by judge"):
        judge_level(PARALLEL, [0.7])


# --- the bootstrap ---------------------------------------------------------------------------


def test_same_input_same_verdict():
    rng = np.random.default_rng(3)
    pairs = np.c_[rng.uniform(3, 4, 9), rng.uniform(3, 6, 9)]
    assert judge(PARALLEL, pairs) == judge(PARALLEL, pairs.tolist())


def test_interval_matches_a_brute_force_percentile_computation():
    """The same resamples, medians taken one by one in Python, the 250th from each end."""
    rng = np.random.default_rng(11)
    pairs = np.c_[rng.uniform(3, 4, 6), rng.uniform(3, 6, 6)]  # even n: middle two averaged
    log_r = [math.log(b / a) for a, b in pairs]
    draws = np.random.Generator(np.random.PCG64(BOOTSTRAP_SEED))
    idx = draws.integers(0, 6, size=(RESAMPLES, 6), dtype=np.int32)
    medians = []
    for row in idx.tolist():
        x = sorted(log_r[i] for i in row)
        medians.append((x[2] + x[3]) / 2)
    medians.sort()
    assert TAIL == 250
    v = judge(PARALLEL, pairs)
    assert v.low == pytest.approx(math.exp(medians[249]), rel=1e-12)
    assert v.high == pytest.approx(math.exp(medians[RESAMPLES - 250]), rel=1e-12)


def test_interval_matches_the_exact_bootstrap_distribution():
    """All 7**7 equally likely resamples of 7 pairs: the exact 2.5 % and 97.5 % points of the
    bootstrap median, where no atom's cumulative probability is near 2.5 %, equal the
    interval from 10,000 random resamples."""
    ratios = np.array([0.8, 1.1, 0.95, 1.3, 1.05, 1.6, 0.9])
    n = len(ratios)
    codes = np.arange(n**n)
    idx = np.stack([(codes // n**k) % n for k in range(n)], axis=1)  # (7**7, 7)
    medians = np.median(np.log(ratios)[idx], axis=1)
    atoms, counts = np.unique(medians, return_counts=True)
    cdf = np.cumsum(counts) / n**n
    lower = atoms[np.searchsorted(cdf, 0.025)]  # smallest atom with P(median <= atom) >= 2.5 %
    upper_tail = 1 - np.concatenate([[0], cdf[:-1]])  # P(median >= atom)
    upper = atoms[np.flatnonzero(upper_tail >= 0.025)[-1]]
    assert np.all(np.abs(cdf - 0.025) > 0.005) and np.all(np.abs(upper_tail - 0.025) > 0.005)
    v = judge(PARALLEL, pairs_with_ratios(ratios))
    assert (v.low, v.high) == pytest.approx((math.exp(lower), math.exp(upper)), rel=1e-12)
    assert (v.low, v.high) == pytest.approx((0.9, 1.3), rel=1e-12)


def test_numbers_side_by_side_get_the_digits_that_tell_them_apart():
    assert distinct_numbers(1.48, 1.0, 0.855) == ["1.48", "1", "0.855"]
    assert distinct_numbers(1.0086, 1.0148, 1.0) == ["1.009", "1.015", "1"]
    assert distinct_numbers(None, 2841.3) == ["—", "2,841"]


# --- records ---------------------------------------------------------------------------------


def test_outputs_records_one_verdict_per_claim(tmp_path):
    out = Outputs("03_demo", "smoke", root=tmp_path)
    v = judge(PARALLEL, pairs_with_ratios([1.45, 1.50, 1.52]), why="NVMe here, Apple SSD there")
    out.verdict(PARALLEL, v)
    out.verdict(ADMISSION, judge(ADMISSION, pairs_with_ratios([0.9, 0.95]), why="synthetic"))
    again = judge(PARALLEL, pairs_with_ratios([1.45, 1.50, 1.52, 1.49]), why="four pairs")
    out.verdict(PARALLEL, again)  # replaces the first record
    records = json.loads((out.dir / "verdicts.json").read_text())
    assert [r["claim"] for r in records] == ["000-§0-parallel", "000-§4.3-admission"]
    first = records[0]
    assert first["verdict"] == REPRODUCED and first["n"] == 4 and first["why"] == "four pairs"
    assert first["data"][0] == [4.0, 5.8] and first["seed"] == 1.48 and first["table"] == "T4"
    assert first["resamples"] == RESAMPLES and first["bootstrap_seed"] == BOOTSTRAP_SEED
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


# --- docs/index.md: every verdict cell from outputs/ -----------------------------------------


def verdict_cell_problems(index: str, outputs: Path, params: str) -> list[str]:
    """Every verdict shown in a rendered docs/index.md that no verdicts.json under
    outputs/*/<params>/ backs (and every record that is not shown); [] when all agree."""
    records = [r for _, r in collect_verdicts(outputs, params)]
    problems = []
    lines = index.splitlines()
    head = lines.index("| id | seed § | table | notebook | verdicts | where |")
    seeds = {spec.id: spec.seed for spec in CATALOGUE}
    for line in lines[head + 2 : head + 2 + len(CATALOGUE)]:
        table, cell = line.split(" | ")[0][2:], line.split(" | ")[4]
        words = Counter(r["verdict"] for r in records if r["table"] == table)
        if cell in (NOT_JUDGED, NO_SEED_CLAIM):
            expected = NO_SEED_CLAIM if seeds[table] == "—" else NOT_JUDGED
            if words or cell != expected:
                problems.append(f"{table}: '{cell}' but records say {dict(words)}")
            continue
        shown = Counter()
        for item in cell.split(" · "):
            count, word = item.split(" ", 1)
            shown[word] += int(count)
        if shown != words or not set(shown) <= set(VERDICTS):
            problems.append(f"{table}: '{cell}' but records say {dict(words)}")
    by_id = {r["claim"]: r for r in records}
    shown_ids = set()
    start = next(
        (i for i, ln in enumerate(lines) if ln.startswith("| claim | table | seed |")), None
    )
    rows = []
    if start is not None:
        rows = [ln for ln in lines[start + 2 :] if ln.startswith("| ")]
        rows = rows[: next((i for i, ln in enumerate(rows) if not ln), len(rows))]
    for line in rows:
        cells = line[2:-2].split(" | ")
        claim_id = cells[0].split(" (")[0]
        word = re.fullmatch(r"\[(.+)\]\(\.\./outputs/.+/verdicts\.json\)", cells[5])
        record = by_id.get(claim_id)
        if record is None or word is None or word.group(1) != record["verdict"]:
            problems.append(f"seed claim row not from a record: {line}")
        elif cells[4] != str(record["n"]) or cells[6] != record["reason"]:
            problems.append(f"seed claim row differs from its record: {line}")
        shown_ids.add(claim_id)
    problems += [f"record {c} not shown" for c in by_id if c not in shown_ids]
    if not records and "*No notebook has recorded a verdict yet" not in index:
        problems.append("no records, but no line saying so")
    return problems


@pytest.fixture
def judged(tmp_path):
    """A repository whose notebook 03_demo recorded two verdicts on T4 and one on T7."""
    make_repo(tmp_path, {}, {"03_demo": ("",)})
    (tmp_path / "docs" / "src").mkdir(parents=True)
    (tmp_path / "docs" / "src" / "index.md").write_text(
        "# lab\n\n{{index:catalogue}}\n\n{{index:verdict_rule}}\n\n{{index:verdicts}}\n"
    )
    out = Outputs("03_demo", "default", root=tmp_path / "outputs")
    why = "NVMe here, Apple SSD there; mini model"
    out.verdict(PARALLEL, judge(PARALLEL, pairs_with_ratios([1.45, 1.50, 1.52, 1.47]), why=why))
    noisy = Claim("000-§3-io-24", "T4", "6.03 vs 5.62 tok/s", 6.03 / 5.62, "higher", "tok/s")
    out.verdict(noisy, judge(noisy, pairs_with_ratios([0.7, 1.9, 1.1, 1.6, 0.9]), why=why))
    out.verdict(ADMISSION, judge(ADMISSION, pairs_with_ratios([0.92, 0.94, 0.93]), why=why))
    return tmp_path


def test_index_shows_the_rule_and_every_recorded_verdict(judged):
    render("default", root=judged)
    index = (judged / "docs" / "index.md").read_text()
    assert RULE.rstrip("\n") in index
    row = {ln.split(" | ")[0][2:]: ln for ln in index.splitlines() if ln.startswith("| T")}
    assert "| 1 reproduced · 1 inconclusive |" in row["T4"]
    assert "| 1 reproduced |" in row["T7"]
    assert f"| {NOT_JUDGED} |" in row["T1"] and f"| {NO_SEED_CLAIM} |" in row["T12"]
    parallel = next(ln for ln in index.splitlines() if ln.startswith("| 000-§0-parallel"))
    assert parallel == (
        "| 000-§0-parallel (decode_tok_s, parallel / serial) | [T4](#table-catalogue) "
        "| +48.0 % decode tok/s (3.73 -> 5.52) (1.48×) | 1.485× [1.45, 1.52] | 4 "
        "| [reproduced](../outputs/03_demo/default/verdicts.json) "
        "| 95 % interval 1.45–1.52 excludes 1 on the seed's side "
        "| NVMe here, Apple SSD there; mini model |"
    )
    assert "about 113 pairs would settle it" in index  # 5 · (log(1.1 / 0.7) / log 1.1)² = 112.4
    assert verdict_cell_problems(index, judged / "outputs", "default") == []


def test_a_typed_verdict_cell_is_caught(judged):
    render("default", root=judged)
    index = (judged / "docs" / "index.md").read_text()
    outputs = judged / "outputs"
    typed = index.replace(f"| {NOT_JUDGED} |", "| 1 reproduced |", 1)
    assert verdict_cell_problems(typed, outputs, "default") == [
        "T1: '1 reproduced' but records say {}"
    ]
    flipped = index.replace("[inconclusive](", "[reproduced](", 1)
    assert len(verdict_cell_problems(flipped, outputs, "default")) == 1
    dropped = "\n".join(ln for ln in index.splitlines() if not ln.startswith("| 000-§3-io-24"))
    assert verdict_cell_problems(dropped, outputs, "default") == ["record 000-§3-io-24 not shown"]


def test_a_record_whose_data_do_not_give_its_verdict_is_not_rendered(judged):
    path = judged / "outputs" / "03_demo" / "default" / "verdicts.json"
    records = json.loads(path.read_text())
    records[0]["verdict"] = REPRODUCED if records[0]["verdict"] != REPRODUCED else CONTRADICTED
    path.write_text(json.dumps(records))
    with pytest.raises(LabError, match="says .* but its .* measurements give"):
        render("default", root=judged)


def test_no_records_is_said_in_words(judged):
    (judged / "outputs" / "03_demo" / "default" / "verdicts.json").unlink()
    render("default", root=judged)
    index = (judged / "docs" / "index.md").read_text()
    assert "*No notebook has recorded a verdict yet: there is no `verdicts.json` in" in index
    assert verdict_cell_problems(index, judged / "outputs", "default") == []


def test_the_committed_index_shows_only_verdicts_from_the_committed_outputs():
    root = repo_root()
    index = (root / "docs" / "index.md").read_text(encoding="utf-8")
    assert RULE.rstrip("\n") in index
    assert verdict_cell_problems(index, root / "outputs", "default") == []


def test_no_template_types_a_verdict():
    """A verdict word in a table row of a docs template would be a verdict typed by hand."""
    for template in sorted((repo_root() / "docs" / "src").glob("*.md")):
        for number, line in enumerate(template.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("|"):
                assert not any(w in line for w in VERDICTS), f"{template.name}:{number}: {line}"
