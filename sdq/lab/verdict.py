"""Verdicts on the seed documents' claims: one rule, from paired measurements to one word.

A seed claim says that an arm B differs from a baseline arm A by a stated factor in a stated
direction (000 §0: segment-parallel reads decode at 1.48× the speed of serial reads). A
notebook states it as a `Claim`, measures both arms in paired, alternating runs and calls
`judge(claim, pairs)`; `Outputs.verdict(claim, verdict)` records the result in
outputs/<notebook>/<params>/verdicts.json and `make docs` shows every verdict, with the rule
below, in docs/index.md. The section "Rule" of this docstring is that rule: it is rendered into
docs/index.md verbatim (`RULE`), so it is stated once and the code beneath it is what it says.

    claim = Claim("000-§0-parallel", "T4", "+48.0 % decode tok/s (3.73 -> 5.52)",
                  seed=1.48, direction="higher", metric="decode_tok_s",
                  a="serial", b="parallel")
    v = judge(claim, [(3.1, 4.4), (3.0, 4.6), (3.2, 4.3)], why="NVMe here, Apple SSD there")
    v.verdict, v.estimate, (v.low, v.high)   # 'reproduced', 1.42, (1.34, 1.53)

Rule
----

**Data.** A claim compares two arms on one metric: A, the seed's baseline, and B. The seed
reports the ratio B/A (its *seed effect*, e.g. 1.48 for "+48 %") and the direction of the
finding (B *higher* or *lower* than A). We measure n pairs (a_i, b_i), running the arms
alternately (A B A B …) so that a slow drift of the machine touches both alike, and take each
pair's ratio r_i = b_i / a_i. A claim about a single quantity instead of two arms (a *level*,
such as a hit rate) uses the runs' values x_i divided by x_0, the level at which the finding
would not hold (stated with the claim), as r_i, and the seed's level divided by x_0 as the seed
effect. Every measurement must be a finite positive number.

**Estimate.** The median of the r_i (for an even n, the geometric mean of the two middle
ones, so that swapping A and B inverts the estimate exactly). A single disturbed run moves it
little.

**Interval.** A 95 % percentile bootstrap interval: draw 10,000 resamples of the n pairs
with replacement (NumPy's PCG64 generator seeded with 0, so the same data always give the same
interval), take each resample's median as above, and report the 250th smallest and the 250th
largest of the 10,000 medians.

**Verdict.** For a claim in the direction "higher" (seed effect s > 1), with interval
[lo, hi]:

- *reproduced*: the interval excludes 1 on the seed's side (lo > 1);
- *contradicted*: the interval excludes 1 on the other side (hi < 1);
- *not reproduced here*: the interval contains 1 but lies below the seed effect (hi < s):
  whatever effect there is here is smaller than the seed's;
- *inconclusive*: the interval contains both 1 and s, or fewer than 2 pairs were measured.

For the direction "lower" the same rule applies to 1/r_i. An interval that touches 1 or s
contains it. A verdict also says whether s lies inside the interval, i.e. whether the size of
the seed's effect, not only its direction, is consistent with ours.

**Pairs that would settle an inconclusive verdict.** Take logarithms, negated for the
direction "lower", so that the seed's side is positive: m is the log of the estimate, [l, h]
the log of the interval and t the log of the seed effect s; "inconclusive" means l ≤ 0 and
t ≤ h. If the interval kept its shape around m and narrowed as 1/√n, it would exclude 0
(reproduced) once n·((m − l)/m)² pairs were measured, possible when m > 0, and exclude t (not
reproduced here) once n·((h − m)/(t − m))² were, possible when m < t. The smaller of the two,
rounded up and at least n + 1, is reported: a projection from the observed spread, not a
promise. With fewer than 2 pairs there is no spread to project from, and no number is given.
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
NOT_REPRODUCED = "not reproduced here"
INCONCLUSIVE = "inconclusive"
CONTRADICTED = "contradicted"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, CONTRADICTED)  # the only verdict words
DIRECTIONS = ("higher", "lower")
KINDS = ("ratio", "level")  # B/A from pairs; one quantity from runs

CONFIDENCE = 0.95
RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
TAIL = round(RESAMPLES * (1 - CONFIDENCE) / 2)  # 250: the interval's ends are the TAIL-th
MIN_N = 2  # fewer measurements: no interval, "inconclusive"
MAX_N = 20_000  # the bootstrap holds RESAMPLES x n int32 indices (800 MB at this n)


def _rule_section(doc: str) -> str:
    start = doc.index("\nRule\n----\n") + len("\nRule\n----\n")
    return doc[start:].strip("\n") + "\n"


RULE = _rule_section(__doc__)  # the rule in words, rendered into docs/index.md


@dataclass(frozen=True)
class Claim:
    """One claim of a seed document, as a notebook tests it.

    Parameters
    ----------
    id : str
        Stable name, "<seed>-§<section>-<topic>", e.g. "000-§0-parallel".
    table : str
        The catalogue table it belongs to, "T1" ... "T12".
    seed_figure : str
        The seed's figure as the seed states it, e.g. "+48.0 % decode tok/s (3.73 -> 5.52)".
    seed : float
        The seed effect: the ratio B/A for a "ratio" claim (1.48 for +48 %), the level itself
        for a "level" claim (0.70 for a 70 % hit rate).
    direction : str
        "higher" or "lower": the side of `null` on which the seed found B (or the level).
    metric : str
        The metric compared (a DESIGN.md metric name where there is one).
    a, b : str
        Names of the baseline arm A and the compared arm B ("ratio" claims).
    kind : str
        "ratio" (judged by `judge` from pairs) or "level" (by `judge_level` from runs).
    null : float or None
        The value that means "no effect": None for a ratio claim (the ratio 1); required for a
        level claim (the level at which the finding would not hold).
    """

    id: str
    table: str
    seed_figure: str
    seed: float
    direction: str
    metric: str
    a: str = ""
    b: str = ""
    kind: str = "ratio"
    null: float | None = None

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
        if self.direction not in DIRECTIONS:
            raise ParamsError(
                f"claim {self.id}: direction {self.direction!r} is not one of {DIRECTIONS}"
            )
        if self.kind not in KINDS:
            raise ParamsError(f"claim {self.id}: kind {self.kind!r} is not one of {KINDS}")
        if self.kind == "ratio" and self.null is not None:
            raise ParamsError(
                f"claim {self.id}: a ratio claim's no-effect value is the ratio 1; "
                f"null={self.null} is for level claims"
            )
        if self.kind == "level" and self.null is None:
            raise ParamsError(
                f"claim {self.id}: a level claim needs null, the level at which the finding "
                "would not hold"
            )
        checked = (("seed", self.seed),) + ((("null", self.null),) if self.kind == "level" else ())
        for what, x in checked:
            if not _positive_number(x):
                raise ParamsError(f"claim {self.id}: {what} {x!r} must be a finite number > 0")
        side = (
            self.seed > self.reference if self.direction == "higher" else self.seed < self.reference
        )
        if not side:
            raise ParamsError(
                f"claim {self.id}: seed {self.seed} is not {self.direction} than the "
                f"no-effect value {self.reference}"
            )

    @property
    def reference(self) -> float:
        """The no-effect value: 1 for a ratio claim, `null` for a level claim."""
        return 1.0 if self.kind == "ratio" else float(self.null)  # type: ignore[arg-type]

    @property
    def unit(self) -> str:
        """What one measurement of this claim is called: "pair" or "run"."""
        return "pair" if self.kind == "ratio" else "run"


@dataclass(frozen=True)
class Verdict:
    """What `judge` found for one claim; `why` is the notebook's one line on the difference.

    Parameters
    ----------
    claim : str
        The `Claim.id` judged.
    verdict : str
        One of `VERDICTS`.
    n : int
        Pairs (ratio claim) or runs (level claim) measured.
    estimate : float or None
        Median ratio B/A (ratio claim) or median level (level claim); None when n == 0.
    low, high : float or None
        The 95 % bootstrap interval, same units as `estimate`; None when n < 2.
    seed_inside : bool or None
        Whether the seed effect lies in [low, high]; None when n < 2.
    n_needed : int or None
        For "inconclusive" with n >= 2: pairs (or runs) in all that would settle it.
    reason : str
        The clause of the rule that decided, with its numbers.
    data : tuple
        The measurements judged: (a, b) pairs, or values; kept so the verdict can be redone.
    why : str
        One line, filled by the notebook: why ours differs from the seed (device, model,
        method), or why it agrees.
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
    confidence: float = CONFIDENCE
    resamples: int = RESAMPLES
    bootstrap_seed: int = BOOTSTRAP_SEED


