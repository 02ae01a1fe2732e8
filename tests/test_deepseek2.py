"""deepseek2 against llama.cpp on the synthetic `tiny-deepseek2` model (DeepSeek-V2-Lite's
shape, small: MLA with a 64-dim latent and 32 RoPE dims of 128 query/key dims, YaRN x4, the
first block dense, 16 experts top-4 plus 2 shared, routed weights x1.5): llama.cpp loads it,
F32 logits and greedy continuation, quantized teacher forcing, paged against resident
experts, the anatomy `sdq info` shows, and chat under a budget.
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
from sdq.run.workspace import Workspace
from sdq.synth.build import build_model

PRESET = "tiny-deepseek2"


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
    tokens = random_tokens(72, seed=1)  # two ubatches of 64 on both sides
    want = llama_logits(f32_path, tokens)
    got = sdq_logits(sdq_engine(f32_path, len(tokens) + 8), tokens)
    err = per_position_error(got, want)
    # F32 weights and activations everywhere: only float rounding differs
    assert err.max() < 1e-4, f"worst position {err.argmax()}: {err.max():.2e}"
    assert (got.argmax(1) == want.argmax(1)).all()


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


@pytest.mark.parametrize("qtype, bar", [("Q8_0", 0.98), ("Q4_K_M", 0.96)])
def test_quantized_teacher_forcing(llama_cpp, qtype, bar):
    path = build_model(PRESET, qtype=qtype, seed=0)
    n = 260
    tokens = random_tokens(n, seed=2)
    got = sdq_logits(sdq_engine(path, n + 8), tokens)
    want = llama_logits(path, tokens)
    fa = llama(path, n + 8, flash_attn=True)  # llama.cpp again: K and V rounded to F16
    fa.eval(tokens)
    other = np.array(fa.scores[:n], dtype=np.float32)  # [T, V]
    err = per_position_error(got, want)
    agree = (got.argmax(1) == want.argmax(1)).mean()
    self_agree = (other.argmax(1) == want.argmax(1)).mean()
    # Both engines convert activations to 8-bit blocks as ggml does and agree to float32
    # rounding (measured 1.4e-7 and 3.7e-7 of the largest logit) until a last-bit difference
    # moves an activation across a rounding boundary (measured: first at position 43 for
    # Q8_0, 29 for Q4_K_M; from 73 on for Q8_0 every later position, through the attention
    # to the cache). Afterwards positions end ~1-2 % of the largest logit apart (median
    # 1.3e-2 and 2.0e-2), which flips top-1 where the top two nearly tie. llama.cpp does the
    # same against itself: with flash attention it agrees with its own top-1 on 249/260
    # (Q8_0) and 249/260 (Q4_K_M) positions (median 1.8e-2 and 2.6e-2 apart), so 99 % is out
    # of reach here; sdq measured 255/260 and 250/260. (Across ubatch sizes 64 and 1 both
    # llama.cpp and sdq agree with themselves exactly.)
    assert err[:16].max() < 1e-5, f"early positions differ: {err[:16].max():.2e}"
    assert self_agree < 0.99, f"llama.cpp agrees with itself on {self_agree:.3f}"
    assert agree >= max(bar, self_agree), f"top-1 agreement {agree:.3f} ({self_agree:.3f})"


@pytest.mark.parametrize("n_ubatch", [1, 16])
def test_paged_experts_give_the_resident_logits(q4_path, n_ubatch):
    tokens = random_tokens(24, seed=3)
    base = sdq_logits(sdq_engine(q4_path, 64, n_ubatch=n_ubatch), tokens, n_ubatch)
    model = open_model(q4_path)
    spec = model.spec
    slots = spec.n_expert_used + 3  # < 2 x one layer's 4 used experts: chunks and evictions
    assert slots < 2 * 2 * spec.n_expert_used
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
    budget = minimum + 1  # a few slots: far fewer than the model's 48 experts
    chat = subprocess.run(
        [sys.executable, "-m", "sdq", "chat", "-m", str(q4_path), "-p", "Hello there"]
        + ["-n", "8", "--ram-budget-mb", f"{budget:.1f}", "--reserve-mb", "0", "--json"],
        capture_output=True,
        text=True,
    )
    assert chat.returncode == 0, chat.stderr
    out = json.loads(chat.stdout)
    assert out["n_generated"] == 8
    assert out["slots"] < 3 * open_model(q4_path).spec.n_expert
    assert out["expert_cache"]["misses"] > 0
