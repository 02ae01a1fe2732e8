"""Builders for the lab tests: a throw-away repository with notebooks and parameter sets."""

from __future__ import annotations

from pathlib import Path

import nbformat

PARAMETERS = 'params_name = "scratch"\nmodel_path = ""\n'


def make_notebook(path: Path, parameters: str, *cells: str, title: str = "Demo") -> Path:
    """A notebook: a markdown title, the `parameters` cell, then one code cell per source."""
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell(f"# {title}\n\nWhat this measures."))
    p = nbformat.v4.new_code_cell(PARAMETERS + parameters)
    p.metadata["tags"] = ["parameters"]
    nb.cells.append(p)
    nb.cells.extend(nbformat.v4.new_code_cell(src) for src in cells)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def make_repo(root: Path, params: dict[str, str], notebooks: dict[str, tuple]) -> Path:
    """root/params/<name>.yaml from text, root/notebooks/<stem>.ipynb from (parameters, *cells)."""
    (root / "params").mkdir(parents=True, exist_ok=True)
    for name, text in params.items():
        (root / "params" / f"{name}.yaml").write_text(text)
    for stem, (parameters, *cells) in notebooks.items():
        make_notebook(root / "notebooks" / f"{stem}.ipynb", parameters, *cells)
    return root
