"""The real Qwen2 BPE vocabulary, taken from llama.cpp's tokenizer test files.

Provenance: llama.cpp keeps, for its tokenizer tests, vocabulary-only GGUF files of popular
models under `models/`; `models/ggml-vocab-qwen2.gguf` holds the Qwen2 byte-level BPE
tokenizer (151,936 tokens including 293 special and padding entries, 151,387 merges, token
types, the `qwen2` pre-tokenizer name, BOS/EOS ids and a ChatML chat template) and no tensors.
Beside it, `ggml-vocab-qwen2.gguf.inp` holds test strings and `.out` the token ids llama.cpp's
tokenizer must produce for them. llama-cpp-python vendors llama.cpp, and its source
distribution on PyPI contains these files under `vendor/llama.cpp/models/`.

We fetch that source distribution with pip (`pip download --no-deps --no-binary :all:
llama-cpp-python==<pinned version>`: the same release pinned in pyproject.toml, so the
tokenizer matches the llama.cpp we compare against, and pip's HTTP cache makes repeats cheap),
extract only those three files into `<cache>/vocab/`, and check their SHA-256 against the
values below, so every synthetic model is built from exactly the same vocabulary. A local copy
of the tarball can be named with `$SDQ_LLAMA_CPP_SDIST` (for machines without network).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sdq import files
from sdq.dirs import cache_subdir
from sdq.errors import SdqError

LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # must equal the llama-cpp-python pin in pyproject.toml
SDIST_ENV = "SDQ_LLAMA_CPP_SDIST"
_MEMBER_DIR = "vendor/llama.cpp/models"
QWEN2_VOCAB = "ggml-vocab-qwen2.gguf"

# file name -> SHA-256 of the copy in llama-cpp-python 0.3.36
QWEN2_FILES = {
    QWEN2_VOCAB: "44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c",
    QWEN2_VOCAB + ".inp": "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
    QWEN2_VOCAB + ".out": "de785bb305cc6fa9d43908ed5da337f853c0b79e971348fcfb9f0915a39c5363",
}
PIP_TIMEOUT_S = 1800


@dataclass(frozen=True)
class Vocab:
    """A GGUF tokenizer as stored under `tokenizer.*` (lists are in token-id order)."""

    model: str  # "gpt2": byte-level BPE
    pre: str  # pre-tokenizer name, "qwen2"
    tokens: list[str]  # [V] byte-level token strings
    token_types: list[int]  # [V] 1 normal, 3 control, 4 user-defined
    merges: list[str]  # "left right" pairs, highest priority first
    bos_id: int
    eos_id: int
    pad_id: int
    chat_template: str | None
    sha256: str  # of the GGUF file it came from

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)


def vocab_dir() -> Path:
    return cache_subdir("vocab")


def qwen2_vocab_path() -> Path:
    """Path to `ggml-vocab-qwen2.gguf` in the cache, fetching it first if needed."""
    return _ensure_files()[QWEN2_VOCAB]


def qwen2_vocab_test_vectors() -> tuple[Path, Path]:
    """(`.inp`, `.out`): llama.cpp's tokenizer test strings and their expected token ids."""
    files = _ensure_files()
    return files[QWEN2_VOCAB + ".inp"], files[QWEN2_VOCAB + ".out"]


def read_test_vectors(inp: Path, out: Path) -> list[tuple[str, list[int]]]:
    """Pairs (text, expected token ids) from llama.cpp's `.inp`/`.out` files.

    `.inp` separates the texts with lines `__ggml_vocab_test__`; `.out` has one line of
    space-separated ids per text, in the same order.
    """
    texts = inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    if texts and texts[-1].endswith("\n__ggml_vocab_test__"):
        texts[-1] = texts[-1][: -len("\n__ggml_vocab_test__")]
    if texts and texts[-1] == "":
        texts.pop()
    lines = out.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(texts) != len(lines):
        raise SdqError(f"{inp.name}: {len(texts)} test strings but {out.name} has {len(lines)}")
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines, strict=True)]


def load_qwen2_vocab() -> Vocab:
    """The Qwen2 tokenizer read from the cached vocabulary GGUF (well under a second)."""
    from sdq.format.header import read_header

    path = qwen2_vocab_path()
    meta = read_header(path).metadata
    return Vocab(
        model=meta["tokenizer.ggml.model"],
        pre=meta["tokenizer.ggml.pre"],
        tokens=meta["tokenizer.ggml.tokens"],
        token_types=meta["tokenizer.ggml.token_type"],
        merges=meta["tokenizer.ggml.merges"],
        bos_id=int(meta["tokenizer.ggml.bos_token_id"]),
        eos_id=int(meta["tokenizer.ggml.eos_token_id"]),
        pad_id=int(
            meta.get("tokenizer.ggml.padding_token_id", meta["tokenizer.ggml.eos_token_id"])
        ),
        chat_template=meta.get("tokenizer.chat_template"),
        sha256=QWEN2_FILES[QWEN2_VOCAB],
    )


def _ensure_files() -> dict[str, Path]:
    folder = vocab_dir()
    paths = {name: folder / name for name in QWEN2_FILES}
    if all(p.is_file() for p in paths.values()):
        return paths
    # One process fetches; others wait on the lock and then find the files in place.
    with open(folder / ".fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all(p.is_file() for p in paths.values()):
            _fetch_into(folder)
    return paths


def _fetch_into(folder: Path) -> None:
    local = os.environ.get(SDIST_ENV)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".sdist-") as tmp:
        if local:
            sdist = Path(local)
            if not sdist.is_file():
                raise SdqError(f"${SDIST_ENV}={local}: no such file")
        else:
            sdist = _pip_download(Path(tmp))
        _extract(sdist, folder)


def _pip_download(dest: Path) -> Path:
    spec = f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    cmd += ["--disable-pip-version-check", "--quiet", spec, "-d", str(dest)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SdqError(
            f"pip download {spec} took over {PIP_TIMEOUT_S} s; to use a local copy of the"
            f" source tarball set ${SDIST_ENV}"
        ) from None
    found = sorted(dest.glob("llama_cpp_python-*.tar.gz"))
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        why = tail[-1] if tail else f"exit code {proc.returncode}"
        raise SdqError(
            f"cannot fetch the Qwen2 vocabulary: pip download {spec} failed ({why});"
            f" to use a local copy of the source tarball set ${SDIST_ENV}"
        )
    return found[0]


def _extract(sdist: Path, folder: Path) -> None:
    """Copy the three Qwen2 files out of the tarball, each verified, then renamed into place."""
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            members = {Path(m.name).name: m for m in tar.getmembers() if _MEMBER_DIR in m.name}
            for name, want in QWEN2_FILES.items():
                member = members.get(name)
                if member is None or not member.isfile():
                    raise SdqError(f"{sdist.name}: has no {_MEMBER_DIR}/{name}")
                data = tar.extractfile(member).read()
                got = hashlib.sha256(data).hexdigest()
                if got != want:
                    raise SdqError(
                        f"{sdist.name}: {name} has SHA-256 {got[:16]}…, expected {want[:16]}…"
                    )
                files.write_bytes(folder / name, data)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise SdqError(f"{sdist}: cannot read the source tarball ({exc})") from None
