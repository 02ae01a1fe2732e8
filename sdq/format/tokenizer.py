"""Tokenizers built from a GGUF file's vocabulary, tokenizing as llama.cpp does for that file.

Two kinds, by `tokenizer.ggml.model`:

- `gpt2`, byte-level BPE (Qwen, Llama 3, DeepSeek, OLMo, GPT-2, ...): the pre-tokenizer named by
  `tokenizer.ggml.pre` splits text into words with one or more regexes (each applied in turn to
  every piece the previous ones left, matches and the gaps between them both kept); each word's
  UTF-8 bytes are mapped to printable characters (GPT-2's byte-to-unicode table) and merged by
  the rank of `tokenizer.ggml.merges` ("left right" strings, highest priority first).
- `llama`, SentencePiece BPE (Llama 2, Mistral/Mixtral, Phi-3): every text piece gets a leading
  space, spaces become U+2581 (the whole piece is one word), and adjacent symbols are merged
  while some pair forms a vocabulary token, the pair whose token has the highest
  `tokenizer.ggml.scores` first. A character no token covers becomes its UTF-8 bytes as
  `<0xXX>` tokens.

Both become a HuggingFace `tokenizers.Tokenizer` (for SentencePiece, with merges derived from
the scores). Control and unknown-type tokens written in the text are single tokens only when
asked (`special=True`); user-defined tokens always are, as in llama.cpp.

Decoding maps each token back to its bytes; `StreamDecoder` holds back an incomplete UTF-8
sequence so that text can be printed as it is generated, and never raises on invalid bytes.

Every inconsistency in the metadata (unknown kind or pre-tokenizer, arrays of different
lengths, a merge naming a token that is not in the vocabulary, ...) and every failure inside
`tokenizers` (including its Rust panics) is a one-line `TokenizerError`.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path

from sdq.errors import TokenizerError

TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_CONTROL = 1, 2, 3
TOKEN_TYPE_USER_DEFINED, TOKEN_TYPE_UNUSED, TOKEN_TYPE_BYTE = 4, 5, 6
SPACE_MARK = "\u2581"  # SentencePiece's visible space

# --- pre-tokenizers (byte-level BPE) -------------------------------------------------------

# English contractions, matched case by case (a case-insensitive group would also take the
# long s U+017F for "s", which llama.cpp does not).
_CONTRACTION = r"'(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD])"


def _word_regex(letters: str, numbers: str, not_word: str) -> str:
    """The Llama 3 / Qwen2 family: contractions, letters with at most one leading non-letter,
    digit groups, punctuation runs with one leading space and trailing newlines, newline runs,
    and whitespace (a run before a word leaves its last space to that word)."""
    return (
        f"{_CONTRACTION}|[^\\r\\n\\p{{L}}\\p{{N}}]?{letters}+|{numbers}"
        f"| ?[^\\s{not_word}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
    )


# GPT-2's split: lower-case contractions, then letters, digits or other runs with an optional
# leading space, and whitespace not followed by a word.
_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"


def _ranges(pairs: tuple[tuple[int, int], ...]) -> str:
    """A regex character-class body from inclusive code point ranges."""
    return "".join(f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in pairs)


# The cased letters (Lu, Ll, Lt) as the deepseek-llm tokenizer lists them.
_DEEPSEEK_LETTERS = (
    (0x41, 0x5A), (0x61, 0x7A), (0xB5, 0xB5), (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA),
    (0x1BC, 0x1BF), (0x1C4, 0x293), (0x295, 0x2AF), (0x370, 0x373), (0x376, 0x377),
    (0x37B, 0x37D), (0x37F, 0x37F), (0x386, 0x386), (0x388, 0x38A), (0x38C, 0x38C),
    (0x38E, 0x3A1), (0x3A3, 0x3F5), (0x3F7, 0x481), (0x48A, 0x52F), (0x531, 0x556),
    (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA), (0x1CBD, 0x1CBF),
    (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15), (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59, 0x1F59), (0x1F5B, 0x1F5B),
    (0x1F5D, 0x1F5D), (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), (0x1FBE, 0x1FBE),
    (0x1FC2, 0x1FC4), (0x1FC6, 0x1FCC), (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC),
    (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC), (0x2102, 0x2102), (0x2107, 0x2107), (0x210A, 0x2113),
    (0x2115, 0x2115), (0x2119, 0x211D), (0x2124, 0x2124), (0x2126, 0x2126), (0x2128, 0x2128),
    (0x212A, 0x212D), (0x212F, 0x2134), (0x2139, 0x2139), (0x213C, 0x213F), (0x2145, 0x2149),
    (0x214E, 0x214E), (0x2183, 0x2184), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4), (0x2CEB, 0x2CEE),
    (0x2CF2, 0x2CF3), (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F), (0xA771, 0xA787),
    (0xA78B, 0xA78E), (0xAB70, 0xABBF), (0xFB00, 0xFB06), (0xFB13, 0xFB17), (0xFF21, 0xFF3A),
    (0xFF41, 0xFF5A), (0x10400, 0x1044F), (0x104B0, 0x104D3), (0x104D8, 0x104FB),
    (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF), (0x1E900, 0x1E943),
)  # fmt: skip
# ASCII punctuation, fullwidth punctuation, curly quotes, ideographic space and full stops.
_DEEPSEEK_PUNCT = ((0x21, 0x2F), (0x3A, 0x7E), (0xFF01, 0xFF0F), (0xFF1A, 0xFF5E),
                   (0x2018, 0x201F), (0x3000, 0x3002))  # fmt: skip
# CJK ideographs, then everything from Samaritan up to them, then Hangul.
_DEEPSEEK_CJK = ((0x4E00, 0x9FA5), (0x800, 0x4E00), (0xAC00, 0xD7FF))
# CJK ideographs, Hiragana, Katakana.
_DEEPSEEK3_CJK = ((0x4E00, 0x9FA5), (0x3040, 0x309F), (0x30A0, 0x30FF))

# Han ideographs as llama.cpp ranges them: CJK unified (with extensions A-F) and compatibility.
_HAN = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0x2CEB0, 0x2EBEF), (0xF900, 0xFAFF),
        (0x2F800, 0x2FA1F))  # fmt: skip
# Kimi K2: Han runs on their own, then words of other letters (case not considered, as in
# llama.cpp) with one optional leading non-letter and a contraction, digit groups of up to 3.
_KIMI_K2_REGEX = (
    f"[{_ranges(_HAN)}]+"
    f"|[^\\r\\n\\p{{L}}\\p{{N}}]?(?:(?![{_ranges(_HAN)}])\\p{{L}})+(?:{_CONTRACTION})?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# GPT-4o (o200k): a word is upper-case letters then lower-case ones, or the reverse; letters
# other than ASCII count as both (as in llama.cpp).
_UPPER = r"(?:(?=\p{L})[^a-z])"
_LOWER = r"(?:(?=\p{L})[^A-Z])"
_GPT4O_REGEX = (
    f"[^\\r\\n\\p{{L}}\\p{{N}}]?{_UPPER}*{_LOWER}+(?:{_CONTRACTION})?"
    f"|[^\\r\\n\\p{{L}}\\p{{N}}]?{_UPPER}+{_LOWER}*(?:{_CONTRACTION})?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class PreTokenizer:
    """How one family of `tokenizer.ggml.pre` values splits text into words before BPE."""

    regexes: tuple[str, ...]  # applied in turn; each splits every piece the previous ones left
    ignore_merges: bool = False  # a word that is itself a token is that token, unmerged
    add_bos: bool = False  # when the file has no tokenizer.ggml.add_bos_token


_QWEN2 = PreTokenizer((_word_regex(r"\p{L}", r"\p{N}", r"\p{L}\p{N}"),))
_LLAMA3_REGEX = _word_regex(r"\p{L}", r"\p{N}{1,3}", r"\p{L}\p{N}")
_STARCODER = PreTokenizer((r"\p{N}", _GPT2_REGEX))
_GPT2 = PreTokenizer((_GPT2_REGEX,))

PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    # llama.cpp's choice when the file names none
    "default": PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2_REGEX, r"\p{N}+", r"[0-9][0-9][0-9]")),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", "hunyuan"), _QWEN2),
    "qwen35": PreTokenizer((_word_regex(r"[\p{L}\p{M}]", r"\p{N}", r"\p{L}\p{M}\p{N}"),)),
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe"),
        PreTokenizer((_LLAMA3_REGEX,), ignore_merges=True, add_bos=True),
    ),
    **dict.fromkeys(("dbrx", "smaug-bpe"), PreTokenizer((_LLAMA3_REGEX,))),
    "deepseek-llm": PreTokenizer(
        (
            r"[\r\n]",
            f"\\s?[{_ranges(_DEEPSEEK_LETTERS)}]+",
            f"\\s?[{_ranges(_DEEPSEEK_PUNCT)}]+",
            r"\s+$",
            f"[{_ranges(_DEEPSEEK_CJK)}]+",
            r"\p{N}+",
        )
    ),
    "deepseek-coder": PreTokenizer(
        (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", f"[{_ranges(_DEEPSEEK_CJK)}]+", r"\p{N}")
    ),
    "deepseek-v3": PreTokenizer(
        (
            r"\p{N}{1,3}",
            f"[{_ranges(_DEEPSEEK3_CJK)}]+",
            r"[!-/:-@\[-`{-~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
            r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        )
    ),
    "falcon": PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2_REGEX, r"[0-9][0-9][0-9]")),
    **dict.fromkeys(("starcoder", "refact", "command-r", "smollm"), _STARCODER),
    **dict.fromkeys(("gpt-2", "phi-2", "mpt", "olmo"), _GPT2),
    **dict.fromkeys(("gpt-4o", "llama4", "minimax-m2"), PreTokenizer((_GPT4O_REGEX,))),
    "kimi-k2": PreTokenizer((_KIMI_K2_REGEX,)),
}

TOKENIZER_MODELS = ("gpt2", "llama")


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
# A byte-level token's bytes are `token.translate(_TO_LATIN1).encode("latin-1", _PASS_UTF8)`:
# a byte-level character becomes the latin-1 character of its byte; any other character
# (some vocabularies hold raw symbols such as "\u2122") stands for its own UTF-8 bytes:
# spelled out as latin-1 characters below 256, given by the `_PASS_UTF8` error handler above 255.
_TO_LATIN1 = {ord(c): chr(b) for c, b in CHAR_TO_BYTE.items()} | {
    cp: chr(cp).encode("utf-8").decode("latin-1")
    for cp in range(0x80, 0x100)
    if chr(cp) not in CHAR_TO_BYTE
}
_PASS_UTF8 = "sdq-pass-utf8"
codecs.register_error(
    _PASS_UTF8, lambda e: (e.object[e.start : e.end].encode("utf-8", "replace"), e.end)
)


# --- calling `tokenizers` ------------------------------------------------------------------


def _is_rust_panic(exc: BaseException) -> bool:
    """pyo3 turns a Rust panic into `pyo3_runtime.PanicException`, a BaseException."""
    return type(exc).__module__ == "pyo3_runtime" and type(exc).__name__ == "PanicException"


def _hf_call(source: str, what: str, fn, *args, **kwargs):
    """fn(*args, **kwargs), with any failure inside `tokenizers` as a one-line TokenizerError."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # tokenizers raises plain Exception for its errors
        raise TokenizerError(f"{source}: {what} failed: {_first_line(exc)}") from None
    except BaseException as exc:
        if not _is_rust_panic(exc):
            raise
        raise TokenizerError(f"{source}: {what} failed: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --- reading and checking the metadata -----------------------------------------------------


@dataclass(frozen=True)
class _Vocabulary:
    """The `tokenizer.ggml.*` arrays, checked against each other."""

    tokens: list[str]  # [V]
    types: list[int]  # [V]
    scores: list[float] | None  # [V], SentencePiece only


def _read_vocabulary(meta: dict, source: str) -> _Vocabulary:
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list | tuple) or len(tokens) == 0:
        raise TokenizerError(f"{source}: empty or missing vocabulary (tokenizer.ggml.tokens)")
    if set(map(type, tokens)) != {str}:
        i = next(i for i, t in enumerate(tokens) if not isinstance(t, str))
        raise TokenizerError(f"{source}: token {i} is a {type(tokens[i]).__name__}, not a string")
    n = len(tokens)
    types = meta.get("tokenizer.ggml.token_type")
    if types is None:
        types = [TOKEN_TYPE_NORMAL] * n
    scores = meta.get("tokenizer.ggml.scores")
    for key, values in (("token_type", types), ("scores", scores)):
        if values is not None and (not isinstance(values, list | tuple) or len(values) != n):
            got = len(values) if isinstance(values, list | tuple) else type(values).__name__
            raise TokenizerError(f"{source}: tokenizer.ggml.{key} has {got} entries for {n} tokens")
    if not set(map(type, types)) <= {int}:
        raise TokenizerError(f"{source}: tokenizer.ggml.token_type holds a non-integer")
    if scores is not None and not set(map(type, scores)) <= {int, float}:
        raise TokenizerError(f"{source}: tokenizer.ggml.scores holds a non-number")
    return _Vocabulary(list(tokens), list(types), None if scores is None else list(scores))


