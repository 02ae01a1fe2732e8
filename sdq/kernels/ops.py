"""Transformer ops for the qwen3moe forward pass, as Numba kernels with NumPy references.

Dimension key: T tokens, D hidden, H query heads, Hkv KV heads, Dh head dim, G = H / Hkv,
C KV-cache positions, E experts, K experts used per token.

Arithmetic follows ggml's CPU ops where it matters for agreement with llama.cpp:
- rms_norm: sum of squares in float64, mean and 1/sqrt in float32, then times the weight;
- softmax: exponentials in float32, their sum in float64, one float32 reciprocal;
- router: softmax over all E experts, the K largest, optionally divided by their sum (in
  float64, as ggml's sum_rows);
- silu(x) = x / (1 + exp(-x)) with ggml's vector exp, sigmoid(x) = 1 / (1 + expf(-x));
- RoPE: cos / sin of theta by libm, x0 cos - x1 sin with x0 cos fused (as GCC compiles ggml);
- attention (ggml without flash attention): scores by dot_f32, times the scale, ggml's
  soft_max, then the values weighted in tinyBLAS's lanes (2+ tokens) or dot_f32's (1 token).

ggml's x86 float primitives, for the kernels that must round as llama.cpp does (these compile
without fastmath; LLVM must not contract or reorder their float operations):
- fma32: a * b + c rounded once (ggml's SIMD code and GCC's contracted `s += a * b` use FMA),
  and fma32_ref, the same in NumPy (for tables computed outside the kernels);
- expf_simd: ggml_v_expf of an AVX512 build (a polynomial, within ~1.5 ulp of exp, not libm's
  expf), which ggml's silu, swiglu and softmax use on each whole group of 16 values of a row;
  the rest of the row uses libm's expf;
- dot_f32: ggml_vec_dot_f32 of an AVX512 build: 4 x 16 float lanes with FMA per 64 values,
  the lanes summed as GCC's _mm512_reduce_add_ps, the remainder added one product at a time
  (multiplied, then added: no FMA);
- tinyBLAS (llamafile's sgemm, which ggml uses for F32 products of 2 or more tokens when the
  rows are a multiple of 4 and the columns of 16): 16 lanes with FMA, then the same sum.

Every op writes into caller-owned arrays (the engine's workspace); nothing allocates per call
except attention's per-head score rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from sdq.kernels.jit import inline, kernel

# ---------------------------------------------------------------------------------------
# ggml's float primitives (x86, AVX512 build)

SIMD_F32 = 16  # float lanes of one ggml vector


@intrinsic
def fma32(typingctx, a, b, c):
    """a * b + c rounded once to float32 (the FMA instruction, or libm's fmaf without it)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, sig, args):
        f = ir.FloatType()
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(f, [f, f, f]), "llvm.fma.f32"
        )
        return builder.call(fn, args)

    return sig, codegen


@intrinsic
def scale2(typingctx, x, n):
    """x * 2^n rounded once to float32, for float32 x and an integer -1022 <= n <= 1023 (2^n
    built as a float64 from its exponent bits; the product is exact in float64)."""
    sig = types.float32(types.float32, types.int64)

    def codegen(context, builder, sig, args):
        i64, f64 = ir.IntType(64), ir.DoubleType()
        bits = builder.shl(builder.add(args[1], ir.Constant(i64, 1023)), ir.Constant(i64, 52))
        prod = builder.fmul(builder.fpext(args[0], f64), builder.bitcast(bits, f64))
        return builder.fptrunc(prod, ir.FloatType())

    return sig, codegen


_H = float.fromhex
_EXP_SHIFT = np.float32(_H("0x1.8p23"))  # adding it rounds x / ln 2 to an integer
_LOG2E = np.float32(_H("0x1.715476p+0"))
_LN2_HI, _LN2_LO = np.float32(_H("0x1.62e4p-1")), np.float32(_H("0x1.7f7d1cp-20"))
_EXP_C = tuple(
    np.float32(_H(c))
    for c in ("0x1.ffffecp-1", "0x1.fffdb6p-2", "0x1.555e66p-3", "0x1.573e2ep-5", "0x1.0e4020p-7")
)


