"""provenance.json records the code, packages, parameters, machine and date of a run."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest
from lab_support import make_notebook, make_repo

from sdq.lab import Outputs, provenance
from sdq.lab.docs import render
from sdq.lab.paths import repo_root


def test_record_has_every_field(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    params = {"name": "smoke", "model": {"preset": "tiny", "qtype": "Q4_K_M", "seed": 0}}
    record = provenance.collect(params, "00_demo", tmp_path, model, extra={"duration_s": 1.5})
    path = provenance.write(tmp_path / "provenance.json", record)
    p = json.loads(path.read_text())

    assert p["notebook"] == "00_demo" and p["params"] == params and p["duration_s"] == 1.5
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", p["date_utc"])
    assert re.fullmatch(r"[0-9a-f]{40}", p["git"]["sha"])
    assert isinstance(p["git"]["dirty"], bool)
    assert p["packages"]["numpy"] == np.__version__
    assert p["packages"]["sdq"] and p["packages"]["python"]
    assert p["cpu"]["logical_cores"] >= 1 and p["cpu"]["usable_cores"] >= 1
    assert p["cpu"]["model"]
    assert isinstance(p["cpu"]["vector_extensions"], list)  # [] on a CPU that names none
    assert p["ram"]["total_mb"] > 0
    assert p["model"]["file"] == "m.gguf" and p["model"]["bytes"] == 64
    for disk in (p["model"]["disk"], p["outputs_disk"]):
        assert disk["fstype"] and disk["mountpoint"] and disk["total_gb"] > 0
    assert p["kernel"]["system"] and p["kernel"]["release"]


def test_dirty_ignores_generated_outputs_and_docs(tmp_path):
    import subprocess

    from sdq.lab.provenance import git_state

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    for rel in ("outputs/t.md", "docs/t.md", "sdq/code.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("a\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    (tmp_path / "outputs/t.md").write_text("b\n")
    (tmp_path / "docs/t.md").write_text("b\n")
    assert git_state(tmp_path)["dirty"] is False
    (tmp_path / "sdq/code.py").write_text("b\n")
    state = git_state(tmp_path)
    assert (state["dirty"], state["changed_files"]) == (True, 1)


def git(root, *args):
    return subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A git repository with sdq/, two notebooks and a docs template for 00_demo."""
    make_repo(tmp_path, {}, {"00_demo": ("",), "01_other": ("",)})
    for rel, text in {
        "sdq/code.py": "a\n",
        "docs/src/00_demo.md": "# Demo\n\n{{value:n}}\n",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "init")
    return tmp_path


def test_sha_is_head_and_trees_are_the_code_at_head():
    state = provenance.git_state(repo_root(), "00_model_anatomy")
    assert state["sha"] == git(repo_root(), "rev-parse", "HEAD")
    assert state["trees"] == {
        "sdq": git(repo_root(), "rev-parse", "HEAD:sdq"),
        "notebooks/00_model_anatomy.ipynb": git(
            repo_root(), "rev-parse", "HEAD:notebooks/00_model_anatomy.ipynb"
        ),
    }


def test_code_changed_since_names_what_differs_at_head(repo):
    record = {"notebook": "00_demo", "git": provenance.git_state(repo, "00_demo")}
    assert provenance.code_changed_since(record, repo) == []
    make_notebook(repo / "notebooks/01_other.ipynb", "x = 2\n")  # another notebook: not this one's
    git(repo, "commit", "-qam", "other")
    assert provenance.code_changed_since(record, repo) == []
    (repo / "sdq/code.py").write_text("b\n")
    git(repo, "commit", "-qam", "code")
    assert provenance.code_changed_since(record, repo) == ["sdq"]
    # a record from before trees were kept: looked up by its commit
    old = {"notebook": "00_demo", "git": {"sha": record["git"]["sha"]}}
    assert provenance.code_changed_since(old, repo) == ["sdq"]
    assert provenance.code_changed_since({"notebook": "00_demo", "git": {}}, repo) is None


def test_a_code_change_during_the_run_makes_the_record_dirty(repo):
    before = provenance.git_state(repo, "00_demo")
    (repo / "sdq/code.py").write_text("b\n")
    git(repo, "commit", "-qam", "code")
    rec = provenance.collect({}, "00_demo", repo, None, root=repo, git_before=before)
    assert rec["git"]["dirty"] and rec["git"]["changed_during_run"]
    assert rec["git"]["at_start"]["sha"] == before["sha"] != rec["git"]["sha"]
    same = provenance.collect({}, "00_demo", repo, None, root=repo, git_before=rec["git"])
    assert same["git"]["dirty"] is False and "changed_during_run" not in same["git"]


def _run(root, stem, n, date):
    """A finished run of `stem` in a staging folder, as the runner leaves it."""
    out = Outputs(stem, "default", root=root / "staging" / date)
    out.table("T1", pd.DataFrame({"n": [n]}), title="n")
    out.value("n", n)
    record = provenance.collect({}, stem, root, None, root=root)
    record["date_utc"] = date
    provenance.write(out.dir / "provenance.json", record)
    return out.dir


def test_every_run_is_kept_and_the_page_counts_them(repo):
    final = repo / "outputs" / "00_demo" / "default"
    # outputs from before runs/ existed: the top level alone
    first = _run(repo, "00_demo", 1, "2026-01-01T00:00:00Z")
    final.parent.mkdir(parents=True)
    first.rename(final)
    for n, date in ((2, "2026-01-02T00:00:00Z"), (3, "2026-01-02T00:00:00Z")):
        staged = _run(repo, "00_demo", n, date)
        provenance.archive_run(staged, final)
        shutil.rmtree(final)
        staged.rename(final)
    runs = provenance.list_runs(final)
    assert [r["run"] for r in runs] == [
        "20260101T000000Z",
        "20260102T000000Z",
        "20260102T000000Z-2",
    ]
    kept = [json.loads((final / "runs" / r["run"] / "values.json").read_text()) for r in runs]
    assert kept == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert (final / "runs" / runs[0]["run"] / "tables" / "T1.json").is_file()
    assert json.loads((final / "values.json").read_text()) == {"n": 3}  # the latest on top

    render("default", root=repo)
    page = (repo / "docs" / "00_demo.md").read_text()
    assert "3 runs of this notebook with `default` are kept in" in page
    assert "the figures above are from the latest, 2026-01-02T00:00:00Z" in page
    assert "Warning" not in page
    (repo / "sdq/code.py").write_text("b\n")
    git(repo, "commit", "-qam", "code")
    render("default", root=repo)
    page = (repo / "docs" / "00_demo.md").read_text()
    assert "**Warning: these outputs come from commit" in page and "`sdq` differ at HEAD" in page
