"""olmoe: the whole-projection QK norm against its NumPy reference, the engine against
llama.cpp on the synthetic `tiny-olmoe` model (RMS norms over the whole q and k projections
before NeoX RoPE, 16 experts top-4 whose weights are not renormalised), paged against resident
experts, `sdq chat` under a budget, and the file's anatomy."""

import numpy as np
import pytest
from family_support import (
    chat_summary,
    chat_under_budget,
    f32_logits_error,
    greedy_both,
    model_fixture,
    paged_and_resident,
    sdq_engine,
    teacher_forced,
)
from gguf import GGUFValueType
from gguf_builders import Layout, write_model
from llama_support import N_UBATCH, exact_bar, llama, random_tokens

from sdq.format.model import anatomy, open_model
from sdq.kernels import ops
from sdq.run.engine import _qk_norm
from sdq.synth.build import build_model

PRESET = "tiny-olmoe"


f32_path = model_fixture(PRESET, "F32", "f32_path")
q4_path = model_fixture(PRESET, "Q4_K_M", "q4_path")


def test_qk_norm_over_the_whole_projection_or_per_head():
    rng = np.random.default_rng(0)
    T, H, Dh = 5, 4, 16
    x = (rng.standard_normal((T, H * Dh)) * np.arange(1, H + 1).repeat(Dh)).astype(np.float32)
    whole_w = (1 + 0.1 * rng.standard_normal(H * Dh)).astype(np.float32)  # [H*Dh]
    head_w = whole_w[:Dh].copy()  # [Dh]
    whole = x.copy()
    _qk_norm(whole, whole.reshape(T, H, Dh), whole_w, 1e-6)
    np.testing.assert_allclose(whole, ops.rms_norm_ref(x, whole_w, 1e-6), rtol=1e-6, atol=1e-6)
    per_head = x.copy()
    _qk_norm(per_head, per_head.reshape(T, H, Dh), head_w, 1e-6)
    want = ops.rms_norm_ref(x.reshape(T, H, Dh), head_w, 1e-6).reshape(T, H * Dh)
    np.testing.assert_allclose(per_head, want, rtol=1e-6, atol=1e-6)
    # heads of different scale: the two norms differ
    assert np.abs(whole[:, :Dh] - per_head[:, :Dh]).max() > 0.1


def test_llama_cpp_loads_it_and_the_spec_reads_its_keys(f32_path):
    llm = llama(f32_path, 64)
    model = open_model(f32_path)
    spec = model.spec
    assert llm.n_vocab() == spec.n_vocab
    assert spec.arch == "olmoe" and not spec.norm_topk_prob
    assert (spec.n_expert, spec.n_expert_used, spec.n_shared_expert) == (16, 4, 0)
    # the expert FFN size is read from the tensors; the file has only feed_forward_length
    assert spec.expert_ffn == model.metadata["olmoe.feed_forward_length"] == 256
    assert "olmoe.expert_feed_forward_length" not in model.metadata
    assert model.tensors["blk.0.attn_k_norm.weight"].shape == (spec.n_head_kv * spec.head_dim,)


def test_f32_logits_match_llama_cpp(f32_path):
    err, ours, theirs = f32_logits_error(f32_path)
    # F32 weights and activations on both sides: only the order of float32 sums differs.
    assert err.max() < 1e-5, f"worst position {err.argmax()}: {err.max():.2e}"
    assert (ours == theirs).all()


def test_f32_greedy_continuation_identical(f32_path):
    ours, theirs, n_prompt = greedy_both(f32_path, 32)
    assert n_prompt > N_UBATCH and ours == theirs


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K_M"])
def test_quantized_teacher_forcing(llama_cpp, qtype):
    agree, err = teacher_forced(build_model(PRESET, qtype=qtype, seed=0), 260)
    # Both engines quantize activations to the same 8-bit blocks; their float sums differ in
    # the last bit (measured 2e-7 of the largest logit), and now and then such a bit moves an
    # activation across a rounding boundary. In this model (top-4 of 16, weights not
    # renormalised) such an event can move the later positions by ~1 % of the largest logit
    # (median 0.5-0.8 %), which flips top-1 where the top two nearly tie. llama.cpp does the
    # same against itself (ubatch 1 instead of 64). Measured top-1 agreement, sdq vs
    # llama.cpp / llama.cpp ubatch 1 vs 64: Q8_0 254-257/260 / 259/260, Q4_K_M 253/260 /
    # 255/260 (sdq's range: while the float order of other ops changed). The first event fell
    # at position 13 (Q8_0) and 22 (Q4_K_M); before it the engines agree to float rounding
    # (measured 2e-7 and 4e-7).
    # Where llama.cpp is an AVX512 build (whose rounding sdq reproduces in every op, the
    # K-quant products included): measured 260/260 with bit-identical logits, both types.
    assert err[:5].max() < 1e-5, f"early positions differ: {err[:5].max():.2e}"
    assert agree >= exact_bar(0.96), f"top-1 agreement {agree:.4f}"


def test_the_top_k_weights_are_not_renormalised(f32_path):
    engine = sdq_engine(f32_path, 64)
    engine.forward(random_tokens(20, seed=5), "none")
    weights = engine.ws.topk_w[:20]  # [T, K] of the last layer
    assert (weights.sum(axis=1) < 0.999).all()


@pytest.mark.parametrize("n_ubatch", [1, 16])
def test_paged_experts_give_the_resident_logits(q4_path, n_ubatch):
    base, got, stats, slots = paged_and_resident(q4_path, n_ubatch)
    assert slots < 2 * open_model(q4_path).spec.n_expert_used
    assert np.array_equal(got, base)
    assert stats["misses"] > 0 and stats["evictions"] > 0


def test_chat_under_a_budget_at_the_plans_minimum(q4_path):
    chat, budget = chat_under_budget(q4_path)
    out = chat_summary(chat)
    # The budget (measured ~365 MB) is mostly the process itself (Python, NumPy, Numba), more
    # than this 66 MB file: what stays below the file is the arena, fewer slots than the
    # model has experts, so experts are read and evicted while the chat runs.
    spec = open_model(q4_path).spec
    assert out["n_generated"] == 8
    # the process measured in the chat differs from the plan's by ~1-2 MB, 10-20 slots here:
    # the arena holds fewer experts than the model has, not always fewer than one layer's
    assert out["slots"] < spec.n_layer * spec.n_expert
    assert out["expert_cache"]["misses"] > 0


def test_info_classes_the_qk_norms_and_has_no_shared_expert(q4_path):
    info = anatomy(open_model(q4_path))
    classes, layers = info["tensor_classes"], 3
    assert "shared_expert" not in classes
    assert classes["attention"]["count"] == 4 * layers
    # attn_norm, attn_q_norm, attn_k_norm, ffn_norm per block, and output_norm
    assert classes["norms"]["count"] == 4 * layers + 1
    assert info["experts"]["moe_layers"] == layers and info["experts"]["n_expert"] == 16


def test_a_renormalisation_key_is_ignored_as_llama_cpp_does(tmp_path):
    key = "olmoe.expert_weights_norm"
    layout = Layout(arch="olmoe", extra_kv={key: (True, GGUFValueType.BOOL)})
    path, _ = write_model(tmp_path / "m.gguf", layout)
    model = open_model(path)
    assert model.metadata[key] is True
    assert not model.spec.norm_topk_prob
