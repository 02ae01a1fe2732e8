"""Transformer ops for the qwen3moe forward pass, as Numba kernels with NumPy references.

Dimension key: T tokens, D hidden, H query heads, Hkv KV heads, Dh head dim, G = H / Hkv,
C KV-cache positions, E experts, K experts used per token.

Arithmetic follows ggml's CPU ops where it matters for agreement with llama.cpp:
- rms_norm: sum of squares in float64, mean and 1/sqrt in float32, then times the weight;
- softmax: exponentials in float32, their sum in float64, one float32 reciprocal;
- router: softmax over all E experts, the K largest, optionally divided by their sum;
- silu(x) = x / (1 + exp(-x)).

Every op writes into caller-owned arrays (the engine's workspace); nothing allocates per call
except attention's per-head score rows.
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from sdq.kernels.jit import FLOAT_MATH, kernel

# ---------------------------------------------------------------------------------------
# RMSNorm


@kernel  # no fastmath: bit-exact with ggml (a reassociated product moves Q8_0 roundings)
def _rms_norm(x, w, eps, out):  # x, out [N, D]; w [D]
    N, D = x.shape
    for n in range(N):
        ss = 0.0  # float64 accumulator, as ggml
        for i in range(D):
            v = x[n, i]
            ss += np.float64(v * v)  # the square rounded to float32 first, as ggml does
        mean = np.float32(ss / D)
        scale = np.float32(1.0) / np.float32(math.sqrt(mean + np.float32(eps)))
        for i in range(D):
            out[n, i] = (x[n, i] * scale) * w[i]


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> None:
    """out = x / sqrt(mean(x^2) + eps) * weight over the last axis; x, out [..., D] (may alias)."""
    D = x.shape[-1]
    _rms_norm(x.reshape(-1, D), weight, np.float32(eps), out.reshape(-1, D))


def rms_norm_ref(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    ss = np.einsum("...i,...i->...", x.astype(np.float64), x.astype(np.float64))
    mean = (ss / x.shape[-1]).astype(np.float32)
    scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
    return (x * scale[..., None]) * weight


# ---------------------------------------------------------------------------------------
# RoPE, NEOX style (qwen3): dimension i is rotated with dimension i + Dh/2.


def rope_tables(positions: np.ndarray, freq_base: float, Dh: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [T, Dh/2] float32 for rope_neox, computed as ggml's rope cache does:
    theta_0 = pos, theta_(i+1) = theta_i * base^(-2/Dh) in float32, then cos/sin of theta."""
    half = Dh // 2
    step = np.float32(freq_base) ** np.float32(-2.0 / Dh)
    theta = np.empty((len(positions), half), dtype=np.float32)
    theta[:, 0] = np.asarray(positions, dtype=np.float32)
    for i in range(1, half):
        theta[:, i] = theta[:, i - 1] * step
    return np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)


@kernel(fastmath=FLOAT_MATH)
def _rope_neox(x, cos, sin):  # x [T, H, Dh] in place; cos, sin [T, Dh/2]
    T, H, Dh = x.shape
    half = Dh // 2
    for t in range(T):
        for h in range(H):
            for i in range(half):
                x0 = x[t, h, i]
                x1 = x[t, h, i + half]
                x[t, h, i] = x0 * cos[t, i] - x1 * sin[t, i]
                x[t, h, i + half] = x0 * sin[t, i] + x1 * cos[t, i]


