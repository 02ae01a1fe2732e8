"""Reuse windows, U(k) unions and prompt-lookup drafting."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sdq.analysis.ngram import mean_accepted, prompt_lookup, text_tokens, verify_reads
from sdq.analysis.reuse import (
    layer_popularity,
    only_once_fraction,
    reuse_histogram,
    union_reads,
    union_saving,
)


@st.composite
def blocks(draw):
    t, n_layer, n_expert = (
        draw(st.integers(1, 20)),
        draw(st.integers(1, 3)),
        draw(st.integers(2, 8)),
    )
    k = draw(st.integers(1, n_expert))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    b = np.array(
        [[rng.choice(n_expert, k, replace=False) for _ in range(n_layer)] for _ in range(t)]
    )
    return b.astype(np.int32), n_expert  # [T, L, K]


@settings(max_examples=60, deadline=None)
@given(blocks(), st.integers(1, 8))
def test_union_of_one_token_is_plain_decode(block_e, k):
    block, _ = block_e
    one, single = union_reads(block, 1)
    assert one == single == block.size
    batched, _ = union_reads(block, k)
    assert batched <= single
    assert union_saving([block], 1) == 0.0


@settings(max_examples=60, deadline=None)
@given(blocks(), st.integers(1, 30))
def test_reuse_window_counts_agree_with_a_direct_count(block_e, window):
    block, _ = block_e
    once = total = 0
    for j in range(block.shape[1]):
        for start in range(0, block.shape[0], window):
            ids = block[start : start + window, j].ravel()
            for e in ids:
                once += int((ids == e).sum() == 1)
                total += 1
    assert only_once_fraction([block], window) == once / total
    assert abs(sum(reuse_histogram([block], window).values()) - 1.0) < 1e-9


def test_reuse_and_union_on_a_known_block():
    # one layer, two experts per token: tokens use {0,1}, {0,2}, {0,1}, {3,4}
    block = np.array([[[0, 1]], [[0, 2]], [[0, 1]], [[3, 4]]], dtype=np.int32)
    assert only_once_fraction([block], 4) == 3 / 8  # 2, 3 and 4 once; 0 three times, 1 twice
    assert union_reads(block, 2) == (3 + 4, 8)
    pop = layer_popularity([block], 5, top=1)[0]
    assert pop["distinct"] == 5 and pop["top1_share"] == 3 / 8


def test_prompt_lookup_accepts_a_repeated_phrase():
    toks = "a b c d e f a b c d e f".split()
    steps = prompt_lookup(toks, 6, n=2, k=8)
    # at 6 the suffix "e f" only occurs as itself, at 7 "f a" is new, at 8 "a b" matches
    assert [(s.pos, s.drafted, s.accepted) for s in steps] == [(6, 0, 0), (7, 0, 0), (8, 6, 4)]
    assert mean_accepted(steps) > 0
    no_repeat = [str(i) for i in range(40)]
    assert mean_accepted(prompt_lookup(no_repeat, 5, n=2, k=8)) == 0.0


def test_text_tokens_keep_words_punctuation_and_indents():
    assert text_tokens("if x:\n    return 1") == ["if", " ", "x", ":", "\n    ", "return", " ", "1"]


def test_verify_reads_without_drafts_is_plain_decode():
    rng = np.random.default_rng(0)
    block = np.array([[rng.choice(8, 2, replace=False) for _ in range(3)] for _ in range(30)])
    toks = [str(i) for i in range(30)]  # nothing repeats: every step is a plain step
    r = verify_reads(block, prompt_lookup(toks, 1, 2, 8), 8)
    assert r["plain_reads_per_token"] == r["batch_reads_per_token_optimistic"] == 3 * 2
    # a fully repeated stream: batches read fewer experts per token than plain decode
    rep = np.concatenate([block[:10]] * 3)
    toks = [str(i % 10) for i in range(30)]
    r = verify_reads(rep, prompt_lookup(toks, 1, 2, 8), 8)
    assert r["batch_reads_per_token_optimistic"] < r["plain_reads_per_token"]