# Token texts llama.cpp treats as control tokens whatever the file's token_type says: the
# end-of-generation tokens, and for each fill-in-the-middle role the file gives no id for, the
# first of its candidates the vocabulary holds.
_END_OF_GENERATION = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
))  # fmt: skip
_FILL_IN_MIDDLE = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>",
                "<PRE>", "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>",
                "<SUF>", "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>",
                "<MID>", "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}  # fmt: skip


def _effective_types(voc: _Vocabulary, vocab: dict[str, int], meta: dict) -> list[int]:
    """[V] token types as llama.cpp uses them: control-looking tokens made control; with the
    harmony tool tokens `<|end|>` is user-defined, and with `<|tool_response>` `</s>` normal."""
    types = list(voc.types)
    for text in _END_OF_GENERATION & vocab.keys():
        types[vocab[text]] = _as_control(types[vocab[text]])
    for role, texts in _FILL_IN_MIDDLE.items():
        found = [vocab[t] for t in texts if t in vocab]
        if found and meta.get(f"tokenizer.ggml.{role}_token_id") is None:
            types[min(found)] = _as_control(types[min(found)])
    have = vocab.keys()
    calls = "<|call|>" in have or "<|calls|>" in have
    if "<|end|>" in have and calls and ("<|return|>" in have or "<|flush|>" in have):
        types[vocab["<|end|>"]] = TOKEN_TYPE_USER_DEFINED
    if "</s>" in have and ("<|tool_response>" in have or "<|plamo:eos|>" in have):
        types[vocab["</s>"]] = TOKEN_TYPE_NORMAL
    return types


