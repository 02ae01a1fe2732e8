"""The GGUF tokenizer against llama.cpp's own test vectors for the Qwen2 vocabulary."""

import pytest

from sdq.errors import TokenizerError
from sdq.format.tokenizer import StreamDecoder, Tokenizer, _complete_utf8_prefix


@pytest.fixture(scope="module")
def tok(qwen2_vocab) -> Tokenizer:
    return Tokenizer.from_gguf(qwen2_vocab)


def test_llama_cpp_vectors(tok, qwen2_test_vectors):
    assert len(qwen2_test_vectors) >= 40
    for special in (False, True):
        wrong = [
            (text, want, tok.encode(text, special=special)) for text, want in qwen2_test_vectors
        ]
        wrong = [w for w in wrong if w[1] != w[2]]
        assert not wrong, wrong[:3]


def test_vectors_round_trip(tok, qwen2_test_vectors):
    for text, ids in qwen2_test_vectors:
        assert tok.decode(ids) == text


def test_control_tokens_parsed_only_when_asked(tok):
    text = "<|im_start|>user\nhi<|im_end|>"
    ids = tok.encode(text)
    assert ids[0] == 151644 and ids[-1] == 151645
    plain = tok.encode(text, special=False)
    assert 151644 not in plain and len(plain) > len(ids)
    assert tok.decode(ids) == text == tok.decode(plain)
    assert tok.decode(ids, skip_special=True) == "user\nhi"


def test_stop_ids_and_bos(tok):
    assert {151643, 151645} <= tok.stop_ids
    assert tok.encode("a", add_bos=True)[0] == tok.bos_id


def test_stream_decoder_holds_back_partial_characters(tok):
    text = "Äpfel 🦙 нещо 我想在apple工作 😶‍🌫️"
    ids = tok.encode(text)
    stream = tok.stream()
    pieces = [stream.push(i) for i in ids]
    pieces.append(stream.flush())
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    # a byte-level token can end inside a character: some push must have held bytes back
    assert any(
        len(tok.token_bytes(i).decode("utf-8", "replace")) != len(tok.token_bytes(i)) for i in ids
    )


@pytest.mark.parametrize(
    "data, cut",
    [(b"ab", 2), (b"a\xc3", 1), (b"a\xc3\xa4", 3), (b"\xe4\xbd", 0), (b"\xf0\x9f\xa6\x99", 4)],
)
def test_complete_utf8_prefix(data, cut):
    assert _complete_utf8_prefix(data) == cut


def test_stream_decoder_flushes_invalid_bytes(tok):
    s = StreamDecoder(tok)
    s.pending = b"\xe4\xbd"
    assert s.flush() == "\ufffd"


def test_unsupported_tokenizer_is_a_clear_error():
    with pytest.raises(TokenizerError, match="tokenizer model 'bert' is not supported"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "bert"}, source="x.gguf")
    with pytest.raises(TokenizerError, match="unknown pre-tokenizer 'jais'.*known: .*qwen2"):
        Tokenizer.from_metadata(
            {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "jais"}, source="x.gguf"
        )
