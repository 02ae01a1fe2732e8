"""gpt-oss against llama.cpp on the synthetic `tiny-gptoss` model (4 blocks, 0 and 2 with a
16-token sliding window, attention sinks, q/k/v/o, router and expert biases, clamped SwiGLU,
YaRN x32): F32 logits and greedy continuation, MXFP4 experts (llama.cpp's MXFP4_MOE)
teacher-forced, paged against resident experts, the CLI under a budget, refusals."""

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
    teacher_forced_three_ways,
)
from llama_support import N_UBATCH

from sdq.errors import UnsupportedError
from sdq.format.model import open_model
from sdq.run.gpt_oss import GptOssEngine, gpt_oss_settings

PRESET = "tiny-gptoss"


f32_path = model_fixture(PRESET, "F32", "f32_path")
mxfp4_path = model_fixture(PRESET, "MXFP4_MOE", "mxfp4_path")


def test_file_has_the_gpt_oss_anatomy(mxfp4_path):
    from gguf.constants import GGMLQuantizationType as Q

    model = open_model(mxfp4_path)
    spec, table = model.spec, model.experts
    assert spec.arch == "gpt-oss" and spec.n_expert == 16 and spec.n_expert_used == 4
    assert {int(q) for q in np.asarray(table.qtypes).reshape(-1)} == {int(Q.MXFP4)}
    assert model.tensors["blk.0.attn_q.weight"].qtype == Q.Q8_0
    assert "blk.0.ffn_gate_exps.bias" in model.tensors  # resident, not an expert segment
    settings = gpt_oss_settings(model)
    assert settings.sliding_window == 16 and settings.swa_layers == frozenset({0, 2})
    assert settings.rope.ext_factor == 1.0 and settings.rope.freq_scale == 1 / 32
    assert isinstance(sdq_engine(mxfp4_path, 16), GptOssEngine)


def test_engine_matches_llama_cpp_f32(f32_path):
    # two ubatches; windows of 16 slide well past 0
    err, ours, theirs = f32_logits_error(f32_path, 100)
    assert err.max() < 1e-4, f"worst position {err.argmax()}: {err.max():.2e}"
    assert (ours == theirs).all()


def test_f32_greedy_continuation_identical(f32_path):
    ours, theirs, n_prompt = greedy_both(f32_path, 32)
    assert n_prompt > N_UBATCH and ours == theirs


def test_mxfp4_experts_teacher_forcing(mxfp4_path):
    n = 260
    # self_agree: llama.cpp against itself with flash attention, K and V rounded to F16
    err, agree, self_agree = teacher_forced_three_ways(mxfp4_path, n)
    # MXFP4 experts and Q8_0 matrices multiply Q8_0 activations in both engines, so positions
    # agree to float32 rounding (measured 1.3e-7 of the largest logit) until a last-bit
    # difference (a product's float sums in another order) moves an activation across a Q8_0
    # rounding boundary (measured: first at position 23). The full-attention blocks carry
    # that position's K/V to every later token, which then ends ~1 % of the largest logit
    # apart (median 1.2e-2): top-1 flips where the top two nearly tie. llama.cpp does the
    # same against itself: with flash attention it agrees with its own top-1 on 247/260
    # positions (median 1.8e-2 apart), so 99 % is out of reach here; sdq measured 255/260.
    # (Across ubatch sizes 13 and 64 llama.cpp agrees with itself exactly, as sdq does.)
    assert err[:16].max() < 1e-5, f"early positions differ: {err[:16].max():.2e}"
    assert self_agree < 0.99 * n, f"llama.cpp agrees with itself on {self_agree}/{n}"
    assert agree >= max(0.97 * n, self_agree), f"top-1 agreement {agree}/{n} ({self_agree})"


@pytest.mark.parametrize("n_ubatch", [1, 16])
def test_paged_experts_give_the_resident_logits(mxfp4_path, n_ubatch):
    # K + 3 slots < 2 x one layer's 4 experts: chunks and evictions
    base, got, stats, slots = paged_and_resident(mxfp4_path, n_ubatch, n_tokens=32)
    assert slots < 2 * open_model(mxfp4_path).spec.n_expert_used
    assert np.array_equal(got, base)
    assert stats["misses"] > 0 and stats["evictions"] > 0


def test_chat_under_a_budget_exits_0(mxfp4_path):
    chat, budget = chat_under_budget(mxfp4_path, timeout=120)
    # budget = minimum + 1: the process (~290 MB) dominates it: a 97 MB file cannot be undercut
    out = chat_summary(chat)
    assert out["n_generated"] == 8
    assert out["expert_cache"]["misses"] > 0
    assert out["slots"] < 4 * open_model(mxfp4_path).spec.n_expert


def test_unsupported_rope_scaling_is_one_line(f32_path):
    from sdq.commands.info import cannot_run

    model = open_model(f32_path)
    assert cannot_run(model) is None
    model.metadata["gpt-oss.rope.scaling.type"] = "longrope"
    with pytest.raises(UnsupportedError, match="longrope"):
        gpt_oss_settings(model)


def test_the_plan_counts_a_ring_for_the_windowed_layers(mxfp4_path):
    from sdq.run.workspace import swa_ring, workspace_bytes

    spec = open_model(mxfp4_path).spec
    C, T, W = 4096, 64, spec.sliding_window
    kv = {k: b for k, b in workspace_bytes(spec, C, T).items() if k.endswith("cache")}
    row = spec.n_head_kv * spec.head_dim * 4  # bytes of one position's K (or V) in one layer
    assert swa_ring(spec, C, T) == W + T - 1 == 79
    # blocks 1 and 3 keep every position, blocks 0 and 2 the last W + T - 1
    assert kv == {
        "k_cache": 2 * C * row,
        "v_cache": 2 * C * row,
        "swa_k_cache": 2 * 79 * row,
        "swa_v_cache": 2 * 79 * row,
    }
    assert swa_ring(spec, 32, T) == 32  # a context shorter than the ring: the context
