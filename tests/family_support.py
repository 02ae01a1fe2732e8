"""What the MoE family test modules (qwen3moe's parity, qwen35moe, mixtral, granitemoe,
qwen2moe, olmoe, glm4moe, deepseek2, gpt-oss) run on their synthetic presets: the model files
per qtype, the engine against llama.cpp (F32 logits, greedy continuation, quantized teacher
forcing, llama.cpp with flash attention as its own second opinion), paged against resident
experts, and `sdq chat` under a RAM budget below the file size."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from llama_support import N_UBATCH, TEXT, llama_greedy, llama_logits, random_tokens

from sdq.format.model import open_model
from sdq.format.tokenizer import Tokenizer
from sdq.paging.cache import ExpertCache
from sdq.run.engine import ResidentExperts
from sdq.run.engines import make_engine
from sdq.run.generate import GenerateSettings, generate
from sdq.run.plan import plan_for_slots
from sdq.run.sampler import SamplerSettings
from sdq.run.workspace import Workspace
from sdq.synth.build import build_model


def model_fixture(preset: str, qtype: str, name: str):
    """A module-scoped fixture `name`: the preset's synthetic file in qtype (seed 0), built
    once llama.cpp is known to be importable."""

    @pytest.fixture(scope="module", name=name)
    def path(llama_cpp):
        return build_model(preset, qtype=qtype, seed=0)

    return path


def sdq_engine(path, n_ctx: int, experts=None, n_ubatch: int = N_UBATCH):
    """The engine for the file's architecture (gpt-oss's or the common one), every expert
    resident unless `experts` is given."""
    model = open_model(path)
    ws = Workspace.allocate(model.spec, n_ctx, n_ubatch)
    experts = experts if experts is not None else ResidentExperts(model)
    return make_engine(model, experts, ws, n_ctx, n_ubatch)


def sdq_logits(engine, tokens, n_ubatch: int = N_UBATCH) -> np.ndarray:
    parts = [
        engine.forward(tokens[i : i + n_ubatch], "all") for i in range(0, len(tokens), n_ubatch)
    ]
    return np.concatenate(parts)  # [T, V]


def per_position_error(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """max |difference| over the vocabulary / max |llama.cpp logit|, per position [T]."""
    return np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)


def f32_logits_error(path, n: int = 100) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(per-position error [n], sdq top-1 [n], llama.cpp top-1 [n]) over two ubatches."""
    tokens = random_tokens(n, seed=1)
    want = llama_logits(path, tokens)
    got = sdq_logits(sdq_engine(path, n + 8), tokens)
    return per_position_error(got, want), got.argmax(1), want.argmax(1)


def greedy_both(path, n: int = 32) -> tuple[list[int], list[int], int]:
    """(sdq's, llama.cpp's) greedy continuations of TEXT, and the prompt length."""
    tok = Tokenizer.from_gguf(path)
    prompt = tok.encode(TEXT)
    engine = sdq_engine(path, len(prompt) + n)
    settings = GenerateSettings(n_predict=n, sampler=SamplerSettings(temp=0.0), stop_at_eos=False)
    ours = generate(engine, tok, prompt, settings).generated_ids
    return list(ours), llama_greedy(path, prompt, n), len(prompt)


def teacher_forced_logits(path, n: int = 260) -> tuple[np.ndarray, np.ndarray]:
    """(sdq's, llama.cpp's) logits [n, V] of the same n tokens."""
    tokens = random_tokens(n, seed=2)
    got = sdq_logits(sdq_engine(path, n + 8), tokens)
    return got, llama_logits(path, tokens)


def teacher_forced(path, n: int = 260) -> tuple[float, np.ndarray]:
    """(top-1 agreement with llama.cpp, per-position error [n]) on the same n tokens."""
    got, want = teacher_forced_logits(path, n)
    return float((got.argmax(1) == want.argmax(1)).mean()), per_position_error(got, want)


def teacher_forced_three_ways(path, n: int = 260) -> tuple[np.ndarray, int, int]:
    """sdq against llama.cpp on the same n tokens, and llama.cpp against itself with flash
    attention (attention summed in another order, K and V rounded to F16): (per-position error
    of sdq [n], positions where sdq's top-1 is llama.cpp's, positions where flash attention's
    top-1 is llama.cpp's)."""
    got, want = teacher_forced_logits(path, n)
    other = llama_logits(path, random_tokens(n, seed=2), flash_attn=True)
    top1 = want.argmax(1)
    agree, self_agree = int((got.argmax(1) == top1).sum()), int((other.argmax(1) == top1).sum())
    return per_position_error(got, want), agree, self_agree


def paged_and_resident(
    path, n_ubatch: int, extra_slots: int = 3, n_tokens: int = 40
) -> tuple[np.ndarray, np.ndarray, dict, int]:
    """Logits of n_tokens tokens with every expert resident and with an arena of
    K + extra_slots slots: (resident, paged, the cache's stats, slots)."""
    tokens = random_tokens(n_tokens, seed=3)
    base = sdq_logits(sdq_engine(path, 64, n_ubatch=n_ubatch), tokens, n_ubatch)
    model = open_model(path)
    slots = model.spec.n_expert_used + extra_slots
    with ExpertCache(model, plan_for_slots(model, slots)) as cache:
        got = sdq_logits(sdq_engine(path, 64, cache, n_ubatch), tokens, n_ubatch)
        stats = cache.stats
    return base, got, stats, slots


def chat_under_budget(path, timeout=None) -> tuple[subprocess.CompletedProcess, float]:
    """`sdq chat` with the plan's minimum budget + 1 MB (no reserve); (the run, budget MB).
    The chat measures its own process, which can be a MB or two larger than the planning
    one: when it states a higher minimum, the run is repeated at that minimum + 1 MB (at most
    three times)."""
    plan = subprocess.run(
        [sys.executable, "-m", "sdq", "plan", str(path), "--ram-budget-mb", "1"]
        + ["--reserve-mb", "0"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert plan.returncode == 2 and len(plan.stderr.strip().splitlines()) == 1, plan.stderr
    minimum = float(plan.stderr.split("minimum budget ")[1].split(" MB")[0])
    for _ in range(3):
        budget = minimum + 1
        chat = subprocess.run(
            [sys.executable, "-m", "sdq", "chat", "-m", str(path), "-p", "Hello there", "-n", "8"]
            + ["--ram-budget-mb", f"{budget:.1f}", "--reserve-mb", "0", "--json"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if chat.returncode != 2 or "minimum budget " not in chat.stderr:
            break
        minimum = float(chat.stderr.split("minimum budget ")[1].split(" MB")[0])
    return chat, budget


def chat_summary(chat: subprocess.CompletedProcess) -> dict:
    assert chat.returncode == 0, chat.stderr
    return json.loads(chat.stdout)
