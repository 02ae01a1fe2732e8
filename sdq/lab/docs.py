"""Render docs/ from outputs/: `python -m sdq.lab.docs --params default`.

docs/src/<stem>.md is a template; docs/<stem>.md is rendered from it with the outputs of
outputs/<stem>/<params>/ by replacing markers:

    {{table:T2}}             the table's Markdown (tables/T2.md)
    {{chart:bytes_by_class}} an image link to docs/charts/<stem>/bytes_by_class.svg (copied)
    {{value:expert_bytes}}   a number from values.json; {{value:name:.1f}} with a format spec

docs/index.md is rendered from docs/src/index.md, whose markers become

    {{index:summary}}       the answers first: how many claims got each verdict, the
                            predictions among them, claims with no data, stale outputs
    {{index:notebooks}}     the notebook list, each with whether its outputs come from the
                            code at HEAD
    {{index:catalogue}}     the T1-T12 catalogue: where each table is (or "not yet produced")
                            and the verdicts on its seed claims
    {{index:verdict_rule}}  the verdict rule in words (the "Rule" section of sdq.lab.verdict)
    {{index:verdicts}}      one line per seed claim recorded in outputs/*/<params>/verdicts.json:
                            kind, the seed's figure and value, ours, n, margin, verdict, the
                            rule's clause and why
    {{index:stability}}     per claim and machine: in how many kept runs of the same
                            experiment (code and parameters) the verdict came out as
                            the latest, and the verdict on their pooled data

A verdict is shown only from a verdicts.json record, and only after its data have been judged
again and give the same verdict. The figures come only from the files under outputs/, so the
committed outputs/*/default/ alone rebuild docs/ byte for byte; each page ends with its
outputs' provenance, the number of runs kept in outputs/<stem>/<params>/runs/, and — the one
thing read from git — a warning, at its top and its end, when sdq/ or the notebook differ at
HEAD from the code that produced the outputs (git trees, not commits: committing the outputs
moves HEAD, not the code). A marker whose target does not exist is an error naming the
template, line and missing file.

Stability: outputs/<stem>/<params>/runs/ keeps every run. Runs *of the same experiment* are
those whose provenance records the same git trees of sdq/ and of the notebook as the latest
outputs, and the same parameters (the model's and the notebook's: `provenance.same_experiment`);
they are grouped by machine (`provenance.machine`: the CPU, its
vector extensions, the disk), so a run copied in from another machine's outputs/ is that
machine's column. For each claim and machine the index shows how many of those runs gave the
latest verdict, and the verdict on all their data pooled (pairs or values concatenated, judged
again by the rule) — pooled only over runs whose claim is coded identically (every `Claim`
field), with the median of their applicability ceilings.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from sdq import files as atomic
from sdq.errors import LabError, SdqError
from sdq.lab import provenance
from sdq.lab.catalogue import CATALOGUE
from sdq.lab.formatting import format_value
from sdq.lab.notebooks import STEM_PATTERN, notebook_paths, read_notebook
from sdq.lab.outputs import collect_verdicts
from sdq.lab.paths import repo_root, shown_params
from sdq.lab.reproduce import is_silent_gap
from sdq.lab.verdict import (
    MIN_N,
    NOT_TESTABLE,
    RULE,
    VERDICTS,
    Claim,
    Verdict,
    distinct_numbers,
    from_record,
    rejudge,
)

MARKER = re.compile(r"\{\{\s*([a-z]+):([A-Za-z0-9_.-]+)(?::([^}\s]*))?\s*\}\}")
NOT_PRODUCED = "not yet produced"
NO_SEED_CLAIM = "no seed claim"  # the table reproduces no seed section (catalogue seed "—")
NOT_JUDGED = "not yet judged"  # no notebook has recorded a verdict on the table's claims
INDEX_BLOCKS = ("summary", "notebooks", "catalogue", "verdict_rule", "verdicts", "stability")
PREDICTION = "prediction of the emulated device"  # beside the word of a claim of basis prediction
VERDICT_HEADER = (
    "| claim | kind | table | seed | ours | n | margin | verdict | by the rule | why it differs |"
)
DEFAULT_HEADINGS = {  # the index's sections when docs/src/index.md does not exist
    "summary": "Answers",
    "notebooks": "Notebooks",
    "catalogue": "Table catalogue",  # the verdict rows link #table-catalogue
    "verdict_rule": "Verdict rule",
    "verdicts": "Seed claims",
    "stability": "Stability",
}
STABILITY_HEADER = "| claim | latest |"  # then one column per machine


@dataclass(frozen=True)
class Site:
    """Where things are: the repository's docs/, docs/src/ and outputs/ for one params set."""

    root: Path
    params: str

    @property
    def docs(self) -> Path:
        return self.root / "docs"

    @property
    def src(self) -> Path:
        return self.docs / "src"

    def out(self, stem: str) -> Path:
        return self.root / "outputs" / stem / shown_params(stem, self.params)

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()


