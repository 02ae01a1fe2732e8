"""How often an expert comes back: reuse in a token window, U(k) unions, per-layer popularity.

Dimension key: T tokens, L MoE layers, K experts per token, E experts per layer.
Inputs are one sequence's routing `block` int32 [T, L, K] (-1 = not recorded). Every count
is per layer, over the tokens recorded for that layer, so traces with missing tokens
(Mixtral) are counted exactly.
"""

from __future__ import annotations

import numpy as np


def window_counts(block: np.ndarray, window: int) -> np.ndarray:
    """int64 [Q]: for each request, how often its (layer, expert) occurs in its window.

    Windows are consecutive, non-overlapping runs of `window` tokens of a layer's stream;
    the last window may be shorter.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out = []
    for j in range(block.shape[1]):
        g = block[:, j, :]  # [T, K]
        g = g[(g >= 0).any(axis=1)]
        for start in range(0, g.shape[0], window):
            ids = g[start : start + window]
            ids = ids[ids >= 0]
            counts = np.bincount(ids)
            out.append(counts[ids])
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def only_once_fraction(blocks: list[np.ndarray], window: int) -> float:
    """Fraction of requests whose (layer, expert) appears once in their W-token window."""
    counts = np.concatenate([window_counts(b, window) for b in blocks])
    return float((counts == 1).mean()) if counts.size else float("nan")


def reuse_histogram(blocks: list[np.ndarray], window: int, edges=(1, 2, 3, 5, 9, 17)) -> dict:
    """Share of requests by occurrences of their (layer, expert) in the window.

    Bins are [edges[i], edges[i+1]) and a last open bin; keys are labels like "1", "3-4", "17+".
    """
    counts = np.concatenate([window_counts(b, window) for b in blocks])
    out = {}
    for lo, hi in zip(edges, list(edges[1:]) + [None], strict=True):
        label = f"{lo}+" if hi is None else (str(lo) if hi == lo + 1 else f"{lo}-{hi - 1}")
        mask = counts >= lo if hi is None else (counts >= lo) & (counts < hi)
        out[label] = float(mask.mean()) if counts.size else float("nan")
    return out


def union_reads(block: np.ndarray, k: int) -> tuple[int, int]:
    """(reads with k-token batches, reads one token at a time) for one sequence, no cache.

    A batch of k consecutive tokens of a layer reads the union of their experts once.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    batched = single = 0
    for j in range(block.shape[1]):
        g = block[:, j, :]  # [T, K]
        g = g[(g >= 0).any(axis=1)]
        single += int((g >= 0).sum())
        for start in range(0, g.shape[0], k):
            ids = g[start : start + k]
            batched += len(np.unique(ids[ids >= 0]))
    return batched, single


def union_saving(blocks: list[np.ndarray], k: int) -> float:
    """1 - U(k) / U(1): the share of expert reads a k-token batch saves."""
    batched = single = 0
    for b in blocks:
        u, s = union_reads(b, k)
        batched += u
        single += s
    return 1.0 - batched / single if single else float("nan")


def layer_popularity(
    blocks: list[np.ndarray], n_expert: int, top: int, layer_ids=None
) -> list[dict]:
    """Per layer: distinct experts used, share of requests to the top-1 and top-`top` experts,
    and the entropy of the expert distribution relative to uniform (1.0 = uniform)."""
    if not blocks:
        return []
    n_layer = blocks[0].shape[1]
    rows = []
    for j in range(n_layer):
        ids = np.concatenate([b[:, j, :].ravel() for b in blocks])
        ids = ids[ids >= 0]
        counts = np.sort(np.bincount(ids, minlength=n_expert))[::-1]  # [E] descending
        total = counts.sum()
        p = counts[counts > 0] / total
        rows.append(
            {
                "layer": int(layer_ids[j]) if layer_ids is not None else j,
                "requests": int(total),
                "distinct": int((counts > 0).sum()),
                "top1_share": float(counts[0] / total),
                f"top{top}_share": float(counts[:top].sum() / total),
                "entropy_vs_uniform": float(-(p * np.log(p)).sum() / np.log(n_expert)),
            }
        )
    return rows
