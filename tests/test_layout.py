"""The package's folders follow a token's path, and imports only go down that path.

Each folder (and each top-level module) has a rank; a module may import modules of its own
folder and of folders with a lower rank, never a higher one, and no chain of imports (also
those inside functions) comes back to where it started. The ranks are the ones the folders'
`__init__.py` docstrings state.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "sdq"

# folder (or top-level module) -> rank; lower ranks never import higher ones.
RANKS = {
    "errors": 0,
    "units": 0,
    "files": 0.5,  # sdq.files raises sdq.errors
    "dirs": 0,
    "proc": 1,
    "_io": 0,
    "format": 2,
    "kernels": 3,
    "paging": 3,
    "analysis": 4,
    "synth": 4,
    "run": 5,
    "measure": 6,
    "lab": 7,
    "commands": 8,
    "api": 8.25,  # sdq.api: the Python API, re-exported by the package
    "cli": 9,
    "__main__": 10,
}
ROOT_RANK = 8.5


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every sdq module `name` imports, at module level or inside a function."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            # `from pkg import mod` imports pkg.mod when that is a module
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t.startswith("sdq") and t != name:
                found.add(t)
    return found


def rank_of(module: str) -> tuple[str, int]:
    parts = module.split(".")
    if len(parts) == 1:  # sdq itself: the package's front door, above everything but the CLI
        return "sdq", ROOT_RANK
    folder = parts[1]
    if folder not in RANKS:
        pytest.fail(f"{module}: folder or module {folder!r} has no rank in tests/test_layout.py")
    return folder, RANKS[folder]


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods) | {"sdq._io"}
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def test_no_upward_imports():
    bad = []
    for name, targets in graph().items():
        folder, rank = rank_of(name)
        for t in sorted(targets):
            t_folder, t_rank = rank_of(t)
            if t_folder != folder and t_rank >= rank:
                bad.append(
                    f"{name} ({folder}, rank {rank}) imports {t} ({t_folder}, rank {t_rank})"
                )
    assert not bad, "upward or sideways imports:\n" + "\n".join(bad)


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `g` as a list of modules, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    for root in sorted(g):
        if state.get(root):
            continue
        path, stack = [root], [iter(sorted(g[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(g.get(nxt, ()))))
    return None


def test_no_import_cycles():
    g = graph()
    # a package's __init__ re-exporting its own modules is not a cycle of behaviour
    for name in g:
        g[name] = {t for t in g[name] if not name.startswith(t + ".")}
    cycle = find_cycle(g)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_cycle_finder_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_every_folder_says_what_it_is_for():
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc.split()) >= 15, f"{init}: the docstring should say what the folder is for"
        assert "import" in doc, f"{init}: the docstring should say what the folder may import"