def _as_control(token_type: int) -> int:
    return (
        token_type if token_type in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN) else TOKEN_TYPE_CONTROL
    )


def _special_id(meta: dict, key: str, n_vocab: int, source: str) -> int | None:
    value = meta.get(f"tokenizer.ggml.{key}")
    if value is None:
        return None
    if not isinstance(value, int) or not 0 <= value < n_vocab:
        raise TokenizerError(
            f"{source}: tokenizer.ggml.{key} is {value!r}, outside the {n_vocab}-token vocabulary"
        )
    return value


def _bpe_merges(meta: dict, vocab: dict[str, int], source: str) -> list[tuple[str, str]]:
    """The file's merges as (left, right) pairs, each piece and their join in the vocabulary.

    The separator is the first space after the first character, as llama.cpp reads it. The
    checks run over whole arrays (151k merges in a few tens of ms); the loop that names the
    first bad entry runs only when one is bad."""
    merges = meta.get("tokenizer.ggml.merges")
    if merges is None:
        return []
    if not isinstance(merges, list | tuple) or not all(isinstance(m, str) for m in merges):
        raise TokenizerError(f"{source}: tokenizer.ggml.merges is not an array of strings")
    if not any(map(str.startswith, merges, repeat(" "))):  # else "  x": a space on the left
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        # a join missing from the vocabulary makes `tokenizers` panic: checked here; a
        # missing piece is its error, which `_bpe_merge_error` then names
        joins = map(str.replace, merges, repeat(" "), repeat(""), repeat(1))
        if not pairs or (min(map(len, pairs)) == 2 and vocab.keys() >= set(joins)):
            return pairs
    else:
        pairs = [_split_merge(m) for m in merges]
        if all(p[1] is not None and p[0] + p[1] in vocab for p in pairs):
            return pairs
    _bpe_merge_error(merges, vocab, source)
    return [_split_merge(m) for m in merges]  # not reached: the check above found a bad entry


