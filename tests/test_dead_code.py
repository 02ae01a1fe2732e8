"""No code in sdq/ that only tests reach.

A function, method or class of `sdq/` must be named somewhere in the product: the package
itself (other than its own definition), the notebooks' code cells, the Makefile or the docs
templates. One named only by tests is either dead code kept alive by its test, or a tool the
tests need that the package holds for a stated reason: `TEST_ONLY` lists those, each with its
reason, and an entry that the product now reaches, or that no longer exists, fails too, so the
list stays true.

The check works on names, as a reader searching the tree would: a definition whose name also
belongs to something the product uses passes (it may hide dead code, never raises a false
alarm). Decorated functions are reached through their decorator (the server's routes), and
dunder methods through Python itself.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# name: why the package keeps it although only tests call it
TEST_ONLY = {
    "Qwen35Reference": "the plain NumPy forward pass of qwen35moe the engine is tested against",
    "optimal_misses": "the exhaustive search that checks the offline optimum on small traces",
    "plan_for_slots": "a memory plan with a given slot count: the pager tests size arenas by it",
    "from_gguf": "a file's tokenizer without the engine: the tokenizer and parity tests",
    "qwen2_vocab_test_vectors": "llama.cpp's tokenizer test vectors, kept with the vocab cache",
    "read_test_vectors": "reads those vectors",
    "write_engine": "the route-log writer: the inverse the reader round-trip tests need",
    "write_granite": "granite trace writer: the inverse the reader round-trip tests need",
    "write_mixtral": "mixtral trace writer: the inverse the reader round-trip tests need",
    "write_deepseek": "deepseek trace writer: the inverse the reader round-trip tests need",
}
REFERENCE_SUFFIX = "_ref"  # the NumPy reference beside each Numba kernel: tests compare them


def _code(path: Path) -> str:
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return path.read_text()


def _product_sources() -> list[Path]:
    return [
        *sorted((ROOT / "sdq").rglob("*.py")),
        *sorted((ROOT / "notebooks").glob("*.ipynb")),
        *sorted((ROOT / "docs" / "src").glob("*.md")),
        ROOT / "Makefile",
        ROOT / "pyproject.toml",
    ]


def _definitions() -> dict[str, list[str]]:
    """Every undecorated function, method and class of sdq/: name -> ["path:line", ...]."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "sdq").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            if not isinstance(node, kinds) or node.decorator_list and not _is_plain(node):
                continue
            if node.name.startswith("__") and node.name.endswith("__"):
                continue
            found.setdefault(node.name, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def _is_plain(node) -> bool:
    """Decorators that do not register the function anywhere: it still needs a caller."""
    plain = {
        "property", "staticmethod", "classmethod", "dataclass", "cached_property", "njit", "jit",
        "lru_cache", "cache", "contextmanager",
    }  # fmt: skip
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name not in plain:
            return False
    return True


def _unreached() -> dict[str, list[str]]:
    """Definitions no product source names beyond the definitions themselves."""
    mentions: Counter[str] = Counter()
    for path in _product_sources():
        mentions.update(IDENTIFIER.findall(_code(path)))
    return {name: where for name, where in _definitions().items() if mentions[name] <= len(where)}


def test_no_sdq_code_is_reached_only_by_tests():
    unreached = _unreached()
    dead = {
        name: where
        for name, where in unreached.items()
        if name not in TEST_ONLY and not name.endswith(REFERENCE_SUFFIX)
    }
    assert not dead, "named by nothing but tests (remove, or list in TEST_ONLY with why): " + (
        "; ".join(f"{name} at {', '.join(where)}" for name, where in sorted(dead.items()))
    )


def test_the_test_only_list_is_true():
    unreached = _unreached()
    defined = _definitions()
    stale = [name for name in TEST_ONLY if name not in defined or name not in unreached]
    assert not stale, f"TEST_ONLY entries the product reaches or that no longer exist: {stale}"
    assert all(reason.strip() for reason in TEST_ONLY.values())


def test_the_check_finds_a_planted_orphan(tmp_path, monkeypatch):
    """A function nothing names is found; once a notebook names it, it is not."""
    pkg = tmp_path / "sdq"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "def used():\n    return orphan_helper\n\n\ndef orphan():\n    return 1\n\n\n"
        "@app.get('/x')\ndef route():\n    return 2\n\n\n"
        "class Thing:\n    @property\n    def lonely(self):\n        return 3\n"
    )
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "Makefile").write_text("test:\n\tpython -m sdq.m used\n")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'  # Thing\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert sorted(_unreached()) == ["lonely", "orphan"]
    notebook = {"cells": [{"cell_type": "code", "source": ["orphan()\n"]}]}
    (tmp_path / "notebooks" / "n.ipynb").write_text(json.dumps(notebook))
    assert sorted(_unreached()) == ["lonely"]
