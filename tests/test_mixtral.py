"""llama with experts (Mixtral): the normal RoPE kernel against its reference, then the engine
against llama.cpp on the synthetic `tiny-mixtral` model (8 experts top-2, no Q/K norms,
adjacent-pair RoPE) in both expert layouts (3-D ffn_*_exps tensors and one 2-D tensor per
expert), paged against resident experts, and the CLI on it.
"""

import json

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
    sdq_logits,
    teacher_forced_logits,
)
from gguf.constants import GGUFValueType
from gguf_builders import Layout, write_model
from llama_support import N_UBATCH, llama, random_tokens

from sdq.errors import UnsupportedError
from sdq.format.model import anatomy, open_model
from sdq.kernels import ops
from sdq.run.engine import Engine, ResidentExperts
from sdq.run.workspace import Workspace
from sdq.synth.build import build_model

PRESET, LEGACY = "tiny-mixtral", "tiny-mixtral-legacy"
STR, F32 = GGUFValueType.STRING, GGUFValueType.FLOAT32


f32_path = model_fixture(PRESET, "F32", "f32_path")
q4_path = model_fixture(PRESET, "Q4_K_M", "q4_path")


@pytest.fixture(scope="module")
def q4_legacy_path(llama_cpp, q4_path):
    return build_model(LEGACY, qtype="Q4_K_M", seed=0)


# --- kernel against its reference -----------------------------------------------------------


def test_rope_norm_matches_reference_and_differs_from_neox():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3, 16)).astype(np.float32)  # [T, H, Dh]
    cos, sin = ops.rope_tables(np.arange(7, 12, dtype=np.float32), 10_000.0, 16)  # [T, 8]
    want = ops.rope_norm_ref(x, cos, sin)
    got = x.copy()
    ops.rope_norm(got, cos, sin)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # each adjacent pair keeps its length; NeoX pairs (i, i + 8) would give other values
    np.testing.assert_allclose(
        np.hypot(got[..., 0::2], got[..., 1::2]), np.hypot(x[..., 0::2], x[..., 1::2]), rtol=1e-5
    )
    assert np.abs(ops.rope_neox_ref(x, cos, sin) - want).max() > 0.1


# --- the file --------------------------------------------------------------------------------


def test_info_shows_a_llama_moe_without_qk_norms(q4_path, q4_legacy_path):
    info = anatomy(open_model(q4_path))
    spec = info["spec"]
    assert spec["arch"] == "llama" and spec["rope_neox"] is False
    assert (spec["n_expert"], spec["n_expert_used"], spec["norm_topk_prob"]) == (8, 2, True)
    assert not any("attn_q_norm" in n for n in open_model(q4_path).tensors)
    assert info["experts"]["moe_layers"] == 2 and info["dense_bytes"] > 0
    legacy = anatomy(open_model(q4_legacy_path))
    # same experts, same bytes: only the tensor directory differs
    assert legacy["experts"]["segments"][0]["nbytes"] == info["experts"]["segments"][0]["nbytes"]
    assert legacy["routed_expert_bytes"] == info["routed_expert_bytes"]
    assert legacy["n_tensors"] == info["n_tensors"] + 2 * 3 * (8 - 1)
    assert "blk.1.ffn_down.7.weight" in open_model(q4_legacy_path).tensors


