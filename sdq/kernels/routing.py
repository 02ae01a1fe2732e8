"""Expert routers beyond softmax-top-K: sigmoid (or softmax) scores with a selection bias and
group-limited top-K (GLM-4.5, DeepSeek-V2/V3), with a Numba kernel and its NumPy reference.

Dimension key: T tokens, E experts, K experts used per token, Gn expert groups (E / Gn experts
each), Gu groups kept per token.

Per token, as ggml's graph for these routers computes it:
    p = sigmoid(logits) or softmax(logits)   # [E] the scores that weight the experts
    s = p + bias                             # [E] selection scores (exp_probs_b); p unchanged
    if Gn > 1: each group's score is the sum of its two largest s; all experts outside the Gu
               best groups are excluded from the selection
    ids = the K largest s (descending)       # [K]
    w = p[ids]                               # [K]
    if renorm: w /= max(sum(w), 2^-14)       # the sum in float64, rounded to float32
    w *= scale                               # expert_weights_scale (1: unchanged)

sigmoid(x) = 1 / (1 + exp(-x)) in float32, as ggml; softmax as sdq.kernels.ops.softmax_topk
(ops.softmax_row: ggml's exponentials, their sum in float64, one float32 reciprocal). Plain
softmax top-K without bias or groups stays with ops.softmax_topk.
"""

from __future__ import annotations

import math

import numpy as np

from sdq.kernels.jit import kernel
from sdq.kernels.ops import softmax_row

GATING_SOFTMAX = "softmax"
GATING_SIGMOID = "sigmoid"
# llama.cpp's llama_expert_gating_func_type values (`{arch}.expert_gating_func`)
GATING_BY_CODE = {1: GATING_SOFTMAX, 2: GATING_SIGMOID}
MIN_WEIGHT_SUM = np.float32(6.103515625e-5)  # ggml clamps the sum to the smallest F16 normal


@kernel
def _route_topk(logits, sigmoid, bias, K, n_group, n_group_used, renorm, scale, ids, weights):
    T, E = logits.shape
    p = np.empty(E, np.float32)
    s = np.empty(E, np.float32)
    taken = np.empty(E, np.bool_)
    per_group = E // n_group if n_group > 1 else E
    group_score = np.empty(max(n_group, 1), np.float32)
    group_kept = np.empty(max(n_group, 1), np.bool_)
    one = np.float32(1.0)
    for t in range(T):
        if sigmoid:
            for e in range(E):
                p[e] = one / (one + np.float32(math.exp(-logits[t, e])))
        else:
            m = np.float32(-np.inf)
            for e in range(E):
                m = max(m, logits[t, e])
            inv = softmax_row(logits[t], m, p)
            for e in range(E):
                p[e] *= inv
        for e in range(E):
            s[e] = p[e] + bias[e]
            taken[e] = False
        if n_group > 1:
            for g in range(n_group):  # sum of the group's two largest selection scores
                a = -1
                b = -1
                for e in range(g * per_group, (g + 1) * per_group):
                    if a < 0 or s[e] > s[a]:
                        b = a
                        a = e
                    elif b < 0 or s[e] > s[b]:
                        b = e
                top2 = np.float64(s[a])
                if b >= 0:
                    top2 += np.float64(s[b])
                group_score[g] = np.float32(top2)
                group_kept[g] = False
            for _ in range(n_group_used):
                best = -1
                for g in range(n_group):
                    if not group_kept[g] and (best < 0 or group_score[g] > group_score[best]):
                        best = g
                group_kept[best] = True
            for e in range(E):
                if not group_kept[e // per_group]:
                    taken[e] = True  # outside the kept groups: never selected
        wsum = 0.0  # float64, as ggml's row sum
        for k in range(K):
            best = -1
            for e in range(E):
                if not taken[e] and (best < 0 or s[e] > s[best]):
                    best = e
            taken[best] = True
            ids[t, k] = best
            weights[t, k] = p[best]
            wsum += np.float64(p[best])
        if renorm:
            total = max(np.float32(wsum), MIN_WEIGHT_SUM)
            for k in range(K):
                weights[t, k] = weights[t, k] / total
        if scale != one:
            for k in range(K):
                weights[t, k] = weights[t, k] * scale


def route_topk(
    logits: np.ndarray,
    gating: str,
    bias: np.ndarray | None,
    K: int,
    renorm: bool,
    scale: float,
    ids_out: np.ndarray,
    w_out: np.ndarray,
    n_group: int = 0,
    n_group_used: int = 0,
) -> None:
    """Router logits [T, E] -> ids_out [T, K] (integer), w_out [T, K] (float32).

    gating: "sigmoid" or "softmax" scores. bias [E] (or None) shifts the selection only; with
    n_group > 1 the selection is limited to the n_group_used groups of E / n_group consecutive
    experts whose two best scores sum highest.
    """
    if gating not in (GATING_SIGMOID, GATING_SOFTMAX):
        raise ValueError(f"expert gating {gating!r}")
    E = logits.shape[1]
    b = np.zeros(E, np.float32) if bias is None else np.ascontiguousarray(bias, np.float32)
    if n_group > 1 and (E % n_group or not 0 < n_group_used <= n_group):
        raise ValueError(f"{E} experts in {n_group} groups, {n_group_used} used")
    _route_topk(
        logits,
        gating == GATING_SIGMOID,
        b,
        K,
        int(n_group),
        int(n_group_used),
        bool(renorm),
        np.float32(scale),
        ids_out,
        w_out,
    )


def route_topk_ref(
    logits: np.ndarray,
    gating: str,
    bias: np.ndarray | None,
    K: int,
    renorm: bool,
    scale: float,
    n_group: int = 0,
    n_group_used: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """NumPy statement of route_topk: returns ids [T, K], weights [T, K] float32."""
    x = logits.astype(np.float32)
    if gating == GATING_SIGMOID:
        p = (np.float32(1.0) / (np.float32(1.0) + np.exp(-x))).astype(np.float32)  # [T, E]
    else:
        z = np.exp(x - x.max(axis=1, keepdims=True))  # [T, E] float32
        p = (z * np.float32(1.0 / z.astype(np.float64).sum(axis=1, keepdims=True))).astype(
            np.float32
        )
    s = p + (np.float32(0.0) if bias is None else bias.astype(np.float32))  # [T, E]
    T, E = s.shape
    if n_group > 1:
        grouped = s.reshape(T, n_group, E // n_group)  # [T, Gn, E/Gn]
        top2 = -np.sort(-grouped, axis=2)[:, :, :2].astype(np.float64).sum(axis=2)  # [T, Gn]
        keep = np.argsort(-top2.astype(np.float32), axis=1, kind="stable")[:, :n_group_used]
        mask = np.ones((T, n_group), bool)
        np.put_along_axis(mask, keep, False, axis=1)
        s = np.where(np.repeat(mask, E // n_group, axis=1), -np.inf, s)
    ids = np.argsort(-s, axis=1, kind="stable")[:, :K]  # [T, K]
    w = np.take_along_axis(p, ids, axis=1)  # [T, K]
    if renorm:
        total = w.astype(np.float64).sum(axis=1, keepdims=True).astype(np.float32)
        w = w / np.maximum(total, MIN_WEIGHT_SUM)
    if scale != 1.0:
        w = w * np.float32(scale)
    return ids, w.astype(np.float32)
