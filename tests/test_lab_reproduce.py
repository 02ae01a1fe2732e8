"""The reproduce runner: papermill into a staging folder, renamed only when a notebook succeeds."""

from __future__ import annotations

import json

import pytest
from lab_support import make_notebook, make_repo

from sdq.errors import LabError
from sdq.lab import reproduce
from sdq.lab.params import load_params

OK_CELL = """import pandas as pd
from sdq.lab import Outputs
out = Outputs("00_ok", params_name)
out.table("T1", pd.DataFrame({"n": [n]}), title="n")
out.value("model", model_path)"""
FAILING = ("boom = 1\n", "x = 1", "if boom:\n    raise ValueError(f'boom {boom}')")
PARAMS = "model: {preset: tiny, qtype: Q4_K_M, seed: 0}\n00_ok: {n: 7}\n01_fails: {boom: 2}\n"


@pytest.fixture
def repo(tmp_path):
    root = make_repo(
        tmp_path, {"smoke": PARAMS}, {"00_ok": ("n = 1\n", OK_CELL), "01_fails": FAILING}
    )
    (root / "model.gguf").write_bytes(b"GGUF")
    return root


@pytest.mark.slow
def test_runs_every_notebook_and_reports_the_failing_cell(repo):
    params = load_params("smoke", root=repo)
    lines: list[str] = []
    results = reproduce.run(params, root=repo, model_path=repo / "model.gguf", log=lines.append)
    ok, failed = results
    outputs = repo / "outputs"

    assert ok.ok and ok.output_dir == outputs / "00_ok" / "smoke"
    table = json.loads((ok.output_dir / "tables" / "T1.json").read_text())
    assert table["records"] == [{"n": 7}]  # the section's value reached the notebook
    values = json.loads((ok.output_dir / "values.json").read_text())
    assert values["model"] == str(repo / "model.gguf")
    prov = json.loads((ok.output_dir / "provenance.json").read_text())
    assert prov["params"]["00_ok"] == {"n": 7} and prov["executed_notebook"]["kept"]
    executed = json.loads((ok.output_dir / "00_ok.ipynb").read_text())
    assert all(c["execution_count"] for c in executed["cells"] if c["cell_type"] == "code")

    # the failure names the cell as numbered in the source notebook, in one line
    assert not failed.ok
    assert failed.error == "01_fails.ipynb: cell 4 (`if boom:`) raised ValueError: boom 2"
    assert not (outputs / "01_fails" / "smoke").exists()  # never looks finished
    assert (outputs / "01_fails" / "smoke.failed" / "01_fails.ipynb").exists()
    assert (outputs / "01_fails" / "smoke.failed" / "error.txt").read_text() == failed.error + "\n"
    assert [p.name for p in outputs.iterdir() if p.name.startswith(".")] == []  # staging gone
    assert any("01_fails: FAILED" in line for line in lines)


@pytest.mark.slow
def test_a_failed_rerun_keeps_the_previous_outputs(repo):
    params = load_params("smoke", root=repo)
    (result,) = reproduce.run(
        params, only=["00_ok"], root=repo, model_path=repo / "model.gguf", log=lambda s: None
    )
    assert result.ok
    before = (result.output_dir / "tables" / "T1.json").read_bytes()
    make_notebook(repo / "notebooks" / "00_ok.ipynb", "n = 1\n", OK_CELL + "\n1 / 0")
    (again,) = reproduce.run(
        params, only=["00_ok"], root=repo, model_path=repo / "model.gguf", log=lambda s: None
    )
    assert not again.ok and "ZeroDivisionError" in again.error
    assert (result.output_dir / "tables" / "T1.json").read_bytes() == before


def test_unknown_notebook_and_missing_section_fail_before_running(repo):
    params = load_params("smoke", root=repo)
    with pytest.raises(
        LabError, match=r"--only 07_x: no such notebook \(notebooks/: 00_ok, 01_fails\)"
    ):
        reproduce.run(params, only=["07_x"], root=repo, model_path=repo / "model.gguf")
    (repo / "params" / "bare.yaml").write_text("model: {preset: tiny, qtype: Q4_K_M, seed: 0}\n")
    bare = load_params("bare", root=repo)
    with pytest.raises(Exception, match="no section for notebook 00_ok"):
        reproduce.run(bare, root=repo, model_path=repo / "model.gguf")
    with pytest.raises(Exception, match="no section for notebook 01_fails"):
        reproduce.run(bare, only=["01_fails"], root=repo, model_path=repo / "model.gguf")


@pytest.mark.slow
def test_a_set_runs_the_notebooks_it_has_sections_for(repo):
    (repo / "params" / "one.yaml").write_text(
        "model: {preset: tiny, qtype: Q4_K_M, seed: 0}\n00_ok: {}\n"
    )
    lines = []
    results = reproduce.run(
        load_params("one", root=repo), root=repo, model_path=repo / "model.gguf", log=lines.append
    )
    assert [r.stem for r in results] == ["00_ok"]
    assert any("not run (no section in params/one.yaml): 01_fails" in ln for ln in lines)


def test_cli_unknown_params_is_exit_2(capsys):
    assert reproduce.main(["--params", "no-such-set"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("reproduce: error: params/no-such-set.yaml: no such parameter set")


@pytest.mark.slow
def test_outputs_under_another_name_are_refused(repo):
    params = load_params("smoke", root=repo)
    make_notebook(
        repo / "notebooks" / "00_ok.ipynb",
        "n = 1\n",
        OK_CELL.replace('"00_ok", params_name', '"00_ok", "default"'),
    )
    (result,) = reproduce.run(
        params, only=["00_ok"], root=repo, model_path=repo / "model.gguf", log=lambda s: None
    )
    assert not result.ok
    assert result.error == (
        "00_ok.ipynb: wrote outputs to 00_ok/default/ instead of 00_ok/<params_name>/ "
        "(use Outputs('00_ok', params_name))"
    )
    assert not (repo / "outputs" / "00_ok" / "default").exists()


@pytest.mark.slow
def test_a_rerun_adds_a_run_and_keeps_the_earlier_ones(repo):
    for n in (7, 8):
        (repo / "params" / "smoke.yaml").write_text(PARAMS.replace("{n: 7}", f"{{n: {n}}}"))
        params = load_params("smoke", root=repo)
        (result,) = reproduce.run(
            params, only=["00_ok"], root=repo, model_path=repo / "model.gguf", log=lambda s: None
        )
        assert result.ok
    runs = sorted((result.output_dir / "runs").iterdir())
    assert len(runs) == 2
    kept = [json.loads((r / "tables" / "T1.json").read_text())["records"] for r in runs]
    assert kept == [[{"n": 7}], [{"n": 8}]]
    for r in runs:
        assert {p.name for p in r.iterdir()} == {"tables", "values.json", "provenance.json"}
    latest = json.loads((result.output_dir / "provenance.json").read_text())
    assert latest == json.loads((runs[-1] / "provenance.json").read_text())
