"""Choosing the next token from logits: greedy, or temperature with top-k / top-p, seeded.

Order of the filters (as in llama.cpp's default chain): top-k, then top-p on the renormalised
top-k probabilities, then temperature, then a draw from a seeded generator. `temp <= 0` is greedy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sdq.errors import ParamsError


@dataclass(frozen=True)
class SamplerSettings:
    temp: float = 0.0  # <= 0: greedy (argmax)
    top_k: int = 40  # <= 0: all tokens
    top_p: float = 0.95  # 1.0: no nucleus filter
    seed: int = 0

    def __post_init__(self):
        if not 0.0 < self.top_p <= 1.0:
            raise ParamsError(f"--top-p {self.top_p} must be in (0, 1]")


class Sampler:
    def __init__(self, settings: SamplerSettings):
        self.settings = settings
        self.rng = np.random.default_rng(settings.seed)

    def __call__(self, logits: np.ndarray) -> int:  # logits [V]
        s = self.settings
        if s.temp <= 0.0:
            return int(np.argmax(logits))
        ids = _top_k_ids(logits, s.top_k)  # [k] sorted by logit, descending
        z = logits[ids].astype(np.float64)
        if s.top_p < 1.0:
            p = _softmax(z)
            keep = int(np.searchsorted(np.cumsum(p), s.top_p) + 1)  # smallest set with mass >= p
            ids, z = ids[:keep], z[:keep]
        p = _softmax(z / s.temp)
        return int(ids[self.rng.choice(len(ids), p=p)])


def _top_k_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest logits, largest first (ties: lower id first)."""
    n = logits.shape[0]
    if k <= 0 or k >= n:
        return np.argsort(-logits, kind="stable")
    part = np.argpartition(-logits, k - 1)[:k]
    return part[np.lexsort((part, -logits[part]))]


def _softmax(z: np.ndarray) -> np.ndarray:
    p = np.exp(z - z.max())
    return p / p.sum()