def test_synth_arch_flag_picks_the_preset(q4_path, capsys):
    from sdq.cli import main

    assert main(["synth", "--arch", "llama", "--qtype", "Q4_K_M", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["path"] == str(q4_path) and out["preset"] == PRESET and out["cached"]
    assert main(["synth", "--arch", "granitemoe", "--preset", PRESET]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a llama model, not granitemoe" in err


# --- against llama.cpp ----------------------------------------------------------------------


def test_engine_matches_llama_cpp_f32(f32_path):
    err, ours, theirs = f32_logits_error(f32_path, 100)  # two ubatches of 64 on both sides
    # F32 weights and activations: only float rounding differs
    assert err.max() < 1e-5
    assert (ours == theirs).all()


def test_f32_greedy_continuation_identical(f32_path):
    ours, theirs, n_prompt = greedy_both(f32_path, 32)
    assert n_prompt > N_UBATCH and ours == theirs


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K_M"])
def test_quantized_teacher_forcing(llama_cpp, qtype):
    got, want = teacher_forced_logits(build_model(PRESET, qtype=qtype, seed=0), 260)
    agree = int((got.argmax(1) == want.argmax(1)).sum())
    # Both engines convert activations to the same 8-bit blocks; now and then a last-bit
    # difference in a float sum moves an activation across a rounding boundary, and that
    # position and the later ones attending to it move by up to ~1 % of the largest logit.
    # Measured top-1 agreement: 259/260 (Q8_0), 260/260 (Q4_K_M).
    assert agree >= 0.99 * len(got), f"top-1 agreement {agree}/{len(got)}"


def test_legacy_layout_gives_the_merged_logits(q4_path, q4_legacy_path):
    """One 2-D tensor per expert: the same bytes at other offsets, so the same logits as the
    merged file, which test_quantized_teacher_forcing checks against llama.cpp. (llama.cpp
    itself no longer loads the per-expert layout: it requires ffn_*_exps.)"""
    tokens = random_tokens(40, seed=5)
    merged = sdq_logits(sdq_engine(q4_path, 48, n_ubatch=16), tokens, 16)
    legacy = sdq_logits(sdq_engine(q4_legacy_path, 48, n_ubatch=16), tokens, 16)
    assert np.array_equal(legacy, merged)
    with pytest.raises(ValueError, match="Failed to load model"):
        llama(q4_legacy_path, 16)


# --- paging, CLI ----------------------------------------------------------------------------


@pytest.mark.parametrize("layout, n_ubatch", [("merged", 1), ("merged", 16), ("legacy", 16)])
def test_paged_experts_give_the_resident_logits(q4_path, q4_legacy_path, layout, n_ubatch):
    path = q4_path if layout == "merged" else q4_legacy_path
    # K + 1 slots < 2 x one layer's 2 used experts: evicts
    base, got, stats, slots = paged_and_resident(path, n_ubatch, extra_slots=1)
    assert slots < 2 * open_model(path).spec.n_expert_used
    assert np.array_equal(got, base)
    assert stats["misses"] > 0 and stats["evictions"] > 0


def test_chat_under_a_budget_exits_0(q4_path):
    chat, budget = chat_under_budget(q4_path)
    # the process itself (Python, Numba: ~300 MB) is most of the minimum, so the budget is
    # above this small file's size; the arena still holds fewer experts than the model has
    out = chat_summary(chat)
    assert out["n_generated"] == 8
    spec = open_model(q4_path).spec
    assert out["slots"] < spec.n_layer * spec.n_expert  # the experts are paged, not all held
    assert out["expert_cache"]["misses"] > 0


LINEAR_X4 = {"llama.rope.scaling.type": ("linear", STR), "llama.rope.scaling.factor": (4.0, F32)}


@pytest.mark.parametrize(
    "extra_kv, extra_tensors, what",
    [
        ({}, {"rope_freqs.weight": ((8,), "F32")}, "RoPE frequency factors"),
        (LINEAR_X4, {}, "RoPE scaling 'linear' x4.0"),
    ],
)
def test_unsupported_rope_is_refused_in_one_line(tmp_path, extra_kv, extra_tensors, what):
    from gguf.constants import GGMLQuantizationType as Q

    tensors = {name: (shape, Q[q]) for name, (shape, q) in extra_tensors.items()}
    lay = Layout(arch="llama", extra_kv=extra_kv, extra_tensors=tensors)
    path, _ = write_model(tmp_path / "m.gguf", lay)
    model = open_model(path)
    with pytest.raises(UnsupportedError, match=what):
        Engine(model, ResidentExperts(model), Workspace.allocate(model.spec, 8, 8), 8, 8)
