"""Every notebook in notebooks/: committed clean, and runs end to end at smoke size.

The run uses the reproduce runner itself (papermill, staging folder, provenance) with
params/smoke.yaml, into a temporary outputs folder.
"""

from __future__ import annotations

import json

import pytest

from sdq.lab import reproduce
from sdq.lab.notebooks import PARAMETERS_TAG, RUNNER_PARAMETERS, notebook_paths, read_notebook
from sdq.lab.params import load_params
from sdq.lab.paths import repo_root

NOTEBOOKS = notebook_paths(repo_root() / "notebooks")


def stems(paths):
    return [p.stem for p in paths]


def test_there_are_notebooks():
    assert "00_model_anatomy" in stems(NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=stems(NOTEBOOKS))
def test_committed_without_outputs_and_with_one_parameters_cell(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    dirty = [
        i
        for i, c in enumerate(nb["cells"])
        if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count") is not None)
    ]
    assert not dirty, f"{path.name}: cells {dirty} have outputs or execution counts; clear them"
    tagged = [c for c in nb["cells"] if PARAMETERS_TAG in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: {len(tagged)} cells tagged '{PARAMETERS_TAG}'"
    assert code and code[0] is tagged[0], (
        f"{path.name}: the parameters cell is not the first code cell"
    )
    defaults = read_notebook(path).defaults
    for name in RUNNER_PARAMETERS:
        assert name in defaults, f"{path.name}: parameters cell does not define {name}"
    assert defaults["params_name"] == "scratch" and defaults["model_path"] == ""
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3"


@pytest.fixture(scope="module")
def smoke():
    return load_params("smoke")


@pytest.fixture(scope="module")
def smoke_model(smoke):
    return reproduce.build_model(smoke.model)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=stems(NOTEBOOKS))
def test_runs_at_smoke_size(path, smoke, smoke_model, tmp_path):
    if path.stem not in smoke.notebooks:
        pytest.fail(f"params/smoke.yaml has no section for {path.stem}: add one")
    (result,) = reproduce.run(
        smoke,
        only=[path.stem],
        outputs_root=tmp_path,
        model_path=smoke_model,
        log=lambda line: None,
        max_executed_bytes=None,  # keep the executed notebook to inspect it
    )
    assert result.ok, result.error
    executed = json.loads((result.output_dir / path.name).read_text(encoding="utf-8"))
    code = [c for c in executed["cells"] if c["cell_type"] == "code"]
    not_run = [i for i, c in enumerate(code) if not c.get("execution_count")]
    assert not not_run, f"code cells {not_run} did not run"
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors[0].get("ename")
    assert (result.output_dir / "provenance.json").is_file()
