"""Verdicts on the seed documents' claims: one rule, from measurements to one word.

A notebook states a seed finding as a `Claim` (what the seed measured, its size, the smallest
difference that matters), measures it here and calls `judge` (paired runs of two arms),
`judge_level` (runs of one quantity) or `judge_computed` (a deterministic quantity, once);
`Outputs.verdict(claim, verdict)` records the result in outputs/<notebook>/<params>/
verdicts.json and `make docs` shows every verdict, with the rule below, in docs/index.md. The
section "Rule" of this docstring is that rule: it is rendered into docs/index.md verbatim
(`RULE`), so it is stated once and the code beneath it is what it says.

    claim = Claim("000-§0-parallel", "T4", "+48.0 % decode tok/s (3.73 -> 5.52)",
                  seed=1.48, direction="higher", metric="decode_tok_s",
                  a="serial", b="parallel", margin=0.2)
    v = judge(claim, pairs, why="NVMe here, Apple SSD there", ceiling=1 / (1 - io_share))
    v.verdict, v.estimate, (v.low, v.high)

Rule
----

**What a claim says.** Each seed finding is coded as one of four kinds:

- *effect*: arm B differs from the seed's baseline arm A by the factor s = B/A in a stated
  direction (000 §0: segment-parallel reads decode at s = 1.48× the speed of serial reads);
- *null*: B and A do not differ ("flat", "no gain", "equal"); s is the seed's own ratio,
  shown beside ours;
- *level*: one quantity, measured in repeated runs, against the value x₀ at which the finding
  would not hold; s is the seed's level;
- *computed*: a deterministic quantity (a file's layout, a statistic of one routing trace, a
  plan's number) against x₀: computed once (n = 1), never repeated as if measured.

Every claim states a margin δ, the smallest difference that matters (by default the ±20 %
run-to-run jitter the seed reports for its own decode speeds). On the log scale, with d =
log(1 + δ), the *no-effect band* is [−d, d] around no effect and the *seed's band* is
[log s − d, log s + d]. A directional claim's seed value must lie more than 2d from no effect,
so that the two bands do not meet; a smaller seed effect needs a smaller margin, or is a
null claim.

**Data.** Paired runs give one ratio r_i = b_i / a_i per pair, the arms run alternately (A B
A B …) so that a slow drift of the machine touches both alike; a level claim's runs give r_i
= x_i / x₀; a computed claim has one value r = x / x₀. Every measurement must be a finite
positive number. All comparisons are on log r, negated for the direction "lower", so that
the seed's side is positive.

**Estimate.** The median of the log r_i (for an even n, the mean of the two middle ones),
shown as a ratio.

**Interval.** The exact distribution-free 95 % interval of the median: the k-th smallest and
the k-th largest log r_i, with k the largest integer for which 2 · P(Bin(n, ½) < k) ≤ 0.05.
Its coverage is at least 95 % at every n for any continuous distribution of the ratios, and
is stated with each verdict. Fewer than 6 measurements cannot reach 95 % (with 5, the widest
interval, smallest to largest, covers 93.75 %), so they give no interval and no decisive word.
A computed value is exact: its interval is the value itself.

**Applicability.** A claim may state the regime it needs, measured in the same run: for a
faster read path, the share w of token time spent waiting on reads, which caps any decode
gain at 1 / (1 − w). When that cap in the seed's direction lies below the seed's band (below
s / (1 + δ)), the seed's effect cannot appear here whatever the pager does, and the verdict
is *not testable here*; for a null claim, when the cap lies inside the no-effect band, the
null holds trivially and is *not testable here* too. The estimate is still shown.

**Verdict of an effect** (and of a level or computed claim with a direction), with [l, h]
the aligned interval:

- *not reproduced*: [l, h] lies inside the no-effect band (whatever effect there is, it is
  smaller than the margin);
- *reproduced*: otherwise, l > 0 (no effect is excluded on the seed's side) and [l, h]
  overlaps the seed's band (the seed's size is consistent with ours);
- *reproduced in direction only (smaller)* / *(larger)*: otherwise, l > 0 and [l, h] lies
  below / above the seed's band;
- *contradicted*: otherwise, h < 0 (an effect on the other side, reaching beyond the margin);
- *inconclusive*: anything else, or fewer than 6 measurements, with the number of
  measurements that would settle it.

**Verdict of a null claim** (and of a level or computed claim with direction "equal"):
*reproduced* when [l, h] lies inside the no-effect band; *contradicted* when it lies wholly
outside it; *inconclusive* otherwise.

**Predictions.** A claim judged on an emulated device (a device model fitted to the seed's
§1 table) is a *prediction* of that model, shown as such: only the seed's own §1 table can
check the fit, and it is shown as residuals, not judged.

**Measurements that would settle an inconclusive verdict.** If the interval kept its shape
around the estimate m and narrowed as 1/√n, it would reach the nearest decision (exclude no
effect, fall inside a band, or leave the seed's band) after n · (half-width / distance)²
measurements; the smallest such number, rounded up and at least 6 and n + 1, is reported: a
projection from the observed spread, not a promise. With fewer than 2 measurements there is
no spread to project from, and 6 is reported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from sdq.errors import LabError, ParamsError
from sdq.lab.catalogue import CATALOGUE

REPRODUCED = "reproduced"
SMALLER = "reproduced in direction only (smaller)"
LARGER = "reproduced in direction only (larger)"
NOT_REPRODUCED = "not reproduced"
CONTRADICTED = "contradicted"
INCONCLUSIVE = "inconclusive"
NOT_TESTABLE = "not testable here"
VERDICTS = (  # the only verdict words, in the order the index counts them
    REPRODUCED,
    SMALLER,
    LARGER,
    NOT_REPRODUCED,
    CONTRADICTED,
    INCONCLUSIVE,
    NOT_TESTABLE,
)
SUPPORTS = (REPRODUCED, SMALLER, LARGER)  # decisive words on the seed's side
OPPOSES = (NOT_REPRODUCED, CONTRADICTED)  # decisive words against it
KINDS = ("effect", "null", "level", "computed")
DIRECTIONS = ("higher", "lower", "equal")
BASES = ("measured", "prediction")

CONFIDENCE = 0.95
MIN_N = 6  # the fewest measurements whose widest interval covers >= 95 %
DEFAULT_MARGIN = 0.2  # the seed's own run-to-run jitter of decode speed (000 §0: ±20 %)


def _rule_section(doc: str) -> str:
    start = doc.index("\nRule\n----\n") + len("\nRule\n----\n")
    return doc[start:].strip("\n") + "\n"


RULE = _rule_section(__doc__)  # the rule in words, rendered into docs/index.md


@dataclass(frozen=True)
class Claim:
    """One finding of a seed document, as a notebook tests it.

    Parameters
    ----------
    id : str
        Stable name, "<seed>-§<section>-<topic>", e.g. "000-§0-parallel".
    table : str
        The catalogue table it belongs to, "T1" ... "T12".
    seed_figure : str
        The seed's figure as the seed states it, e.g. "+48.0 % decode tok/s (3.73 -> 5.52)".
    seed : float
        The seed's value: the ratio B/A ("effect", "null": 1.48 for +48 %), or the quantity
        itself ("level", "computed": 0.70 for a 70 % hit rate).
    direction : str
        "higher" or "lower": the side of no effect on which the seed found B (or the
        quantity); "equal" for a finding of no difference (always so for kind "null").
    metric : str
        The metric compared (a DESIGN.md metric name where there is one).
    a, b : str
        Names of the baseline arm A and the compared arm B ("effect", "null").
    kind : str
        "effect", "null", "level" or "computed" (see the rule).
    null : float or None
        The value of the quantity that means "no effect" ("level", "computed"); None for a
        ratio of two arms, whose no-effect value is 1.
    margin : float
        δ: the smallest relative difference that matters (0.2 = 20 %).
    basis : str
        "measured" (this machine) or "prediction" (an emulated device's model).
    """

    id: str
    table: str
    seed_figure: str
    seed: float
    direction: str
    metric: str
    a: str = ""
    b: str = ""
    kind: str = "effect"
    null: float | None = None
    margin: float = DEFAULT_MARGIN
    basis: str = "measured"

    def __post_init__(self) -> None:
        for what in ("id", "seed_figure", "metric"):
            text = getattr(self, what)
            if not isinstance(text, str) or not text.strip():
                raise ParamsError(f"claim {self.id!r}: {what} must be a non-empty string")
        for what in ("id", "seed_figure", "metric", "a", "b"):
            text = getattr(self, what)
            if not isinstance(text, str) or not text.isprintable() or "|" in text:
                raise ParamsError(
                    f"claim {self.id!r}: {what} {text!r} must be one printable line without '|'"
                )
        tables = [spec.id for spec in CATALOGUE]
        if self.table not in tables:
            raise ParamsError(f"claim {self.id}: table {self.table!r} is not one of {tables}")
        for what, value, allowed in (
            ("direction", self.direction, DIRECTIONS),
            ("kind", self.kind, KINDS),
            ("basis", self.basis, BASES),
        ):
            if value not in allowed:
                raise ParamsError(f"claim {self.id}: {what} {value!r} is not one of {allowed}")
        paired = self.kind in ("effect", "null")
        if paired and self.null is not None:
            raise ParamsError(
                f"claim {self.id}: the no-effect value of a ratio of two arms is 1; "
                f"null={self.null} is for level and computed claims"
            )
        if not paired and self.null is None:
            raise ParamsError(
                f"claim {self.id}: a {self.kind} claim needs null, the value at which the "
                "finding would not hold"
            )
        if self.kind == "null" and self.direction != "equal":
            raise ParamsError(f"claim {self.id}: a null claim has direction 'equal'")
        if self.kind == "effect" and self.direction == "equal":
            raise ParamsError(
                f"claim {self.id}: an effect has direction 'higher' or 'lower'; a finding of "
                "no difference is kind 'null'"
            )
        checked = (("seed", self.seed), ("margin", self.margin))
        checked += (("null", self.null),) if not paired else ()
        for what, x in checked:
            if not _positive_number(x):
                raise ParamsError(f"claim {self.id}: {what} {x!r} must be a finite number > 0")
        d = self.band
        t = math.log(self.seed / self.reference)
        if self.direction == "equal":
            if abs(t) > d:
                raise ParamsError(
                    f"claim {self.id}: the seed's own {self.seed:g} lies outside its no-effect "
                    f"band (margin {self.margin:g}): the seed saw a difference; widen the "
                    "margin or code the claim as an effect"
                )
            return
        aligned = t if self.direction == "higher" else -t
        if aligned <= 2 * d:
            raise ParamsError(
                f"claim {self.id}: seed {self.seed:g} is not {self.direction} than the "
                f"no-effect value {self.reference:g} by more than twice the margin "
                f"{self.margin:g} (its band would meet the no-effect band): a smaller margin, "
                "or a null claim"
            )

    @property
    def reference(self) -> float:
        """The no-effect value: 1 for a ratio of two arms, `null` otherwise."""
        return 1.0 if self.null is None else float(self.null)

    @property
    def band(self) -> float:
        """d = log(1 + margin): the half-width of the no-effect band and the seed's band."""
        return math.log1p(self.margin)

    @property
    def unit(self) -> str:
        """What one measurement of this claim is called: "pair", "run" or "value"."""
        return {"effect": "pair", "null": "pair", "level": "run", "computed": "value"}[self.kind]


@dataclass(frozen=True)
class Verdict:
    """What the rule found for one claim; `why` is the notebook's one line on the difference.

    Parameters
    ----------
    claim : str
        The `Claim.id` judged.
    verdict : str
        One of `VERDICTS`.
    n : int
        Pairs, runs or values measured.
    estimate : float or None
        Median ratio B/A, median level or the computed value; None when n == 0.
    low, high : float or None
        The interval (coverage `confidence`), same units as `estimate`; None when n < MIN_N
        (a computed value: the value itself).
    seed_inside : bool or None
        Whether the interval overlaps the seed's band (the seed's value widened by the
        margin); None without an interval.
    n_needed : int or None
        For "inconclusive": the measurements in all that would settle it.
    reason : str
        The clause of the rule that decided, with its numbers.
    data : tuple
        The measurements judged: (a, b) pairs, or values; kept so the verdict can be redone.
    why : str
        One line, filled by the notebook: why ours differs from the seed (device, model,
        method), or why it agrees.
    confidence : float or None
        The interval's exact coverage (>= 0.95); None without an interval; 1 for a computed
        value.
    ceiling : float or None
        The largest ratio the measured regime allows in the seed's direction (applicability);
        None when the claim states no regime.
    regime : str
        What `ceiling` comes from, with its numbers.
    """

    claim: str
    verdict: str
    n: int
    estimate: float | None
    low: float | None
    high: float | None
    seed_inside: bool | None
    n_needed: int | None
    reason: str
    data: tuple
    why: str = ""
    confidence: float | None = None
    ceiling: float | None = None
    regime: str = ""


def judge(
    claim: Claim,
    pairs: Sequence[Sequence[float]],
    why: str = "",
    ceiling: float | None = None,
    regime: str = "",
) -> Verdict:
    """Judge an effect or null claim from paired, alternating runs by the rule of this module.

    Parameters
    ----------
    claim : Claim
        A claim of kind "effect" or "null".
    pairs : sequence of (a, b)
        shape (n, 2): metric of arm A and of arm B in each pair of adjacent runs; n may be 0.
    why : str
        The notebook's one line on why ours differs from the seed.
    ceiling, regime : float or None, str
        The largest ratio B/A in the seed's direction that the measured regime allows, and
        the words and numbers it comes from (the rule's "Applicability").

    Raises
    ------
    LabError
        A measurement that is not a finite positive number, or pairs not of shape (n, 2).
    """
    if claim.kind not in ("effect", "null"):
        raise ParamsError(f"claim {claim.id}: a {claim.kind} claim is not judged from pairs")
    arr = np.asarray(pairs, dtype=np.float64)
    if arr.size == 0:
        arr = arr.reshape(0, 2)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise LabError(f"claim {claim.id}: pairs must have shape (n, 2), got {arr.shape}")
    _check_measurements(claim, arr)
    log_r = np.log(arr[:, 1]) - np.log(arr[:, 0])  # (n,) log(b_i / a_i)
    data = tuple((float(a), float(b)) for a, b in arr)
    return _judge(claim, log_r, data, why, ceiling, regime)


def judge_level(
    claim: Claim,
    values: Sequence[float],
    why: str = "",
    ceiling: float | None = None,
    regime: str = "",
) -> Verdict:
    """Judge a level claim from n runs' values of one quantity (against `claim.null`).

    values : shape (n,): the quantity in each run; n may be 0. The runs must be repeated
    measurements: a deterministic quantity is a computed claim (`judge_computed`).
    """
    if claim.kind != "level":
        raise ParamsError(f"claim {claim.id}: a {claim.kind} claim is not judged from runs")
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise LabError(f"claim {claim.id}: values must have shape (n,), got {arr.shape}")
    _check_measurements(claim, arr)
    log_r = np.log(arr) - math.log(claim.reference)  # (n,) log(x_i / x_0)
    return _judge(claim, log_r, tuple(float(x) for x in arr), why, ceiling, regime)


def judge_computed(claim: Claim, value: float, why: str = "") -> Verdict:
    """Judge a computed claim from its one deterministic value (against `claim.null`)."""
    if claim.kind != "computed":
        raise ParamsError(f"claim {claim.id}: a {claim.kind} claim is not one computed value")
    arr = np.asarray([value], dtype=np.float64)  # (1,)
    _check_measurements(claim, arr)
    log_r = np.log(arr) - math.log(claim.reference)
    return _judge(claim, log_r, (float(arr[0]),), why, None, "")


def _below(k: int, n: int) -> float:
    """P(Bin(n, 1/2) < k), exactly."""
    return sum(math.comb(n, i) for i in range(k)) / 2.0**n


def judge_not_testable(claim: Claim, regime: str, why: str = "") -> Verdict:
    """A claim that this machine cannot test at all, whatever it measures (the seed's absolute
    figure of another machine, a resource this machine lacks): *not testable here*, with
    `regime` saying what rules it out and where it is testable. No data are judged."""
    if not isinstance(regime, str) or not regime.strip():
        raise LabError(f"claim {claim.id}: 'not testable here' needs the regime that rules it out")
    return Verdict(
        claim.id, NOT_TESTABLE, 0, None, None, None, None, None, regime, (), why, regime=regime
    )


def order_statistic_rank(n: int, confidence: float = CONFIDENCE) -> int:
    """k: the interval of the median runs from the k-th smallest to the k-th largest of n
    values; the largest k with 2 * P(Bin(n, 1/2) < k) <= 1 - confidence, 0 when there is none
    (n < MIN_N at 95 %)."""
    k = 0
    while k < n // 2 + 1 and 2 * _below(k + 1, n) <= 1 - confidence + 1e-12:
        k += 1
    return k


def coverage(n: int, confidence: float = CONFIDENCE) -> float | None:
    """The exact coverage of the order-statistic interval at n; None when there is none."""
    k = order_statistic_rank(n, confidence)
    return None if k == 0 else 1 - 2 * _below(k, n)


def interval(log_r: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """The exact interval of the median of `log_r` (shape (n,)), on the log scale; None when
    n is too small to reach `confidence`."""
    n = len(log_r)
    k = order_statistic_rank(n, confidence)
    if k == 0:
        return None
    x = np.sort(log_r)
    return float(x[k - 1]), float(x[n - k])


def _judge(
    claim: Claim,
    log_r: np.ndarray,
    data: tuple,
    why: str,
    ceiling: float | None,
    regime: str,
) -> Verdict:
    n = len(log_r)
    ref = claim.reference
    unit = claim.unit
    units = f"{n} {unit}{'' if n == 1 else 's'}"
    d = claim.band
    sign = -1.0 if claim.direction == "lower" else 1.0
    s = sign * math.log(claim.seed / ref)  # aligned seed value: > d, or |s| <= d if "equal"
    equal = claim.direction == "equal"
    if ceiling is not None and not (_positive_number(ceiling) and regime.strip()):
        raise LabError(f"claim {claim.id}: ceiling {ceiling!r} needs a positive value and a regime")
    estimate = ref * math.exp(float(np.median(log_r))) if n else None
    if claim.kind == "computed":
        lo_log = hi_log = float(log_r[0]) if n else None
        conf = 1.0 if n else None
    else:
        bounds = interval(log_r)
        lo_log, hi_log = bounds if bounds else (None, None)
        conf = coverage(n)
    low = None if lo_log is None else ref * math.exp(lo_log)
    high = None if hi_log is None else ref * math.exp(hi_log)
    fields = dict(why=why, confidence=conf, ceiling=ceiling, regime=regime)

    def verdict(word, reason, inside=None, needed=None):
        return Verdict(
            claim.id, word, n, estimate, low, high, inside, needed, reason, data, **fields
        )

    if ceiling is not None:
        cap = math.log(ceiling)  # aligned: the largest effect on the seed's side
        if equal and cap <= d:
            return verdict(
                NOT_TESTABLE,
                f"{regime}: no effect beyond the margin ({claim.margin:.0%}) can appear here, "
                "so the seed's 'no difference' holds trivially",
            )
        if not equal and cap < s - d:
            shown_cap = ceiling if claim.direction == "higher" else 1 / ceiling
            t_cap, t_seed = distinct_numbers(shown_cap, claim.seed)
            bound = "at most" if claim.direction == "higher" else "at least"
            return verdict(
                NOT_TESTABLE,
                f"{regime}: {bound} {t_cap}× here, short of the seed's {t_seed}× by more than "
                f"its {claim.margin:.0%} margin",
            )
    if lo_log is None:
        return verdict(
            INCONCLUSIVE,
            f"{units}: an interval with {CONFIDENCE:.0%} coverage needs at least {MIN_N}",
            needed=MIN_N,
        )
    lo, hi = sorted((sign * lo_log, sign * hi_log))  # aligned: the seed's side is positive
    m = sign * float(np.median(log_r))
    t_low, t_high, t_ref, t_seed = distinct_numbers(low, high, ref, claim.seed)
    shown = f"{t_low}" if claim.kind == "computed" else f"{conf:.1%} interval {t_low}–{t_high}"
    none = "1" if claim.null is None else f"the no-effect value {t_ref}"
    band = f"±{claim.margin:.0%}"
    seed_overlap = hi >= s - d and lo <= s + d
    if equal:
        if -d <= lo and hi <= d:
            return verdict(REPRODUCED, f"{shown} lies inside {none} {band}", seed_overlap)
        if lo > d or hi < -d:
            return verdict(CONTRADICTED, f"{shown} lies outside {none} {band}", seed_overlap)
        needed = _n_needed(n, m, lo, hi, [d, -d])
        return verdict(
            INCONCLUSIVE,
            f"{shown} straddles the edge of {none} {band}; about {needed} {unit}s would settle it",
            seed_overlap,
            needed,
        )
    if -d <= lo and hi <= d:
        return verdict(NOT_REPRODUCED, f"{shown} lies inside {none} {band}", False)
    if lo > 0:
        if seed_overlap:
            why_word = f"excludes {none} on the seed's side and meets the seed's {t_seed} {band}"
            return verdict(REPRODUCED, f"{shown} {why_word}", True)
        word, side = (SMALLER, "below") if hi < s - d else (LARGER, "above")
        return verdict(
            word, f"{shown} excludes {none} and lies {side} the seed's {t_seed} {band}", False
        )
    if hi < 0:
        return verdict(
            CONTRADICTED,
            f"{shown} excludes {none} on the side opposite the seed's, beyond {band}",
            False,
        )
    needed = _n_needed(n, m, lo, hi, [0.0, d, -d, s - d])
    return verdict(
        INCONCLUSIVE,
        f"{shown} contains {none} and reaches beyond {band}; about {needed} {unit}s would "
        "settle it",
        seed_overlap,
        needed,
    )


def _n_needed(n: int, m: float, lo: float, hi: float, edges: Sequence[float]) -> int:
    """Measurements at which the interval, keeping its shape around m and narrowing as
    1/sqrt(n), would first clear one of `edges` (aligned log scale): the half-width on the
    edge's side over the distance from m to the edge, squared, times n."""
    options = []
    for edge in edges:
        half = (m - lo) if edge < m else (hi - m)
        gap = abs(m - edge)
        if gap > 0:
            options.append(n * (half / gap) ** 2)
    best = math.ceil(min(options)) if options else n + 1
    return max(n + 1, MIN_N, best)


def _check_measurements(claim: Claim, arr: np.ndarray) -> None:
    """Every measurement finite and > 0; `arr` is (n, 2) pairs or (n,) values."""
    bad = ~(np.isfinite(arr) & (arr > 0))
    if arr.ndim == 2:
        bad = bad.any(axis=1)  # (n,) a pair is bad if either run is
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        shown = tuple(float(x) for x in arr[i]) if arr.ndim == 2 else float(arr[i])
        raise LabError(
            f"claim {claim.id}: {claim.unit} {i} is {shown}: every measurement must be a "
            f"finite number > 0 ({int(bad.sum())} of {len(arr)} {claim.unit}s are not)"
        )


def _positive_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def distinct_numbers(*xs: float | None) -> list[str]:
    """Text for numbers shown side by side: 3 significant digits, more (up to 6) where two
    different numbers would otherwise read the same (1.009 and 1.015, not 1.01 and 1.01).
    None is an em dash; numbers from 1,000 up are whole with thousands separators."""
    values = [None if x is None else float(x) for x in xs]
    for digits in range(3, 7):
        texts = [_number(x, digits) for x in values]
        clash = any(
            texts[i] == texts[j] and values[i] != values[j]
            for i in range(len(values))
            for j in range(i)
        )
        if not clash:
            break
    return texts


def _number(x: float | None, digits: int) -> str:
    if x is None:
        return "—"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return format(x, f".{digits}g")


# --- records: what verdicts.json holds, one per claim --------------------------------------

CLAIM_FIELDS = (
    "id",
    "table",
    "seed_figure",
    "seed",
    "direction",
    "metric",
    "a",
    "b",
    "kind",
    "null",
    "margin",
    "basis",
)


def to_record(claim: Claim, verdict: Verdict) -> dict[str, Any]:
    """One JSON record: the claim's fields (its id as "claim") and the verdict's."""
    if verdict.claim != claim.id:
        raise LabError(f"verdict of claim {verdict.claim} recorded under claim {claim.id}")
    record: dict[str, Any] = {"claim": claim.id}
    record.update({k: getattr(claim, k) for k in CLAIM_FIELDS if k != "id"})
    v = asdict(verdict)
    del v["claim"]
    v["data"] = [list(d) if isinstance(d, tuple) else d for d in verdict.data]
    record.update(v)
    return record


def from_record(record: Mapping[str, Any]) -> tuple[Claim, Verdict]:
    """The (Claim, Verdict) a record holds; a missing or malformed field is a LabError."""
    try:
        claim = Claim(id=record["claim"], **{k: record[k] for k in CLAIM_FIELDS if k != "id"})
        fields = {k: record[k] for k in Verdict.__dataclass_fields__ if k not in ("claim", "data")}
        data = tuple(tuple(d) if isinstance(d, list) else d for d in record["data"])
        verdict = Verdict(claim=claim.id, data=data, **fields)
    except KeyError as exc:
        raise LabError(f"verdict record {record.get('claim', '?')!r}: no field {exc}") from None
    except (TypeError, ParamsError) as exc:
        raise LabError(f"verdict record {record.get('claim', '?')!r}: {exc}") from None
    if verdict.verdict not in VERDICTS:
        raise LabError(
            f"verdict record {claim.id}: verdict {verdict.verdict!r} is not one of {VERDICTS}"
        )
    return claim, verdict


def rejudge(claim: Claim, verdict: Verdict) -> Verdict:
    """Judge the recorded data again (what docs does before it shows a recorded verdict)."""
    regime = dict(ceiling=verdict.ceiling, regime=verdict.regime)
    if verdict.n == 0 and verdict.verdict == NOT_TESTABLE and verdict.ceiling is None:
        return judge_not_testable(claim, verdict.regime, why=verdict.why)
    if claim.kind in ("effect", "null"):
        return judge(claim, verdict.data, why=verdict.why, **regime)
    if claim.kind == "level":
        return judge_level(claim, verdict.data, why=verdict.why, **regime)
    return judge_computed(claim, verdict.data[0], why=verdict.why)
