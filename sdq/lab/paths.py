"""Where the lab's files live: the repository root and its fixed top-level folders."""

from __future__ import annotations

import os
from pathlib import Path

# Set by the runner for the notebook's kernel: the folder that replaces `outputs/` while a
# notebook runs (a staging folder, renamed into place only when the whole notebook succeeded).
OUTPUTS_ROOT_ENV = "SDQ_OUTPUTS_ROOT"


def repo_root() -> Path:
    """The repository holding this package (editable install), else the current directory."""
    here = Path(__file__).resolve().parent.parent.parent
    if (here / "pyproject.toml").is_file() and (here / "notebooks").is_dir():
        return here
    return Path.cwd()


def default_outputs_root() -> Path:
    """`outputs/` of the repository, or the runner's staging folder while a notebook runs."""
    staged = os.environ.get(OUTPUTS_ROOT_ENV)
    return Path(staged) if staged else repo_root() / "outputs"


def shown(path: Path, root: Path) -> str:
    """`path` relative to `root` when it lies inside it (for messages), else as given."""
    try:
        return Path(path).resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return str(path)


# Notebooks that only their own parameter set runs (too long for the default run): the default
# docs and site show them from that set's outputs.
OWN_PARAMS = {"06_seed_scenario": "seed-scale"}


def shown_params(stem: str, params: str) -> str:
    """The parameter set whose outputs a page of `params` shows for notebook `stem`."""
    return OWN_PARAMS.get(stem, params) if params == "default" else params