def render(params: str = "default", root: Path | None = None) -> list[Path]:
    """Render every page and the index; return the files written."""
    site = Site(root or repo_root(), params)
    templates = sorted(p for p in site.src.glob("*.md") if STEM_PATTERN.match(p.stem))
    charts_dir = site.docs / "charts"
    pages: dict[str, str] = {}
    charts: dict[Path, Path] = {}  # destination -> source
    for template in templates:
        pages[template.stem] = _render_page(site, template, charts)
    # everything checked: now write (charts folder rebuilt so that nothing stale remains)
    shutil.rmtree(charts_dir, ignore_errors=True)
    for dst, src in sorted(charts.items()):
        atomic.write_bytes(dst, src.read_bytes())
    written = [atomic.write_text(site.docs / f"{stem}.md", text) for stem, text in pages.items()]
    written.append(atomic.write_text(site.docs / "index.md", _render_index(site, pages)))
    return written


def _render_page(site: Site, template: Path, charts: dict[Path, Path]) -> str:
    stem = template.stem
    out = site.out(stem)
    header = (
        f"<!-- Generated by `make docs` from {site.rel(template)} and {site.rel(out)}/. "
        "Edit the template, not this file. -->\n"
    )
    if not out.is_dir():
        notebook = site.root / "notebooks" / f"{stem}.ipynb"
        title = read_notebook(notebook).title if notebook.is_file() else stem
        return header + (
            f"# {title}\n\n*{NOT_PRODUCED}: {site.rel(out)}/ does not exist. Run "
            f"`make reproduce PARAMS={shown_params(stem, site.params)}` to produce it.*\n"
        )
    text = template.read_text(encoding="utf-8")
    values_path = out / "values.json"
    values = json.loads(values_path.read_text(encoding="utf-8")) if values_path.exists() else {}

    def where(match: re.Match) -> str:
        line = text.count("\n", 0, match.start()) + 1
        return f"{site.rel(template)}:{line}: {match.group(0)}"

    def replace(match: re.Match) -> str:
        kind, name, spec = match.group(1), match.group(2), match.group(3)
        if kind == "table":
            path = out / "tables" / f"{name}.md"
            if not path.is_file():
                raise LabError(f"{where(match)}: {site.rel(path)} does not exist")
            return path.read_text(encoding="utf-8").rstrip("\n")
        if kind == "chart":
            path = out / "charts" / f"{name}.svg"
            if not path.is_file():
                raise LabError(f"{where(match)}: {site.rel(path)} does not exist")
            dst = site.docs / "charts" / stem / f"{name}.svg"
            charts[dst] = path
            return f"![{_chart_alt(out, name)}]({dst.relative_to(site.docs).as_posix()})"
        if kind == "value":
            if name not in values:
                raise LabError(f"{where(match)}: no value '{name}' in {site.rel(values_path)}")
            try:
                return format_value(values[name], spec or None)
            except ValueError as exc:
                raise LabError(f"{where(match)}: bad format spec '{spec}': {exc}") from None
        raise LabError(f"{where(match)}: unknown marker kind '{kind}' (table, chart, value)")

    body = _after_title(MARKER.sub(replace, text), _code_warning(site, _provenance(site, stem)))
    return header + body.rstrip("\n") + "\n\n" + _provenance_line(site, stem) + "\n"


