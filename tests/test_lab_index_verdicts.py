"""docs/index.md under the verdict rule: every verdict cell from a record of outputs/, the
answers first, ratios printed once, predictions marked, stale outputs flagged, verdicts across
kept runs and machines, and no claim without data (in `make reproduce` and in the committed
outputs)."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from lab_support import make_notebook, make_repo

from sdq.errors import LabError
from sdq.lab import Outputs, provenance, reproduce
from sdq.lab.catalogue import CATALOGUE
from sdq.lab.docs import (
    NO_SEED_CLAIM,
    NOT_JUDGED,
    PREDICTION,
    STABILITY_HEADER,
    VERDICT_HEADER,
    pooled_verdict,
    render,
    seed_cell,
)
from sdq.lab.outputs import collect_verdicts
from sdq.lab.paths import repo_root
from sdq.lab.verdict import (
    CONTRADICTED,
    INCONCLUSIVE,
    NOT_TESTABLE,
    REPRODUCED,
    RULE,
    VERDICTS,
    Claim,
    from_record,
    judge,
    judge_computed,
    judge_not_testable,
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
NOISE = Claim(  # 000 §3: 24 threads "within noise" of 16
    "000-§3-io-24",
    "T4",
    "6.03 vs 5.62 tok/s, within noise",
    seed=6.03 / 5.62,
    direction="equal",
    metric="decode_tok_s",
    a="16 threads",
    b="24 threads",
    kind="null",
)
PREDICTED = Claim(
    "000-§0-parallel-emulated",
    "T4",
    "+48.0 % decode tok/s (3.73 -> 5.52)",
    seed=1.48,
    direction="higher",
    metric="decode_tok_s",
    a="serial",
    b="parallel",
    basis="prediction",
)
ADMISSION = Claim(
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
READS = Claim(  # a file's layout: computed once
    "000-§2-three-reads",
    "T2",
    "3 reads per expert",
    seed=3.0,
    direction="equal",
    metric="reads per expert",
    kind="computed",
    null=3.0,
)
SPLIT = Claim(
    "003-split4-total",
    "T5",
    "total ms 7-12 % lower (1.10x)",
    seed=1.10,
    direction="higher",
    metric="total ms",
    a="split 4",
    b="split 1",
    margin=0.04,
)
WHY = "NVMe here, Apple SSD there; mini model"


def pairs_with_ratios(ratios, a=4.0):
    """Pairs (a, a * r) with the given ratios b/a."""
    return [(a, a * r) for r in ratios]


# --- docs/index.md: every verdict cell from outputs/ -----------------------------------------


def _rows(lines: list[str], header: str) -> list[str]:
    """The body rows of the Markdown table whose header line starts with `header`."""
    start = next((i for i, ln in enumerate(lines) if ln.startswith(header)), None)
    if start is None:
        return []
    rows = []
    for ln in lines[start + 2 :]:
        if not ln.startswith("| "):
            break
        rows.append(ln)
    return rows


def _cells(line: str) -> list[str]:
    return re.split(r"(?<!\\) \| ", line[2:-2])


def _counts(cell: str) -> Counter:
    """ "2 reproduced · 1 reproduced in direction only (smaller)" -> Counter of the words."""
    shown: Counter = Counter()
    for item in cell.split(" · "):
        count, word = item.split(" ", 1)
        shown[word] += int(count)
    return shown


def verdict_cell_problems(index: str, outputs: Path, params: str) -> list[str]:
    """Every verdict shown in a rendered docs/index.md that no verdicts.json under
    outputs/*/<params>/ backs (and every record that is not shown); [] when all agree. Checks
    the catalogue's counts, the summary's counts, each row of the verdict table (word, kind,
    n, the rule's clause, the prediction mark) and the latest word of the stability table."""
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
        shown = _counts(cell)
        if shown != words or not set(shown) <= set(VERDICTS):
            problems.append(f"{table}: '{cell}' but records say {dict(words)}")
    summary = re.search(r"\*\*(\d+) seed claims judged\*\* by \d+ notebooks: (.+?)\.\n", index)
    everything = Counter(r["verdict"] for r in records)
    if records and (
        summary is None
        or int(summary.group(1)) != len(records)
        or _counts(summary.group(2)) != everything
    ):
        problems.append(f"summary: {summary and summary.group(0)!r} but records say {everything}")
    by_id = {r["claim"]: r for r in records}
    shown_ids = set()
    word_cell = re.compile(
        r"\[(.+)\]\(\.\./outputs/.+/verdicts\.json\)( \(" + re.escape(PREDICTION) + r"\))?"
    )
    for line in _rows(lines, VERDICT_HEADER):
        cells = _cells(line)
        claim_id = cells[0].split(" (")[0]
        word = word_cell.fullmatch(cells[7])
        record = by_id.get(claim_id)
        if record is None or word is None or word.group(1) != record["verdict"]:
            problems.append(f"seed claim row not from a record: {line}")
        elif (
            cells[1] != record["kind"]
            or cells[5] != str(record["n"])
            or cells[8] != record["reason"]
            or bool(word.group(2)) != (record["basis"] == "prediction")
        ):
            problems.append(f"seed claim row differs from its record: {line}")
        shown_ids.add(claim_id)
    problems += [f"record {c} not shown" for c in by_id if c not in shown_ids]
    for line in _rows(lines, STABILITY_HEADER):
        cells = _cells(line)
        record = by_id.get(cells[0])
        if record is None or cells[1] != record["verdict"]:
            problems.append(f"stability row not from a record: {line}")
        for cell in cells[2:]:
            pooled = re.search(r": (.+)$", cell) if "pooled" in cell else None
            if pooled and pooled.group(1) not in VERDICTS:
                problems.append(f"stability cell with a word the rule has not: {cell}")
    if not records and "*No notebook has recorded a verdict yet" not in index:
        problems.append("no records, but no line saying so")
    return problems


@pytest.fixture
def judged(tmp_path):
    """A repository whose notebook 03_demo recorded verdicts on T2, T4, T5 and T7."""
    make_repo(tmp_path, {}, {"03_demo": ("",)})
    (tmp_path / "docs" / "src").mkdir(parents=True)
    (tmp_path / "docs" / "src" / "index.md").write_text(
        "# lab\n\n{{index:summary}}\n\n{{index:catalogue}}\n\n{{index:verdict_rule}}\n\n"
        "{{index:verdicts}}\n\n{{index:stability}}\n"
    )
    out = Outputs("03_demo", "default", root=tmp_path / "outputs")
    for claim, ratios in (
        (PARALLEL, [1.45, 1.50, 1.52, 1.46, 1.49, 1.44]),
        (NOISE, [0.7, 1.9, 1.1, 1.6, 0.9, 1.3]),
        (PREDICTED, [1.05, 1.06, 1.04, 1.05, 1.07, 1.03]),
        (ADMISSION, [1.06, 1.07, 1.065, 1.068, 1.062, 1.066]),
    ):
        out.verdict(claim, judge(claim, pairs_with_ratios(ratios), why=WHY))
    out.verdict(READS, judge_computed(READS, 3.0, why="the same layout"))
    regime = "expert I/O 0.4 of 44 ms per token: at most 1.01x; testable on a slower disk"
    out.verdict(SPLIT, judge_not_testable(SPLIT, regime, why=WHY))
    return tmp_path


def test_index_shows_the_rule_and_every_recorded_verdict(judged):
    render("default", root=judged)
    index = (judged / "docs" / "index.md").read_text()
    assert RULE.rstrip("\n") in index
    row = {ln.split(" | ")[0][2:]: ln for ln in index.splitlines() if ln.startswith("| T")}
    assert "| 1 reproduced · 1 not reproduced · 1 inconclusive |" in row["T4"]
    assert "| 1 not testable here |" in row["T5"]
    assert "| 1 reproduced in direction only (smaller) |" in row["T7"]
    assert f"| {NOT_JUDGED} |" in row["T1"] and f"| {NO_SEED_CLAIM} |" in row["T12"]
    parallel = next(ln for ln in index.splitlines() if ln.startswith("| 000-§0-parallel ("))
    assert parallel == (
        "| 000-§0-parallel (decode_tok_s, parallel / serial) | effect | [T4](#table-catalogue) "
        "| +48.0 % decode tok/s (3.73 -> 5.52) = 1.48× | 1.47× [1.44, 1.52], 96.9% coverage "
        "| 6 | ±20 % | [reproduced](../outputs/03_demo/default/verdicts.json) "
        "| 96.9% interval 1.44–1.52 excludes 1 on the seed's side and meets the seed's 1.48 ±20% "
        f"| {WHY} |"
    )
    reads = next(ln for ln in index.splitlines() if ln.startswith("| 000-§2-three-reads"))
    assert "| computed | [T2](#table-catalogue) | 3 reads per expert | 3 (computed once) | 1 |" in (
        reads
    )
    split = next(ln for ln in index.splitlines() if ln.startswith("| 003-split4-total"))
    assert "| not measured | 0 | ±4 % | [not testable here](" in split
    assert verdict_cell_problems(index, judged / "outputs", "default") == []


def test_the_answers_come_first(judged):
    """The summary — words counted over every claim, predictions, claims with no data — comes
    before the catalogue, the rule and the claims."""
    render("default", root=judged)
    index = (judged / "docs" / "index.md").read_text()
    summary = (
        "**6 seed claims judged** by 1 notebooks: 1 reproduced · 1 reproduced in direction only "
        "(smaller) · 1 not reproduced · 1 inconclusive · 1 not testable here."
    )
    # READS is "reproduced" too: 2 reproduced in all
    summary = summary.replace("1 reproduced ·", "2 reproduced ·", 1)
    assert summary in index
    assert f"1 of them are {PREDICTION}s" in index
    assert "Every claim rests on data, or says why it is not testable here." in index
    assert index.index(summary) < index.index("| id | seed § |") < index.index(VERDICT_HEADER)


def test_a_prediction_is_marked_as_one(judged):
    render("default", root=judged)
    index = (judged / "docs" / "index.md").read_text()
    row = next(ln for ln in index.splitlines() if ln.startswith("| 000-§0-parallel-emulated"))
    assert f"[not reproduced](../outputs/03_demo/default/verdicts.json) ({PREDICTION}) |" in row
    plain = next(ln for ln in index.splitlines() if ln.startswith("| 000-§0-parallel ("))
    assert PREDICTION not in plain


@pytest.mark.parametrize(
    ("figure", "seed", "kind", "shown"),
    [
        ("aggregate 16.2x, 1 to 16 reads", 16.19, "effect", "aggregate 16.2x, 1 to 16 reads"),
        ("+48.0 % (3.73 -> 5.52)", 1.48, "effect", "+48.0 % (3.73 -> 5.52) = 1.48×"),
        ("6.94 -> 7.77 ms (1.12×)", 7.77 / 6.94, "null", "6.94 -> 7.77 ms (1.12×)"),
        ("1.5 reads", 1.52, "effect", "1.5 reads = 1.52×"),  # a number that is not the ratio
        ("hit rate 70.6 %", 0.706, "level", "hit rate 70.6 % = 0.706"),
        ("3 reads per expert", 3.0, "computed", "3 reads per expert"),
    ],
)  # fmt: skip
def test_the_seed_s_value_is_printed_once(figure, seed, kind, shown):
    fields = dict(a="a", b="b") if kind in ("effect", "null") else dict(null=seed / 2)
    direction = "equal" if kind == "null" else "higher"
    claim = Claim("x", "T1", figure, seed, direction, "m", kind=kind, margin=0.2, **fields)
    text = f"{seed:.3g}"
    assert seed_cell(claim, text) == shown


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
    dropped = "\n".join(ln for ln in index.splitlines() if not ln.startswith("| 000-§3-io-24 ("))
    assert verdict_cell_problems(dropped, outputs, "default") == ["record 000-§3-io-24 not shown"]
    unmarked = index.replace(f" ({PREDICTION}) |", " |", 1)
    assert len(verdict_cell_problems(unmarked, outputs, "default")) == 1
    summary = index.replace("**6 seed claims judged**", "**5 seed claims judged**", 1)
    assert len(verdict_cell_problems(summary, outputs, "default")) == 1


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


def test_no_template_types_a_verdict():
    """A verdict word in a table row of a docs template would be a verdict typed by hand."""
    for template in sorted((repo_root() / "docs" / "src").glob("*.md")):
        for number, line in enumerate(template.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("|"):
                assert not any(w in line for w in VERDICTS), f"{template.name}:{number}: {line}"


# --- stability: kept runs of the same experiment, by machine ---------------------------------

TREES = {"sdq": "a" * 40, "notebooks/03_demo.ipynb": "b" * 40}
XEON = {"model": "Xeon X", "vector_extensions": ["sse4_2", "avx", "avx2", "avx512f"]}
EPYC = {"model": "EPYC Y", "vector_extensions": ["sse4_2", "avx", "avx2"]}
DISK = {"device": "/dev/vda", "fstype": "ext4", "rotational": True}
PARAMS = {"name": "default", "model": {"preset": "seed"}, "03_demo": {"repeat": 6}}


def _provenance(date, cpu, trees=TREES, params=PARAMS):
    return {
        "notebook": "03_demo",
        "date_utc": date,
        "git": {"sha": "c" * 40, "dirty": False, "trees": dict(trees)},
        "params": params,
        "cpu": cpu,
        "model": {"disk": DISK},
    }


def _keep(
    out_dir: Path, date: str, cpu: dict, records: list[dict], trees=TREES, params=PARAMS
) -> None:
    """A kept run under out_dir/runs/<date>/: its verdicts and provenance."""
    run = out_dir / "runs" / date.replace("-", "").replace(":", "")
    run.mkdir(parents=True)
    (run / "verdicts.json").write_text(json.dumps(records))
    (run / "provenance.json").write_text(json.dumps(_provenance(date, cpu, trees, params)))


@pytest.fixture
def kept(judged):
    """03_demo's latest outputs (on the Xeon) and its kept runs: one earlier Xeon run of the
    same experiment, one copied in from an EPYC machine, one of older code, one with other
    parameters, one under an old rule."""
    out = judged / "outputs" / "03_demo" / "default"
    latest = json.loads((out / "verdicts.json").read_text())
    (out / "provenance.json").write_text(json.dumps(_provenance("2026-01-03T00:00:00Z", XEON)))
    _keep(out, "2026-01-03T00:00:00Z", XEON, latest)  # the latest, kept as the runner keeps it
    earlier = to_record(
        PARALLEL, judge(PARALLEL, pairs_with_ratios([1.0, 1.02, 0.99, 1.01, 1.0, 1.03]), why=WHY)
    )
    _keep(out, "2026-01-02T00:00:00Z", XEON, [earlier])
    epyc = to_record(
        PARALLEL, judge(PARALLEL, pairs_with_ratios([1.4, 1.5, 1.6, 1.45, 1.55, 1.5]), why=WHY)
    )
    _keep(out, "2026-01-01T00:00:00Z", EPYC, [epyc])
    older = to_record(PARALLEL, judge(PARALLEL, pairs_with_ratios([0.5] * 6), why=WHY))
    _keep(out, "2025-12-01T00:00:00Z", XEON, [older], trees={**TREES, "sdq": "d" * 40})
    fewer = {**PARAMS, "03_demo": {"repeat": 4}}
    _keep(out, "2025-12-02T00:00:00Z", XEON, [older], params=fewer)
    old_rule = {k: v for k, v in epyc.items() if k not in ("margin", "basis")}
    _keep(out, "2025-12-31T00:00:00Z", EPYC, [old_rule])
    return judged


def test_stability_counts_same_experiment_runs_by_machine_and_pools_their_data(kept):
    render("default", root=kept)
    index = (kept / "docs" / "index.md").read_text()
    lines = index.splitlines()
    assert "- machine 1: EPYC Y (avx, avx2); disk /dev/vda (ext4, rotational)" in lines
    assert "- machine 2: Xeon X (avx, avx2, avx512f); disk /dev/vda (ext4, rotational)" in lines
    assert (
        "- 03_demo: 4 of the 6 kept runs repeat the experiment of its latest outputs "
        "(machine 1: 2, machine 2: 2) (1 records written under an older rule skipped)."
    ) in lines
    (parallel,) = [
        ln for ln in _rows(lines, STABILITY_HEADER) if ln.startswith("| 000-§0-parallel |")
    ]
    cells = _cells(parallel)
    assert cells[1] == REPRODUCED
    assert cells[2] == "1 of 1 runs the same; pooled (6 pairs, 1.5×): reproduced"  # the EPYC
    # the Xeon: the latest and an earlier run of the same experiment; the runs of older code
    # and of other parameters are left out
    assert cells[3] == "1 of 2 runs the same; pooled (12 pairs, 1.22×): inconclusive"
    noise = next(ln for ln in _rows(lines, STABILITY_HEADER) if ln.startswith("| 000-§3-io-24"))
    assert _cells(noise)[2] == "not recorded"
    assert verdict_cell_problems(index, kept / "outputs", "default") == []


def test_runs_coding_a_claim_otherwise_are_not_pooled(kept):
    out = kept / "outputs" / "03_demo" / "default"
    wider = Claim(**{**PARALLEL.__dict__, "margin": 0.1})
    recoded = to_record(wider, judge(wider, pairs_with_ratios([1.5] * 6), why=WHY))
    _keep(out, "2026-01-02T12:00:00Z", XEON, [recoded])
    render("default", root=kept)
    lines = (kept / "docs" / "index.md").read_text().splitlines()
    parallel = next(
        ln for ln in _rows(lines, STABILITY_HEADER) if ln.startswith("| 000-§0-parallel |")
    )
    assert _cells(parallel)[3] == (
        "2 of 3 runs the same; pooled of the 2 runs coded alike (12 pairs, 1.22×): inconclusive"
    )


def test_pooled_data_are_judged_again_by_the_rule():
    """Two runs of 3 pairs each give no interval; pooled, their 6 pairs do."""
    runs = [judge(PARALLEL, pairs_with_ratios(r), why=WHY) for r in ([1.45, 1.5, 1.52], [1.47] * 3)]
    assert [v.verdict for v in runs] == [INCONCLUSIVE, INCONCLUSIVE]
    pooled = pooled_verdict(PARALLEL, runs)
    assert (pooled.n, pooled.verdict) == (6, REPRODUCED)
    assert pooled.data == runs[0].data + runs[1].data
    capped = [judge(PARALLEL, pairs_with_ratios([1.5] * 6), why=WHY, ceiling=c, regime=f"cap {c}")
              for c in (1.1, 1.2, 1.3)]  # fmt: skip
    pooled = pooled_verdict(PARALLEL, capped)
    assert pooled.ceiling == 1.2 and pooled.verdict == NOT_TESTABLE
    assert pooled.regime == "median ceiling of 3 runs (latest: cap 1.3)"
    gone = judge_not_testable(PARALLEL, "no such device here", why=WHY)
    assert pooled_verdict(PARALLEL, [gone, gone]).verdict == NOT_TESTABLE


def test_provenance_names_the_machine():
    assert provenance.vector_extensions("model name: X\nflags : fpu sse sse2 avx avx2 aes\n") == [
        "sse",
        "sse2",
        "avx",
        "avx2",
    ]
    assert provenance.vector_extensions("Features : fp asimd sve crc32\n") == ["asimd", "sve"]
    record = _provenance("2026-01-01T00:00:00Z", XEON)
    assert provenance.machine(record) == (
        "Xeon X (avx, avx2, avx512f); disk /dev/vda (ext4, rotational)"
    )
    old = {"cpu": {"model": "Xeon X"}, "outputs_disk": {"device": "/dev/sda"}}
    assert provenance.machine(old) == "Xeon X (vector extensions not recorded); disk /dev/sda"
    assert provenance.same_code(record, _provenance("2026-01-02T00:00:00Z", EPYC))
    assert not provenance.same_code(record, _provenance("x", XEON, {**TREES, "sdq": "e" * 40}))
    assert not provenance.same_code(record, {"notebook": "03_demo", "git": {"sha": "c" * 40}})
    assert provenance.same_experiment(record, _provenance("y", EPYC))
    other = {**PARAMS, "03_demo": {"repeat": 9}}
    assert provenance.same_code(record, _provenance("y", XEON, params=other))
    assert not provenance.same_experiment(record, _provenance("y", XEON, params=other))
    other_model = {**PARAMS, "model": {"preset": "mini"}}
    assert not provenance.same_experiment(record, _provenance("y", XEON, params=other_model))
    assert not provenance.same_experiment(record, {**record, "params": None})


def test_a_new_run_records_the_cpu_s_vector_extensions(tmp_path):
    record = provenance.collect({}, "03_demo", tmp_path, None)
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    assert record["cpu"]["vector_extensions"] == provenance.vector_extensions(flags)
    assert "disk_model" in record["outputs_disk"]


# --- stale outputs ---------------------------------------------------------------------------


def git(root, *args):
    return subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def test_outputs_of_other_code_than_head_s_are_flagged_on_the_index_and_the_page(tmp_path):
    make_repo(tmp_path, {}, {"00_demo": ("",), "01_other": ("",)})
    for rel, text in {
        "sdq/code.py": "a\n",
        "docs/src/00_demo.md": "# Demo\n\nThe answer: {{value:n}}.\n",
        "docs/src/01_other.md": "# Other\n\n{{value:n}}\n",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "init")
    for stem in ("00_demo", "01_other"):
        out = Outputs(stem, "default", root=tmp_path / "outputs")
        out.value("n", 1)
        record = provenance.collect({}, stem, tmp_path / "outputs", None, root=tmp_path)
        provenance.write(out.dir / "provenance.json", record)
    git(tmp_path, "add", "outputs")
    git(tmp_path, "commit", "-qm", "outputs")  # HEAD moves, the code does not: not stale
    render("default", root=tmp_path)
    index = (tmp_path / "docs" / "index.md").read_text()
    assert "Every notebook's outputs come from the code at HEAD." in index
    assert "Warning" not in (tmp_path / "docs" / "00_demo.md").read_text()
    make_notebook(tmp_path / "notebooks" / "00_demo.ipynb", "x = 2\n")
    git(tmp_path, "commit", "-qam", "notebook changed")
    render("default", root=tmp_path)
    index = (tmp_path / "docs" / "index.md").read_text()
    sha = git(tmp_path, "rev-parse", "HEAD~2")[:10]  # the commit the outputs ran at
    assert (
        "**Stale outputs** — produced by other code than HEAD's, to be rerun: "
        f"[00_demo](00_demo.md) (outputs from commit {sha}; `notebooks/00_demo.ipynb` differ at "
        "HEAD)."
    ) in index
    row = next(ln for ln in index.splitlines() if "(../notebooks/00_demo.ipynb)" in ln)
    assert row.endswith(f"| **stale**: from {sha}; `notebooks/00_demo.ipynb` differ at HEAD |")
    other = next(ln for ln in index.splitlines() if "(../notebooks/01_other.ipynb)" in ln)
    assert other.endswith("| HEAD's |")
    page = (tmp_path / "docs" / "00_demo.md").read_text().splitlines()
    assert page[1] == "# Demo" and page[3].startswith("**Warning: these outputs come from commit")
    assert page[-1].startswith("**Warning")  # and at the end, beside the provenance


def test_the_committed_seed_scenario_page_and_index_say_when_its_outputs_are_stale():
    """Notebook 06 runs only with seed-scale (an hour, 45 GB): until it is rerun at HEAD, its
    page and the index must say that its outputs come from other code. Checks the committed
    docs/, so it holds once `make docs` has rendered them with this code."""
    root = repo_root()
    stem = "06_seed_scenario"
    record = json.loads((root / "outputs" / stem / "seed-scale" / "provenance.json").read_text())
    changed = provenance.code_changed_since(record, root)
    page = (root / "docs" / f"{stem}.md").read_text(encoding="utf-8")
    index = (root / "docs" / "index.md").read_text(encoding="utf-8")
    if not changed:
        assert "**Warning: these outputs come from commit" not in page
        return
    head = page.split("\n## ", 1)[0]
    assert "**Warning: these outputs come from commit" in head, "no warning at the page's top"
    stale = next(ln for ln in index.splitlines() if ln.startswith("**Stale outputs**"))
    assert f"[{stem}]({stem}.md)" in stale


# --- no silent gaps --------------------------------------------------------------------------


def test_reproduce_names_a_claim_with_no_data_and_exits_non_zero(judged, monkeypatch, capsys):
    out = Outputs("03_demo", "default", root=judged / "outputs")
    out.verdict(NOISE, judge(NOISE, [], why="every run refused: --reserve-mb -4.6 must be >= 0"))
    gaps = reproduce.silent_gaps(out.dir, judged)
    assert gaps == [
        "claim 000-§3-io-24 of notebook 03_demo has no data (n = 0, verdict 'inconclusive': "
        "0 pairs: an interval with 95% coverage needs at least 6); every run of it failed or "
        "none was measured (outputs/03_demo/default/verdicts.json)"
    ]  # 003-split4-total: not testable here, with its regime, is no gap

    class Params:
        name = "default"

    result = reproduce.NotebookResult("03_demo", True, 1.0, out.dir)
    monkeypatch.setattr(reproduce, "load_params", lambda name: Params())
    monkeypatch.setattr(reproduce, "run", lambda params, only=None: [result])
    assert reproduce.main(["--params", "default"]) == 1
    err = capsys.readouterr().err
    assert "reproduce: error: claim 000-§3-io-24 of notebook 03_demo has no data" in err


def test_a_claim_with_data_or_not_testable_is_no_gap(judged):
    out = judged / "outputs" / "03_demo" / "default"
    assert reproduce.silent_gaps(out, judged) == []
    record = to_record(SPLIT, judge_not_testable(SPLIT, "no such device", why=WHY))
    assert not reproduce.is_silent_gap(record)
    assert reproduce.is_silent_gap({**record, "regime": " "})
    assert reproduce.is_silent_gap({**record, "verdict": INCONCLUSIVE})


def test_no_committed_claim_is_without_data():
    """Every claim in outputs/*/default/verdicts.json rests on data (n > 0), or is "not
    testable here" with the regime that rules it out. Reads records of the current rule:
    holds once the outputs are regenerated by it."""
    records = collect_verdicts(repo_root() / "outputs", "default")
    assert records, "no verdicts under outputs/*/default/"
    gaps = [f"{nb}: {r['claim']}" for nb, r in records if reproduce.is_silent_gap(r)]
    assert gaps == []
    for _, record in records:
        from_record(record)  # every record readable under the current rule


def test_the_committed_index_shows_only_verdicts_from_the_committed_outputs():
    """Holds once `make docs` rendered docs/index.md from outputs regenerated by this rule."""
    root = repo_root()
    index = (root / "docs" / "index.md").read_text(encoding="utf-8")
    assert RULE.rstrip("\n") in index
    assert verdict_cell_problems(index, root / "outputs", "default") == []
