"""n-gram / prompt-lookup drafting on a token stream, and what batch verification reads.

Dimension key: T tokens, L MoE layers, K experts per token, E experts per layer.

Drafting (replayed on a recorded stream, greedy acceptance): to produce token i, take the
last n tokens of the context tokens[:i], find their most recent earlier occurrence, and
draft the (up to k) tokens that followed it there. The target model checks the draft in one
batch and accepts its longest correct prefix a; the step emits a + 1 tokens (the accepted
ones and the model's own next token). No match: a plain one-token step.

Token streams: sdq's route log carries token ids; DeepSeek's trace carries its tokenizer's
tokens; for text without tokens (Mixtral's generated text) `text_tokens` is a stated proxy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

# proxy tokenizer: a word, one punctuation character, or a run of whitespace (code indents)
_TOKEN = re.compile(r"\w+|[^\w\s]|\s+")


def text_tokens(text: str) -> list[str]:
    """Word-level proxy tokens: words, single punctuation marks, whitespace runs."""
    return _TOKEN.findall(text)


@dataclass(frozen=True)
class Step:
    pos: int  # index of the first token this step produces
    drafted: int  # draft length d (0: no match)
    accepted: int  # a <= d


def prompt_lookup(tokens: list, start: int, n: int, k: int) -> list[Step]:
    """Replay prompt-lookup decoding of tokens[start:] given tokens[:start] as the prompt."""
    if n < 1 or k < 1:
        raise ValueError(f"n and k must be >= 1, got n={n}, k={k}")
    toks = list(tokens)
    start = max(start, 1)
    last_end: dict[tuple, int] = {}  # n-gram -> end index of its latest occurrence
    indexed = n  # n-grams ending before this index are in last_end
    steps = []
    i = start
    T = len(toks)
    while i < T:
        # index the n-grams that end before i, except the suffix itself (it ends at i)
        while indexed < i:
            last_end[tuple(toks[indexed - n : indexed])] = indexed
            indexed += 1
        d = a = 0
        if i >= n:
            end = last_end.get(tuple(toks[i - n : i]))
            if end is not None:
                draft = toks[end : min(end + k, i)]
                d = len(draft)
                while a < d and i + a < T and draft[a] == toks[i + a]:
                    a += 1
        steps.append(Step(i, d, a))
        i += a + 1
    return steps


def mean_accepted(steps: list[Step]) -> float:
    """Average accepted draft length per step (the seed's "平均接受長度")."""
    return float(np.mean([s.accepted for s in steps])) if steps else float("nan")


def verify_reads(block: np.ndarray, steps: list[Step], n_expert: int) -> dict:
    """Expert reads (no cache) per generated token when each step's inputs run as one batch.

    Step inputs are the previous token (row pos-1 of `block`, routing aligned with the token
    stream) and the d drafted tokens. Accepted drafts route as recorded. Rejected drafts are
    tokens the stream never held, so their routing is unknown: `optimistic` routes them like
    the recorded tokens at their positions, `pessimistic` adds K new experts per layer each.
    """
    T, L, K = block.shape
    opt = pes = plain = tokens = 0
    for s in steps:
        lo = s.pos - 1
        hi = min(s.pos + s.drafted, T)  # rows lo..hi-1 are the batch's inputs
        good = min(s.pos + s.accepted, T)  # rows lo..good-1 are exact
        rejected = hi - good
        for j in range(L):
            exact = block[lo:good, j]
            guess = block[lo:hi, j]
            n_exact = len(np.unique(exact[exact >= 0]))
            opt += len(np.unique(guess[guess >= 0]))
            pes += min(n_exact + rejected * K, n_expert)
        emitted = min(s.accepted + 1, T - s.pos)
        plain += int((block[lo : lo + emitted] >= 0).sum())
        tokens += emitted
    if not tokens:
        return {"tokens": 0}
    return {
        "tokens": tokens,
        "plain_reads_per_token": plain / tokens,
        "batch_reads_per_token_optimistic": opt / tokens,
        "batch_reads_per_token_pessimistic": pes / tokens,
    }
