"""qwen35moe: delta-net kernels against their NumPy references, the NumPy reference and the
engine against llama.cpp on the synthetic `tiny35` model (3 delta-net blocks, 1 full-attention
block, 12 query / 3 KV heads, delta-net 3 key / 6 value heads, shared expert), paged against
resident experts, the CLI on it, and one-line refusals.
"""

import subprocess
import sys

import numpy as np
import pytest
from family_support import (
    chat_summary,
    chat_under_budget,
    f32_logits_error,
    greedy_both,
    model_fixture,
    paged_and_resident,
    per_position_error,
    sdq_engine,
    sdq_logits,
    teacher_forced,
)
from gguf_builders import Layout, write_model
from llama_support import N_UBATCH, exact_bar, llama_logits, random_tokens

from sdq.errors import UnsupportedError
from sdq.format.model import open_model
from sdq.kernels import delta_net
from sdq.run.engine import Engine, ResidentExperts
from sdq.run.qwen35_reference import Qwen35Reference
from sdq.run.workspace import Workspace
from sdq.synth.build import build_model, resolve_config

f32_path = model_fixture("tiny35", "F32", "f32_path")
q4_path = model_fixture("tiny35", "Q4_K_M", "q4_path")


# --- kernels against their references -----------------------------------------------------


def test_causal_conv_silu_matches_reference():
    rng = np.random.default_rng(0)
    T, C, Kc = 7, 45, 4
    x = rng.standard_normal((T, C)).astype(np.float32)  # [T, C]
    state = rng.standard_normal((Kc - 1, C)).astype(np.float32)  # [Kc-1, C]
    w = rng.standard_normal((C, Kc)).astype(np.float32)  # [C, Kc]
    out = np.empty((T, C), np.float32)
    delta_net.causal_conv_silu(np.concatenate([state, x]), w, out)
    conv, new_state = delta_net.causal_conv_ref(x, w, state)
    np.testing.assert_allclose(out, conv / (1 + np.exp(-conv)), rtol=2e-5, atol=2e-6)
    np.testing.assert_array_equal(new_state, np.concatenate([state, x])[T:])


def test_l2_norm_heads_matches_reference_on_strided_views():
    rng = np.random.default_rng(1)
    buf = rng.standard_normal((5, 3 * 24 + 10)).astype(np.float32)  # q heads inside a wider row
    view = buf[:, 10:].reshape(5, 3, 24)  # [T, H, S], not contiguous
    want = delta_net.l2_norm_ref(view, 1e-6)
    delta_net.l2_norm_heads(view, 1e-6)
    np.testing.assert_allclose(buf[:, 10:].reshape(5, 3, 24), want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.linalg.norm(view, axis=-1), 1.0, rtol=1e-5)


def test_gated_delta_rule_matches_reference_with_tiled_key_heads():
    rng = np.random.default_rng(2)
    T, Hk, Hv, S = 9, 2, 6, 24  # value head h reads key head h % Hk
    q = delta_net.l2_norm_ref(rng.standard_normal((T, Hk, S)), 1e-6).astype(np.float32)
    k = delta_net.l2_norm_ref(rng.standard_normal((T, Hk, S)), 1e-6).astype(np.float32)
    v = rng.standard_normal((T, Hv, S)).astype(np.float32)
    g = -rng.uniform(0.05, 2.0, (T, Hv)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (T, Hv)).astype(np.float32)
    state0 = rng.standard_normal((Hv, S, S)).astype(np.float32)
    want_o, want_s = delta_net.gated_delta_rule_ref(q, k, v, g, beta, state0)
    state = state0.copy()
    out = np.empty((T, Hv, S), np.float32)
    delta_net.gated_delta_rule(q, k, v, g, beta, state, out)
    np.testing.assert_allclose(out, want_o, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state, want_s, rtol=1e-4, atol=1e-5)
    # the head mapping matters: the block mapping h // (Hv / Hk) gives a different output
    blocked = Hv // Hk
    alt, _ = delta_net.gated_delta_rule_ref(
        np.repeat(q, blocked, axis=1), np.repeat(k, blocked, axis=1), v, g, beta, state0
    )
    assert np.abs(alt - want_o).max() > 1e-2