def _bpe_merge_error(merges: list[str], vocab: dict[str, int], source: str) -> None:
    """Raise a TokenizerError naming the first merge that is malformed or names a piece (or
    a join) missing from the vocabulary; return if there is none."""
    for i, m in enumerate(merges):  # name the first bad entry
        left, right = _split_merge(m)
        if right is None:
            raise TokenizerError(f"{source}: merge {i} ({m!r}) is not two tokens and a space")
        for piece in (left, right, left + right):
            if piece not in vocab:
                raise TokenizerError(
                    f"{source}: merge {i} ({m!r}) names {piece!r}, which is not in the vocabulary"
                )


def _split_merge(merge: str) -> tuple[str, str | None]:
    cut = merge.find(" ", 1)
    return (merge, None) if cut < 0 else (merge[:cut], merge[cut + 1 :])


def _spm_merges(voc: _Vocabulary, vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Merges equivalent to SentencePiece's rule: any two adjacent pieces whose join is a token
    may merge, the join with the highest score first (ties: the lower id first)."""
    scores = voc.scores or [0.0] * len(voc.tokens)
    ranked = []  # (-score, id, left, right)
    for joined, i in vocab.items():
        for cut in range(1, len(joined)):
            left, right = joined[:cut], joined[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[i], i, left, right))
    ranked.sort()
    return [(left, right) for _, _, left, right in ranked]


def _pre_tokenizer(meta: dict, source: str) -> tuple[str, PreTokenizer]:
    pre = meta.get("tokenizer.ggml.pre", "default")
    if not isinstance(pre, str) or pre not in PRE_TOKENIZERS:
        known = ", ".join(sorted(PRE_TOKENIZERS))
        raise TokenizerError(f"{source}: unknown pre-tokenizer {pre!r} (known: {known})")
    return pre, PRE_TOKENIZERS[pre]


_KEEP_SPACE_AFTER = frozenset(("<unk>", "<s>", "<|endoftext|>"))


def _rstrip_patterns(voc: _Vocabulary, meta: dict) -> dict[bool, re.Pattern] | None:
    """Phi-3 files (by name, as llama.cpp decides): the ASCII whitespace right after a special
    token other than <unk>, <s> and <|endoftext|> is dropped. {special: pattern matching a
    token parsed in that mode and the whitespace after it}, or None for other files."""
    name = str(meta.get("general.name", "")).lower()
    if "phi-3" not in name and "phi3" not in name:
        return None
    control = (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN)
    patterns = {}
    for special in (True, False):
        parsed = {
            t
            for t, ty in zip(voc.tokens, voc.types, strict=True)
            if t and (ty == TOKEN_TYPE_USER_DEFINED or (special and ty in control))
        }
        if not parsed:
            patterns[special] = re.compile(r"(?!)")  # matches nothing
            continue
        alternatives = "|".join(map(re.escape, sorted(parsed, key=len, reverse=True)))
        patterns[special] = re.compile(f"({alternatives})[ \t\n\v\f\r]*")
    return patterns


def _drop_space_after(match: re.Match) -> str:
    token = match.group(1)
    return match.group(0) if token in _KEEP_SPACE_AFTER else token


# --- the tokenizer -------------------------------------------------------------------------


@dataclass
class Tokenizer:
    """Encode text to token ids and decode ids to bytes/text, as llama.cpp does for the file."""

    kind: str  # tokenizer.ggml.model: "gpt2" or "llama"
    pre: str | None  # tokenizer.ggml.pre for gpt2 (None for llama)
    tokens: list[str]  # [V]
    token_types: list[int]  # [V]
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool  # llama: a space before every text piece, removed by decode
    source: str
    _hf: object  # tokenizers.Tokenizer
    _token_bytes: list[bytes]  # [V]
    _rstrip: dict[bool, re.Pattern] | None  # whitespace dropped after special tokens (Phi-3)

    @classmethod
    def from_gguf(cls, path: str | Path) -> Tokenizer:
        from sdq.format.header import read_header

        return cls.from_metadata(read_header(path).metadata, source=str(path))

    @classmethod
    def from_metadata(cls, meta: dict, source: str = "model") -> Tokenizer:
        kind = meta.get("tokenizer.ggml.model")
        if not isinstance(kind, str) or kind not in TOKENIZER_MODELS:
            raise TokenizerError(
                f"{source}: tokenizer model {kind!r} is not supported"
                f" (known: {', '.join(TOKENIZER_MODELS)})"
            )
        pre, spec = _pre_tokenizer(meta, source) if kind == "gpt2" else (None, None)
        voc = _read_vocabulary(meta, source)
        vocab = {t: i for i, t in enumerate(voc.tokens)}  # a repeated token: the last id wins
        voc = _Vocabulary(voc.tokens, _effective_types(voc, vocab, meta), voc.scores)
        if kind == "gpt2":
            hf, token_bytes = _build_byte_level(meta, voc, vocab, spec, source)
            add_bos_default, add_space_prefix = spec.add_bos, False
        else:
            add_bos_default = True
            add_space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
            merges = _spm_merges(voc, vocab)
            what = "building the SentencePiece tokenizer"
            hf = _hf_call(source, what, _sentencepiece_bpe, vocab, merges, add_space_prefix)
            token_bytes = [_spm_bytes(t, ty) for t, ty in zip(voc.tokens, voc.types, strict=True)]
        _hf_call(source, "adding the special tokens", _add_special_tokens, hf, voc)
        n = len(voc.tokens)
        return cls(
            kind=kind,
            pre=pre,
            tokens=voc.tokens,
            token_types=voc.types,
            bos_id=_special_id(meta, "bos_token_id", n, source),
            eos_id=_special_id(meta, "eos_token_id", n, source),
            eot_id=_special_id(meta, "eot_token_id", n, source),
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default)),
            add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
            add_space_prefix=add_space_prefix,
            source=source,
            _hf=hf,
            _token_bytes=token_bytes,
            _rstrip=_rstrip_patterns(voc, meta),
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
        (e.g. `<|im_start|>`) become their ids; otherwise they are split like plain text.
        User-defined tokens are single tokens either way. (The mode is a flag on the shared
        `tokenizers` object: one thread encodes at a time.)"""
        if self._rstrip is not None:
            text = self._rstrip[special].sub(_drop_space_after, text)
        hf = self._hf
        hf.encode_special_tokens = not special
        try:
            ids = _hf_call(self.source, "tokenizing", hf.encode, text, add_special_tokens=False).ids
        finally:
            hf.encode_special_tokens = False
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return list(ids)

    def token_bytes(self, token_id: int) -> bytes:
        return self._token_bytes[token_id]

    def decode_bytes(self, ids, skip_special: bool = False) -> bytes:
        """The bytes of `ids` joined; with `skip_special`, control and user-defined tokens are
        left out."""
        parts = []
        for i in ids:
            if skip_special and self.token_types[i] not in (TOKEN_TYPE_NORMAL, TOKEN_TYPE_BYTE):
                continue
            parts.append(self._token_bytes[i])
        return b"".join(parts)

    def decode(self, ids, skip_special: bool = False) -> str:
        """Text of `ids`; SentencePiece's leading space (added by encode) is removed. Invalid
        UTF-8 becomes U+FFFD."""
        data = self.decode_bytes(ids, skip_special)
        if self.add_space_prefix and data.startswith(b" "):
            data = data[1:]
        return data.decode("utf-8", errors="replace")

    def stream(self, skip_special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special)


def _build_byte_level(meta: dict, voc: _Vocabulary, vocab: dict[str, int], spec, source: str):
    """(tokenizers.Tokenizer, [V] token bytes) for a byte-level BPE file."""
    merges = _bpe_merges(meta, vocab, source)
    try:
        hf = _hf_call(source, "building the BPE tokenizer", _byte_level_bpe, vocab, merges, spec)
    except TokenizerError:
        _bpe_merge_error(meta.get("tokenizer.ggml.merges", []), vocab, source)  # names it
        raise
    token_bytes = [
        t.translate(_TO_LATIN1).encode("latin-1", _PASS_UTF8)  # _byte_level_bytes, inlined
        if ty == TOKEN_TYPE_NORMAL
        else _byte_level_bytes(t, ty)
        for t, ty in zip(voc.tokens, voc.types, strict=True)
    ]
    return hf, token_bytes


def _byte_level_bpe(vocab: dict[str, int], merges: list[tuple[str, str]], spec: PreTokenizer):
    from tokenizers import Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    model = models.BPE(
        vocab, merges, fuse_unk=False, byte_fallback=False, ignore_merges=spec.ignore_merges
    )
    hf = HFTokenizer(model)
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in spec.regexes]
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    hf.decoder = decoders.ByteLevel()
    return hf


