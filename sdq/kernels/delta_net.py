"""Gated delta-net ("linear attention") ops of qwen35moe: Numba kernels, NumPy references.

Dimension key: T tokens, C conv channels, Kc conv taps, Hk key heads, Hv value heads
(a multiple of Hk; value head h reads key head h % Hk, as ggml tiles them), S head dim of q, k
and v (the state is S x S per value head).

One delta-net block, per token t and value head h (ggml's gated_delta_net):

    S_h <- exp(g_t,h) * S_h                       decay (g < 0)
    d   <- beta_t,h * (v_t,h - S_h k_t,h)          what the state gets wrong about v
    S_h <- S_h + d k_t,h^T                         delta-rule write
    o   <- S_h q_t,h / sqrt(S)

with q, k L2-normalized per head, beta = sigmoid(x W_beta), g = softplus(x W_alpha + dt_bias) * a
(a = -exp(A_log) < 0). Before that, q/k/v pass a causal depthwise conv of Kc taps (the last
Kc-1 inputs are the conv state) and SiLU; after it, a gated RMS norm: rms_norm(o) * silu(z).

Kernels (float32, caller-owned outputs; each `*_ref` is the float64 statement it is tested
against): causal_conv_silu, l2_norm_heads, gated_delta_rule, decay_and_beta. The gated norm is
sdq.kernels.ops.rms_norm then ops.silu_mul. The kernels round as ggml's CPU ops do (see
sdq.kernels.ops for the primitives): the conv is one FMA per tap, then ggml's silu; the L2 norm
is ggml's rms_norm with eps / S, then times 1 / sqrt(S); the recurrence scales the state by
expf(g), takes its dot products in ggml_vec_dot_f32's order and adds d k^T with one FMA per
entry.
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from sdq.kernels.jit import kernel
from sdq.kernels.ops import SIMD_F32, dot_f32, fma32, silu_at


@kernel  # no fastmath: rounds as ggml's ssm_conv and silu
def _causal_conv_silu(window, w, out):  # window [Kc-1+T, C], w [C, Kc], out [T, C]
    T, C = out.shape
    Kc = w.shape[1]
    simd = C - C % SIMD_F32  # ggml's vector silu covers the whole groups of 16 of a row
    for t in range(T):
        for c in range(C):
            acc = np.float32(0.0)
            for j in range(Kc):  # one FMA per tap, as GCC compiles ggml's ssm_conv
                acc = fma32(window[t + j, c], w[c, j], acc)
            out[t, c] = silu_at(acc, c < simd)


def causal_conv_silu(window: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """out [T, C] = silu(causal conv) of window [Kc-1+T, C] (conv state rows, then the T new
    inputs) with taps w [C, Kc]."""
    _causal_conv_silu(window, w, out)


@kernel  # no fastmath: rounds as ggml's rms_norm and scale
def _l2_norm_heads(x, eps):  # x [T, H, S] in place
    T, H, S = x.shape
    # ggml: rms_norm(x, eps / S) * (1 / sqrt(S)) = x / sqrt(sum(x^2) + eps)
    eps_n = np.float32(eps / np.float32(S))
    inv_sqrt_n = np.float32(1.0) / np.float32(math.sqrt(np.float32(S)))
    for t in range(T):
        for h in range(H):
            ss = 0.0  # float64 accumulator, as ggml's rms_norm
            for i in range(S):
                v = x[t, h, i]
                ss += np.float64(v * v)
            mean = np.float32(ss / S)
            scale = np.float32(1.0) / np.float32(math.sqrt(mean + eps_n))
            for i in range(S):
                x[t, h, i] = (x[t, h, i] * scale) * inv_sqrt_n


def l2_norm_heads(x: np.ndarray, eps: float) -> None:
    """x [T, H, S] /= sqrt(sum over S of x^2 + eps), in place (any strides)."""
    _l2_norm_heads(x, np.float32(eps))


@kernel(parallel=True)  # no fastmath: rounds as ggml's gated_delta_net
def _gated_delta_rule(q, k, v, g, beta, state, out):
    T, Hk, S = q.shape
    Hv = v.shape[1]
    scale = np.float32(1.0) / np.float32(math.sqrt(np.float32(S)))
    for h in prange(Hv):
        s = state[h]  # [S, S]: row j = value dim j, column i = key dim i
        hk = h % Hk
        d = np.empty(S, np.float32)  # [S]
        acc = np.empty(64, np.float32)  # dot_f32's lanes
        for t in range(T):
            decay = np.float32(math.exp(g[t, h]))
            for j in range(S):
                for i in range(S):
                    s[j, i] *= decay
            for j in range(S):
                d[j] = (v[t, h, j] - dot_f32(s[j], k[t, hk], acc)) * beta[t, h]
            for j in range(S):
                for i in range(S):
                    s[j, i] = fma32(k[t, hk, i], d[j], s[j, i])
            for j in range(S):
                out[t, h, j] = dot_f32(s[j], q[t, hk], acc) * scale


def gated_delta_rule(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray,
    out: np.ndarray,
) -> None:
    """The recurrence of gated_delta_rule_ref in float32: state [Hv, S, S] updated in place,
    out [T, Hv, S] written; q, k [T, Hk, S] (L2-normalized), v [T, Hv, S], g, beta [T, Hv].
    Value heads run in parallel."""
    _gated_delta_rule(q, k, v, g, beta, state, out)


@kernel  # no fastmath: rounds as ggml's softplus and sigmoid
def _decay_and_beta(alpha, dt_bias, a, beta):  # alpha, beta [T, Hv] in place; dt_bias, a [Hv]
    T, Hv = alpha.shape
    for t in range(T):
        for h in range(Hv):
            x = alpha[t, h] + dt_bias[h]
            # ggml's softplus: logf(1 + expf(x)), x itself above 20
            sp = x if x > np.float32(20.0) else np.float32(math.log(np.float32(1.0) + math.exp(x)))
            alpha[t, h] = sp * a[h]
            beta[t, h] = np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-beta[t, h])))


def decay_and_beta(alpha: np.ndarray, dt_bias: np.ndarray, a: np.ndarray, beta: np.ndarray):
    """In place: alpha [T, Hv] -> g = softplus(alpha + dt_bias) * a (the log decay); beta
    [T, Hv] -> sigmoid(beta)."""
    _decay_and_beta(alpha, dt_bias, a, beta)


def decay_and_beta_ref(alpha, dt_bias, a, beta) -> tuple[np.ndarray, np.ndarray]:
    """(g, sigmoid(beta)) of decay_and_beta, float64."""
    g = softplus_ref(np.asarray(alpha, np.float64) + dt_bias) * a
    return g, 1.0 / (1.0 + np.exp(-np.asarray(beta, np.float64)))


def l2_norm_ref(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(sum(x^2) + eps) over the last axis (ggml: rms_norm(x, eps/n) / sqrt(n))."""
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def causal_conv_ref(
    x: np.ndarray, w: np.ndarray, state: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal conv: out[t, c] = sum_j window[t + j, c] * w[c, j].

    x [T, C] new inputs; w [C, Kc] taps (tap Kc-1 meets the current token); state [Kc-1, C]
    the previous inputs (zeros for a new sequence). Returns out [T, C] (before SiLU) and the
    new state [Kc-1, C] (the last Kc-1 rows of the window).
    """
    Kc = w.shape[1]
    window = np.concatenate([state, x]).astype(np.float64)  # [Kc-1+T, C]
    T = x.shape[0]
    out = np.zeros((T, x.shape[1]), np.float64)  # [T, C]
    for j in range(Kc):
        out += window[j : j + T] * w[:, j]
    return out, window[T:].copy() if Kc > 1 else window[:0].copy()


def gated_delta_rule_ref(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The recurrence above, token by token.

    q, k [T, Hk, S] (already L2-normalized); v [T, Hv, S]; g, beta [T, Hv]; state [Hv, S, S]
    with state[h] @ k = the value the state recalls for key k. Returns o [T, Hv, S] and the new
    state [Hv, S, S].
    """
    T, Hk, S = q.shape
    Hv = v.shape[1]
    s = np.array(state, np.float64)  # [Hv, S, S]
    o = np.empty((T, Hv, S), np.float64)  # [T, Hv, S]
    scale = 1.0 / np.sqrt(S)
    for t in range(T):
        for h in range(Hv):
            kh, qh = k[t, h % Hk], q[t, h % Hk]  # [S]
            s[h] *= np.exp(g[t, h])
            d = beta[t, h] * (v[t, h] - s[h] @ kh)  # [S]
            s[h] += np.outer(d, kh)
            o[t, h] = (s[h] @ qh) * scale
    return o, s


def gated_rms_norm_ref(x: np.ndarray, w: np.ndarray, z: np.ndarray, eps: float) -> np.ndarray:
    """rms_norm(x) * w * silu(z) over the last axis; x, z [..., S], w [S]."""
    x = np.asarray(x, np.float64)
    z = np.asarray(z, np.float64)
    normed = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w
    return normed * (z / (1.0 + np.exp(-z)))


def softplus_ref(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)), computed without overflow."""
    x = np.asarray(x, np.float64)
    return np.logaddexp(0.0, x)


def rope_partial_ref(x: np.ndarray, positions: np.ndarray, base: float, n_rot: int) -> np.ndarray:
    """NeoX RoPE on the first n_rot dims of each head, the rest passed through.

    x [T, H, Dh]; positions [T]. qwen35moe's multi-section RoPE reduces to this for text,
    where every section's position is the token's position.
    """
    x = np.array(x, np.float64)
    half = n_rot // 2
    theta = np.asarray(positions, np.float64)[:, None] * base ** (
        -2.0 * np.arange(half) / n_rot
    )  # [T, half]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]  # [T, 1, half]
    a, b = x[..., :half].copy(), x[..., half:n_rot].copy()
    x[..., :half] = a * cos - b * sin
    x[..., half:n_rot] = a * sin + b * cos
    return x
