"""The Qwen2 vocabulary: fetched from llama-cpp-python's sdist, verified, usable by llama.cpp."""

import hashlib
import io
import tarfile
import tomllib
from pathlib import Path

import pytest

from sdq.errors import SdqError
from sdq.synth import vocab

ROOT = Path(__file__).resolve().parents[1]


def test_version_matches_the_pinned_llama_cpp_python():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = project["optional-dependencies"]["reference"]  # llama.cpp is an extra
    assert f"llama-cpp-python=={vocab.LLAMA_CPP_PYTHON_VERSION}" in deps


def test_cached_files_match_their_hashes(qwen2_vocab):
    inp, out = vocab.qwen2_vocab_test_vectors()
    for path in (qwen2_vocab, inp, out):
        assert hashlib.sha256(path.read_bytes()).hexdigest() == vocab.QWEN2_FILES[path.name]


def test_loaded_vocabulary_is_qwen2(qwen2_vocab):
    v = vocab.load_qwen2_vocab()
    assert (v.model, v.pre) == ("gpt2", "qwen2")
    assert v.n_vocab == len(v.token_types) == 151_936
    assert len(v.merges) == 151_387
    assert v.tokens[v.eos_id] == "<|endoftext|>"
    assert v.tokens[151644] == "<|im_start|>"
    assert sum(1 for t in v.token_types if t != 1) == 293  # control + padding entries


def test_test_vectors_parse(qwen2_test_vectors):
    assert len(qwen2_test_vectors) == 46
    assert qwen2_test_vectors[0] == ("ied 4 ½ months", [1122, 220, 19, 220, 26062, 3951])
    assert ("", []) in qwen2_test_vectors
    assert ("Hello world", [9707, 1879]) in qwen2_test_vectors


def test_llama_cpp_tokenizes_the_vectors_as_expected(llama_cpp, qwen2_vocab, qwen2_test_vectors):
    from sdq.measure.llama_ref import open_llama

    llm = open_llama(qwen2_vocab, n_ctx=64, n_ubatch=64, threads=1, vocab_only=True)
    for text, ids in qwen2_test_vectors:
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == ids, text


def _fake_sdist(tmp_path: Path, files: dict[str, bytes]) -> Path:
    path = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"llama_cpp_python-0.3.36/vendor/llama.cpp/models/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_extracts_from_a_local_sdist(tmp_path, monkeypatch, qwen2_vocab):
    inp, out = vocab.qwen2_vocab_test_vectors()
    files = {p.name: p.read_bytes() for p in (qwen2_vocab, inp, out)}
    files["ggml-vocab-gpt-2.gguf"] = b"not wanted"
    monkeypatch.setenv("SDQ_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(vocab.SDIST_ENV, str(_fake_sdist(tmp_path, files)))
    got = vocab.qwen2_vocab_path()
    assert got.parent == tmp_path / "cache" / "vocab"
    assert got.read_bytes() == files[got.name]
    assert sorted(p.name for p in got.parent.iterdir() if not p.name.startswith(".")) == sorted(
        vocab.QWEN2_FILES
    )


def test_corrupt_sdist_is_refused(tmp_path, monkeypatch, qwen2_vocab):
    inp, out = vocab.qwen2_vocab_test_vectors()
    files = {p.name: p.read_bytes() for p in (qwen2_vocab, inp, out)}
    files[qwen2_vocab.name] = files[qwen2_vocab.name][:-1] + b"\0"
    monkeypatch.setenv("SDQ_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(vocab.SDIST_ENV, str(_fake_sdist(tmp_path, files)))
    with pytest.raises(SdqError, match="SHA-256"):
        vocab.qwen2_vocab_path()
    assert not (tmp_path / "cache" / "vocab" / qwen2_vocab.name).exists()


def test_missing_member_and_missing_tarball_are_clear_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("SDQ_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(vocab.SDIST_ENV, str(_fake_sdist(tmp_path, {"other.gguf": b"x"})))
    with pytest.raises(SdqError, match="has no vendor/llama.cpp/models/ggml-vocab-qwen2.gguf"):
        vocab.qwen2_vocab_path()
    monkeypatch.setenv(vocab.SDIST_ENV, str(tmp_path / "absent.tar.gz"))
    with pytest.raises(SdqError, match="no such file"):
        vocab.qwen2_vocab_path()


def test_failed_pip_download_is_a_clear_error(tmp_path, monkeypatch):
    class Done:
        returncode, stdout = 1, ""
        stderr = "ERROR: No matching distribution found for llama-cpp-python==0.3.36\n"

    monkeypatch.setenv("SDQ_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(vocab.SDIST_ENV, raising=False)
    monkeypatch.setattr(vocab.subprocess, "run", lambda *a, **k: Done())
    with pytest.raises(SdqError, match="pip download .* failed .*No matching distribution"):
        vocab.qwen2_vocab_path()