def _after_title(body: str, note: str) -> str:
    """`body` with `note` (if any) as the paragraph after its first `# ` heading (or first)."""
    note = note.strip()
    if not note:
        return body
    lines = body.split("\n")
    at = next((i + 1 for i, ln in enumerate(lines) if ln.startswith("# ")), 0)
    head = "\n".join(lines[:at]).rstrip("\n")
    rest = "\n".join(lines[at:]).lstrip("\n")
    return (head + "\n\n" if head else "") + note + "\n\n" + rest


def _chart_alt(out: Path, name: str) -> str:
    """The image's alt text: the chart's description (what it shows, `Outputs.chart(...,
    alt=...)`), else its title, else its name; brackets escaped for Markdown."""
    spec_path = out / "charts" / f"{name}.vl.json"
    text = name
    if spec_path.is_file():
        spec = json.loads(spec_path.read_text(encoding="utf-8"))
        title = spec.get("title")
        if isinstance(title, dict):
            title = title.get("text")
        for candidate in (spec.get("description"), title):
            if isinstance(candidate, str) and candidate.strip():
                text = candidate.strip()
                break
    return text.replace("[", "\\[").replace("]", "\\]")


def _provenance(site: Site, stem: str) -> dict | None:
    path = site.out(stem) / "provenance.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _provenance_line(site: Site, stem: str) -> str:
    p = _provenance(site, stem)
    if p is None:
        return f"*Outputs: {site.rel(site.out(stem))}/ (no provenance.json).*"
    git = p.get("git") or {}
    sha = (git.get("sha") or "unknown")[:10] + (
        " (uncommitted changes)" if git.get("dirty") else ""
    )
    cpu = p.get("cpu") or {}
    ram = p.get("ram") or {}
    model = p.get("model") or {}
    m = (p.get("params") or {}).get("model") or {}
    return (
        f"*Produced by `make reproduce PARAMS={shown_params(stem, site.params)}` on "
        f"{p.get('date_utc', '?')} at "
        f"commit {sha}; model: {m.get('preset', '?')} {m.get('qtype', '?')} seed "
        f"{m.get('seed', '?')} ({format_value(model.get('bytes'))} bytes); machine: "
        f"{cpu.get('model', '?')}, {cpu.get('usable_cores', '?')} cores, "
        f"{format_value(ram.get('total_mb'))} MB RAM. Evidence: "
        f"[{site.rel(site.out(stem))}/](../{site.rel(site.out(stem))}/).*"
        + _runs_line(site, stem, p)
        + _code_warning(site, p)
    )


def _runs_line(site: Site, stem: str, latest: dict) -> str:
    """How many runs of the notebook with these parameters are kept (runs/), and which one
    the page shows: a rerun adds a run, and the page says so."""
    runs = provenance.list_runs(site.out(stem))
    if not runs:
        return ""
    where = site.rel(site.out(stem) / provenance.RUNS_DIR)
    shown = [
        f"{r.get('date_utc', '?')} at {((r.get('git') or {}).get('sha') or 'unknown')[:10]}"
        for r in runs
    ]
    kept = (
        "run of this notebook with `{}` is"
        if len(runs) == 1
        else "runs of this notebook with `{}` are"
    )
    return (
        f"\n\n*{len(runs)} {kept.format(shown_params(stem, site.params))} kept in "
        f"[{where}/](../{where}/) ({'; '.join(shown)}); the figures above are from the latest, "
        f"{latest.get('date_utc', '?')}.*"
    )


def _code_warning(site: Site, p: dict | None) -> str:
    """A warning when the code that produced the outputs is not the code at HEAD."""
    changed = provenance.code_changed_since(p, site.root) if p else None
    if not changed:
        return ""
    sha = ((p.get("git") or {}).get("sha") or "unknown")[:10]
    paths = ", ".join(f"`{c}`" for c in changed)
    return (
        f"\n\n**Warning: these outputs come from commit {sha}; {paths} differ at HEAD. "
        f"Rerun `make reproduce ONLY={p.get('notebook', '?')} "
        f"PARAMS={shown_params(p.get('notebook', ''), site.params)}`.**"
    )


