"""Multi-head latent attention (sdq.run.mla): YaRN RoPE tables and scales against float64
statements of ggml's formulas, the engine's absorbed MLA block against the float64 reference
that decompresses keys and values per head, the compressed KV cache in the memory plan, and
the refusal of legacy fused attn_kv_b files."""

import math
import subprocess
import sys
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGUFWriter

from sdq.errors import UnsupportedError
from sdq.format.model import MlaSpec, open_model
from sdq.kernels import ops
from sdq.run import mla
from sdq.run.engine import Engine, ResidentExperts
from sdq.run.workspace import Workspace, workspace_bytes
from sdq.synth.build import build_model

MLA = MlaSpec(
    q_lora_rank=0,
    kv_lora_rank=512,
    key_length=192,
    value_length=128,
    rope_dim=64,
    rope_scaling="yarn",
    rope_factor=40.0,
    rope_orig_ctx=4096,
    yarn_log_mul=0.707,
    rope_attn_factor=1.0,
    yarn_beta_fast=32.0,
    yarn_beta_slow=1.0,
)
V2_LITE = SimpleNamespace(mla=MLA, rope_base=10_000.0)  # DeepSeek-V2-Lite's rope keys


def test_yarn_scales_of_deepseek_v2_lite():
    sc = mla.rope_scaling(V2_LITE)
    assert sc.freq_scale == pytest.approx(1 / 40) and sc.ext_factor == 1.0
    # mscale == mscale_all_dim: the magnitude factor cancels to 1 / (1 + 0.1 ln 40), which the
    # RoPE op multiplies back; the scores get mscale^2 / sqrt(Dk), mscale = 1 + 0.1 * 0.707 ln 40
    assert sc.attn_factor == pytest.approx(1 / (1 + 0.1 * math.log(40)), rel=1e-6)
    want = (1 + 0.1 * 0.707 * math.log(40)) ** 2 / math.sqrt(192)
    assert sc.kq_scale == pytest.approx(want, rel=1e-6)
    # correction dims: n_dims ln(n_ctx_orig / (2 pi beta)) / (2 ln base), floor / ceil
    low = math.floor(64 * math.log(4096 / (2 * math.pi * 32)) / (2 * math.log(10_000)))
    high = math.ceil(64 * math.log(4096 / (2 * math.pi * 1)) / (2 * math.log(10_000)))
    assert (sc.corr_low, sc.corr_high) == (low, min(63, high))


