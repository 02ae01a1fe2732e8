"""The lab's notebooks as files: which exist, their `parameters` cell, their title.

A notebook's stem (`00_model_anatomy`) names it everywhere: its section in params/*.yaml, its
folder in outputs/, its template in docs/src/. Only the standard library and nbformat's JSON
layout are used here, so that loading parameters stays cheap.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdq.errors import ParamsError

STEM_PATTERN = re.compile(r"^\d\d_[a-z0-9_]+$")
PARAMETERS_TAG = "parameters"
# Every notebook's parameters cell defines these; the runner fills them in.
RUNNER_PARAMETERS = ("params_name", "model_path")


@dataclass(frozen=True)
class NotebookInfo:
    stem: str
    path: Path
    title: str  # first markdown heading, without the leading #'s
    defaults: dict[str, Any]  # parameter name -> default value from the parameters cell


def notebook_paths(notebooks_dir: Path) -> list[Path]:
    """The lab notebooks, sorted by stem (their number orders them)."""
    if not notebooks_dir.is_dir():
        return []
    return sorted(p for p in notebooks_dir.glob("*.ipynb") if STEM_PATTERN.match(p.stem))


def read_notebook(path: Path) -> NotebookInfo:
    """Read a notebook's title and the defaults of its single `parameters` cell."""
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ParamsError(f"{path}: not a readable notebook ({exc})") from None
    cells = nb.get("cells", [])
    tagged = [c for c in cells if PARAMETERS_TAG in c.get("metadata", {}).get("tags", [])]
    if len(tagged) != 1:
        raise ParamsError(
            f"{path}: needs exactly one cell tagged '{PARAMETERS_TAG}', found {len(tagged)}"
        )
    return NotebookInfo(
        stem=path.stem,
        path=path,
        title=_title(cells) or path.stem,
        defaults=parse_parameters(_source(tagged[0]), path),
    )


def parse_parameters(source: str, path: Path | str = "<cell>") -> dict[str, Any]:
    """`name = literal` assignments of a parameters cell -> {name: value}.

    A default that is not a Python literal is recorded as None (its type is then not checked).
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ParamsError(f"{path}: parameters cell does not parse: {exc.msg}") from None
    defaults: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name):
            try:
                defaults[target.id] = ast.literal_eval(value)
            except ValueError:
                defaults[target.id] = None
    return defaults


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _title(cells: list[dict]) -> str:
    for cell in cells:
        if cell.get("cell_type") == "markdown":
            for line in _source(cell).splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return ""