def _render_index(site: Site, pages: dict[str, str]) -> str:
    template = site.src / "index.md"
    if template.is_file():
        text = template.read_text(encoding="utf-8")
    else:
        text = "# sdq lab\n\n" + "\n\n".join(
            f"## {DEFAULT_HEADINGS[b]}\n\n{{{{index:{b}}}}}" for b in INDEX_BLOCKS
        )
    verdicts = _verdicts(site)
    blocks = {
        "summary": _summary(site, pages, verdicts),
        "notebooks": _notebook_list(site, pages),
        "catalogue": _catalogue(site, pages, verdicts),
        "verdict_rule": RULE.rstrip("\n"),
        "verdicts": _verdict_table(site, verdicts),
        "stability": _stability(site, verdicts),
    }
    assert tuple(blocks) == INDEX_BLOCKS

    def replace(match: re.Match) -> str:
        kind, name = match.group(1), match.group(2)
        if kind != "index" or name not in blocks:
            line = text.count("\n", 0, match.start()) + 1
            known = ", ".join(f"{{{{index:{b}}}}}" for b in INDEX_BLOCKS)
            raise LabError(
                f"{site.rel(template)}:{line}: {match.group(0)}: the index knows only {known}"
            )
        return blocks[name]

    header = (
        f"<!-- Generated by `make docs` from {site.rel(template)} and outputs/*/{site.params}/. "
        "Edit the template, not this file. -->\n"
    )
    return header + MARKER.sub(replace, text).rstrip("\n") + "\n"


CODE_AT_HEAD = "HEAD's"  # the notebook list's code cell when the outputs come from HEAD's code


def _notebook_list(site: Site, pages: dict[str, str]) -> str:
    rows = ["| notebook | page | outputs | code |", "| --- | --- | --- | --- |"]
    for path in notebook_paths(site.root / "notebooks"):
        stem = path.stem
        title = f"[{read_notebook(path).title}](../notebooks/{path.name})"
        page = f"[{stem}.md]({stem}.md)" if stem in pages else "no docs template yet"
        p = _provenance(site, stem)
        if p is None:
            status, code = NOT_PRODUCED, "—"
        else:
            link = f"[{site.rel(site.out(stem))}/](../{site.rel(site.out(stem))}/)"
            status = f"{link}, {p.get('date_utc', '?')[:10]}, {p.get('duration_s', '?')} s"
            code = _code_cell(site, p)
        rows.append(f"| {title} | {page} | {status} | {code} |")
    return "\n".join(rows)


def _code_cell(site: Site, p: dict) -> str:
    """Whether a notebook's outputs come from the code at HEAD (sdq/ and the notebook)."""
    changed = provenance.code_changed_since(p, site.root)
    if changed is None:
        return "unknown (no git trees to compare)"
    if not changed:
        return CODE_AT_HEAD
    sha = ((p.get("git") or {}).get("sha") or "unknown")[:10]
    return f"**stale**: from {sha}; " + ", ".join(f"`{c}`" for c in changed) + " differ at HEAD"


def _stale(site: Site) -> list[tuple[str, str]]:
    """(stem, what differs) for every notebook whose outputs come from other code than HEAD's."""
    found = []
    for path in notebook_paths(site.root / "notebooks"):
        p = _provenance(site, path.stem)
        changed = provenance.code_changed_since(p, site.root) if p else None
        if changed:
            sha = ((p.get("git") or {}).get("sha") or "unknown")[:10]
            what = ", ".join(f"`{c}`" for c in changed)
            found.append((path.stem, f"outputs from commit {sha}; {what} differ at HEAD"))
    return found


