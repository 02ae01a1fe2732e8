"""gpt-oss against llama.cpp on the synthetic `tiny-gptoss` model (4 blocks, 0 and 2 with a
16-token sliding window, attention sinks, q/k/v/o, router and expert biases, clamped SwiGLU,
YaRN x32): F32 logits and greedy continuation, MXFP4 experts (llama.cpp's MXFP4_MOE)
teacher-forced, paged against resident experts, the CLI under a budget, refusals."""

import json
import subprocess
import sys

import numpy as np
import pytest
from llama_support import N_UBATCH, TEXT, llama, llama_logits, random_tokens

from sdq.errors import UnsupportedError
from sdq.format.model import open_model
from sdq.format.tokenizer import Tokenizer
from sdq.paging.cache import ExpertCache
from sdq.run.engine import ResidentExperts
from sdq.run.engines import make_engine
from sdq.run.generate import GenerateSettings, generate
from sdq.run.gpt_oss import GptOssEngine, gpt_oss_settings
from sdq.run.plan import plan_for_slots
from sdq.run.sampler import SamplerSettings
from sdq.run.workspace import Workspace
from sdq.synth.build import build_model

PRESET = "tiny-gptoss"


def sdq_engine(path, n_ctx: int, experts=None, n_ubatch: int = N_UBATCH):
    model = open_model(path)
    ws = Workspace.allocate(model.spec, n_ctx, n_ubatch)
    experts = experts if experts is not None else ResidentExperts(model)
    return make_engine(model, experts, ws, n_ctx, n_ubatch)


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
def mxfp4_path(llama_cpp):
    return build_model(PRESET, qtype="MXFP4_MOE", seed=0)


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
    tokens = random_tokens(100, seed=1)  # two ubatches; windows of 16 slide well past 0
    want = llama_logits(f32_path, tokens)
    got = sdq_logits(sdq_engine(f32_path, len(tokens) + 8), tokens)
    err = per_position_error(got, want)
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


def test_mxfp4_experts_teacher_forcing(mxfp4_path):
    n = 260
    tokens = random_tokens(n, seed=2)
    got = sdq_logits(sdq_engine(mxfp4_path, n + 8), tokens)
    want = llama_logits(mxfp4_path, tokens)
    fa = llama(mxfp4_path, n + 8, flash_attn=True)  # llama.cpp again: K and V rounded to F16
    fa.eval(tokens)
    other = np.array(fa.scores[:n], dtype=np.float32)  # [T, V]
    err = per_position_error(got, want)
    agree = int((got.argmax(1) == want.argmax(1)).sum())
    self_agree = int((other.argmax(1) == want.argmax(1)).sum())
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
    tokens = random_tokens(32, seed=3)
    base = sdq_logits(sdq_engine(mxfp4_path, 64, n_ubatch=n_ubatch), tokens, n_ubatch)
    model = open_model(mxfp4_path)
    slots = model.spec.n_expert_used + 3  # < 2 x one layer's 4 experts: chunks and evictions
    assert slots < 2 * model.spec.n_expert_used
    with ExpertCache(model, plan_for_slots(model, slots)) as cache:
        got = sdq_logits(sdq_engine(mxfp4_path, 64, cache, n_ubatch), tokens, n_ubatch)
        stats = cache.stats
    assert np.array_equal(got, base)
    assert stats["misses"] > 0 and stats["evictions"] > 0


def test_chat_under_a_budget_exits_0(mxfp4_path):
    def sdq(*args):
        return subprocess.run(
            [sys.executable, "-m", "sdq", *args], capture_output=True, text=True, timeout=120
        )

    plan = sdq("plan", str(mxfp4_path), "--ram-budget-mb", "1", "--reserve-mb", "0")
    assert plan.returncode == 2 and len(plan.stderr.strip().splitlines()) == 1
    minimum = float(plan.stderr.split("minimum budget ")[1].split(" MB")[0])
    budget = minimum + 1  # the process (~290 MB) dominates it: a 97 MB file cannot be undercut
    chat = sdq(
        "chat", "-m", str(mxfp4_path), "-p", "Hello there", "-n", "8",
        "--ram-budget-mb", f"{budget:.1f}", "--reserve-mb", "0", "--json",
    )  # fmt: skip
    assert chat.returncode == 0, chat.stderr
    out = json.loads(chat.stdout)
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
