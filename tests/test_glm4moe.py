"""glm4moe (GLM-4.5 layout) on the synthetic `tiny-glm4moe` model: 1 dense-FFN block, 2 MoE blocks
(16 experts in 4 groups, sigmoid router with selection bias, 2 groups and 4 experts per token,
weights renormalised and scaled 1.5, one ungated shared expert), q/k/v biases, partial NeoX
RoPE over 32 of 64 dims, and 1 MTP block that is listed but not run. The engine against
llama.cpp, paged against resident experts, the CLI under a budget, the anatomy and the plan.
"""

import numpy as np
import pytest
from family_support import (
    chat_summary,
    chat_under_budget,
    greedy_both,
    model_fixture,
    paged_and_resident,
    per_position_error,
    sdq_engine,
    sdq_logits,
    teacher_forced_three_ways,
)
from llama_support import N_UBATCH, exact_bar, llama_logits, random_tokens

from sdq.format.model import anatomy, open_model
from sdq.run.workspace import workspace_bytes
from sdq.synth.build import build_model

PRESET = "tiny-glm4moe"


f32_path = model_fixture(PRESET, "F32", "f32_path")
q4_path = model_fixture(PRESET, "Q4_K_M", "q4_path")


@pytest.fixture(scope="module")
def f32_llama_logits(f32_path):
    tokens = random_tokens(100, seed=1)  # two ubatches of 64 on both sides
    return tokens, llama_logits(f32_path, tokens)


# --- the file ---------------------------------------------------------------------------


def test_spec_and_anatomy(q4_path):
    model = open_model(q4_path)
    s = model.spec
    assert (s.arch, s.n_layer, s.n_nextn_layer, s.n_dense_lead) == ("glm4moe", 3, 1, 1)
    assert (s.expert_gating, s.n_expert_groups, s.n_group_used) == ("sigmoid", 4, 2)
    assert s.expert_weights_scale == 1.5 and s.norm_topk_prob
    assert (s.rope_dim, s.head_dim, s.dense_ffn, s.shared_ffn) == (32, 64, 512, 256)
    assert s.moe_layers == (1, 2)  # the MTP block's experts are not in the table
    info = anatomy(model)
    classes = info["tensor_classes"]
    assert classes["dense_ffn"]["count"] == 3  # block 0's ffn_gate/up/down
    assert classes["router"]["count"] == 2 * 2  # ffn_gate_inp + exp_probs_b in blocks 1, 2
    assert classes["shared_expert"]["count"] == 2 * 3
    assert info["mtp"]["present"] and info["mtp"]["nextn_predict_layers"] == 1
    assert info["mtp"]["tensors"] == 4  # nextn.eh_proj, enorm, hnorm, shared_head_norm
    assert info["experts"]["moe_layers"] == 2 and info["experts"]["layers"] == "1-2"
    assert info["dense_bytes"] + info["routed_expert_bytes"] == info["total_bytes"]


def test_dense_ffn_buffers_are_in_the_workspace(q4_path):
    spec = open_model(q4_path).spec
    sizes = workspace_bytes(spec, 64, 16)
    assert sizes["dense_gate"] == sizes["dense_up"] == 16 * spec.dense_ffn * 4
    engine = sdq_engine(q4_path, 64, n_ubatch=16)
    assert engine.ws.nbytes == sum(sizes.values())
    assert engine.weights.layers[0].router is None and engine.weights.layers[0].dense is not None
    assert all(lw.exp_probs_b is not None for lw in engine.weights.layers[1:])


# --- against llama.cpp ----------------------------------------------------------------------


def test_engine_matches_llama_cpp_f32(f32_path, f32_llama_logits):
    tokens, want = f32_llama_logits
    got = sdq_logits(sdq_engine(f32_path, len(tokens) + 8), tokens)
    # F32 weights and activations everywhere: only float rounding differs
    assert per_position_error(got, want).max() < 1e-5
    assert (got.argmax(1) == want.argmax(1)).all()


