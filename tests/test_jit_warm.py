"""The kernel warm-up before a paged run: a stamp per (machine, sources, model kind), a child
process that compiles and caches the kernels when the stamp is missing, a note when it fails."""

import subprocess

import pytest

from sdq.format.model import open_model
from sdq.run import jit_warm


@pytest.fixture
def stamp_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(jit_warm, "kernel_cache_dir", lambda: tmp_path)
    monkeypatch.delenv(jit_warm.CHILD_ENV, raising=False)
    return tmp_path


def test_the_key_names_what_decides_the_compiled_kernels(tiny_model):
    model = open_model(tiny_model)
    key = jit_warm.warm_key(model, 2, 128)
    assert key == jit_warm.warm_key(model, 4, 128)  # several threads: one prefill path
    assert key != jit_warm.warm_key(model, 1, 128)  # one thread: no worker pool
    assert key != jit_warm.warm_key(model, 2, 64)


def test_a_child_compiles_once_then_the_stamp_says_so(tiny_model, stamp_dir):
    model = open_model(tiny_model)
    notes = []
    assert jit_warm.ensure_warm(model, 2, 8, notes.append) is True
    assert len(list(stamp_dir.glob("sdq-warm-*.ok"))) == 1
    assert len(notes) == 1 and "helper process" in notes[0]
    assert jit_warm.ensure_warm(model, 2, 8, notes.append) is False  # stamped: no child
    assert len(notes) == 1


def test_a_failed_child_leaves_no_stamp_and_says_why(tiny_model, stamp_dir, monkeypatch):
    model = open_model(tiny_model)

    def fail(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "Traceback...\nMemoryError: out\n")

    monkeypatch.setattr(jit_warm.subprocess, "run", fail)
    notes = []
    assert jit_warm.ensure_warm(model, 2, 8, notes.append) is False
    assert not list(stamp_dir.glob("sdq-warm-*"))
    assert "failed (MemoryError: out); compiling here" in notes[-1]


def test_the_child_starts_no_child_of_its_own(tiny_model, stamp_dir, monkeypatch):
    monkeypatch.setenv(jit_warm.CHILD_ENV, "1")
    monkeypatch.setattr(jit_warm.subprocess, "run", lambda *a, **k: pytest.fail("a child ran"))
    assert jit_warm.ensure_warm(open_model(tiny_model), 2, 8, print) is False
