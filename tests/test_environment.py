"""The conda spec and pyproject.toml pin the same packages at the same versions."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        specs.extend(extra)
    return dict(_split(spec) for spec in specs)


def _environment_pins() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_block = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    return dict(_split(spec) for spec in pip_block if not spec.startswith("-e"))


def _split(spec: str) -> tuple[str, str]:
    match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", spec.strip())
    assert match, f"not pinned with ==: {spec!r}"
    return match.group(1).lower(), match.group(2)


def test_every_dependency_is_pinned_identically():
    assert _pyproject_pins() == _environment_pins()


def test_required_packages_are_pinned():
    required = {
        "jupyterlab", "papermill", "numpy", "numba", "gguf", "altair", "vl-convert-python",
        "psutil", "tqdm", "tokenizers", "pytest", "ruff", "llama-cpp-python",
    }  # fmt: skip
    assert required <= set(_pyproject_pins())
