"""Checks that the qwen2moe and olmoe test modules run on their synthetic presets: the engine
against llama.cpp (F32 logits, greedy continuation, quantized teacher forcing), paged against
resident experts, and `sdq chat` under a RAM budget below the file size."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from llama_support import N_UBATCH, TEXT, llama, llama_logits, random_tokens

from sdq.format.model import open_model
from sdq.format.tokenizer import Tokenizer
from sdq.paging.cache import ExpertCache
from sdq.run.engine import Engine, ResidentExperts
from sdq.run.generate import GenerateSettings, generate
from sdq.run.plan import plan_for_slots
from sdq.run.sampler import SamplerSettings
from sdq.run.workspace import Workspace


def sdq_engine(path, n_ctx: int, experts=None, n_ubatch: int = N_UBATCH) -> Engine:
    model = open_model(path)
    ws = Workspace.allocate(model.spec, n_ctx, n_ubatch)
    experts = experts if experts is not None else ResidentExperts(model)
    return Engine(model, experts, ws, n_ctx, n_ubatch)


def sdq_logits(engine: Engine, tokens, n_ubatch: int = N_UBATCH) -> np.ndarray:
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
    llm = llama(path, len(prompt) + n)
    llm.eval(prompt)
    theirs = []
    for _ in range(n):
        theirs.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval(theirs[-1:])
    return list(ours), theirs, len(prompt)


def teacher_forced(path, n: int = 260) -> tuple[float, np.ndarray]:
    """(top-1 agreement with llama.cpp, per-position error [n]) on the same n tokens."""
    tokens = random_tokens(n, seed=2)
    got = sdq_logits(sdq_engine(path, n + 8), tokens)
    want = llama_logits(path, tokens)
    return float((got.argmax(1) == want.argmax(1)).mean()), per_position_error(got, want)


def paged_and_resident(path, n_ubatch: int) -> tuple[np.ndarray, np.ndarray, dict, int]:
    """Logits of 40 tokens with every expert resident and with an arena of K + 3 slots (fewer
    than two layers' K experts): (resident, paged, the cache's stats, slots)."""
    tokens = random_tokens(40, seed=3)
    base = sdq_logits(sdq_engine(path, 64, n_ubatch=n_ubatch), tokens, n_ubatch)
    model = open_model(path)
    slots = model.spec.n_expert_used + 3
    with ExpertCache(model, plan_for_slots(model, slots)) as cache:
        got = sdq_logits(sdq_engine(path, 64, cache, n_ubatch), tokens, n_ubatch)
        stats = cache.stats
    return base, got, stats, slots


def chat_under_budget(path) -> tuple[subprocess.CompletedProcess, float]:
    """`sdq chat` with the plan's minimum budget + 1 MB (no reserve); (the run, budget MB)."""
    plan = subprocess.run(
        [sys.executable, "-m", "sdq", "plan", str(path), "--ram-budget-mb", "1"]
        + ["--reserve-mb", "0"],
        capture_output=True,
        text=True,
    )
    assert plan.returncode == 2 and len(plan.stderr.strip().splitlines()) == 1, plan.stderr
    minimum = float(plan.stderr.split("minimum budget ")[1].split(" MB")[0])
    budget = minimum + 1
    chat = subprocess.run(
        [sys.executable, "-m", "sdq", "chat", "-m", str(path), "-p", "Hello there", "-n", "8"]
        + ["--ram-budget-mb", f"{budget:.1f}", "--reserve-mb", "0", "--json"],
        capture_output=True,
        text=True,
    )
    return chat, budget


def chat_summary(chat: subprocess.CompletedProcess) -> dict:
    assert chat.returncode == 0, chat.stderr
    return json.loads(chat.stdout)
