"""Notebook outputs: tables as JSON + Markdown, charts, values; every write atomic."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from sdq import files as atomic
from sdq.errors import LabError
from sdq.lab import Outputs
from sdq.lab.formatting import format_value, markdown_table
from sdq.lab.paths import OUTPUTS_ROOT_ENV, repo_root


@pytest.fixture
def out(tmp_path):
    return Outputs("00_demo", "smoke", root=tmp_path)


def test_table_writes_json_records_and_markdown(out, tmp_path):
    df = pd.DataFrame(
        {
            "part": ["gate", "up", "down"],
            "offset": np.array([1180930528, 1335144928, 995267040], dtype=np.int64),
            "bytes": np.array([589824, 589824, 720896], dtype=np.int64),
            "ms": [12.6, 7.57, float("nan")],
        }
    )
    out.table("T2", df, title="L0E0", note="absolute offsets", formats={"offset": "d"})
    assert out.dir == tmp_path / "00_demo" / "smoke"
    data = json.loads((out.dir / "tables" / "T2.json").read_text())
    assert data["columns"] == ["part", "offset", "bytes", "ms"]
    assert data["title"] == "L0E0" and data["note"] == "absolute offsets"
    assert data["records"][0] == {"part": "gate", "offset": 1180930528, "bytes": 589824, "ms": 12.6}
    assert data["records"][2]["ms"] is None  # NaN is not valid JSON
    md = (out.dir / "tables" / "T2.md").read_text()
    assert md.startswith(
        "**T2. L0E0**\n\n| part | offset | bytes | ms |\n| --- | ---: | ---: | ---: |"
    )
    assert "| gate | 1180930528 | 589,824 | 12.60 |" in md
    assert "| down | 995267040 | 720,896 | — |" in md
    assert md.endswith("*absolute offsets*\n")


def test_named_index_becomes_a_column(out):
    df = pd.DataFrame({"hits": [3, 4]}, index=pd.Index([1, 2], name="threads"))
    out.table("T9", df, title="t")
    assert json.loads((out.dir / "tables" / "T9.json").read_text())["columns"] == [
        "threads",
        "hits",
    ]


def test_values_accumulate_and_numpy_scalars_become_plain(out):
    out.value("best_threads", np.int64(8))
    out.value("mb_s", np.float32(1.5))
    out.value("mode", "direct")
    assert json.loads((out.dir / "values.json").read_text()) == {
        "best_threads": 8,
        "mb_s": 1.5,
        "mode": "direct",
    }
    with pytest.raises(LabError, match="value bad: must be a number or string"):
        out.value("bad", [1, 2])


def test_chart_writes_svg_png_and_spec(out):
    import altair as alt

    df = pd.DataFrame({"x": ["a", "b"], "y": [1, 2]})
    chart = alt.Chart(df, title="Demo").mark_bar().encode(x="x", y="y")
    out.chart("demo", chart, alt="Bars: y for each x")
    charts = out.dir / "charts"
    assert (charts / "demo.svg").read_text().lstrip().startswith("<svg")
    assert (charts / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((charts / "demo.vl.json").read_text())["title"] == "Demo"


def test_chart_alt_text_is_kept_as_the_specs_description(out):
    import altair as alt

    chart = alt.Chart(pd.DataFrame({"x": ["a", "b"], "y": [1, 2]})).mark_bar().encode(x="x", y="y")
    said = "Bars: y for each x; b is twice a"
    out.chart("demo", chart, alt=said)
    assert json.loads((out.dir / "charts" / "demo.vl.json").read_text())["description"] == said
    with pytest.warns(FutureWarning, match="chart demo: no alt text"):
        out.chart("demo", chart)
    for bad in ("demo", "bytes by class", "two\nlines of alt text", ""):
        with pytest.raises(LabError, match="chart demo: alt"):
            out.chart("demo", chart, alt=bad)


@pytest.mark.parametrize("name", ["", "../up", "a b", "x/y"])
def test_bad_names_are_refused(out, name):
    with pytest.raises(LabError, match="use letters, digits"):
        out.value(name, 1)


def test_default_root_is_the_repository_or_the_runners_staging_folder(monkeypatch, tmp_path):
    monkeypatch.delenv(OUTPUTS_ROOT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)  # a notebook's cwd is notebooks/: outputs/ is still the repo's
    assert Outputs("00_demo", "x").dir == repo_root() / "outputs" / "00_demo" / "x"
    monkeypatch.setenv(OUTPUTS_ROOT_ENV, str(tmp_path / "staging"))
    assert Outputs("00_demo", "x").dir == tmp_path / "staging" / "00_demo" / "x"


def test_atomic_write_leaves_old_file_when_interrupted(tmp_path, monkeypatch):
    target = tmp_path / "t.json"
    atomic.write_json(target, {"v": 1})

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        atomic.write_json(target, {"v": 2})
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]  # no temporary left behind


@pytest.mark.parametrize(
    ("value", "spec", "text"),
    [
        (1180930528, None, "1,180,930,528"),
        (7.574, None, "7.57"),
        (12.6, None, "12.60"),
        (123.45, None, "123.5"),
        (12345.6, None, "12,346"),
        (0.012345, None, "0.0123"),
        (0.0, None, "0"),
        (None, None, "—"),
        (True, None, "yes"),
        (0.385, ".1%", "38.5%"),
        ("Q4_K", None, "Q4_K"),
    ],
)
def test_number_formatting(value, spec, text):
    assert format_value(value, spec) == text


def test_markdown_table_escapes_pipes_and_aligns_text_left():
    md = markdown_table(["a", "b"], [{"a": "x|y", "b": 1}, {"a": "z", "b": None}])
    assert md.splitlines() == ["| a | b |", "| --- | ---: |", "| x\\|y | 1 |", "| z | — |"]