def judge(claim: Claim, pairs: Sequence[Sequence[float]], why: str = "") -> Verdict:
    """Judge a ratio claim from paired, alternating runs by the rule of this module.

    Parameters
    ----------
    claim : Claim
        A claim of kind "ratio".
    pairs : sequence of (a, b)
        shape (n, 2): metric of arm A and of arm B in each pair of adjacent runs; n may be 0.
    why : str
        The notebook's one line on why ours differs from the seed.

    Raises
    ------
    LabError
        A measurement that is not a finite positive number, or pairs not of shape (n, 2).
    """
    if claim.kind != "ratio":
        raise ParamsError(f"claim {claim.id}: a {claim.kind} claim is judged by judge_level")
    arr = np.asarray(pairs, dtype=np.float64)
    if arr.size == 0:
        arr = arr.reshape(0, 2)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise LabError(f"claim {claim.id}: pairs must have shape (n, 2), got {arr.shape}")
    _check_measurements(claim, arr)
    log_r = np.log(arr[:, 1]) - np.log(arr[:, 0])  # (n,) log(b_i / a_i)
    data = tuple((float(a), float(b)) for a, b in arr)
    return _judge(claim, log_r, data, why)


def judge_level(claim: Claim, values: Sequence[float], why: str = "") -> Verdict:
    """Judge a level claim from n runs' values of one quantity (against `claim.null`).

    Parameters
    ----------
    claim : Claim
        A claim of kind "level".
    values : sequence of float
        shape (n,): the quantity in each run; n may be 0.
    why : str
        The notebook's one line on why ours differs from the seed.
    """
    if claim.kind != "level":
        raise ParamsError(f"claim {claim.id}: a {claim.kind} claim is judged by judge")
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise LabError(f"claim {claim.id}: values must have shape (n,), got {arr.shape}")
    _check_measurements(claim, arr)
    log_r = np.log(arr) - math.log(claim.reference)  # (n,) log(x_i / x_0)
    return _judge(claim, log_r, tuple(float(x) for x in arr), why)