@pytest.mark.parametrize("change", ["no selection bias", "no groups", "full rope"])
def test_each_feature_changes_the_logits(f32_path, f32_llama_logits, change):
    """The cross-check can fail: dropping one glm4moe feature moves the logits off llama.cpp."""
    import dataclasses

    tokens, want = f32_llama_logits
    engine = sdq_engine(f32_path, len(tokens) + 8)
    if change == "no selection bias":
        for lw in engine.weights.layers:
            lw.exp_probs_b = None
    elif change == "no groups":
        engine.spec = dataclasses.replace(engine.spec, n_expert_groups=0)
    else:
        engine.spec = dataclasses.replace(engine.spec, rope_dim=0)
    got = sdq_logits(engine, tokens)
    assert per_position_error(got, want).max() > 1e-3


def test_f32_greedy_continuation_identical(f32_path):
    ours, theirs, n_prompt = greedy_both(f32_path, 32)
    assert n_prompt > N_UBATCH and ours == theirs


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K_M"])
def test_quantized_teacher_forcing(llama_cpp, qtype):
    n = 260
    path = build_model(PRESET, qtype=qtype, seed=0)
    # self_agree: llama.cpp against itself with flash attention, attention sums in another order
    err, agree, self_agree = teacher_forced_three_ways(path, n)
    agree, self_agree = agree / n, self_agree / n  # fractions of the n positions
    # Both engines convert activations to 8-bit blocks as ggml does and agree to float32
    # rounding until a last-bit difference moves an activation across a rounding boundary
    # (measured: first at position 25 for Q8_0, 12 for Q4_K_M, on two machines). In this
    # model such an event does not stay local: attention spreads it to later tokens, whose
    # 8-bit activations and sigmoid expert groups then flip in turn, and about half of the
    # later positions end ~1 % of the largest logit apart, which flips top-1 where the top
    # two nearly tie. Which positions flip depends on the CPU (llama.cpp sums in the order of
    # the vector kernels it was built for). llama.cpp does the same against itself: with
    # flash attention (the same weights, attention summed in another order) it agrees with
    # its own top-1 on 246/260 (Q8_0) and 239/260 (Q4_K_M) positions on both machines.
    # sdq measured 254 and 258 (Q8_0), 256 and 250 (Q4_K_M) while it summed in its own
    # orders; where llama.cpp is an AVX512 build, whose rounding sdq now reproduces (the
    # K-quant products included), 260/260 in both types, bit-identical. The bar there: 99 %;
    # elsewhere at least llama.cpp's agreement with itself, measured in the same run, and
    # never below 95 %. (Across ubatch sizes 16 and 64 llama.cpp agrees with itself exactly.)
    assert err[:12].max() < 1e-4, f"early positions differ: {err[:12].max():.2e}"
    assert self_agree < 0.99, f"llama.cpp agrees with itself on {self_agree:.3f}"
    assert agree >= exact_bar(max(0.95, self_agree)), (
        f"top-1 agreement {agree:.3f} (llama.cpp {self_agree:.3f})"
    )


# --- paging, CLI ----------------------------------------------------------------------------


@pytest.mark.parametrize("n_ubatch", [1, 16])
def test_paged_experts_give_the_resident_logits(q4_path, n_ubatch):
    # K + 3 slots < 2 x one layer's K used experts: acquires in chunks, evicts
    base, got, stats, slots = paged_and_resident(q4_path, n_ubatch)
    K = open_model(q4_path).spec.n_expert_used
    assert slots < 2 * K
    assert np.array_equal(got, base)
    assert stats["misses"] > 0 and stats["evictions"] > 0


def test_chat_under_a_budget_exits_0(q4_path):
    chat, budget = chat_under_budget(q4_path)
    # a few slots: far fewer than the model's 32 experts (the process itself, with Numba and
    # the 150k-token vocabulary, is larger than this 67 MB file, so no budget below it runs)
    out = chat_summary(chat)
    assert out["n_generated"] == 8
    assert out["slots"] < 2 * open_model(q4_path).spec.n_expert
    assert out["expert_cache"]["misses"] > 0
