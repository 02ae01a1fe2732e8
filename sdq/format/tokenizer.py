"""Byte-level BPE tokenizer built from a GGUF file's vocabulary (qwen2 / gpt2 style).

The GGUF stores `tokenizer.ggml.tokens` (byte-level unicode strings), `token_type`
(1 normal, 3 control, 4 user-defined), `merges` ("a b" strings) and the pre-tokenizer name
(`tokenizer.ggml.pre`). We build a HuggingFace `tokenizers.Tokenizer` from them: the pre-tokenizer
regex splits text into words, each word's UTF-8 bytes are mapped to printable characters
(GPT-2's byte-to-unicode table) and merged by rank.

Decoding maps each token back to bytes; `StreamDecoder` holds back an incomplete UTF-8 sequence
so that text can be printed as it is generated.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sdq.errors import UnsupportedError

# Word-splitting regexes per `tokenizer.ggml.pre` value. Letters attach at most one leading
# non-letter (e.g. a space), digits are split one by one, punctuation runs keep one leading
# space and trailing newlines, and whitespace before a word is left to that word.
PRE_TOKENIZER_REGEX = {
    "qwen2": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
        r"|[^\r\n\p{L}\p{N}]?\p{L}+"
        r"|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+"
        r"|\s+(?!\S)"
        r"|\s+"
    ),
}

TOKEN_TYPE_NORMAL, TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED = 1, 3, 4


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable unicode characters."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_CHAR = _bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


@dataclass
class Tokenizer:
    """Encode text to token ids and decode ids to bytes/text, as llama.cpp does for the file."""

    tokens: list[str]
    token_types: list[int]
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    add_bos: bool
    _hf: object  # tokenizers.Tokenizer
    _token_bytes: list[bytes]

    @classmethod
    def from_gguf(cls, path: str | Path) -> Tokenizer:
        from sdq.format.header import read_header

        return cls.from_metadata(read_header(path).metadata, source=str(path))

    @classmethod
    def from_metadata(cls, meta: dict, source: str = "model") -> Tokenizer:
        from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise UnsupportedError(f"{source}: tokenizer model {kind!r} is not supported (gpt2)")
        pre = meta.get("tokenizer.ggml.pre", "default")
        if pre not in PRE_TOKENIZER_REGEX:
            known = ", ".join(sorted(PRE_TOKENIZER_REGEX))
            raise UnsupportedError(f"{source}: pre-tokenizer {pre!r} is not supported ({known})")
        if not meta.get("tokenizer.ggml.tokens"):
            raise UnsupportedError(f"{source}: no vocabulary (tokenizer.ggml.tokens)")
        tokens = list(meta["tokenizer.ggml.tokens"])
        types = list(meta.get("tokenizer.ggml.token_type") or [TOKEN_TYPE_NORMAL] * len(tokens))
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
        vocab = {t: i for i, t in enumerate(tokens)}

        hf = HFTokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(PRE_TOKENIZER_REGEX[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        hf.decoder = decoders.ByteLevel()
        special = [
            AddedToken(t, special=True, normalized=False)
            for t, ty in zip(tokens, types, strict=True)
            if ty in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
        ]
        hf.add_special_tokens(special)

        token_bytes = []
        for t, ty in zip(tokens, types, strict=True):
            if ty == TOKEN_TYPE_NORMAL:
                token_bytes.append(bytes(CHAR_TO_BYTE.get(c, 0x3F) for c in t))
            else:
                token_bytes.append(t.encode("utf-8"))
        return cls(
            tokens=tokens,
            token_types=types,
            bos_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_id=meta.get("tokenizer.ggml.eos_token_id"),
            eot_id=meta.get("tokenizer.ggml.eot_token_id"),
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            _hf=hf,
            _token_bytes=token_bytes,
        )

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    @property
    def stop_ids(self) -> frozenset[int]:
        """Ids that end generation: EOS, end-of-turn, and the `<|im_end|>` control token."""
        ids = {i for i in (self.eos_id, self.eot_id) if i is not None}
        for name in ("<|im_end|>", "<|endoftext|>"):
            i = self._hf.token_to_id(name)
            if i is not None and self.token_types[i] == TOKEN_TYPE_CONTROL:
                ids.add(i)
        return frozenset(ids)

    def encode(self, text: str, add_bos: bool | None = None, special: bool = True) -> list[int]:
        """Token ids of `text`. With `special`, control tokens written in the text
        (e.g. `<|im_start|>`) become their ids; otherwise they are split like plain text."""
        if special:
            ids = self._hf.encode(text, add_special_tokens=False).ids
        else:
            ids = self._encode_plain(text)
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return list(ids)

    def _encode_plain(self, text: str) -> list[int]:
        """Encode without recognising control tokens (they are split like any other text)."""
        ids: list[int] = []
        for word, _span in self._hf.pre_tokenizer.pre_tokenize_str(text):
            ids.extend(tok.id for tok in self._hf.model.tokenize(word))
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        return self._token_bytes[token_id]

    def decode_bytes(self, ids, skip_special: bool = False) -> bytes:
        parts = []
        for i in ids:
            if skip_special and self.token_types[i] != TOKEN_TYPE_NORMAL:
                continue
            parts.append(self._token_bytes[i])
        return b"".join(parts)

    def decode(self, ids, skip_special: bool = False) -> str:
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def stream(self, skip_special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special)


class StreamDecoder:
    """Turns tokens into text one at a time, holding back an incomplete UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self.pending = b""

    def push(self, token_id: int) -> str:
        self.pending += self.tokenizer.decode_bytes([token_id], self.skip_special)
        cut = _complete_utf8_prefix(self.pending)
        text, self.pending = self.pending[:cut], self.pending[cut:]
        return text.decode("utf-8", errors="replace")

    def flush(self) -> str:
        text, self.pending = self.pending, b""
        return text.decode("utf-8", errors="replace")


def _complete_utf8_prefix(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside a UTF-8 character."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        if b & 0x80 == 0:
            return n
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return n if back >= need else n - back
    return n
