"""sdq against llama.cpp with every weight in RAM (`sdq bench resident MODEL`).

Both engines get the same GGUF file, the same prompt token ids, the same thread count, ubatch
and number of generated tokens (greedy, EOS ignored). They run alternately (sdq first on even
repeats, llama.cpp first on odd ones) in this one process, after one warm-up each (Numba
compilation, first touch of the weights), and the medians over repeats are reported.

Timing is the same wall clock for both: prefill = evaluating the prompt (ubatches of -b
tokens) up to its last logits; decode = n - 1 single-token forward passes plus the argmax that
picks each next token. sdq's experts come from `ResidentExperts` (all in RAM), so the number
compares compute, not paging.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import TYPE_CHECKING

from sdq.measure.llama_ref import LLAMA_SETTINGS_NOTE, open_llama

if TYPE_CHECKING:
    from sdq.run.settings import RunSettings

DEFAULT_PROMPT = (
    "The storage hierarchy of a computer has three levels that matter here: the CPU caches, "
    "main memory and the solid-state disk. Explain in a few sentences how a program that is "
    "larger than main memory can still run quickly, and what limits its speed."
)


def compare_resident(
    settings: RunSettings, prompt: str = DEFAULT_PROMPT, *, repeats: int = 3
) -> dict:
    """Medians of `repeats` alternating runs of sdq and llama.cpp (prefill and decode tok/s,
    each engine's list of runs, and the sdq/llama.cpp ratios). Of `settings` the model, its
    lengths (n_predict, n_ctx, n_ubatch) and threads count: sdq runs resident, greedy, EOS
    ignored, as llama.cpp does here."""
    from sdq.errors import ParamsError
    from sdq.run.sampler import SamplerSettings
    from sdq.run.session import Session

    n_predict = settings.n_predict
    if n_predict < 2 or repeats < 1:
        raise ParamsError(f"-n {n_predict} must be >= 2 and -r {repeats} >= 1")
    settings = dataclasses.replace(
        settings, sampler=SamplerSettings(temp=0.0), stop_at_eos=False, resident=True
    )
    model, threads, ubatch = settings.model, settings.threads, settings.n_ubatch
    session = Session(settings)
    ids = session.tokenizer.encode(prompt)
    llama = LlamaRunner(model, settings.n_ctx, ubatch, threads)

    def sdq_once() -> dict:
        g = session.generate(ids)
        f = g.figures
        return {"prefill_tok_s": f["prefill_tok_s"], "decode_tok_s": f["decode_tok_s"]}

    def llama_once() -> dict:
        return llama.measure(ids, n_predict)

    runners = {"sdq": sdq_once, "llama.cpp": llama_once}
    for fn in runners.values():  # warm-up, not measured
        fn()
    samples: dict[str, list[dict]] = {name: [] for name in runners}
    for r in range(repeats):
        order = list(runners) if r % 2 == 0 else list(reversed(runners))
        for name in order:
            samples[name].append(runners[name]())
    session.close()

    result = {
        "model": str(model),
        "n_prompt": len(ids),
        "n_predict": n_predict,
        "threads": threads,
        "ubatch": ubatch,
        "repeats": repeats,
        "llama_settings": LLAMA_SETTINGS_NOTE,
    }
    for name, rows in samples.items():
        for key in ("prefill_tok_s", "decode_tok_s"):
            result[f"{name}_{key}"] = statistics.median(row[key] for row in rows)
            result[f"{name}_{key}_all"] = [row[key] for row in rows]
    for key in ("prefill_tok_s", "decode_tok_s"):
        result[f"ratio_{key}"] = result[f"sdq_{key}"] / result[f"llama.cpp_{key}"]
    return result


class LlamaRunner:
    """llama.cpp (llama-cpp-python) on the same file: prefill, then greedy decode."""

    def __init__(self, path: str, n_ctx: int, n_ubatch: int, threads: int):
        import llama_cpp

        self.lib = llama_cpp
        self.llm = open_llama(path, n_ctx=n_ctx, n_ubatch=n_ubatch, threads=threads)
        self.n_vocab = self.llm.n_vocab()

    def last_logits(self):
        import numpy as np

        ptr = self.lib.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def measure(self, ids: list[int], n_predict: int) -> dict:
        import numpy as np

        llm = self.llm
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        tok = int(np.argmax(self.last_logits()))  # as sdq: the first token is not timed
        t_first = time.perf_counter()
        for _ in range(n_predict - 1):
            llm.eval([tok])
            tok = int(np.argmax(self.last_logits()))
        t2 = time.perf_counter()
        return {
            "prefill_tok_s": len(ids) / (t1 - t0),
            "decode_tok_s": (n_predict - 1) / (t2 - t_first),
        }
