"""docs/ rendering: markers replaced from outputs/, clear errors, identical bytes every time."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from lab_support import make_repo

from sdq.errors import LabError
from sdq.lab import Outputs
from sdq.lab.docs import NOT_PRODUCED, render

TEMPLATE = """# Demo

{{table:T2}}

One expert is {{value:expert_bytes}} bytes; {{value:share:.1%}} of the file.

{{chart:bytes}}
"""


@pytest.fixture
def repo(tmp_path):
    """A repository with notebook 00_demo, its template and its default outputs."""
    make_repo(tmp_path, {}, {"00_demo": ("",), "01_other": ("",)})
    (tmp_path / "docs" / "src").mkdir(parents=True)
    (tmp_path / "docs" / "src" / "00_demo.md").write_text(TEMPLATE)
    out = Outputs("00_demo", "default", root=tmp_path / "outputs")
    df = pd.DataFrame({"part": ["gate", "up"], "bytes": [589824, 720896]})
    out.table("T2", df, title="One expert", note="L0E0")
    out.value("expert_bytes", 1900544)
    out.value("share", 0.0123)
    (out.dir / "charts").mkdir()
    (out.dir / "charts" / "bytes.svg").write_text("<svg>bytes</svg>\n")
    (out.dir / "charts" / "bytes.vl.json").write_text(json.dumps({"title": "Bytes per class"}))
    (out.dir / "provenance.json").write_text(
        json.dumps(
            {
                "date_utc": "2026-01-02T03:04:05Z",
                "git": {"sha": "0123456789abcdef", "dirty": False},
                "params": {"model": {"preset": "mini", "qtype": "Q4_K_M", "seed": 0}},
                "model": {"bytes": 1234},
                "cpu": {"model": "CPU X", "usable_cores": 2},
                "ram": {"total_mb": 8192},
                "duration_s": 12.5,
            }
        )
    )
    return tmp_path


def test_markers_are_replaced(repo):
    render("default", root=repo)
    page = (repo / "docs" / "00_demo.md").read_text()
    assert "{{" not in page
    assert "**T2. One expert**" in page and "| gate | 589,824 |" in page
    assert "One expert is 1,900,544 bytes; 1.2% of the file." in page
    assert "![Bytes per class](charts/00_demo/bytes.svg)" in page
    assert (repo / "docs" / "charts" / "00_demo" / "bytes.svg").read_text() == "<svg>bytes</svg>\n"
    assert "on 2026-01-02T03:04:05Z at commit 0123456789;" in page


def test_index_lists_notebooks_and_catalogue_honestly(repo):
    render("default", root=repo)
    index = (repo / "docs" / "index.md").read_text()
    assert "[Demo](../notebooks/00_demo.ipynb) | [00_demo.md](00_demo.md)" in index
    t2 = next(line for line in index.splitlines() if line.startswith("| T2 |"))
    assert "[page](00_demo.md) · [T2.md](../outputs/00_demo/default/tables/T2.md)" in t2
    t1 = next(line for line in index.splitlines() if line.startswith("| T1 |"))
    assert t1.endswith(f"| {NOT_PRODUCED} |")
    other = next(line for line in index.splitlines() if "01_other.ipynb" in line)
    assert other.endswith(f"| no docs template yet | {NOT_PRODUCED} | — |")


def test_rendering_is_deterministic(repo):
    render("default", root=repo)
    first = {p: p.read_bytes() for p in sorted((repo / "docs").rglob("*")) if p.is_file()}
    render("default", root=repo)
    second = {p: p.read_bytes() for p in sorted((repo / "docs").rglob("*")) if p.is_file()}
    assert first == second


def test_missing_table_names_template_line_and_file(repo):
    (repo / "docs" / "src" / "00_demo.md").write_text("# Demo\n\ntext\n{{table:T9}}\n")
    with pytest.raises(LabError) as err:
        render("default", root=repo)
    assert str(err.value) == (
        "docs/src/00_demo.md:4: {{table:T9}}: outputs/00_demo/default/tables/T9.md does not exist"
    )


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("{{chart:nope}}", "charts/nope.svg does not exist"),
        ("{{value:nope}}", "no value 'nope' in outputs/00_demo/default/values.json"),
        ("{{value:share:q}}", "bad format spec 'q'"),
        ("{{tabel:T2}}", "unknown marker kind 'tabel'"),
    ],
)
def test_bad_markers_are_one_line_errors(repo, marker, message):
    (repo / "docs" / "src" / "00_demo.md").write_text(f"# Demo\n{marker}\n")
    with pytest.raises(LabError, match=message):
        render("default", root=repo)
    assert not (repo / "docs" / "00_demo.md").exists()  # nothing written on error


def test_page_without_outputs_says_not_produced(repo):
    render("smoke", root=repo)
    page = (repo / "docs" / "00_demo.md").read_text()
    assert f"*{NOT_PRODUCED}: outputs/00_demo/smoke/ does not exist." in page
    index = (repo / "docs" / "index.md").read_text()
    assert next(ln for ln in index.splitlines() if ln.startswith("| T2 |")).endswith(
        NOT_PRODUCED + " |"
    )


def test_cli_prints_one_line_and_exits_2_on_error(repo, monkeypatch, capsys):
    from sdq.lab import docs

    monkeypatch.setattr(docs, "repo_root", lambda: repo)
    assert docs.main(["--params", "default"]) == 0
    assert capsys.readouterr().out.startswith("docs: rendered 2 files from outputs/*/default/")
    (repo / "docs" / "src" / "00_demo.md").write_text("{{value:missing}}\n")
    assert docs.main(["--params", "default"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("docs: error: docs/src/00_demo.md:1:")


def test_unknown_index_marker_names_the_known_ones(repo):
    (repo / "docs" / "src" / "index.md").write_text("# lab\n\n{{index:verdict}}\n")
    with pytest.raises(LabError) as err:
        render("default", root=repo)
    assert str(err.value) == (
        "docs/src/index.md:3: {{index:verdict}}: the index knows only {{index:summary}}, "
        "{{index:notebooks}}, {{index:catalogue}}, {{index:verdict_rule}}, {{index:verdicts}}, "
        "{{index:stability}}"
    )
