"""Prefill in ubatches, then decode token by token; per-token timing and the run's figures.

Figures (names as in DESIGN.md):
    prefill_tok_s   prompt tokens / prefill wall time
    ttft_ms         start of prefill -> first generated token sampled
    decode_tok_s    decode forward passes / their wall time (prefill excluded)
    total_ms_per_token, expert_io_ms_per_token, expert_compute_ms_per_token
                    decode wall time, time the compute waited for expert reads, and time in
                    expert matmuls, each per decode forward pass
    hit_rate        decode expert lookups served from the arena by bytes that an earlier
                    lookup had used / all decode lookups: arena hits only. A lookup served by
                    a prefetch's read is not a hit (sdq.paging.cache says what a hit is).
    prefetch_hit_rate  decode lookups served by a prefetch's read / all decode lookups
                    (1 - hit_rate - prefetch_hit_rate: lookups that read their expert then)
    prefetch_accuracy  decode prefetches a lookup used / decode prefetches (wrong guesses
                    are the rest; NaN when nothing was prefetched)
    guess_accuracy_dN  decode guesses N layers ahead (--prefetch-depth): the guessed experts
                    that their layer then routed to / experts guessed, counting those already
                    cached (which read nothing): how good the router's guess is at that
                    depth, apart from the cache. Present for each depth that guessed
    reads_avoided   1 - expert bytes read during decode / expert bytes an all-miss decode
                    would read (every lookup's expert bytes); prefetch reads, used or not,
                    count as reads. NaN for an expert source without byte counters
                    (ResidentExperts)
    ssd_mb_per_token  bytes read from the model file during decode (device bytes, O_DIRECT
                    rounding included; prefetch reads and wrong guesses included) / decode
                    forward passes
    prefetch_mb_per_token  the part of ssd_mb_per_token that prefetches read
    peak_rss_mb, swap_mb  from the OS (VmHWM and VmSwap of this process)
    prefill_hit_rate, prefill_ssd_mb  the same counts over the prefill (no prefetch runs there)
    forward_ms_per_token, no_read_ms_per_token, pager_ms_per_token
                    per decode pass: the forward pass's wall time, the part of it before the
                    first expert request and after the last release, and the time inside the
                    pager's calls (sdq.run.engine.Timers.marks; sdq.measure.ceiling)

The profile (`Generation.profile`, `sdq chat --profile`): ms per token per category of
sdq.run.engine.Timers, plus `other` (what no timer covered: embedding, output head, sampling,
Python between ops) and `total`, per phase. `other` is the wall time minus the timed
categories, so the categories add up to `total` in every run by construction. Medians over
runs do not add up; sdq.measure.experiments.summary.additive_breakdown scales them so
they do.

The first generated token comes from the prefill's logits; each later one needs a forward pass
of the token before it, so n generated tokens cost n - 1 decode passes (none when the first
token is a stop token or n = 1).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from sdq.errors import SdqError
from sdq.proc import memory_figures
from sdq.run.sampler import Sampler, SamplerSettings


@dataclass(frozen=True)
class GenerateSettings:
    n_predict: int = 64
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    stop_at_eos: bool = True


@dataclass
class Generation:
    prompt_ids: list[int]
    generated_ids: list[int]
    text: str
    figures: dict
    profile: dict  # phase -> category -> ms per token
    token_ms: list[float]  # wall time of each decode step (forward + sampling)


def generate(engine, tokenizer, prompt_ids, settings: GenerateSettings, on_text=None):
    """Run the prompt then sample up to n_predict tokens. on_text(str) receives the text as it
    is generated (whole UTF-8 characters only)."""
    steps = generation_steps(engine, tokenizer, prompt_ids, settings)
    while True:
        try:
            _, piece = next(steps)
        except StopIteration as done:
            return done.value
        if piece and on_text:
            on_text(piece)


def generation_steps(engine, tokenizer, prompt_ids, settings: GenerateSettings, keep_cache=False):
    """`generate` as a generator: yields (token id, text piece) for each generated token (a
    stop token's piece is ""; (None, piece) for text held back until the end) and returns the
    Generation. Closing it early stops between tokens; the KV cache then holds the prompt and
    every generated token but the last. With `keep_cache`, `prompt_ids` continue the sequence
    already in the KV cache instead of starting a new one."""
    prompt_ids = [int(t) for t in prompt_ids]
    n_prompt, n_ctx, n_ub = len(prompt_ids), engine.n_ctx, engine.n_ubatch
    if n_prompt == 0:
        raise SdqError("the prompt is empty (0 tokens)")
    n_past = engine.n_past if keep_cache else 0
    # the last generated token is never fed back, so the cache holds n_prompt + n - 1 tokens
    need = n_past + n_prompt + max(settings.n_predict, 1) - 1
    if need > n_ctx:
        held = f"{n_past} tokens in the KV cache + " if n_past else ""
        raise SdqError(
            f"context overflow: {held}prompt {n_prompt} tokens + -n {settings.n_predict}"
            f" needs {need} KV positions > context length {n_ctx} (-c)"
        )
    sampler = Sampler(settings.sampler)
    stops = tokenizer.stop_ids if settings.stop_at_eos else frozenset()
    stream = tokenizer.stream()
    if not keep_cache:
        engine.reset()

    # -- prefill --------------------------------------------------------------------------
    engine.phase = "prefill"
    timers0, io0 = engine.timers.snapshot(), _cache_stats(engine.experts)
    t_start = time.perf_counter()
    logits = None
    for i in range(0, n_prompt, n_ub):
        chunk = prompt_ids[i : i + n_ub]
        last = i + n_ub >= n_prompt
        logits = engine.forward(chunk, logits="last" if last else "none")
    t_prefill = time.perf_counter() - t_start
    generated = []
    texts = []
    tok = sampler(logits)
    ttft = time.perf_counter() - t_start
    timers1, io1 = engine.timers.snapshot(), _cache_stats(engine.experts)
    marks1, guesses1 = _marks(engine), _guesses(engine)

    # -- decode ---------------------------------------------------------------------------
    engine.phase = "decode"
    token_ms = []
    t_decode0 = time.perf_counter()
    while True:
        generated.append(tok)
        if tok in stops:
            yield tok, ""
            break
        piece = stream.push(tok)
        if piece:
            texts.append(piece)
        yield tok, piece
        if len(generated) >= settings.n_predict:
            break
        ts = time.perf_counter()
        logits = engine.forward([tok], logits="last")
        tok = sampler(logits)
        token_ms.append((time.perf_counter() - ts) * 1e3)
    t_decode = time.perf_counter() - t_decode0
    tail = stream.flush()
    if tail:
        texts.append(tail)
        yield None, tail
    timers2, io2 = engine.timers.snapshot(), _cache_stats(engine.experts)
    marks2, guesses2 = _marks(engine), _guesses(engine)

    n_decode = len(token_ms)
    nan = float("nan")
    per_tok = 1.0 / n_decode if n_decode else nan
    decode_timers = _delta(timers2, timers1)
    decode_io = _delta(io2, io1)
    decode_wall = sum(token_ms) / 1e3
    lookups = decode_io.get("lookups", 0)
    prefetches = decode_io.get("prefetches", 0)
    all_miss = decode_io.get("lookup_expert_bytes", 0)
    figures = {
        "n_prompt": n_prompt,
        "n_generated": len(generated),
        "n_decode": n_decode,
        "prefill_tok_s": n_prompt / t_prefill,
        "ttft_ms": ttft * 1e3,
        "decode_tok_s": n_decode / decode_wall if n_decode else float("nan"),
        "total_ms_per_token": decode_wall * 1e3 * per_tok,
        "expert_io_ms_per_token": decode_timers["io_wait"] * 1e3 * per_tok,
        "expert_compute_ms_per_token": decode_timers["expert_compute"] * 1e3 * per_tok,
        "hit_rate": decode_io.get("hits", 0) / lookups if lookups else float("nan"),
        "prefetch_hit_rate": decode_io.get("prefetch_hits", 0) / lookups if lookups else nan,
        "prefetch_accuracy": decode_io.get("prefetch_hits", 0) / prefetches if prefetches else nan,
        "reads_avoided": 1.0 - decode_io.get("expert_bytes_read", 0) / all_miss
        if all_miss
        else nan,
        "ssd_mb_per_token": decode_io.get("bytes_read", 0) / 1e6 * per_tok,
        "prefetch_mb_per_token": decode_io.get("prefetch_bytes_read", 0) / 1e6 * per_tok,
        "prefill_hit_rate": _ratio(_delta(io1, io0), "hits", "lookups"),
        "prefill_ssd_mb": _delta(io1, io0).get("bytes_read", 0) / 1e6,
        "decode_s": t_decode,
        **{f"{k}_ms_per_token": v * 1e3 * per_tok for k, v in _delta(marks2, marks1).items()},
        **_guess_accuracy(guesses2, guesses1),
        **memory_figures(),
    }
    profile = {
        "prefill": _per_token(_delta(timers1, timers0), t_prefill, n_prompt),
        "decode": _per_token(decode_timers, decode_wall, n_decode),
    }
    return Generation(prompt_ids, generated, "".join(texts), figures, profile, token_ms)


def _cache_stats(experts) -> dict:
    return dict(getattr(experts, "stats", {}) or {})


def _marks(engine) -> dict:
    """The engine's timer marks (sdq.run.engine.Timers.marks), {} for an engine without."""
    return dict(getattr(engine.timers, "marks", {}) or {})


def _guesses(engine) -> dict:
    """{depth: (experts guessed, of them routed)} so far (sdq.run.engine.Engine.guess_counts)."""
    return {d: tuple(c) for d, c in (getattr(engine, "guess_counts", None) or {}).items()}


def _guess_accuracy(after: dict, before: dict) -> dict:
    """guess_accuracy_d1, _d2 ...: per depth, the decode's guessed experts that their layer
    then routed to / experts guessed (depths that guessed nothing are left out)."""
    out = {}
    for d in sorted(after):
        guessed = after[d][0] - before.get(d, (0, 0))[0]
        routed = after[d][1] - before.get(d, (0, 0))[1]
        if guessed:
            out[f"guess_accuracy_d{d}"] = routed / guessed
    return out


def _delta(after: dict, before: dict) -> dict:
    return {
        k: v - before.get(k, 0) for k, v in after.items() if isinstance(v, (int, float, np.number))
    }


def _ratio(d: dict, num: str, den: str) -> float:
    return d.get(num, 0) / d[den] if d.get(den) else float("nan")


def _per_token(timers: dict, wall_s: float, n: int) -> dict:
    """ms per token per category; `other` also absorbs what no timer covered (sampling,
    Python between ops), so the categories add up to the wall time."""
    if n == 0:
        return {}
    ms = {k: v * 1e3 / n for k, v in timers.items()}
    covered = sum(v for k, v in ms.items() if k != "other")
    ms["other"] = wall_s * 1e3 / n - covered
    ms["total"] = wall_s * 1e3 / n
    return ms