def _summary(site: Site, pages: dict[str, str], verdicts: list[dict]) -> str:
    """The index's answers, first: the verdicts counted, the predictions among them, claims with
    no data, and notebooks whose outputs are older than the code."""
    lines = []
    if verdicts:
        notebooks = sorted({r["notebook"] for r in verdicts})
        words = [r["verdict"] for r in verdicts]
        lines.append(
            f"**{len(verdicts)} seed claims judged** by {len(notebooks)} notebooks: "
            f"{verdict_summary(words)}."
        )
        predicted = [r for r in verdicts if r.get("basis") == "prediction"]
        if predicted:
            lines.append(
                f"{len(predicted)} of them are {PREDICTION}s (a device model fitted to the "
                f"seed's §1 table): {verdict_summary([r['verdict'] for r in predicted])}."
            )
        gaps = [r["claim"] for r in verdicts if is_silent_gap(r)]
        lines.append(
            "**Claims with no data:** " + ", ".join(gaps) + "."
            if gaps
            else "Every claim rests on data, or says why it is not testable here."
        )
    else:
        lines.append(NO_VERDICTS.format(params=site.params))
    stale = _stale(site)
    if stale:
        shown = "; ".join(
            f"[{stem}]({stem}.md)" + f" ({what})" if stem in pages else f"{stem} ({what})"
            for stem, what in stale
        )
        lines.append(
            f"**Stale outputs** — produced by other code than HEAD's, to be rerun: {shown}."
        )
    else:
        lines.append("Every notebook's outputs come from the code at HEAD.")
    return "\n\n".join(lines)


def _catalogue(site: Site, pages: dict[str, str], verdicts: list[dict]) -> str:
    rows = [
        "| id | seed § | table | notebook | verdicts | where |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    stems = [p.stem for p in notebook_paths(site.root / "notebooks")]
    for spec in CATALOGUE:
        stem = next((s for s in stems if s.startswith(spec.notebook + "_")), None)
        found = sorted(site.root.glob(f"outputs/*/{site.params}/tables/{spec.id}.md"))
        if found:
            links = []
            for md in found:
                nb = md.parts[-4]
                if nb in pages and f"{{{{table:{spec.id}}}}}" in _template_text(site, nb):
                    links.append(f"[page]({nb}.md)")
                links.append(f"[{md.name}](../{site.rel(md)})")
            where = " · ".join(links)
        else:
            where = NOT_PRODUCED
        judged = verdict_summary([r["verdict"] for r in verdicts if r["table"] == spec.id])
        if not judged:
            judged = NO_SEED_CLAIM if spec.seed == "—" else NOT_JUDGED
        rows.append(
            f"| {spec.id} | {spec.seed} | {spec.table} | {stem or spec.notebook} | {judged} "
            f"| {where} |"
        )
    return "\n".join(rows)


def verdict_summary(words: list[str]) -> str:
    """A catalogue cell: how many claims got each verdict, in the order of VERDICTS
    ("2 reproduced · 1 inconclusive"); "" for none."""
    return " · ".join(f"{words.count(w)} {w}" for w in VERDICTS if w in words)


def _verdicts(site: Site) -> list[dict]:
    """Every verdict record for these params, in catalogue order then by claim, each judged
    again from its data: a record whose verdict its data do not give is an error."""
    order = {spec.id: i for i, spec in enumerate(CATALOGUE)}
    records = []
    for notebook, record in collect_verdicts(site.root / "outputs", site.params):
        claim, recorded = from_record(record)
        again = rejudge(claim, recorded)
        if again.verdict != recorded.verdict:
            path = site.rel(site.out(notebook) / "verdicts.json")
            raise LabError(
                f"{path}: claim {claim.id} says {recorded.verdict!r} but its "
                f"{recorded.n} measurements give {again.verdict!r} ({again.reason}); "
                "rerun the notebook"
            )
        records.append({**record, "notebook": notebook})
    records.sort(key=lambda r: (order[r["table"]], r["claim"]))
    return records


def _verdict_table(site: Site, verdicts: list[dict]) -> str:
    if not verdicts:
        return NO_VERDICTS.format(params=site.params)
    rows = [VERDICT_HEADER, "| --- | --- | --- | --- | --- | ---: | ---: | --- | --- | --- |"]
    for r in verdicts:
        claim, v = from_record(r)
        paired = claim.kind in ("effect", "null")
        arms = f", {claim.b} / {claim.a}" if paired and claim.a and claim.b else ""
        est, low, high, seed = distinct_numbers(v.estimate, v.low, v.high, claim.seed)
        path = site.rel(site.out(r["notebook"]) / "verdicts.json")
        word = f"[{v.verdict}](../{path})"
        cells = [
            f"{claim.id} ({claim.metric}{arms})",
            claim.kind,
            f"[{claim.table}](#table-catalogue)",
            seed_cell(claim, seed),
            ours_cell(claim, v, est, low, high),
            str(v.n),
            f"±{claim.margin * 100:.3g} %",
            word + (f" ({PREDICTION})" if claim.basis == "prediction" else ""),
            v.reason,
            v.why,
        ]
        rows.append(_row(cells))
    return "\n".join(rows)


NO_VERDICTS = (
    "*No notebook has recorded a verdict yet: there is no `verdicts.json` in "
    "`outputs/*/{params}/`.*"
)
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.(\d+))?)\s*([x×])?")


