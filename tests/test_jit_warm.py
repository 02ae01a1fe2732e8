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
    key = jit_warm.warm_key(model, 2)
    assert key == jit_warm.warm_key(model, 4)  # several threads: one prefill path
    assert key != jit_warm.warm_key(model, 1)  # one thread: no worker pool


def test_a_child_compiles_once_then_the_stamp_says_so(tiny_model, stamp_dir):
    model = open_model(tiny_model)
    notes = []
    assert jit_warm.ensure_warm(model, 2, notes.append) is True
    assert len(list(stamp_dir.glob("sdq-warm-*.ok"))) == 1
    assert jit_warm.ensure_warm(model, 2, notes.append) is False  # stamped: no child
    assert notes == []


def test_a_failed_child_leaves_no_stamp_and_says_why(tiny_model, stamp_dir, monkeypatch):
    model = open_model(tiny_model)

    def fail(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "Traceback...\nMemoryError: out\n")

    monkeypatch.setattr(jit_warm.subprocess, "run", fail)
    notes = []
    assert jit_warm.ensure_warm(model, 2, notes.append) is False
    assert not list(stamp_dir.glob("sdq-warm-*"))
    assert notes == ["compiling the kernels in a helper process failed (MemoryError: out); "
                     "compiling here"]  # fmt: skip


def test_a_refused_model_is_left_to_the_caller_to_refuse(tmp_path, stamp_dir):
    """The child of a model sdq refuses exits with REFUSED and the caller notes nothing: the
    run itself then refuses the model in one line."""
    from engine_support import Dims, write_model

    path = write_model(tmp_path / "m.gguf", Dims())
    model = open_model(path)
    model.path = tmp_path / "missing.gguf"  # the child cannot open it: an SdqError there
    notes = []
    assert jit_warm.ensure_warm(model, 2, notes.append) is False
    assert notes == [] and not list(stamp_dir.glob("sdq-warm-*"))


def test_a_finished_paged_run_writes_the_stamp(tiny_model, stamp_dir, monkeypatch):
    from sdq.run.session import RunSettings, Session

    model = open_model(tiny_model)
    monkeypatch.setenv(jit_warm.CHILD_ENV, "1")  # no child: the run's own compilation
    session = Session(RunSettings(model=str(tiny_model), n_ctx=64, n_ubatch=8, n_predict=3))
    session.generate([1, 2, 3, 4])
    monkeypatch.delenv(jit_warm.CHILD_ENV)
    session.close()
    assert (stamp_dir / f"sdq-warm-{jit_warm.warm_key(model, 2)}.ok").exists()


def test_the_child_starts_no_child_of_its_own(tiny_model, stamp_dir, monkeypatch):
    monkeypatch.setenv(jit_warm.CHILD_ENV, "1")
    monkeypatch.setattr(jit_warm.subprocess, "run", lambda *a, **k: pytest.fail("a child ran"))
    assert jit_warm.ensure_warm(open_model(tiny_model), 2, print) is False