def rope_neox(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> None:
    """Rotate every head of x [T, H, Dh] in place by the angles in cos, sin [T, Dh/2]."""
    _rope_neox(x, cos, sin)


def rope_neox_ref(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    c, s = cos[:, None, :], sin[:, None, :]
    x0, x1 = x[..., :half], x[..., half:]
    return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)


# RoPE, normal style (llama, granitemoe): dimension 2i is rotated with dimension 2i + 1, by the
# same angles as rope_neox (rope_tables).


@kernel(fastmath=FLOAT_MATH)
def _rope_norm(x, cos, sin):  # x [T, H, Dh] in place; cos, sin [T, Dh/2]
    T, H, Dh = x.shape
    for t in range(T):
        for h in range(H):
            for i in range(Dh // 2):
                x0 = x[t, h, 2 * i]
                x1 = x[t, h, 2 * i + 1]
                x[t, h, 2 * i] = x0 * cos[t, i] - x1 * sin[t, i]
                x[t, h, 2 * i + 1] = x0 * sin[t, i] + x1 * cos[t, i]


def rope_norm(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> None:
    """Rotate adjacent pairs (2i, 2i+1) of every head of x [T, H, Dh] in place."""
    _rope_norm(x, cos, sin)


def rope_norm_ref(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    c, s = cos[:, None, :], sin[:, None, :]  # [T, 1, Dh/2]
    x0, x1 = x[..., 0::2], x[..., 1::2]  # [T, H, Dh/2] each
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


# ---------------------------------------------------------------------------------------
# Attention over a KV cache (causal, grouped-query)


@kernel(parallel=True, fastmath=FLOAT_MATH)
def _attention(q, k_cache, v_cache, p0, Hkv, scale, out):
    T, H, Dh = q.shape
    G = H // Hkv
    for h in prange(H):
        c0 = (h // G) * Dh  # this head's KV columns
        s = np.empty(p0 + T, np.float32)
        o = np.empty(Dh, np.float32)
        for t in range(T):
            n = p0 + t + 1  # positions this token sees
            qh = q[t, h]  # [Dh]
            smax = np.float32(-np.inf)
            for j in range(n):
                kj = k_cache[j, c0 : c0 + Dh]  # [Dh] view: loop indices >= 0, so LLVM
                acc = np.float32(0.0)  # vectorizes (no negative-index fix-up per element)
                for i in range(Dh):
                    acc += qh[i] * kj[i]
                acc *= scale
                s[j] = acc
                smax = max(smax, acc)
            total = 0.0
            for j in range(n):
                e = np.float32(math.exp(s[j] - smax))
                s[j] = e
                total += e
            inv = np.float32(1.0 / total)
            o[:] = 0
            for j in range(n):
                p = s[j] * inv
                vj = v_cache[j, c0 : c0 + Dh]  # [Dh]
                for i in range(Dh):
                    o[i] += p * vj[i]
            for i in range(Dh):
                out[t, h, i] = o[i]


def attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    p0: int,
    Hkv: int,
    scores: np.ndarray | None,
    out: np.ndarray,
    scale: float | None = None,
) -> None:
    """Causal GQA attention of T new tokens at positions p0..p0+T-1.

    q [T, H, Dh]; k_cache, v_cache [C, Hkv*Dh] already holding positions 0..p0+T-1;
    out [T, H, Dh]. Query head h reads KV head h // (H/Hkv); scores scaled by `scale`
    (default 1/sqrt(Dh); granitemoe's attention.scale).
    ``scores`` is accepted for the NumPy version's signature and not used (each head keeps
    its own score row).
    """
    T, H, Dh = q.shape
    if H % Hkv:
        raise ValueError(f"{H} query heads are not a multiple of {Hkv} KV heads")
    if k_cache.shape[0] < p0 + T:
        raise ValueError(f"KV cache holds {k_cache.shape[0]} positions, {p0 + T} needed")
    kq_scale = np.float32(1.0 / math.sqrt(Dh)) if scale is None else np.float32(scale)
    _attention(q, k_cache, v_cache, p0, Hkv, kq_scale, out)


def attention_ref(q, k_cache, v_cache, p0: int, Hkv: int, scale=None) -> np.ndarray:
    T, H, Dh = q.shape
    scale = 1.0 / math.sqrt(Dh) if scale is None else float(scale)
    G = H // Hkv
    n = p0 + T
    out = np.empty_like(q)
    causal = np.arange(n)[None, :] > (p0 + np.arange(T))[:, None]  # [T, n]
    for h in range(H):
        kv = h // G
        keys = k_cache[:n, kv * Dh : (kv + 1) * Dh].astype(np.float64)  # [n, Dh]
        vals = v_cache[:n, kv * Dh : (kv + 1) * Dh].astype(np.float64)
        s = q[:, h, :].astype(np.float64) @ keys.T * scale  # [T, n]
        s[causal] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[:, h, :] = p @ vals
    return out


# ---------------------------------------------------------------------------------------
# Router: softmax over experts, top-K, renormalisation


@kernel(fastmath=FLOAT_MATH)
def _softmax_topk(logits, K, renorm, ids, weights):
    T, E = logits.shape
    p = np.empty(E, np.float32)
    for t in range(T):
        m = np.float32(-np.inf)
        for e in range(E):
            m = max(m, logits[t, e])
        total = 0.0
        for e in range(E):
            v = np.float32(math.exp(logits[t, e] - m))
            p[e] = v
            total += v
        inv = np.float32(1.0 / total)
        for e in range(E):
            p[e] *= inv
        # top-K by repeated selection (K is small): largest first, lowest index on ties
        wsum = np.float32(0.0)
        for k in range(K):
            best = -1
            for e in range(E):
                if p[e] >= 0 and (best < 0 or p[e] > p[best]):
                    best = e
            ids[t, k] = best
            weights[t, k] = p[best]
            wsum += p[best]
            p[best] = -1.0  # taken
        if renorm:
            for k in range(K):
                weights[t, k] = weights[t, k] / wsum


def softmax_topk(
    logits: np.ndarray, K: int, renorm: bool, ids_out: np.ndarray, w_out: np.ndarray
) -> None:
    """Per token: softmax over E experts, the K most probable (descending) into ids_out [T, K]
    (integer) and their probabilities into w_out [T, K], divided by their sum if renorm."""
    _softmax_topk(logits, K, renorm, ids_out, w_out)


def softmax_topk_ref(logits: np.ndarray, K: int, renorm: bool):
    z = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    ids = np.argsort(-p, axis=1, kind="stable")[:, :K]  # [T, K]
    w = np.take_along_axis(p, ids, axis=1)
    if renorm:
        w /= w.sum(axis=1, keepdims=True)
    return ids, w.astype(np.float32)


# ---------------------------------------------------------------------------------------
# SiLU-gated expert activation


@kernel(fastmath=FLOAT_MATH)
def _silu_mul(gate, up):  # flat views, in place into gate
    for i in range(gate.size):
        g = gate[i]
        gate[i] = g / (np.float32(1.0) + np.float32(math.exp(-g))) * up[i]


def silu_mul(gate: np.ndarray, up: np.ndarray) -> None:
    """gate = silu(gate) * up, in place (any shape, C-contiguous)."""
    _silu_mul(gate.reshape(-1), up.reshape(-1))


def silu_mul_ref(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    g = gate.astype(np.float64)
    return (g / (1.0 + np.exp(-g)) * up).astype(np.float32)