def test_decay_and_beta_matches_reference():
    rng = np.random.default_rng(3)
    alpha = (rng.standard_normal((4, 6)) * 15).astype(np.float32)  # both sides of the cutoff 20
    beta = rng.standard_normal((4, 6)).astype(np.float32)
    dt, a = rng.standard_normal(6).astype(np.float32), -rng.uniform(0.1, 3, 6).astype(np.float32)
    want_g, want_b = delta_net.decay_and_beta_ref(alpha, dt, a, beta)
    delta_net.decay_and_beta(alpha, dt, a, beta)
    np.testing.assert_allclose(alpha, want_g, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(beta, want_b, rtol=1e-6, atol=1e-7)


def test_partial_rope_reference_keeps_the_unrotated_dims():
    x = np.random.default_rng(4).standard_normal((3, 2, 16))
    out = delta_net.rope_partial_ref(x, np.array([0, 1, 5]), 1e6, 8)
    np.testing.assert_array_equal(out[..., 8:], x[..., 8:])
    np.testing.assert_allclose(out[0], x[0])  # position 0: no rotation
    np.testing.assert_allclose(
        np.linalg.norm(out[..., :8], axis=-1), np.linalg.norm(x[..., :8], axis=-1)
    )


# --- against llama.cpp ----------------------------------------------------------------------


def test_reference_and_engine_match_llama_cpp_f32(f32_path):
    tokens = random_tokens(100, seed=1)  # two ubatches of 64 on both sides
    want = llama_logits(f32_path, tokens)
    ref = Qwen35Reference(open_model(f32_path))  # float64 and slow: the first 40 tokens
    parts = [ref.forward(tokens[:17]), ref.forward(tokens[17:18]), ref.forward(tokens[18:40])]
    mine = np.concatenate(parts)  # prefill, one decode step, prefill again: state carried over
    got = sdq_logits(sdq_engine(f32_path, len(tokens) + 8), tokens)
    # F32 weights and activations everywhere: only float rounding differs. Measured: worst
    # position 2e-6 of the largest logit (reference); the engine's logits are bit-identical
    # (it rounds as ggml's x86 AVX512 build; other builds sum in other orders).
    assert per_position_error(mine, want[:40]).max() < 1e-5
    assert per_position_error(got, want).max() < 1e-5
    assert (got.argmax(1) == want.argmax(1)).all()


def test_f32_greedy_continuation_identical(f32_path):
    ours, theirs, n_prompt = greedy_both(f32_path, 32)
    assert n_prompt > N_UBATCH and ours == theirs


@pytest.mark.parametrize("qtype, rounding_bar", [("Q8_0", 0.97), ("Q4_K_M", 0.95)])
def test_quantized_teacher_forcing(llama_cpp, qtype, rounding_bar):
    bar = exact_bar(rounding_bar)  # rounding bars: measured where the last bits differ
    agree, err = teacher_forced(build_model("tiny35", qtype=qtype, seed=0), 260)
    # Both engines convert activations to 8-bit blocks; when their float sums differ in the
    # last bit, now and then such a bit moves an activation across a rounding boundary, and
    # the delta-net state carries that into every later token (~1 % of the largest logit),
    # flipping top-1 where the top two nearly tie. Q8_0: sdq rounds as ggml's x86 AVX512
    # build does in every op (the Q8_0 and F32 products' lanes and FMAs, ggml's vector exp in
    # silu and softmax, libm's expf / cosf elsewhere, the delta-net's dot products), so no
    # such event happens: measured 260/260 with every logit bit-identical (before: 255-256,
    # the first event at position 24). Q4_K_M: the K-quant products take ggml's orders too
    # (kquant_ref: vec_dot, tiled, repacked Q4_K): 260/260, bit-identical (while they summed
    # in sdq's own order: 252-255, the first event at position 23). Where the last bits
    # differ, the engines agree to float rounding before the first event (Q4_K_M: 4e-7):
    assert err[:16].max() < 1e-4, f"early positions differ: {err[:16].max():.2e}"
    assert agree >= bar, f"top-1 agreement {agree:.3f}"


def test_calibrated_router_blocks_match_llama_cpp(llama_cpp):
    """The calibrated router's delta-net blocks are an extreme point of the gated delta rule (one
    fixed key for every token, no decay, beta = context_ema): the engines must still agree."""
    cfg = resolve_config("tiny35", router="calibrated")
    f32 = build_model(cfg, "F32", seed=0)
    err, ours, theirs = f32_logits_error(f32)
    assert err.max() < 1e-5 and (ours == theirs).all(), f"F32 logits differ: {err.max():.2e}"
    mine, llama, _ = greedy_both(f32, 32)
    assert mine == llama
    agree, err = teacher_forced(build_model(cfg, "Q8_0", seed=0), 260)
    assert agree >= exact_bar(0.97), f"top-1 agreement {agree:.3f}"


# --- paging, CLI, refusals ------------------------------------------------------------------


@pytest.mark.parametrize("n_ubatch", [1, 16])
def test_paged_experts_give_the_resident_logits(q4_path, n_ubatch):
    # K + 3 slots < 2 x one layer's 8 experts: acquires in chunks, evicts
    base, got, stats, slots = paged_and_resident(q4_path, n_ubatch)
    assert slots < 2 * open_model(q4_path).spec.n_expert
    assert np.array_equal(got, base)
    assert stats["misses"] > 0 and stats["evictions"] > 0


def test_engine_reset_forgets_the_recurrent_state(f32_path):
    engine = sdq_engine(f32_path, 64)
    tokens = random_tokens(20, seed=4)
    first = engine.forward(tokens, "all")
    engine.reset()
    assert not engine.ws.ssm_cache.any() and not engine.ws.conv_cache.any()
    np.testing.assert_array_equal(engine.forward(tokens, "all"), first)


def test_chat_under_a_budget_exits_0(q4_path):
    size_mb = q4_path.stat().st_size / 1e6
    chat, budget = chat_under_budget(q4_path)
    # budget = minimum + 1: a few slots, far fewer than the model's 32 experts
    out = chat_summary(chat)
    assert out["n_generated"] == 8
    assert out["slots"] < 4 * open_model(q4_path).spec.n_expert
    assert out["expert_cache"]["misses"] > 0
    assert size_mb > 0


def test_qwen35moe_without_delta_net_keys_is_refused_in_one_line(tmp_path):
    path, _ = write_model(tmp_path / "m.gguf", Layout(arch="qwen35moe", shared_ffn=32, n_layer=2))
    model = open_model(path)
    assert model.spec.hybrid is None
    with pytest.raises(UnsupportedError, match="ssm"):
        Engine(model, ResidentExperts(model), Workspace.allocate(model.spec, 8, 8), 8, 8)
    chat = subprocess.run(
        [sys.executable, "-m", "sdq", "chat", "-m", str(path), "-p", "hi", "--resident"],
        capture_output=True,
        text=True,
    )
    assert chat.returncode == 2
    assert len(chat.stderr.strip().splitlines()) == 1 and "ssm" in chat.stderr


def test_recurrent_state_is_counted_with_the_kv_cache(q4_path):
    from sdq.run.plan import plan_memory
    from sdq.run.workspace import workspace_bytes

    model = open_model(q4_path)
    spec, hy = model.spec, model.spec.hybrid
    sizes = workspace_bytes(spec, 256, 32)
    # one full-attention block has a KV cache; three delta-net blocks have conv + delta states
    assert sizes["k_cache"] == 1 * 256 * spec.n_head_kv * spec.head_dim * 4
    assert sizes["ssm_cache"] == 3 * hy.v_heads * hy.state**2 * 4
    assert sizes["conv_cache"] == 3 * (hy.conv_kernel - 1) * hy.conv_channels * 4
    engine = sdq_engine(q4_path, 256, n_ubatch=32)
    assert engine.ws.nbytes == sum(sizes.values())
    plan = plan_memory(model, 1000, n_ctx=256, n_ubatch=32, reserve_mb=0, rss_now=100 << 20)
    kv = sizes["k_cache"] + sizes["v_cache"] + sizes["ssm_cache"] + sizes["conv_cache"]
    assert kv <= plan.kv_bytes < kv + 4 * 4096  # each buffer rounded up to pages


def test_info_classes_delta_net_and_full_attention_tensors(q4_path):
    from sdq.format.model import anatomy

    info = anatomy(open_model(q4_path))
    classes = info["tensor_classes"]
    # per delta-net block: attn_qkv, attn_gate + 7 ssm_* (ssm_norm counts as a norm);
    # the full-attention block: attn_q, attn_k, attn_v, attn_output
    assert classes["linear_attention"]["count"] == 3 * (2 + 6)
    assert classes["attention"]["count"] == 4
    assert classes["shared_expert"]["count"] == 4 * 4  # gate, up, down, gate_inp_shexp
    assert info["spec"]["hybrid"]["recurrent_layers"] == (0, 1, 2)
    assert info["experts"]["moe_layers"] == 4
