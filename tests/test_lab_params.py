"""Parameter sets: typed loading and one-line errors for every kind of mistake."""

from __future__ import annotations

import pytest
from lab_support import make_repo

from sdq.errors import ParamsError
from sdq.lab.params import ModelParams, available, load_params
from sdq.lab.paths import repo_root

MODEL = "model: {preset: tiny, qtype: Q4_K_M, seed: 0}\n"
NOTEBOOK = ("layer = 0\nthreads = [1, 2]\nscale = 1.5\nlabel = 'x'\nfast = False\n",)


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path, {}, {"00_demo": NOTEBOOK})


def write(repo, text, name="p"):
    (repo / "params" / f"{name}.yaml").write_text(text)
    return name


def test_loads_typed_sections(repo):
    name = write(repo, MODEL + "00_demo: {layer: 3, threads: [4, 8], scale: 2}\n")
    p = load_params(name, root=repo)
    assert p.name == "p"
    assert p.model == ModelParams(preset="tiny", qtype="Q4_K_M", seed=0)
    assert p.section("00_demo") == {"layer": 3, "threads": [4, 8], "scale": 2}
    assert available(repo) == ["p"]


def test_empty_section_means_notebook_defaults(repo):
    p = load_params(write(repo, MODEL + "00_demo:\n"), root=repo)
    assert p.section("00_demo") == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (MODEL + "colour: red\n", "p.yaml: unknown top-level key 'colour'"),
        (MODEL + "07_nothing: {}\n", "p.yaml: unknown notebook stem '07_nothing'"),
        (MODEL + "00_demo: {layr: 1}\n", "00_demo.layr: not a parameter of 00_demo.ipynb"),
        (MODEL + "00_demo: {layer: one}\n", "00_demo.layer: expected int"),
        (MODEL + "00_demo: {layer: true}\n", "00_demo.layer: expected int"),
        (MODEL + "00_demo: {threads: 4}\n", "00_demo.threads: expected list"),
        (MODEL + "00_demo: {threads: [1, x]}\n", "00_demo.threads: item 1: expected int"),
        (MODEL + "00_demo: {fast: 1}\n", "00_demo.fast: expected bool"),
        (MODEL + "00_demo: {label: 3}\n", "00_demo.label: expected str"),
        (MODEL + "00_demo: {model_path: /x}\n", "00_demo.model_path: set by the runner"),
        (MODEL + "00_demo: [1]\n", "00_demo: must be a mapping"),
        ("00_demo: {}\n", "missing the `model:` section"),
        ("model: {preset: tiny, qtype: Q4_K_M}\n", "model.seed: missing"),
        ("model: {preset: tiny, qtype: Q4_K_M, seed: '0'}\n", "model.seed: expected int"),
        ("model: {preset: 1, qtype: Q4_K_M, seed: 0}\n", "model.preset: expected str"),
        ("model: {preset: a, qtype: b, seed: 0, size: 2}\n", "model.size: unknown key"),
        ("- just\n- a list\n", "must be a mapping"),
        ("model: {preset: [\n", "not valid YAML at line"),
    ],
)
def test_errors_are_one_line_and_name_the_key(repo, text, message):
    with pytest.raises(ParamsError) as err:
        load_params(write(repo, text), root=repo)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_set_lists_known_ones(repo):
    write(repo, MODEL, name="smoke")
    with pytest.raises(
        ParamsError, match=r"params/nope.yaml: no such parameter set \(known: smoke\)"
    ):
        load_params("nope", root=repo)


def test_missing_section_is_an_error_only_when_running_that_notebook(repo):
    p = load_params(write(repo, MODEL), root=repo)
    with pytest.raises(ParamsError, match="no section for notebook 00_demo"):
        p.section("00_demo")


def test_notebook_needs_exactly_one_parameters_cell(tmp_path):
    import nbformat

    repo = make_repo(tmp_path, {}, {"00_demo": NOTEBOOK})
    path = repo / "notebooks" / "00_demo.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].metadata["tags"] = []
    nbformat.write(nb, path)
    with pytest.raises(ParamsError, match="exactly one cell tagged 'parameters', found 0"):
        load_params(write(repo, MODEL + "00_demo: {}\n"), root=repo)


@pytest.mark.parametrize("name", ["default", "smoke", "mini", "seed-scale"])
def test_committed_sets_load_and_run_what_they_should(name):
    from sdq.lab.paths import OWN_PARAMS

    p = load_params(name)
    assert p.model.preset in {"tiny35", "seed", "mini", "seed-full"}
    notebooks = sorted(q.stem for q in (repo_root() / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    own = {stem for stem, owner in OWN_PARAMS.items() if owner == name}
    if own:  # a notebook's own set runs that notebook only
        assert set(p.notebooks) == own
        return
    want = set(notebooks) if name == "smoke" else set(notebooks) - set(OWN_PARAMS)
    assert set(p.notebooks) == want  # smoke runs everything, small (tests/test_notebooks.py)


def test_the_lab_runs_the_seed_family_and_keeps_mini():
    # the default lab model is shaped like the seed's (qwen35moe, 256 experts); smoke runs the
    # same family small; qwen3moe's mini stays a parameter set of its own
    assert load_params("smoke").model.preset == "tiny35"
    assert load_params("default").model.preset == "seed"
    assert load_params("mini").model.preset == "mini"
    assert load_params("seed-scale").model.preset == "seed-full"
    default, mini = load_params("default"), load_params("mini")
    assert default.notebooks == mini.notebooks  # the same notebook settings, another model
