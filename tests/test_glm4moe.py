"""glm4moe (GLM-4.5 layout) on the synthetic `tiny-glm4moe` model: 1 dense-FFN block, 2 MoE blocks
(16 experts in 4 groups, sigmoid router with selection bias, 2 groups and 4 experts per token,
weights renormalised and scaled 1.5, one ungated shared expert), q/k/v biases, partial NeoX
RoPE over 32 of 64 dims, and 1 MTP block that is listed but not run. The engine against
llama.cpp, paged against resident experts, the CLI under a budget, the anatomy and the plan.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
from llama_support import N_UBATCH, TEXT, llama, llama_logits, random_tokens

from sdq.format.model import anatomy, open_model
from sdq.format.tokenizer import Tokenizer
from sdq.paging.cache import ExpertCache
from sdq.run.engine import Engine, ResidentExperts
from sdq.run.generate import GenerateSettings, generate
from sdq.run.plan import plan_for_slots
from sdq.run.sampler import SamplerSettings
from sdq.run.workspace import Workspace, workspace_bytes
from sdq.synth.build import build_model

PRESET = "tiny-glm4moe"


def sdq_engine(path, n_ctx: int, experts=None, n_ubatch: int = N_UBATCH):
    model = open_model(path)
    ws = Workspace.allocate(model.spec, n_ctx, n_ubatch)
    experts = experts if experts is not None else ResidentExperts(model)
    return Engine(model, experts, ws, n_ctx, n_ubatch)


def sdq_logits(engine, tokens, n_ubatch: int = N_UBATCH) -> np.ndarray:
    parts = [
        engine.forward(tokens[i : i + n_ubatch], "all") for i in range(0, len(tokens), n_ubatch)
    ]
    return np.concatenate(parts)  # [T, V]


def per_position_error(got, want) -> np.ndarray:
    return np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)


@pytest.fixture(scope="module")
def f32_path(llama_cpp):
    return build_model(PRESET, qtype="F32", seed=0)


@pytest.fixture(scope="module")
def q4_path(llama_cpp):
    return build_model(PRESET, qtype="Q4_K_M", seed=0)


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
    tok = Tokenizer.from_gguf(f32_path)
    prompt = tok.encode(TEXT)
    n = 32
    engine = sdq_engine(f32_path, len(prompt) + n)
    settings = GenerateSettings(n_predict=n, sampler=SamplerSettings(temp=0.0), stop_at_eos=False)
    ours = generate(engine, tok, prompt, settings).generated_ids
    llm = llama(f32_path, len(prompt) + n)
    llm.eval(prompt)
    theirs = []
    for _ in range(n):
        theirs.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval(theirs[-1:])
    assert len(prompt) > N_UBATCH and ours == theirs


@pytest.mark.parametrize("qtype, bar", [("Q8_0", 0.97), ("Q4_K_M", 0.975)])
def test_quantized_teacher_forcing(llama_cpp, qtype, bar):
    path = build_model(PRESET, qtype=qtype, seed=0)
    n = 260
    tokens = random_tokens(n, seed=2)
    got = sdq_logits(sdq_engine(path, n + 8), tokens)
    want = llama_logits(path, tokens)
    fa = llama(path, n + 8, flash_attn=True)  # llama.cpp again, attention sums in another order
    fa.eval(tokens)
    other = np.array(fa.scores[:n], dtype=np.float32)  # [T, V]
    err = per_position_error(got, want)
    agree = (got.argmax(1) == want.argmax(1)).mean()
    self_agree = (other.argmax(1) == want.argmax(1)).mean()
    # Both engines convert activations to 8-bit blocks as ggml does and agree to float32
    # rounding until a last-bit difference moves an activation across a rounding boundary
    # (measured: first at position 25 for Q8_0, 12 for Q4_K_M). In this model such an event
    # does not stay local: attention spreads it to later tokens, whose 8-bit activations and
    # sigmoid expert groups then flip in turn, and about half of the later positions end ~1 %
    # of the largest logit apart, which flips top-1 where the top two nearly tie. llama.cpp
    # does the same against itself: with flash attention (the same weights, attention summed
    # in another order) it agrees with its own top-1 on 246/260 (Q8_0) and 239/260 (Q4_K_M)
    # positions, so 99 % is out of reach here; sdq measured 254/260 and 256/260. (Across
    # ubatch sizes 16 and 64 llama.cpp agrees with itself exactly.)
    assert err[:12].max() < 1e-4, f"early positions differ: {err[:12].max():.2e}"
    assert self_agree < 0.99, f"llama.cpp agrees with itself on {self_agree:.3f}"
    assert agree >= max(bar, self_agree), (
        f"top-1 agreement {agree:.3f} (llama.cpp {self_agree:.3f})"
    )


# --- paging, CLI ----------------------------------------------------------------------------


@pytest.mark.parametrize("n_ubatch", [1, 16])
def test_paged_experts_give_the_resident_logits(q4_path, n_ubatch):
    tokens = random_tokens(40, seed=3)
    base = sdq_logits(sdq_engine(q4_path, 64, n_ubatch=n_ubatch), tokens, n_ubatch)
    model = open_model(q4_path)
    K = model.spec.n_expert_used
    slots = K + 3  # < 2 x one layer's K used experts: acquires in chunks, evicts
    assert slots < 2 * K
    with ExpertCache(model, plan_for_slots(model, slots)) as cache:
        got = sdq_logits(sdq_engine(q4_path, 64, cache, n_ubatch), tokens, n_ubatch)
        stats = cache.stats
    assert np.array_equal(got, base)
    assert stats["misses"] > 0 and stats["evictions"] > 0


def test_chat_under_a_budget_exits_0(q4_path):
    plan = subprocess.run(
        [sys.executable, "-m", "sdq", "plan", str(q4_path), "--ram-budget-mb", "1"]
        + ["--reserve-mb", "0"],
        capture_output=True,
        text=True,
    )
    assert plan.returncode == 2 and len(plan.stderr.strip().splitlines()) == 1
    minimum = float(plan.stderr.split("minimum budget ")[1].split(" MB")[0])
    # a few slots: far fewer than the model's 32 experts (the process itself, with Numba and
    # the 150k-token vocabulary, is larger than this 67 MB file, so no budget below it runs)
    budget = minimum + 1
    chat = subprocess.run(
        [sys.executable, "-m", "sdq", "chat", "-m", str(q4_path), "-p", "Hello there", "-n", "8"]
        + ["--ram-budget-mb", f"{budget:.1f}", "--reserve-mb", "0", "--json"],
        capture_output=True,
        text=True,
    )
    assert chat.returncode == 0, chat.stderr
    out = json.loads(chat.stdout)
    assert out["n_generated"] == 8
    assert out["slots"] < 2 * open_model(q4_path).spec.n_expert
    assert out["expert_cache"]["misses"] > 0
