"""The notebook's table builders on the real traces (small slices)."""

from pathlib import Path

import numpy as np
import pytest

from sdq.analysis.engine_log import attach_tokens
from sdq.analysis.readers import read_trace, write_engine
from sdq.analysis.tables import (
    engine_source,
    ngram_table,
    policy_sweep,
    real_source,
    reuse_table,
    union_table,
    verify_table,
)
from sdq.errors import TraceError

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"


def test_glob_joins_files_into_one_source():
    src = real_source(TRACES, "deepseek-v2-lite/prompt_*_data.csv")
    assert len(src.trace.sequences) == 3 and len(src.streams) == 3
    assert src.phase == "prefill"
    with pytest.raises(TraceError, match="no such trace"):
        real_source(TRACES, "nothing/*.csv")


def test_policy_sweep_ratios_and_bounds():
    src = real_source(TRACES, "mixtral-8x7b/gsm8k_2_routing.jsonl")
    df = policy_sweep([src], [0.5, 1.0], ["lru", "lrfu", "pin_other", "belady", "belady_bypass"])
    half = df[df.slots_frac == 0.5].set_index("policy")
    assert half.loc["belady", "misses_vs_belady"] == 1.0
    assert half.loc["belady_bypass", "misses"] <= half.loc["belady", "misses"]
    assert half.loc["belady", "misses"] < half.loc["lru", "misses"]
    full = df[df.slots_frac == 1.0].set_index("policy")
    assert full.loc["lru", "misses"] == full.loc["belady", "misses"]  # nothing is evicted


def test_reuse_union_and_ngram_tables():
    src = real_source(TRACES, "mixtral-8x7b/humaneval_2_routing.jsonl")
    assert 0 <= reuse_table([src], 48).only_once.iloc[0] < 0.05
    u = union_table([src], [1, 4]).set_index("k")
    assert u.loc[1, "saving"] == 0.0 and 0 < u.loc[4, "saving"] < 1
    ng = ngram_table([src], [2, 8], 8)
    assert list(ng.tokens.unique()) == ["word proxy"] and (ng["n=2"] >= ng["n=8"]).all()
    assert verify_table([src], [2], 8).empty  # word proxies are not aligned with routing


def test_engine_source_with_token_ids(tmp_path):
    granite = read_trace(TRACES / "granite-3.0-1b-a400m" / "moe_expert_trace.json")
    path = tmp_path / "route.jsonl"
    write_engine(granite, path)
    one = read_trace(path)
    seq = one.sequences[0]
    n = seq.prefill.n_tokens + seq.decode.n_tokens
    stream = [int(i) % 5 for i in range(n + 1)]  # a repetitive stream: drafts get accepted
    trace = attach_tokens(type(one)(**{**one.__dict__, "sequences": (seq,)}), stream)
    src = engine_source(trace, "engine")
    assert src.streams[0].tokens == stream[:n] and src.streams[0].start == seq.prefill.n_tokens
    v = verify_table([src], [2], 8)
    assert v.mean_accepted.iloc[0] > 1
    assert np.isfinite(v.batch_optimistic.iloc[0])


def test_per_sequence_results_add_up_to_the_trace():
    from sdq.analysis.replay import simulate_sequences, simulate_trace

    src = real_source(TRACES, "deepseek-v2-lite/prompt_*_data.csv")
    for policy in ("lru", "admit", "pin_other", "belady"):
        per = simulate_sequences(src.trace, policy, 32, "layer", src.phase)
        whole = simulate_trace(src.trace, policy, 32, "layer", src.phase)
        assert len(per) == 3
        assert sum(r.misses for r in per) == whole.misses
        assert sum(r.lookups for r in per) == whole.lookups


def union_reads_single(block):
    return int((block >= 0).sum())
