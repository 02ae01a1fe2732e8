"""The model file changed underfoot during a paged `sdq chat`: truncated, rewritten in place or
replaced by another file. Generation stops with one line and exit code 2, and the text printed
before it is a prefix of what the unchanged file generates: no token is computed from bytes of
the changed file.

The change is made from inside the run, at a chosen expert acquire (ExpertCache.acquire wrapped),
so it lands in decode deterministically; the detection under test is the pager's own check of
the file's identity (sdq.paging.reads.FileIdentity).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil

import pytest

from sdq.cli import main
from sdq.paging.cache import ExpertCache

PROMPT = "Tell me about disks."


def chat_args(model) -> list[str]:
    args = ["chat", "-m", str(model), "-p", PROMPT, "-n", "10", "--ignore-eos", "--temp", "0"]
    return args + ["-c", "128", "-b", "16", "--ram-budget-mb", "4000", "--max-slots", "12"]


def chat(model, capsys) -> tuple[int, str, str]:
    rc = main(chat_args(model))
    out = capsys.readouterr()
    return rc, out.out, out.err


def truncate(path):
    os.truncate(path, os.path.getsize(path) - 4096)


def rewrite(path):
    with open(path, "r+b") as f:  # the same bytes written back: only the mtime says so
        head = f.read(4096)
        f.seek(0)
        f.write(head)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # coarse clocks


def replace(path):
    other = f"{path}.new"
    shutil.copyfile(path, other)
    os.replace(other, path)


@pytest.fixture(scope="module")
def unchanged(tiny_model):
    """The unchanged file's output, and how many acquires it makes (run once)."""
    calls = [0]
    original = ExpertCache.acquire

    def counting(self, layer, ids):
        calls[0] += 1
        return original(self, layer, ids)

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setattr(ExpertCache, "acquire", counting)
        assert main(chat_args(tiny_model)) == 0
    return out.getvalue(), calls[0]


@pytest.mark.parametrize("change", [truncate, rewrite, replace], ids=lambda f: f.__name__)
def test_changed_file_stops_generation(
    tiny_model, unchanged, tmp_path, capsys, monkeypatch, change
):
    full, total = unchanged
    model = tmp_path / "model.gguf"
    shutil.copyfile(tiny_model, model)
    original = ExpertCache.acquire
    at = total * 2 // 3  # in decode: prefill is one ubatch per layer
    calls = [0]

    def changing(self, layer, ids):
        calls[0] += 1
        if calls[0] == at:
            change(model)
        return original(self, layer, ids)

    monkeypatch.setattr(ExpertCache, "acquire", changing)
    rc, out, err = chat(model, capsys)
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("sdq chat: error: "), err
    assert f"{model}: the model file changed while in use" in err
    assert full.startswith(out) and len(out) < len(full)
    # stopped at the change: the next acquire (a replaced path: the next token's first one)
    assert calls[0] == at if change is not replace else at <= calls[0] < total
