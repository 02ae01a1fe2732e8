"""The GGUF tokenizers against llama.cpp: its own test vectors and its tokenizer on random text.

llama.cpp keeps vocabulary-only GGUF files (`models/ggml-vocab-<name>.gguf`) with test texts
(`.inp`, separated by `__ggml_vocab_test__` lines) and the ids its tokenizer gives them (`.out`,
tokenized without BOS and without parsing special tokens). `make setup` extracts them from the
pinned llama-cpp-python source package into `<cache>/vocab-tests/<version>/`.

Pre-tokenizers with no vocabulary file of their own (dbrx, olmo, deepseek-v3, gpt-4o, kimi-k2,
default)
are checked by giving another file's vocabulary their name and comparing with llama.cpp (via
llama-cpp-python, `vocab_only=True`) on random text: only the word splitting differs.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
from gguf_builders import copy_vocab
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdq.dirs import cache_root
from sdq.format.tokenizer import (
    CHAR_TO_BYTE,
    TOKEN_TYPE_CONTROL,
    TOKEN_TYPE_NORMAL,
    TOKEN_TYPE_USER_DEFINED,
    Tokenizer,
)
from sdq.synth.vocab import LLAMA_CPP_PYTHON_VERSION, read_test_vectors

VOCAB_DIR = cache_root() / "vocab-tests" / LLAMA_CPP_PYTHON_VERSION

# Every llama.cpp vocabulary with test vectors whose tokenizer kind sdq handles (bert-bge is
# WordPiece and gemma-4 its own kind: not supported, and so not listed).
VECTOR_FILES = (
    "llama-spm", "phi-3",  # SentencePiece
    "llama-bpe", "qwen2", "qwen35", "deepseek-llm", "deepseek-coder", "gpt-2", "mpt",
    "starcoder", "refact", "command-r", "falcon",
)  # fmt: skip

# Pre-tokenizers without a vocabulary file: (name, the vocabulary file lent to them).
RENAMED = (
    ("dbrx", "llama-bpe"),
    ("olmo", "mpt"),
    ("deepseek-v3", "deepseek-llm"),
    ("gpt-4o", "llama-bpe"),
    ("default", "gpt-2"),
    ("kimi-k2", "qwen2"),
)

# Letters, digits and spaces from many scripts, marks, emoji and unusual whitespace.
ALPHABET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    " \t\n\r!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
    "äöüßéèñçÀÉÖſK’“”—…«»¡¿"
    "αβγΩλабвгдЖЯ"
    "中文字我想在工作日本語のカタカナ한국어"
    "١٢٣४५ⅫⅣ½²"
    "\u0301\u0308\u093f\u200d\u00a0\u2009\u3000\u2028"
    "🦙😀👍🏽"
)  # fmt: skip


def _vocab_path(name: str) -> Path:
    path = VOCAB_DIR / f"ggml-vocab-{name}.gguf"
    if not (VOCAB_DIR / ".complete").is_file():
        pytest.skip(f"llama.cpp's tokenizer test files are not in {VOCAB_DIR} (`make setup`)")
    assert path.is_file(), f"{path} missing from a complete extraction"
    return path


_TOKENIZERS: dict[str, Tokenizer] = {}


def _tokenizer(name: str) -> Tokenizer:
    if name not in _TOKENIZERS:
        _TOKENIZERS[name] = Tokenizer.from_gguf(_vocab_path(name))
    return _TOKENIZERS[name]


@pytest.mark.parametrize("name", VECTOR_FILES)
def test_llama_cpp_vectors(name):
    """Every test text gives exactly llama.cpp's ids, and decodes back to itself."""
    path = _vocab_path(name)
    tok = _tokenizer(name)
    vectors = read_test_vectors(Path(f"{path}.inp"), Path(f"{path}.out"))
    assert len(vectors) >= 40
    wrong = []
    for text, want in vectors:
        got = tok.encode(text, add_bos=False, special=False)
        if got != want:
            wrong.append((text, want, got))
    assert not wrong, f"{name}: {len(wrong)}/{len(vectors)} texts differ, first: {wrong[0]}"
    not_back = [text for text, ids in vectors if tok.decode(ids) != text]
    assert not not_back, f"{name}: {len(not_back)} texts do not round-trip: {not_back[:3]}"


def test_metadata_defaults_follow_llama_cpp():
    spm, llama3, qwen2 = _tokenizer("llama-spm"), _tokenizer("llama-bpe"), _tokenizer("qwen2")
    assert (spm.kind, spm.add_bos, spm.add_space_prefix, spm.bos_id, spm.eos_id) == (
        "llama", True, True, 1, 2,
    )  # fmt: skip
    # llama-bpe files carry no add_bos key: llama.cpp's default for that pre-tokenizer is true
    assert (llama3.pre, llama3.add_bos, llama3.bos_id) == ("llama-bpe", True, 128000)
    assert (qwen2.pre, qwen2.add_bos) == ("qwen2", False)
    assert spm.encode("Hello")[:1] == [1] and spm.decode(spm.encode("Hello")[1:]) == "Hello"