def _sentencepiece_bpe(vocab: dict[str, int], merges: list[tuple[str, str]], space_prefix: bool):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, normalizers

    hf = HFTokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=True))
    steps = [normalizers.Prepend(SPACE_MARK)] if space_prefix else []
    hf.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPACE_MARK)])
    return hf


def _add_special_tokens(hf, voc: _Vocabulary) -> None:
    """Control and unknown-type tokens: matched in the text only when asked; user-defined
    tokens: always (llama.cpp's rule)."""
    from tokenizers import AddedToken

    special, user = [], []
    for t, ty in zip(voc.tokens, voc.types, strict=True):
        if not t:
            continue
        if ty in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN):
            special.append(AddedToken(t, special=True, normalized=False))
        elif ty == TOKEN_TYPE_USER_DEFINED:
            user.append(AddedToken(t, special=False, normalized=False))
    hf.add_special_tokens(special)
    hf.add_tokens(user)


def _byte_level_bytes(token: str, token_type: int) -> bytes:
    """The bytes a byte-level BPE token stands for."""
    if token_type == TOKEN_TYPE_NORMAL:
        return token.translate(_TO_LATIN1).encode("latin-1", _PASS_UTF8)
    if token_type == TOKEN_TYPE_UNUSED:
        return b""
    return token.encode("utf-8", errors="replace")


def _spm_bytes(token: str, token_type: int) -> bytes:
    """The bytes a SentencePiece token stands for: U+2581 is a space, <0xXX> one byte."""
    if token_type == TOKEN_TYPE_NORMAL:
        return token.replace(SPACE_MARK, " ").encode("utf-8", errors="replace")
    if token_type == TOKEN_TYPE_BYTE:
        try:
            return bytes([int(token[3:5], 16)]) if len(token) == 6 else b""
        except ValueError:
            return b""
    if token_type == TOKEN_TYPE_UNUSED:
        return b""
    return token.encode("utf-8", errors="replace")


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
