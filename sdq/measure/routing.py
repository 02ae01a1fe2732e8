"""The routing of a model's greedy decodes over a prompt set, read back from the engine's own
route log, and its temporal locality (sdq.analysis.locality): what notebook 02 calibrates the
synthetic router with and what the locality test checks.

Dimension key: T decode tokens, L MoE layers, K experts per token.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from sdq.analysis.locality import locality
from sdq.analysis.readers import read_trace
from sdq.analysis.tables import engine_source
from sdq.format.model import open_model


def decode_blocks(model_path, prompts: list[str], tokens: int, threads: int) -> list[np.ndarray]:
    """Per prompt, the decode's routing int32 [T, L, K]: one greedy generation of `tokens`
    tokens (EOS ignored) per prompt, each in a fresh engine, so T = tokens - 1 (the first token
    comes from the prompt pass)."""
    from sdq.run.runtime import Model
    from sdq.run.sampler import SamplerSettings
    from sdq.run.settings import RunSettings

    n_expert = open_model(model_path).spec.n_expert
    blocks = []
    with tempfile.TemporaryDirectory(prefix="sdq-routes-") as tmp:
        for i, prompt in enumerate(prompts):
            log = Path(tmp) / f"prompt{i}.jsonl"
            settings = RunSettings(
                model=str(model_path),
                threads=threads,
                n_predict=tokens,
                sampler=SamplerSettings(temp=0.0),
                stop_at_eos=False,
                route_log=str(log),
            )
            with Model(settings) as m:
                m.generate(prompt, n=tokens)
            trace = read_trace(log, "engine", n_expert=n_expert)
            blocks.append(engine_source(trace, f"prompt {i}").blocks()[0])  # [T, L, K]
    return blocks


def decode_locality(model_path, prompts: list[str], tokens: int, threads: int) -> list[dict]:
    """One row per prompt: the four locality statistics (sdq.analysis.locality.TARGETS) of its
    greedy decode, the pin ranked on the other prompts' decodes."""
    blocks = decode_blocks(model_path, prompts, tokens, threads)
    n_expert = open_model(model_path).spec.n_expert
    return [{"prompt": i, **row} for i, row in enumerate(locality(blocks, n_expert))]
