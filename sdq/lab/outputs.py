"""What a notebook leaves behind: tables, charts and quoted values under outputs/.

    out = Outputs("00_model_anatomy", params_name)   # -> outputs/00_model_anatomy/<params_name>/
    out.table("T2", df, title="...", note="...")       # tables/T2.json + tables/T2.md
    out.chart("bytes_by_class", chart, alt="Bars: MiB per class")  # charts/bytes_by_class.*
    out.value("expert_bytes", 1900544)                 # values.json
    out.verdict(claim, judge(claim, pairs, why="..."))  # verdicts.json (sdq.lab.verdict)

Every file is written to a temporary name and renamed. A relative `root` is taken from the
repository root, so a notebook writes to the same place from Jupyter (cwd notebooks/) and from
the runner; while the runner executes a notebook, the default root is its staging folder.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sdq import files as atomic
from sdq.errors import LabError
from sdq.lab.formatting import markdown_table, to_json_value
from sdq.lab.paths import default_outputs_root, repo_root
from sdq.lab.verdict import Claim, Verdict, from_record, to_record

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
DEFAULT_ROOT = "outputs"
VERDICTS_FILE = "verdicts.json"
PNG_SCALE = 2  # PNG pixels per SVG unit


class Outputs:
    def __init__(self, notebook: str, params_name: str, root: str | Path = DEFAULT_ROOT):
        for what, name in (("notebook", notebook), ("params_name", params_name)):
            _check_name(what, name)
        if str(root) == DEFAULT_ROOT:
            base = default_outputs_root()
        else:
            base = Path(root) if Path(root).is_absolute() else repo_root() / root
        self.notebook = notebook
        self.params_name = params_name
        self.dir = base / notebook / params_name

    def __repr__(self) -> str:
        return f"Outputs({self.notebook!r}, {self.params_name!r}) -> {self.dir}"

    def table(
        self,
        id: str,
        df,
        title: str,
        note: str = "",
        formats: Mapping[str, str] | None = None,
    ) -> Path:
        """Write a pandas DataFrame as tables/<id>.json and tables/<id>.md.

        A named index becomes leading columns; an unnamed RangeIndex is dropped. `formats`
        maps a column to a format spec (e.g. {"offset": "d"}) where the default rule is wrong.
        """
        _check_name("table id", id)
        if any(n is not None for n in df.index.names):
            df = df.reset_index()
        columns = [str(c) for c in df.columns]
        if len(set(columns)) != len(columns):
            raise LabError(f"table {id}: duplicate column names {columns}")
        records = [
            {c: to_json_value(v) for c, v in zip(columns, row, strict=True)}
            for row in df.itertuples(index=False, name=None)
        ]
        payload = {"id": id, "title": title, "note": note, "columns": columns, "records": records}
        if formats:
            payload["formats"] = dict(formats)
        tables = self.dir / "tables"
        atomic.write_json(tables / f"{id}.json", payload)
        md = f"**{id}. {title}**\n\n" + markdown_table(columns, records, formats)
        if note:
            md += f"\n*{note}*\n"
        return atomic.write_text(tables / f"{id}.md", md)

    def chart(self, name: str, chart, alt: str | None = None) -> Path:
        """Render an altair chart to charts/<name>.svg and .png (and keep its Vega-Lite spec).

        `alt` says in one line what the chart shows — the marks, the axes and what the reader
        should see (e.g. "Lines: hit rate (y) against slots per layer (x), one line per
        policy, one panel per trace") — for readers who cannot see it; it is stored as the
        spec's `description` and becomes the image's alt text in docs/. Without it the docs
        fall back to the chart's title, and a warning says so.
        """
        import vl_convert as vlc

        _check_name("chart name", name)
        spec = chart.to_dict() if hasattr(chart, "to_dict") else dict(chart)
        if alt is None:
            warnings.warn(
                f"chart {name}: no alt text; pass alt='what the chart shows' to out.chart",
                FutureWarning,
                stacklevel=2,
            )
        else:
            _check_alt(name, alt)
            spec["description"] = alt.strip()
        spec_json = json.dumps(spec, sort_keys=True)
        charts = self.dir / "charts"
        atomic.write_text(charts / f"{name}.vl.json", json.dumps(spec, indent=1, sort_keys=True))
        atomic.write_bytes(charts / f"{name}.png", vlc.vegalite_to_png(spec_json, scale=PNG_SCALE))
        return atomic.write_text(charts / f"{name}.svg", vlc.vegalite_to_svg(spec_json))

    def value(self, name: str, v: Any) -> Any:
        """Record a single number (or short string) quoted in prose as {{value:name}}."""
        _check_name("value name", name)
        if isinstance(v, list | tuple | dict | set):
            raise LabError(f"value {name}: must be a number or string, got {type(v).__name__}")
        jv = to_json_value(v) if getattr(v, "ndim", 0) == 0 else v
        if not isinstance(jv, int | float | str | bool) and jv is not None:
            raise LabError(f"value {name}: must be a number or string, got {type(v).__name__}")
        path = self.dir / "values.json"
        values = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        values[name] = jv
        atomic.write_json(path, values)
        return v

    def verdict(self, claim: Claim, verdict: Verdict) -> Verdict:
        """Record a seed claim's verdict in verdicts.json (one record per claim, by claim id).

        `verdict` comes from `sdq.lab.verdict.judge` (or `judge_level`) on `claim` and must say
        `why` in one line: how ours differs from the seed (device, model, method) or agrees.
        Recording a claim again replaces its record.
        """
        if not isinstance(verdict.why, str) or not verdict.why.strip():
            raise LabError(
                f"verdict {claim.id}: `why` is empty; say in one line why ours differs from "
                "the seed (device, model, method) or why it agrees: judge(..., why='...')"
            )
        if not verdict.why.isprintable() or "|" in verdict.why:
            raise LabError(f"verdict {claim.id}: `why` must be one printable line without '|'")
        record = to_record(claim, verdict)
        path = self.dir / VERDICTS_FILE
        records = (
            [r for r in read_verdicts(path) if r["claim"] != claim.id] if path.exists() else []
        )
        records.append(record)
        records.sort(key=lambda r: r["claim"])
        atomic.write_json(path, records)
        return verdict


def read_verdicts(path: Path) -> list[dict[str, Any]]:
    """The records of one verdicts.json, each checked by `sdq.lab.verdict.from_record`."""
    try:
        records = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LabError(f"{path}: cannot read verdicts: {exc}") from None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise LabError(f"{path}: verdicts must be a JSON list of records")
    seen: set[str] = set()
    for r in records:
        try:
            claim, _ = from_record(r)
        except LabError as exc:
            raise LabError(f"{path}: {exc}") from None
        if claim.id in seen:
            raise LabError(f"{path}: claim {claim.id} recorded twice")
        seen.add(claim.id)
    return records


def collect_verdicts(outputs: Path, params_name: str) -> list[tuple[str, dict[str, Any]]]:
    """(notebook, record) for every record of outputs/*/<params_name>/verdicts.json, by
    notebook then claim; a claim recorded by two notebooks is a LabError naming both."""
    found: list[tuple[str, dict[str, Any]]] = []
    owner: dict[str, str] = {}
    for path in sorted(Path(outputs).glob(f"*/{params_name}/{VERDICTS_FILE}")):
        notebook = path.parent.parent.name
        for record in read_verdicts(path):
            if record["claim"] in owner:
                raise LabError(
                    f"claim {record['claim']} has verdicts from two notebooks: "
                    f"{owner[record['claim']]} and {notebook}"
                )
            owner[record["claim"]] = notebook
            found.append((notebook, record))
    return found


def _check_alt(name: str, alt: str) -> None:
    """Alt text: one printable line of words that describes the chart, not its file name."""
    text = alt.strip() if isinstance(alt, str) else ""
    if not text or not text.isprintable():
        raise LabError(f"chart {name}: alt must be one printable line saying what the chart shows")
    if text.lower() in (name.lower(), name.replace("_", " ").lower()) or len(text.split()) < 4:
        raise LabError(
            f"chart {name}: alt {text!r} names the chart instead of saying what it shows "
            "(marks, axes, what to see)"
        )


def _check_name(what: str, name: str) -> None:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise LabError(f"{what} {name!r}: use letters, digits, '_', '-', '.' only")