def seed_cell(claim: Claim, seed_text: str) -> str:
    """The seed's figure as the seed states it and the seed's value — the value only where the
    figure does not already print it (a ratio is printed once: "16.2x", not "16.2x (16.19×)")."""
    ratio = claim.kind in ("effect", "null")
    for match in _NUMBER.finditer(claim.seed_figure):
        if ratio and not match.group(3):
            continue
        value, decimals = float(match.group(1)), len(match.group(2) or "")
        if abs(value - claim.seed) <= 0.5 * 10.0**-decimals + 1e-12:
            return claim.seed_figure
    return f"{claim.seed_figure} = {seed_text}{'×' if ratio else ''}"


def ours_cell(claim: Claim, v: Verdict, est: str, low: str, high: str) -> str:
    """Our estimate with its interval and the interval's coverage, or the computed value."""
    if v.estimate is None:
        if v.verdict == NOT_TESTABLE:
            return "not measured"
        return f"nothing measured (0 {claim.unit}s)"
    times = "×" if claim.kind in ("effect", "null") else ""
    if claim.kind == "computed":
        return f"{est} (computed once)"
    if v.low is None:
        units = f"{v.n} {claim.unit}{'' if v.n == 1 else 's'}"
        return f"{est}{times}, no interval from {units} (needs {MIN_N})"
    return f"{est}{times} [{low}, {high}], {v.confidence:.1%} coverage"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


@dataclass(frozen=True)
class KeptRun:
    """One kept run of a notebook: its provenance and its verdicts by claim id."""

    name: str  # its folder under runs/ ("latest" for top-level outputs not kept there)
    provenance: dict
    verdicts: dict[str, tuple[Claim, Verdict]]
    unreadable: int  # records this code cannot read (written under an older rule)


def kept_runs(out: Path) -> list[KeptRun]:
    """Every run kept under `out`/runs/, oldest first, then the top-level outputs if they are
    not among them (outputs from before runs/ were kept)."""
    found = []
    for record in provenance.list_runs(out):
        name = record.pop("run")
        found.append(_kept_run(out / provenance.RUNS_DIR / name, name, record))
    latest = _read_json(out / "provenance.json")
    if latest is not None and not any(r.provenance == latest for r in found):
        found.append(_kept_run(out, "latest", latest))
    return found


def _kept_run(folder: Path, name: str, record: dict) -> KeptRun:
    raw = _read_json(folder / "verdicts.json")
    verdicts: dict[str, tuple[Claim, Verdict]] = {}
    unreadable = 0
    for item in raw if isinstance(raw, list) else []:
        try:
            claim, v = from_record(item)
        except LabError:
            unreadable += 1
            continue
        verdicts[claim.id] = (claim, v)
    return KeptRun(name, record, verdicts, unreadable)


def pooled_verdict(claim: Claim, verdicts: list[Verdict]) -> Verdict:
    """The rule's verdict on the data of several runs of one claim, pooled: pairs or values
    concatenated (a computed claim: the median of its values, one value), with the median of
    the runs' applicability ceilings where every run states one. The runs must code the claim
    identically; `verdicts` are theirs, oldest first."""
    latest = verdicts[-1]
    data = tuple(d for v in verdicts for d in v.data)
    if claim.kind == "computed" and data:
        data = (statistics.median(data),)
    ceilings = [v.ceiling for v in verdicts if v.ceiling is not None]
    ceiling, regime = latest.ceiling, latest.regime
    if len(verdicts) > 1 and ceilings and len(ceilings) == len(verdicts):
        ceiling = statistics.median(ceilings)
        regime = f"median ceiling of {len(verdicts)} runs (latest: {latest.regime})"
    pooled = replace(latest, data=data, n=len(data), ceiling=ceiling, regime=regime)
    return rejudge(claim, pooled)


