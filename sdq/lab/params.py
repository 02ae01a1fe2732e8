"""Parameter sets: params/<name>.yaml, loaded into typed settings and checked.

A set has a `model:` section (the synthetic model the runner builds once) and one section per
notebook stem, passed to that notebook's `parameters` cell by papermill:

    model: {preset: tiny, qtype: Q4_K_M, seed: 0}
    00_model_anatomy: {layer: 0, expert: 0}

Every mistake is a one-line ParamsError naming the file and the key: an unknown set, an unknown
top-level key, a section for a notebook that does not exist, a parameter the notebook does not
have, or a value whose type differs from the notebook's default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdq import files
from sdq.errors import ParamsError
from sdq.lab.notebooks import (
    RUNNER_PARAMETERS,
    STEM_PATTERN,
    NotebookInfo,
    notebook_paths,
    read_notebook,
)
from sdq.lab.paths import repo_root
from sdq.lab.paths import shown as show_path

MODEL_KEY = "model"


@dataclass(frozen=True)
class ModelParams:
    """The synthetic model of a run: `sdq.synth.build.build_model(preset, qtype=, seed=)`."""

    preset: str
    qtype: str
    seed: int


@dataclass(frozen=True)
class Params:
    name: str  # the set's name: outputs go to outputs/<notebook>/<name>/
    path: Path
    model: ModelParams
    notebooks: dict[str, dict[str, Any]] = field(default_factory=dict)  # stem -> parameters

    def section(self, stem: str) -> dict[str, Any]:
        """The notebook's parameters; a set without a section for it cannot run it."""
        if stem not in self.notebooks:
            raise ParamsError(
                f"params/{self.path.name}: no section for notebook {stem} "
                f"(add `{stem}: {{...}}`, even empty, to run it with this set)"
            )
        return dict(self.notebooks[stem])


def available(root: Path | None = None) -> list[str]:
    """Names of the parameter sets in params/."""
    params_dir = (root or repo_root()) / "params"
    return sorted(p.stem for p in params_dir.glob("*.yaml"))


def load_params(name: str | Path, root: Path | None = None) -> Params:
    """Load and check params/<name>.yaml (or a path to a .yaml file)."""

    root = root or repo_root()
    path = Path(name) if str(name).endswith((".yaml", ".yml")) else root / "params" / f"{name}.yaml"
    shown = show_path(path, root)
    if not path.is_file():
        known = ", ".join(available(root)) or "none"
        raise ParamsError(f"{shown}: no such parameter set (known: {known})")
    data = read_yaml(path, shown)
    if not isinstance(data, dict):
        raise ParamsError(f"{shown}: must be a mapping with a `model:` section")

    notebooks = {p.stem: p for p in notebook_paths(root / "notebooks")}
    if MODEL_KEY not in data:
        raise ParamsError(f"{shown}: missing the `model:` section (preset, qtype, seed)")
    model = _model(data[MODEL_KEY], shown)
    sections: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        if key == MODEL_KEY:
            continue
        key = str(key)
        if not STEM_PATTERN.match(key):
            raise ParamsError(
                f"{shown}: unknown top-level key '{key}' (expected `model` or a notebook stem "
                f"such as 00_model_anatomy)"
            )
        if key not in notebooks:
            known = ", ".join(notebooks) or "none"
            raise ParamsError(f"{shown}: unknown notebook stem '{key}' (notebooks/: {known})")
        sections[key] = _section(value, read_notebook(notebooks[key]), shown)
    return Params(name=path.stem, path=path, model=model, notebooks=sections)


MAX_YAML_BYTES = 2**20  # a parameter set is a few KB


def read_yaml(path: str | Path, shown: str | None = None) -> Any:
    """The document in the YAML file `path` (plain data: yaml.safe_load), or a one-line
    ParamsError naming the file (`shown`) and what is wrong: unreadable, too large, not UTF-8,
    not YAML (with the line), nested too deep."""
    import yaml

    shown = shown or str(path)
    raw = files.read_small(path, MAX_YAML_BYTES, shown)
    try:
        return yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ParamsError(f"{shown}: not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise ParamsError(f"{shown}: not valid YAML{line}") from None
    except RecursionError:
        raise ParamsError(f"{shown}: nested too deep") from None


def _model(value: Any, shown: str) -> ModelParams:
    expected = {"preset": str, "qtype": str, "seed": int}
    if not isinstance(value, dict):
        raise ParamsError(f"{shown}: model: must be a mapping with preset, qtype, seed")
    for key in value:
        if key not in expected:
            raise ParamsError(f"{shown}: model.{key}: unknown key (expected preset, qtype, seed)")
    for key, typ in expected.items():
        if key not in value:
            raise ParamsError(f"{shown}: model.{key}: missing")
        v = value[key]
        if not isinstance(v, typ) or isinstance(v, bool):
            raise ParamsError(
                f"{shown}: model.{key}: expected {typ.__name__}, got {type(v).__name__} {v!r}"
            )
    return ModelParams(preset=value["preset"], qtype=value["qtype"], seed=value["seed"])


def _section(value: Any, nb: NotebookInfo, shown: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ParamsError(f"{shown}: {nb.stem}: must be a mapping of parameter: value")
    for key, v in value.items():
        where = f"{shown}: {nb.stem}.{key}"
        if key in RUNNER_PARAMETERS:
            raise ParamsError(f"{where}: set by the runner, not by a parameter file")
        if key not in nb.defaults:
            names = ", ".join(k for k in nb.defaults if k not in RUNNER_PARAMETERS) or "none"
            raise ParamsError(f"{where}: not a parameter of {nb.path.name} (it has: {names})")
        problem = _type_problem(v, nb.defaults[key])
        if problem:
            raise ParamsError(f"{where}: {problem}")
    return dict(value)


def _type_problem(value: Any, default: Any) -> str:
    """Why `value` cannot replace `default` (the notebook's literal), or '' if it can."""
    if default is None:
        return ""
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif isinstance(default, list | tuple):
        if not isinstance(value, list):
            ok = False
        elif default:
            return next(
                (
                    f"item {i}: {p}"
                    for i, x in enumerate(value)
                    if (p := _type_problem(x, default[0]))
                ),
                "",
            )
        else:
            ok = True
    elif isinstance(default, dict):
        ok = isinstance(value, dict)
    else:
        ok = isinstance(value, type(default))
    if ok:
        return ""
    return (
        f"expected {_type_name(default)} like the notebook's default {default!r}, "
        f"got {type(value).__name__} {value!r}"
    )


def _type_name(default: Any) -> str:
    return "list" if isinstance(default, list | tuple) else type(default).__name__