def bootstrap_medians(log_r: np.ndarray) -> np.ndarray:
    """The medians of `RESAMPLES` resamples of `log_r` (shape (n,)), sorted; shape (RESAMPLES,).

    One draw of all indices from PCG64(`BOOTSTRAP_SEED`), so the result depends on the data only.
    """
    n = len(log_r)
    rng = np.random.Generator(np.random.PCG64(BOOTSTRAP_SEED))
    idx = rng.integers(0, n, size=(RESAMPLES, n), dtype=np.int32)  # (B, n)
    medians = np.empty(RESAMPLES)
    rows = max(1, (1 << 22) // n)  # bound the (rows, n) float block to 32 MB
    for start in range(0, RESAMPLES, rows):
        medians[start : start + rows] = np.median(log_r[idx[start : start + rows]], axis=1)
    return np.sort(medians)


def interval(log_r: np.ndarray) -> tuple[float, float]:
    """The percentile interval on the log scale: the TAIL-th smallest and largest medians."""
    medians = bootstrap_medians(log_r)
    return float(medians[TAIL - 1]), float(medians[RESAMPLES - TAIL])


def _judge(claim: Claim, log_r: np.ndarray, data: tuple, why: str) -> Verdict:
    n = len(log_r)
    ref = claim.reference
    unit = claim.unit
    if n > MAX_N:
        raise LabError(f"claim {claim.id}: {n:,} {unit}s; at most {MAX_N:,} are bootstrapped")
    estimate = ref * math.exp(float(np.median(log_r))) if n else None
    if n < MIN_N:
        reason = f"{n} {unit}{'' if n == 1 else 's'}: a verdict needs at least {MIN_N}"
        return Verdict(
            claim.id, INCONCLUSIVE, n, estimate, None, None, None, None, reason, data, why
        )
    lo_log, hi_log = interval(log_r)
    low, high = ref * math.exp(lo_log), ref * math.exp(hi_log)
    sign = 1.0 if claim.direction == "higher" else -1.0
    m = sign * float(np.median(log_r))  # aligned: the seed's direction is positive
    lo, hi = sorted((sign * lo_log, sign * hi_log))
    s = sign * math.log(claim.seed / ref)  # > 0 by Claim's check
    t_low, t_high, t_ref, t_seed = distinct_numbers(low, high, ref, claim.seed)
    shown = f"95 % interval {t_low}–{t_high}"
    none = "1" if claim.kind == "ratio" else f"the no-effect level {t_ref}"
    seed = f"the seed's {t_seed}"
    needed = None
    if lo > 0:
        word, reason = REPRODUCED, f"{shown} excludes {none} on the seed's side"
    elif hi < 0:
        word, reason = CONTRADICTED, f"{shown} excludes {none} on the side opposite the seed's"
    elif hi < s:
        word, reason = NOT_REPRODUCED, f"{shown} contains {none} but not {seed}"
    else:
        word = INCONCLUSIVE
        needed = _n_needed(n, m, lo, hi, s)
        reason = f"{shown} contains both {none} and {seed}; about {needed} {unit}s would settle it"
    inside = min(low, high) <= claim.seed <= max(low, high)
    return Verdict(claim.id, word, n, estimate, low, high, inside, needed, reason, data, why)


def _n_needed(n: int, m: float, lo: float, hi: float, s: float) -> int:
    """Pairs at which the interval, keeping its shape around m and narrowing as 1/sqrt(n),
    would exclude 0 (needs m > 0) or s (needs m < s); all on the aligned log scale."""
    options = []
    if m > 0:
        options.append(n * ((m - lo) / m) ** 2)
    if m < s:
        options.append(n * ((hi - m) / (s - m)) ** 2)
    return max(n + 1, math.ceil(min(options)))


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
    if claim.kind == "ratio":
        return judge(claim, verdict.data, why=verdict.why)
    return judge_level(claim, verdict.data, why=verdict.why)