def _piece(llm, vocab, token: int) -> bytes:
    """llama.cpp's bytes for one token (special tokens as their text, no space stripped)."""
    import llama_cpp

    buf = ctypes.create_string_buffer(1024)
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
    assert 0 <= n <= len(buf)
    return buf.raw[:n]


def _detokenize(llm, ids: list[int]) -> bytes:
    """llama.cpp's text for `ids` (special tokens written out, nothing removed)."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    tokens = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    size = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(vocab, tokens, len(ids), buf, size, False, True)
    assert 0 <= n <= size
    return buf.raw[:n]


_LLAMAS: dict[Path, object] = {}


@pytest.fixture(scope="module", autouse=True)
def _close_llamas():
    """Close the llama.cpp vocabularies while the module is alive (not at interpreter exit)."""
    yield
    for llm in _LLAMAS.values():
        llm.close()
    _LLAMAS.clear()


def _llama(path: Path):
    import llama_cpp

    if path not in _LLAMAS:
        _LLAMAS[path] = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    return _LLAMAS[path]


def _reference_bytes(tok: Tokenizer, i: int) -> bytes:
    """A byte-level normal token's bytes, character by character: a byte-level character is
    its byte, any other its own UTF-8."""
    return b"".join(
        bytes([CHAR_TO_BYTE[c]]) if c in CHAR_TO_BYTE else c.encode("utf-8") for c in tok.tokens[i]
    )


@pytest.mark.parametrize("name", VECTOR_FILES)
def test_every_token_decodes_to_llama_cpp_bytes(name, llama_cpp):
    """Each token's bytes are llama.cpp's, except for the byte-level tokens holding characters
    outside GPT-2's byte table, which llama.cpp prints as an `[UNK_BYTE_0x..]` marker: those
    are their characters' UTF-8."""
    path = _vocab_path(name)
    tok, llm = _tokenizer(name), _llama(path)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    wrong, unmapped = [], 0
    for i in range(tok.n_vocab):
        want = _piece(llm, vocab, i)
        if want.startswith(b"[UNK_BYTE_0x") and tok.token_types[i] == TOKEN_TYPE_NORMAL:
            unmapped += 1
            want = _reference_bytes(tok, i)
        if tok.token_bytes(i) != want:
            wrong.append(i)
    assert not wrong, f"{name}: {len(wrong)} tokens differ, first {wrong[:5]}"
    assert unmapped == (1403 if name == "command-r" else 0)


def _texts(specials: list[str]):
    """Random text: runs from ALPHABET with, between them, special tokens written out."""
    pieces = st.text(ALPHABET, max_size=16)
    if specials:
        pieces = st.one_of(pieces, pieces, st.sampled_from(specials))
    return st.lists(pieces, max_size=6).map("".join)


def _compare_on_random_text(tok: Tokenizer, llm, examples: int) -> None:
    specials = [
        t
        for t, ty in zip(tok.tokens, tok.token_types, strict=True)
        if ty in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
    ]

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(text=_texts(specials), special=st.booleans())
    def check(text, special):
        want = llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)
        got = tok.encode(text, add_bos=False, special=special)
        assert got == want, (text, special)
        if _detokenize(llm, got) == text.encode("utf-8"):
            assert tok.decode(got) == text, text

    check()


@pytest.mark.parametrize("name", VECTOR_FILES)
def test_random_text_matches_llama_cpp(name, llama_cpp):
    path = _vocab_path(name)
    _compare_on_random_text(_tokenizer(name), _llama(path), examples=60)


@pytest.mark.parametrize(("pre", "lent"), RENAMED)
def test_pre_tokenizers_without_a_vocab_file_match_llama_cpp(pre, lent, tmp_path, llama_cpp):
    path = copy_vocab(_vocab_path(lent), tmp_path / f"ggml-vocab-{pre}.gguf", pre=pre)
    tok = Tokenizer.from_gguf(path)
    assert tok.pre == pre
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        _compare_on_random_text(tok, llm, examples=60)
    finally:
        llm.close()


def test_user_defined_tokens_are_parsed_even_without_special(llama_cpp):
    """llama.cpp parses user-defined tokens ([PAD151646] in Qwen2) in plain text too, and
    control tokens only when asked."""
    path = _vocab_path("qwen2")
    tok, llm = _tokenizer("qwen2"), _llama(path)
    for special in (False, True):
        for text in ("a[PAD151646]b", "<|im_start|>x"):
            want = llm.tokenize(text.encode(), add_bos=False, special=special)
            assert tok.encode(text, special=special) == want
        assert 151646 in tok.encode("a[PAD151646]b", special=special)
    assert 151644 not in tok.encode("<|im_start|>x", special=False)
