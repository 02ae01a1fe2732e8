"""deepseek2 against llama.cpp on the synthetic `tiny-deepseek2` model (DeepSeek-V2-Lite's
shape, small: MLA with a 64-dim latent and 32 RoPE dims of 128 query/key dims, YaRN x4, the
first block dense, 16 experts top-4 plus 2 shared, routed weights x1.5): llama.cpp loads it,
F32 logits and greedy continuation, quantized teacher forcing, paged against resident
experts, the anatomy `sdq info` shows, and chat under a budget.
"""

import numpy as np
import pytest
from family_support import (
    chat_summary,
    chat_under_budget,
    f32_logits_error,
    greedy_both,
    model_fixture,
    paged_and_resident,
    teacher_forced_three_ways,
)
from llama_support import N_UBATCH, exact_bar, llama

from sdq.format.model import anatomy, open_model
from sdq.synth.build import build_model

PRESET = "tiny-deepseek2"


f32_path = model_fixture(PRESET, "F32", "f32_path")
q4_path = model_fixture(PRESET, "Q4_K_M", "q4_path")


def test_llama_cpp_loads_the_file_and_sdq_reads_its_keys(f32_path):
    llm = llama(f32_path, 64)
    model = open_model(f32_path)
    spec, m = model.spec, model.spec.mla
    assert llm.n_vocab() == spec.n_vocab
    assert (spec.n_head, spec.n_head_kv, spec.head_dim) == (4, 1, 64 + 32)  # MLA as MQA
    assert (m.q_lora_rank, m.kv_lora_rank, m.key_length, m.value_length) == (0, 64, 128, 64)
    assert (m.rope_dim, m.rope_scaling, m.rope_factor, m.rope_orig_ctx) == (32, "yarn", 4, 1024)
    assert m.yarn_log_mul == pytest.approx(0.707, rel=1e-6)
    assert (spec.n_dense_lead, spec.dense_ffn, spec.n_shared_expert) == (1, 512, 2)
    assert spec.shared_ffn == 2 * spec.expert_ffn and spec.expert_weights_scale == 1.5
    assert spec.expert_gating == "softmax" and not spec.norm_topk_prob
    assert spec.moe_layers == (1, 2, 3)


def test_info_shows_the_anatomy(q4_path):
    info = anatomy(open_model(q4_path))
    classes = info["tensor_classes"]
    assert classes["dense_ffn"]["count"] == 3  # block 0's ffn_gate, ffn_up, ffn_down
    assert classes["shared_expert"]["count"] == 3 * 3  # gate, up, down in blocks 1-3
    # q, kv_a_mqa, k_b, v_b, output in 4 blocks
    assert classes["attention"]["count"] == 4 * 5
    assert info["experts"]["moe_layers"] == 3 and info["experts"]["layers"] == "1-3"
    assert info["dense_bytes"] + info["routed_expert_bytes"] == info["total_bytes"]
    k_b = open_model(q4_path).tensors["blk.1.attn_k_b.weight"]
    assert k_b.qtype.name == "Q8_0" and k_b.shape == (96, 64, 4)


def test_engine_matches_llama_cpp_f32(f32_path):
    err, ours, theirs = f32_logits_error(f32_path, 72)  # two ubatches of 64 on both sides
    # F32 weights and activations everywhere: only float rounding differs
    assert err.max() < 1e-4, f"worst position {err.argmax()}: {err.max():.2e}"
    assert (ours == theirs).all()


def test_f32_greedy_continuation_identical(f32_path):
    ours, theirs, n_prompt = greedy_both(f32_path, 32)
    assert n_prompt > N_UBATCH and ours == theirs


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K_M"])
def test_quantized_teacher_forcing(llama_cpp, qtype):
    n = 260
    path = build_model(PRESET, qtype=qtype, seed=0)
    # self_agree: llama.cpp against itself with flash attention, K and V rounded to F16
    err, agree, self_agree = teacher_forced_three_ways(path, n)
    agree, self_agree = agree / n, self_agree / n  # fractions of the n positions
    # Both engines convert activations to 8-bit blocks as ggml does and agree to float32
    # rounding (measured 1.4e-7 and 3.7e-7 of the largest logit) until a last-bit difference
    # moves an activation across a rounding boundary. Where that first happens depends on
    # the CPU: llama.cpp sums in the order of the vector kernels it was built for. Measured
    # on two machines: Q8_0 first at position 43 on both, Q4_K_M at 29 and at 3. Afterwards
    # positions end ~1-2 % of the largest logit apart, which flips top-1 where the top two
    # nearly tie. llama.cpp does the same against itself: with flash attention it agrees with
    # its own top-1 on 249/260 and 251/260 positions (Q8_0), 249/260 and 243/260 (Q4_K_M).
    # sdq measured 250-258 while some of its ops rounded otherwise. Where llama.cpp is an
    # AVX512 build, sdq now rounds as it does in every op (MLA's YaRN angles and factor with
    # GCC's FMAs, wk_b's product as ggml_vec_dot_f32 on the strided q_nope, 3-D weights
    # never repacked): 260/260 in both types, bit-identical, and the bar is 99 %. Elsewhere:
    # at least llama.cpp's agreement with itself, measured in the same run, and never below
    # 95 %. (Across ubatch sizes 64 and 1 both agree with themselves exactly.)
    assert err[:2].max() < 1e-5, f"first positions differ: {err[:2].max():.2e}"
    assert self_agree < 0.99, f"llama.cpp agrees with itself on {self_agree:.3f}"
    assert agree >= exact_bar(max(0.95, self_agree)), f"top-1 {agree:.3f} ({self_agree:.3f})"


@pytest.mark.parametrize("n_ubatch", [1, 16])
def test_paged_experts_give_the_resident_logits(q4_path, n_ubatch):
    # K + 3 slots < 2 x one layer's 4 used experts: chunks and evictions
    base, got, stats, slots = paged_and_resident(q4_path, n_ubatch, n_tokens=24)
    spec = open_model(q4_path).spec
    assert slots < 2 * 2 * spec.n_expert_used
    assert np.array_equal(got, base)
    assert stats["misses"] > 0 and stats["evictions"] > 0


def test_chat_under_a_budget_exits_0(q4_path):
    chat, budget = chat_under_budget(q4_path)
    # budget = minimum + 1: a few slots, far fewer than the model's 48 experts
    out = chat_summary(chat)
    assert out["n_generated"] == 8
    assert out["slots"] < 3 * open_model(q4_path).spec.n_expert
    assert out["expert_cache"]["misses"] > 0