def yarn_tables_ref(positions, base, P, factor, low, high):
    """float64 YaRN angles: per pair i, a ramp from extrapolated (i < low) to interpolated
    (i > high) frequencies; magnitude 1 (the attn_factor cancels the YaRN gain)."""
    i = np.arange(P // 2)
    extrap = positions[:, None] * base ** (-2.0 * i / P)  # [T, P/2]
    ramp = 1 - np.clip((i - low) / max(0.001, high - low), 0, 1)  # [P/2]
    theta = extrap / factor * (1 - ramp) + extrap * ramp
    return np.cos(theta), np.sin(theta)


def test_yarn_rope_tables_match_the_formula():
    positions = np.array([0, 1, 7, 300, 4000], np.float32)
    cos, sin = mla.rope_tables(V2_LITE, positions)
    sc = mla.rope_scaling(V2_LITE)
    want_c, want_s = yarn_tables_ref(
        positions.astype(np.float64), 10_000.0, 64, 40.0, sc.corr_low, sc.corr_high
    )
    # float32 angles of up to 4000 radians: ~2e-4 absolute rounding in the angle
    np.testing.assert_allclose(cos, want_c, atol=5e-4)
    np.testing.assert_allclose(sin, want_s, atol=5e-4)
    # the ramp matters: pure interpolation gives other angles at the high-frequency end
    assert np.abs(np.cos(positions[-1] * 1.0 / 40) - cos[-1, 0]) > 0.1


def test_unscaled_rope_tables_are_the_plain_ones():
    spec = SimpleNamespace(mla=replace(MLA, rope_scaling="none", yarn_log_mul=0.0), rope_base=1e4)
    positions = np.arange(0, 50, dtype=np.float32)
    cos, sin = mla.rope_tables(spec, positions)
    want_c, want_s = ops.rope_tables(positions, 1e4, 64)
    np.testing.assert_array_equal(cos, want_c)
    np.testing.assert_array_equal(sin, want_s)
    assert mla.rope_scaling(spec).kq_scale == pytest.approx(1 / math.sqrt(192), rel=1e-7)


def test_rope_norm_on_a_strided_view_matches_reference():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((5, 3, 40)).astype(np.float32)  # [T, H, Dk]: RoPE on the last 16
    cos, sin = ops.rope_tables(np.arange(5, dtype=np.float32), 1e4, 16)
    want = ops.rope_norm_ref(q[:, :, 24:], cos, sin)
    before = q[:, :, :24].copy()
    ops.rope_norm(q[:, :, 24:], cos, sin)
    np.testing.assert_allclose(q[:, :, 24:], want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(q[:, :, :24], before)


# --- the block on the synthetic model --------------------------------------------------------


@pytest.fixture(scope="module")
def f32_model(llama_cpp):
    return open_model(build_model("tiny-deepseek2", qtype="F32", seed=0))


def run_block(engine, il: int, x: np.ndarray) -> np.ndarray:
    """The engine's MLA block on x [T, D] at positions n_past..; returns what it adds to x."""
    T = len(x)
    ws = engine.ws
    ws.x[:T] = x
    positions = np.arange(engine.n_past, engine.n_past + T, dtype=np.float32)
    engine._rope = mla.rope_tables(engine.spec, positions)
    mla.attention_block(engine, il, engine.weights.layers[il], T)
    engine.n_past += T
    return ws.x[:T] - x


@pytest.mark.parametrize("il", [0, 2])
def test_absorbed_block_matches_decompressed_reference(f32_model, il):
    model = f32_model
    engine = Engine(model, ResidentExperts(model), Workspace.allocate(model.spec, 64, 16), 64, 16)
    rng = np.random.default_rng(il)
    xs = rng.standard_normal((23, model.spec.n_embd)).astype(np.float32)  # [23, D]
    first = run_block(engine, il, xs[:16])  # a prefill ubatch, then 7 more tokens on the cache
    second = np.concatenate([run_block(engine, il, xs[16 + t : 17 + t]) for t in range(7)])
    want1 = mla.mla_block_ref(model, il, xs[:16], 0, xs[:0])
    want2 = mla.mla_block_ref(model, il, xs[16:], 16, xs[:16])
    for got, want in ((first, want1), (second, want2)):
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < 1e-5, f"block {il}: relative error {err:.2e}"
    # the cache holds R + P floats per token: the normed latent and the rotated RoPE key
    m = model.spec.mla
    assert engine.ws.kv_cache.shape[-1] == m.kv_lora_rank + m.rope_dim
    assert not engine.ws.kv_cache[engine.kv_row[il], 23:].any()


def test_plan_counts_the_compressed_cache(f32_model):
    spec = f32_model.spec
    m = spec.mla
    sizes = workspace_bytes(spec, 256, 32)
    assert "k_cache" not in sizes and "v_cache" not in sizes
    assert sizes["kv_cache"] == spec.n_layer * 256 * (m.kv_lora_rank + m.rope_dim) * 4
    plain = spec.n_layer * 256 * spec.n_head * (m.key_length + m.value_length) * 4
    assert plain / sizes["kv_cache"] == spec.n_head * (128 + 64) / (64 + 32)  # 8x smaller


def test_low_rank_query_matches_llama_cpp(llama_cpp):
    """DeepSeek-V2 (not Lite): the query through attn_q_a, attn_q_a_norm and attn_q_b."""
    from llama_support import llama_logits, random_tokens

    from sdq.synth.build import resolve_config

    cfg = resolve_config("tiny-deepseek2", q_lora_rank=96, n_layer=2)
    path = build_model(cfg, qtype="F32", seed=0)
    model = open_model(path)
    assert model.spec.mla.q_lora_rank == 96 and "blk.1.attn_q_b.weight" in model.tensors
    tokens = random_tokens(24, seed=6)
    want = llama_logits(path, tokens)
    engine = Engine(model, ResidentExperts(model), Workspace.allocate(model.spec, 32, 32), 32, 32)
    got = engine.forward(tokens, "all")
    err = np.abs(got - want).max(1) / np.abs(want).max(1)
    assert err.max() < 1e-5, f"worst position {err.argmax()}: {err.max():.2e}"
    assert (got.argmax(1) == want.argmax(1)).all()


def test_v3_routing_matches_llama_cpp(llama_cpp):
    """DeepSeek-V3-style routing on the same blocks: sigmoid scores, the exp_probs_b selection
    bias, 4 expert groups of which 2 are kept, renormalised weights times 2.5."""
    from llama_support import llama_logits, random_tokens

    from sdq.synth.build import resolve_config

    cfg = resolve_config(
        "tiny-deepseek2",
        n_layer=2,
        gating="sigmoid",
        n_expert_groups=4,
        n_group_used=2,
        expert_weights_norm=True,
        expert_weights_scale=2.5,
    )
    path = build_model(cfg, qtype="F32", seed=0)
    model = open_model(path)
    spec = model.spec
    assert (spec.expert_gating, spec.n_expert_groups, spec.n_group_used) == ("sigmoid", 4, 2)
    assert spec.norm_topk_prob and "blk.1.exp_probs_b.bias" in model.tensors
    tokens = random_tokens(24, seed=7)
    want = llama_logits(path, tokens)
    engine = Engine(model, ResidentExperts(model), Workspace.allocate(spec, 32, 32), 32, 32)
    got = engine.forward(tokens, "all")
    err = np.abs(got - want).max(1) / np.abs(want).max(1)
    assert err.max() < 1e-5, f"worst position {err.argmax()}: {err.max():.2e}"
    assert (got.argmax(1) == want.argmax(1)).all()


# --- refusals --------------------------------------------------------------------------------


def write_legacy(path):
    """A deepseek2 file as old converters wrote it: fused attn_kv_b, no *_mla keys."""
    w = GGUFWriter(path, "deepseek2")
    D, E, F, V = 32, 4, 32, 16
    w.add_block_count(1)
    w.add_embedding_length(D)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_kv_lora_rank(32)
    w.add_rope_dimension_count(16)
    w.add_expert_count(E)
    w.add_expert_used_count(2)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(V)])
    z = np.zeros
    w.add_tensor("token_embd.weight", z((V, D), np.float32))
    w.add_tensor("blk.0.attn_kv_b.weight", z((2 * 64, 32), np.float32))
    for part, shape in (("gate", (E, F, D)), ("up", (E, F, D)), ("down", (E, D, F))):
        w.add_tensor(f"blk.0.ffn_{part}_exps.weight", z(shape, np.float32))
    w.add_tensor("output_norm.weight", np.ones(D, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_legacy_fused_kv_b_is_refused_in_one_line(tmp_path):
    path = write_legacy(tmp_path / "legacy.gguf")
    model = open_model(path)
    assert model.spec.mla is None
    with pytest.raises(UnsupportedError, match="attn_kv_b"):
        Engine(model, None, Workspace.allocate(model.spec, 8, 8), 8, 8)
    chat = subprocess.run(
        [sys.executable, "-m", "sdq", "chat", "-m", str(path), "-p", "hi", "--resident"],
        capture_output=True,
        text=True,
    )
    assert chat.returncode == 2, chat.stderr
    assert len(chat.stderr.strip().splitlines()) == 1 and "attn_kv_b" in chat.stderr