def _stability(site: Site, verdicts: list[dict]) -> str:
    """Per claim and machine: how many kept runs of the latest outputs' experiment (code and
    parameters) gave the latest verdict, and the verdict on their pooled data."""
    if not verdicts:
        return NO_VERDICTS.format(params=site.params)
    machines: list[str] = []
    notes: list[str] = []
    rows: list[tuple[str, str, dict[str, str]]] = []
    for stem in sorted({r["notebook"] for r in verdicts}):
        latest = _provenance(site, stem) or {}
        runs = [
            r for r in kept_runs(site.out(stem)) if provenance.same_experiment(r.provenance, latest)
        ]
        groups: dict[str, list[KeptRun]] = {}
        for run in runs:
            groups.setdefault(provenance.machine(run.provenance), []).append(run)
        for label in groups:
            if label not in machines:
                machines.append(label)
        total = len(provenance.list_runs(site.out(stem)))
        if runs:
            by = ", ".join(f"machine {machines.index(m) + 1}: {len(g)}" for m, g in groups.items())
            unread = sum(r.unreadable for r in runs)
            note = f" ({unread} records written under an older rule skipped)" if unread else ""
            notes.append(
                f"- {stem}: {len(runs)} of the {total} kept runs repeat the experiment of its "
                f"latest outputs ({by}){note}."
            )
        else:
            notes.append(
                f"- {stem}: no kept run repeats the experiment of its latest outputs (git "
                f"trees of `sdq` and the notebook, parameters), so none is compared."
            )
        for record in (r for r in verdicts if r["notebook"] == stem):
            claim, now = from_record(record)
            cells = {}
            for label, group in groups.items():
                cells[label] = _stability_cell(claim, now, group)
            rows.append((claim.id, now.verdict, cells))
    header = STABILITY_HEADER + "".join(f" machine {i + 1} |" for i in range(len(machines)))
    table = [header, "| --- | --- |" + " --- |" * len(machines)]
    for claim_id, word, cells in rows:
        table.append(_row([claim_id, word] + [cells.get(m, "—") for m in machines]))
    legend = [f"- machine {i + 1}: {m}" for i, m in enumerate(machines)] or [
        "- no kept run of the latest outputs' experiment"
    ]
    return "\n".join(legend) + "\n\n" + "\n".join(notes) + "\n\n" + "\n".join(table)


def _stability_cell(claim: Claim, now: Verdict, group: list[KeptRun]) -> str:
    having = [run.verdicts[claim.id] for run in group if claim.id in run.verdicts]
    if not having:
        return "not recorded"
    same = sum(v.verdict == now.verdict for _, v in having)
    alike = [v for c, v in having if c == claim]
    text = f"{same} of {len(having)} runs the same"
    if not alike:
        return text + "; coded otherwise in every run, not pooled"
    pooled = pooled_verdict(claim, alike)
    over = "" if len(alike) == len(having) else f" of the {len(alike)} runs coded alike"
    unit = f"{pooled.n} {claim.unit}{'' if pooled.n == 1 else 's'}"
    if pooled.estimate is None:
        return f"{text}; pooled{over}: {pooled.verdict}"
    (est,) = distinct_numbers(pooled.estimate)
    times = "×" if claim.kind in ("effect", "null") else ""
    return f"{text}; pooled{over} ({unit}, {est}{times}): {pooled.verdict}"


def _read_json(path: Path):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _template_text(site: Site, stem: str) -> str:
    return (site.src / f"{stem}.md").read_text(encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sdq.lab.docs", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--params", default="default", help="render from outputs/*/NAME/")
    args = parser.parse_args(argv)
    try:
        written = render(args.params)
    except SdqError as exc:
        print(f"docs: error: {exc}", file=sys.stderr)
        return exc.exit_code
    root = repo_root()
    print(
        f"docs: rendered {len(written)} files from outputs/*/{args.params}/: "
        + ", ".join(p.relative_to(root).as_posix() for p in written)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
