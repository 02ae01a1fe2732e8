"""Temporal locality of a decode's routing, and the seed's own figures it is measured against.

Dimension key: T decode tokens, L MoE layers, K experts per token, E experts per layer.
A `block` is one sequence's routing, int32 [T, L, K] (-1 = not recorded), as in
sdq.analysis.reuse. The four statistics are the ones seed 000 printed for its 48-token decode
of Qwen3.6-35B-A3B; `TARGETS` holds them with the tolerance a synthetic router must meet
(stated before any calibration; notebook 02 judges the calibrated router by them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sdq.analysis.reuse import only_once_fraction, union_saving

WINDOW = 48  # the seed's route log: 48 decode tokens
UNION_K = 4  # U(4): batches of 4 tokens
PIN_FRACTION = 0.2  # the seed's pin: its top 2048 of 40 x 256 (layer, expert) pairs


@dataclass(frozen=True)
class Target:
    """One of the seed's routing figures and the tolerance (absolute, same unit) around it."""

    value: float
    tolerance: float
    source: str  # where the seed states it
    meaning: str

    def holds(self, measured: float) -> bool:
        return abs(measured - self.value) <= self.tolerance


TARGETS = {
    "one_offs": Target(
        0.068, 0.02, "000 §4.3", f"requests whose (layer, expert) occurs once in {WINDOW} tokens"
    ),
    "u4_saving": Target(
        0.385, 0.05, "000 §4.2", f"expert reads saved by batches of {UNION_K} tokens, no cache"
    ),
    "hit_ceiling": Target(
        0.789, 0.05, "000 §6", "hit rate of an unlimited per-layer cache (first requests miss)"
    ),
    "pin_coverage": Target(
        0.545,
        0.05,
        "000 §4.4",
        "requests to a static pin of the top 20 % of (layer, expert) pairs (2048 of 10,240), "
        "ranked on other text",
    ),
}


def hit_ceiling(block: np.ndarray) -> float:
    """Hit rate of a cache that holds every expert once read: 1 - distinct / requests, per
    layer over the recorded requests."""
    distinct = requests = 0
    for j in range(block.shape[1]):
        ids = block[:, j, :]  # [T, K]
        ids = ids[ids >= 0]
        distinct += len(np.unique(ids))
        requests += ids.size
    return 1.0 - distinct / requests if requests else float("nan")


def pair_counts(blocks: list[np.ndarray], n_expert: int) -> np.ndarray:
    """float64 [L * E]: requests per (layer, expert) pair over the blocks, pair = l * E + e."""
    L = blocks[0].shape[1]
    counts = np.zeros(L * n_expert)
    for b in blocks:
        pairs = (b + n_expert * np.arange(L)[None, :, None])[b >= 0]  # [requests]
        counts += np.bincount(pairs, minlength=L * n_expert)
    return counts


def pin_coverage(
    block: np.ndarray, profile: list[np.ndarray], n_expert: int, fraction: float = PIN_FRACTION
) -> float:
    """Share of the block's requests that go to the `fraction` most requested (layer, expert)
    pairs of the `profile` blocks: a static pin ranked on other text, then used on this one
    (ties broken by pair id)."""
    ranking = pair_counts(profile, n_expert)
    pinned = np.argsort(-ranking, kind="stable")[: int(round(fraction * ranking.size))]
    counts = pair_counts([block], n_expert)
    return float(counts[pinned].sum() / counts.sum()) if counts.sum() else float("nan")


def locality(blocks: list[np.ndarray], n_expert: int) -> list[dict[str, float]]:
    """The four TARGETS statistics of each sequence's decode routing; a sequence's pin is ranked
    on all the other sequences (so at least two are needed)."""
    if len(blocks) < 2:
        raise ValueError(f"pin coverage ranks on the other sequences: need >= 2, got {len(blocks)}")
    return [
        {
            "one_offs": only_once_fraction([b], WINDOW),
            "u4_saving": union_saving([b], UNION_K),
            "hit_ceiling": hit_ceiling(b),
            "pin_coverage": pin_coverage(b, blocks[:i] + blocks[i + 1 :], n_expert),
        }
        for i, b in enumerate(blocks)
    ]
