"""Every tokenizer failure is a one-line TokenizerError (exit 2 through `sdq chat`), and
decoding never raises, whatever bytes the tokens hold."""

from __future__ import annotations

import pytest
from gguf_builders import Layout, write_model, write_vocab
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdq.cli import main
from sdq.errors import TokenizerError
from sdq.format.tokenizer import (
    BYTE_TO_CHAR,
    PRE_TOKENIZERS,
    StreamDecoder,
    Tokenizer,
    _hf_call,
)

BYTE_CHARS = [BYTE_TO_CHAR[b] for b in range(256)]  # [256] byte-level characters


def _bpe(tokens, merges=(), **extra) -> dict:
    """tokenizer.* metadata of a byte-level BPE vocabulary."""
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": list(tokens),
    }
    if merges:
        meta["tokenizer.ggml.merges"] = list(merges)
    meta.update({f"tokenizer.ggml.{k}": v for k, v in extra.items()})
    return meta


def _spm(tokens, scores, **extra) -> dict:
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": list(tokens),
        "tokenizer.ggml.scores": list(scores),
    }
    meta.update({f"tokenizer.ggml.{k}": v for k, v in extra.items()})
    return meta


BAD_FILES = {
    "missing piece": (
        _bpe([*BYTE_CHARS, "ab"], ["a b", "a c\u0100"]),
        r"merge 1 \('a c\u0100'\) names 'c\u0100', which is not in the vocabulary",
    ),
    "missing join": (
        _bpe([*BYTE_CHARS, "ab"], ["a b", "b c"]),
        r"merge 1 \('b c'\) names 'bc', which is not in the vocabulary",
    ),
    "no space": (_bpe([*BYTE_CHARS, "ab"], ["a b", "ab"]), r"merge 1 \('ab'\) is not two tokens"),
    "types length": (
        _bpe(BYTE_CHARS, token_type=[1] * 255),
        r"tokenizer.ggml.token_type has 255 entries for 256 tokens",
    ),
    "scores length": (
        _spm(["<unk>", "a", "b"], [0.0, -1.0]),
        r"tokenizer.ggml.scores has 2 entries for 3 tokens",
    ),
    "no vocabulary": (
        {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2"},
        r"empty or missing vocabulary",
    ),
    "unknown pre": (
        _bpe(BYTE_CHARS, pre="tekken"),
        r"unknown pre-tokenizer 'tekken' \(known: .*deepseek-llm.*llama-bpe.*qwen2",
    ),
    "unknown model": (
        {"tokenizer.ggml.model": "rwkv", "tokenizer.ggml.tokens": ["a"]},
        r"tokenizer model 'rwkv' is not supported \(known: gpt2, llama\)",
    ),
    "bos outside": (
        _bpe(BYTE_CHARS, bos_token_id=256),
        r"tokenizer.ggml.bos_token_id is 256, outside the 256-token vocabulary",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_tokenizer_files_are_one_line_errors(case, tmp_path, capfd):
    meta, message = BAD_FILES[case]
    path = write_vocab(tmp_path / "bad.gguf", meta)
    with pytest.raises(TokenizerError, match=message) as err:
        Tokenizer.from_gguf(path)
    text = str(err.value)
    assert text.startswith(str(path)) and "\n" not in text
    assert capfd.readouterr().err == ""  # nothing from tokenizers (a Rust panic prints here)


def test_metadata_gguf_cannot_hold_is_an_error():
    """Metadata gguf-py will not write (an empty array, mixed arrays) or of the wrong type."""
    with pytest.raises(TokenizerError, match="empty or missing vocabulary"):
        Tokenizer.from_metadata(_bpe([]), source="x.gguf")
    with pytest.raises(TokenizerError, match="token 1 is a int, not a string"):
        Tokenizer.from_metadata(_bpe(["a", 5]), source="x.gguf")
    with pytest.raises(TokenizerError, match="unknown pre-tokenizer 7"):
        Tokenizer.from_metadata(_bpe(["a"], pre=7), source="x.gguf")
    with pytest.raises(TokenizerError, match="token_type holds a non-integer"):
        Tokenizer.from_metadata(_bpe(["a"], token_type=["x"]), source="x.gguf")
    with pytest.raises(TokenizerError, match="merges is not an array of strings"):
        Tokenizer.from_metadata(_bpe(["a"], ["a a", 3]), source="x.gguf")


def test_rust_panics_become_tokenizer_errors():
    from tokenizers import models

    # a merge whose join is not in the vocabulary makes tokenizers 0.23 panic
    with pytest.raises(TokenizerError, match=r"^x.gguf: building failed: .+") as err:
        _hf_call("x.gguf", "building", models.BPE, {"a": 0, "b": 1}, [("a", "b")])
    assert "\n" not in str(err.value)

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # only tokenizers' own failures are converted
        _hf_call("x.gguf", "encoding", interrupted)


def test_sdq_chat_exits_2_with_one_line(tmp_path, capsys):
    lay = Layout(n_vocab=256, tokenizer=_bpe(BYTE_CHARS, ["a b"]))
    path, _ = write_model(tmp_path / "model.gguf", lay)
    code = main(["chat", "-m", str(path), "-p", "hi", "--ram-budget-mb", "4000", "-n", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "merge 0 ('a b') names 'ab'" in err, err


# --- fuzz ----------------------------------------------------------------------------------

_PIECES = ["a", "b", "c", "ab", "bc", "abc", " ", "\u2581", "\u2581a", "Ġ", "Ġa", "<s>", "</s>",
           "<0x61>", "<0xE4>", "<0xZZ>", "", "\u00e4", "ä", "<|im_end|>", "a b", "\n"]  # fmt: skip


def _size(n: int):
    """Mostly n, sometimes one off."""
    return st.sampled_from([n] * 6 + [max(0, n - 1), n + 1])


# merges whose pieces and joins a vocabulary gets when its merges are drawn well-formed
_MERGEABLE = [("a", "b"), ("ab", "c"), ("b", "c"), ("a", "bc"), ("Ġ", "a"), ("Ġa", "b"),
              ("\u2581", "a"), ("<", "s>"), ("ä", "a")]  # fmt: skip


@st.composite
def _vocabularies(draw) -> dict:
    """Small vocabularies, mostly consistent, sometimes not (lengths, ids, merges)."""
    kind = draw(st.sampled_from(["gpt2", "llama"] * 8 + [["gpt2"]]))
    tokens = draw(st.lists(st.sampled_from(_PIECES), min_size=0, max_size=12))
    merges = []
    if kind == "gpt2" and draw(st.booleans()):  # well-formed merges
        pairs = draw(st.lists(st.sampled_from(_MERGEABLE), min_size=1, max_size=5))
        tokens += [piece for a, b in pairs for piece in (a, b, a + b)]
        merges = [f"{a} {b}" for a, b in pairs]
    elif kind == "gpt2":  # anything
        junk = st.tuples(st.sampled_from(_PIECES), st.sampled_from(_PIECES)).map(" ".join)
        merges = draw(st.lists(junk | st.sampled_from(_PIECES), max_size=4))
    n = len(tokens)
    meta = {"tokenizer.ggml.model": kind, "tokenizer.ggml.tokens": tokens}
    if merges:
        meta["tokenizer.ggml.merges"] = merges
    if draw(st.booleans()):
        size = draw(_size(n))
        meta["tokenizer.ggml.token_type"] = draw(
            st.lists(st.sampled_from([0, 1, 1, 1, 2, 3, 4, 5, 6, 99]), min_size=size, max_size=size)
        )
    if kind == "llama" or draw(st.booleans()):
        size = draw(_size(n))
        meta["tokenizer.ggml.scores"] = draw(
            st.lists(st.floats(-100, 100), min_size=size, max_size=size)
        )
    if kind == "gpt2":
        names = [*sorted(PRE_TOKENIZERS)] * 3 + ["nope", 7, ["qwen2"]]
        meta["tokenizer.ggml.pre"] = draw(st.sampled_from(names))
    for key in ("bos_token_id", "eos_token_id"):
        if draw(st.booleans()):
            meta[f"tokenizer.ggml.{key}"] = draw(
                st.integers(0, max(0, n - 1))
                | st.integers(0, max(0, n - 1))
                | st.integers(-1, n + 1)
            )
    return meta


@settings(max_examples=300, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(meta=_vocabularies(), text=st.text(max_size=20), special=st.booleans())
def test_fuzz_small_vocabularies(meta, text, special):
    """Any vocabulary builds or is a TokenizerError; a built one encodes to ids in range (or a
    TokenizerError) and decodes any ids, streamed or not, without raising."""
    try:
        tok = Tokenizer.from_metadata(meta, source="fuzz.gguf")
    except TokenizerError as exc:
        assert "\n" not in str(exc)
        return
    try:
        ids = tok.encode(text, special=special)
    except TokenizerError:
        ids = []
    assert all(0 <= i < tok.n_vocab for i in ids)
    every = list(range(tok.n_vocab))
    assert isinstance(tok.decode(every), str) and isinstance(tok.decode(ids, True), str)
    stream = tok.stream()
    streamed = "".join(stream.push(i) for i in every) + stream.flush()
    assert streamed == tok.decode_bytes(every).decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def byte_tokenizer() -> Tokenizer:
    """A byte-level vocabulary of the 256 single bytes: any byte string is a token sequence."""
    return Tokenizer.from_metadata(_bpe(BYTE_CHARS), source="bytes.gguf")


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(data=st.binary(max_size=24))
def test_streaming_any_bytes_never_raises(byte_tokenizer, data):
    """Invalid or partial UTF-8 is held back while it may still complete, then replaced; the
    streamed text equals decoding all bytes at once."""
    stream = StreamDecoder(byte_tokenizer)
    pieces = [stream.push(b) for b in data]  # token id b is byte b
    pieces.append(stream.flush())
    assert "".join(pieces) == data.decode("utf-8", errors="replace")
    assert byte_tokenizer.decode(list(data)) == data.decode("utf-8", errors="replace")