@inline
def expf_simd(x):
    """exp(x) as one lane of ggml's AVX512 ggml_v_expf: n = round(x / ln 2), b = x - n ln 2
    (two steps), exp(b) by a degree-5 polynomial, times 2^n; |n| > 192 gives 0 or inf."""
    c1, c2, c3, c4, c5 = _EXP_C
    z = fma32(x, _LOG2E, _EXP_SHIFT)
    n = z - _EXP_SHIFT
    b = fma32(-n, _LN2_LO, fma32(-n, _LN2_HI, x))
    u = b * b
    j = fma32(fma32(fma32(c5, b, c4), u, fma32(c3, b, c2)), u, fma32(c1, b, np.float32(1.0)))
    if abs(n) > np.float32(192.0):
        return np.float32(0.0) if n <= np.float32(0.0) else np.float32(np.inf)
    return scale2(j, np.int64(n))  # scalef: one rounding


def fma32_ref(a, b, c) -> np.ndarray:
    """a * b + c rounded once to float32, elementwise.

    a * b is exact in float64; the float64 sum s and its exact error e (TwoSum) are rounded
    to odd (s moved one float64 ulp towards e when e != 0 and s is even), and a value rounded
    to odd with 29 spare bits rounds to float32 exactly as the infinitely precise sum would."""
    p = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    c = np.asarray(c, np.float64)
    s = p + c
    bb = s - p
    e = (p - (s - bb)) + (c - bb)
    even = (s.view(np.int64) & 1) == 0
    nudge = (e != 0) & even
    s = np.where(nudge, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


@inline
def silu_at(x, simd):
    """silu(x) as ggml computes it: with expf_simd in a whole group of 16 (simd), else expf."""
    e = expf_simd(-x) if simd else np.float32(math.exp(-x))
    return x / (np.float32(1.0) + e)


@inline
def reduce16(v, o):
    """v[o] + ... + v[o + 15] as GCC's _mm512_reduce_add_ps: halves, quarters, then pairs."""
    a0, a1 = v[o] + v[o + 8], v[o + 1] + v[o + 9]
    a2, a3 = v[o + 2] + v[o + 10], v[o + 3] + v[o + 11]
    a4, a5 = v[o + 4] + v[o + 12], v[o + 5] + v[o + 13]
    a6, a7 = v[o + 6] + v[o + 14], v[o + 7] + v[o + 15]
    b0, b1, b2, b3 = a0 + a4, a1 + a5, a2 + a6, a3 + a7
    return (b0 + b2) + (b1 + b3)


@inline
def dot_f32(x, y, acc):
    """x . y for x, y [n] as ggml_vec_dot_f32; acc is float32 scratch [64]."""
    n = x.shape[0]
    m = n - n % 64
    acc[:] = 0
    for o in range(0, m, 64):
        for i in range(64):
            acc[i] = fma32(x[o + i], y[o + i], acc[i])
    for i in range(16):  # the 4 vectors: (0 + 2) + (1 + 3), lane by lane
        acc[i] = (acc[i] + acc[32 + i]) + (acc[16 + i] + acc[48 + i])
    s = reduce16(acc, 0)
    for i in range(m, n):  # not fused: ggml's vec.cpp leaves `sumf += x[i]*y[i]` as written
        s = s + x[i] * y[i]
    return s


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


@dataclass(frozen=True)
class Yarn:
    """YaRN's parameters as ggml's rope op takes them (float32 values)."""

    freq_scale: float  # 1 / factor
    ext_factor: float  # 0: plain interpolation by freq_scale
    attn_factor: float  # magnitude factor handed to the op
    corr_low: float  # the ramp: pure extrapolation below corr_low ...
    corr_high: float  # ... pure interpolation above corr_high


def rope_tables(positions: np.ndarray, freq_base: float, Dh: int, yarn: Yarn | None = None):
    """cos, sin [T, Dh/2] float32 for rope_neox / rope_norm, computed as ggml's rope cache:
    theta_0 = pos, theta_(i+1) = theta_i * base^(-2/Dh) in float32, then libm's cosf / sinf.
    With YaRN (rope_yarn): theta interpolated by freq_scale, mixed with the extrapolated
    angle by the ramp, and cos/sin times the magnitude factor; GCC contracts ggml's
    ``interp * (1 - mix) + extrap * mix`` and ``1 + 0.1 * logf(1 / freq_scale)`` into FMAs
    (the first product fused, the second rounded), and so does this."""
    f32 = np.float32
    half = Dh // 2
    step = f32(freq_base) ** f32(-2.0 / Dh)
    theta = np.empty((len(positions), half), dtype=np.float32)  # [T, Dh/2]
    theta[:, 0] = np.asarray(positions, dtype=np.float32)
    for i in range(1, half):
        theta[:, i] = theta[:, i - 1] * step
    mscale = f32(1.0)
    if yarn is not None:
        extrap = theta
        theta = f32(yarn.freq_scale) * extrap  # interpolated
        mscale = f32(yarn.attn_factor)
        if yarn.ext_factor != 0:
            i = np.arange(half, dtype=np.float32)
            y = (i - f32(yarn.corr_low)) / max(f32(0.001), f32(yarn.corr_high - yarn.corr_low))
            mix = (f32(1) - np.clip(y, f32(0), f32(1))).astype(np.float32) * f32(yarn.ext_factor)
            theta = fma32_ref(theta, f32(1) - mix, extrap * mix)
            ln_inv = logf(f32(1) / f32(yarn.freq_scale))
            mscale = f32(mscale * fma32_ref(f32(0.1), ln_inv, f32(1)))
    theta = np.ascontiguousarray(theta, np.float32)
    cos, sin = np.empty_like(theta), np.empty_like(theta)
    cos_sin(theta, cos, sin)
    if yarn is None:
        return cos, sin
    return (cos * mscale).astype(np.float32), (sin * mscale).astype(np.float32)


@kernel
def _cos_sin(theta, cos, sin):  # flat views
    for i in range(theta.size):
        cos[i] = math.cos(theta[i])  # float32: libm's cosf (NumPy's own cos differs in ulps)
        sin[i] = math.sin(theta[i])


@kernel
def _logf(x):
    return math.log(x)  # float32: libm's logf


def logf(x) -> np.float32:
    """libm's logf of a float32 scalar (ggml's YaRN factors use it)."""
    return np.float32(_logf(np.float32(x)))


def cos_sin(theta: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> None:
    """cos, sin = cosf(theta), sinf(theta) (float32, C-contiguous, any shape)."""
    _cos_sin(theta.reshape(-1), cos.reshape(-1), sin.reshape(-1))


@kernel  # no fastmath: x0 * cos is fused with the other product's sum, as GCC builds ggml
def _rope_neox(x, cos, sin):  # x [T, H, Dh] in place; cos, sin [T, Dh/2]
    T, H, Dh = x.shape
    half = Dh // 2
    for t in range(T):
        for h in range(H):
            for i in range(half):
                x0 = x[t, h, i]
                x1 = x[t, h, i + half]
                x[t, h, i] = fma32(x0, cos[t, i], -(x1 * sin[t, i]))
                x[t, h, i + half] = fma32(x0, sin[t, i], x1 * cos[t, i])


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


@kernel  # no fastmath: as _rope_neox
def _rope_norm(x, cos, sin):  # x [T, H, Dh] in place; cos, sin [T, Dh/2]
    T, H, Dh = x.shape
    for t in range(T):
        for h in range(H):
            for i in range(Dh // 2):
                x0 = x[t, h, 2 * i]
                x1 = x[t, h, 2 * i + 1]
                x[t, h, 2 * i] = fma32(x0, cos[t, i], -(x1 * sin[t, i]))
                x[t, h, 2 * i + 1] = fma32(x0, sin[t, i], x1 * cos[t, i])


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


@kernel(parallel=True)  # no fastmath: rounds as ggml's attention (not flash attention)
def _attention(q, k_cache, v_cache, p0, Hkv, scale, out):
    T, H, Dh = q.shape
    G = H // Hkv
    # ggml's V product: tinyBLAS (16 lanes) for a ubatch of 2+ tokens, else ggml_vec_dot_f32
    # (64 lanes, 4 vectors); its KV length is padded to 256, the padding weighted by 0
    lanes = SIMD_F32 if T >= 2 else 64
    for h in prange(H):
        c0 = (h // G) * Dh  # this head's KV columns
        p = np.empty(p0 + T + SIMD_F32, np.float32)  # scores, then probabilities
        acc = np.empty(64, np.float32)  # dot_f32's lanes; one output's V lanes
        vacc = np.empty((lanes, Dh), np.float32)  # [lanes, Dh] V lanes of the whole head
        for t in range(T):
            n = p0 + t + 1  # positions this token sees
            qh = q[t, h]  # [Dh]
            smax = np.float32(-np.inf)
            for j in range(n):
                p[j] = dot_f32(k_cache[j, c0 : c0 + Dh], qh, acc) * scale
                smax = max(smax, p[j])
            n16 = (n + SIMD_F32 - 1) // SIMD_F32 * SIMD_F32
            p[n:n16] = -np.inf  # masked: exp gives 0
            inv = softmax_row(p[:n16], smax, p)
            vacc[:] = 0
            for j in range(n):
                pj = p[j] * inv
                vj = v_cache[j, c0 : c0 + Dh]  # [Dh]
                a = vacc[j % lanes]  # [Dh]
                for i in range(Dh):
                    a[i] = fma32(vj[i], pj, a[i])
            for i in range(Dh):
                for m in range(lanes):
                    acc[m] = vacc[m, i]
                if lanes == 64:
                    for m in range(SIMD_F32):  # the 4 vectors: (0 + 2) + (1 + 3)
                        acc[m] = (acc[m] + acc[32 + m]) + (acc[16 + m] + acc[48 + m])
                out[t, h, i] = reduce16(acc, 0)


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


@inline
def softmax_row(x, m, p):
    """p = exp(x - m) as ggml's soft_max (expf_simd on each group of 16, reduced in float32
    and added to a float64 sum, then libm's expf one by one); returns 1 / sum in float32."""
    n = x.shape[0]
    simd = n - n % SIMD_F32
    total = 0.0
    for o in range(0, simd, SIMD_F32):
        for i in range(o, o + SIMD_F32):
            p[i] = expf_simd(x[i] - m)
        total += reduce16(p, o)
    for i in range(simd, n):
        p[i] = np.float32(math.exp(x[i] - m))
        total += p[i]
    return np.float32(1.0 / total)


@kernel
def _softmax_topk(logits, K, renorm, ids, weights):
    T, E = logits.shape
    p = np.empty(E, np.float32)
    for t in range(T):
        m = np.float32(-np.inf)
        for e in range(E):
            m = max(m, logits[t, e])
        inv = softmax_row(logits[t], m, p)
        for e in range(E):
            p[e] *= inv
        # top-K by repeated selection (K is small): largest first, lowest index on ties
        wsum = 0.0  # float64, as ggml's sum_rows
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
            total = max(np.float32(wsum), np.float32(6.103515625e-5))  # ggml clamps the sum
            for k in range(K):
                weights[t, k] = weights[t, k] / total


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


@kernel
def _silu_mul(gate, up):  # gate, up [N, n], in place into gate
    N, n = gate.shape
    simd = n - n % SIMD_F32  # ggml's vector silu covers the whole groups of 16 of a row
    for r in range(N):
        for i in range(n):
            gate[r, i] = silu_at(gate[r, i], i < simd) * up[r, i]


def silu_mul(gate: np.ndarray, up: np.ndarray) -> None:
    """gate = silu(gate) * up, in place (any shape, C-contiguous; rows are the last axis, as
    the rows of ggml's silu / swiglu op)."""
    n = gate.shape[-1]
    _silu_mul(gate.reshape(-1, n), up.reshape(-1, n))


def silu_mul_ref(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    g = gate.astype(np.float64)
    return (g / (1.0 + np.exp(-g)) * up).astype(np.float32)


# ---------------------------------------------------------------------------------------
# Sigmoid (output gates), as ggml's sigmoid op: 1 / (1 + expf(-x)) with libm's expf


@kernel
def _sigmoid(x, silu_ratio):  # flat view, in place
    for i in range(x.size):
        v = x[i]
        if silu_ratio:  # ggml's silu of a row of one value (expf), divided by the value
            x[i] = (v / (np.float32(1.0) + np.float32(math.exp(-v)))) / v
        else:
            x[i] = np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-v)))


def sigmoid(x: np.ndarray, silu_ratio: bool = False) -> None:
    """x = 1 / (1 + exp(-x)), in place (any shape, C-contiguous). silu_ratio: computed as
    silu(x) / x, as qwen2moe's graph does for its shared expert's gate (NaN at 0, as there)."""
    _sigmoid(x.reshape(-1), silu_ratio)


def sigmoid_ref(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))).astype(np.float32)
