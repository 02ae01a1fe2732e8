"""Matrix products on GGUF weight bytes: out[T, rows] = X[T, cols] @ W[rows, cols].T

Dimension key: T tokens (1 when decoding), rows/cols of the weight matrix, nb blocks per row.

The activations are first converted as ggml's CPU backend does (see act_quant.py): Q8_K for
K-quant weights, Q8_0 for Q8_0/Q4_0, F16/BF16/F32 for float weights. Then, per weight block
and token, exact integer dot products of the block's quants with the token's int8 quants,
and ggml's float steps. Rows are the outer loop and tokens the inner one, so a prefill
ubatch reuses each weight row (from L1) for all its T tokens.

K-quants round as ggml's x86 build: it takes one of four float orders by weight type, row
count and token count (vec_dot below 8 tokens, its tiled kernel from 8, and for Q4_K
weights with a multiple of 8 rows the repacked gemv/gemm); kquant_ref.py states them and
computes them in NumPy, and simd_mm.product_order picks one. So a token's result can depend
on how many tokens share the product, exactly as in llama.cpp.

Q8_0 rounds exactly as ggml's x86 code (vec_dot_q8_0_q8_0, and llamafile's tinyBLAS, which
ggml's mul_mat takes for 2+ tokens): eight float lanes, lane k adding the integer sum of the
block's values 4k..4k+3 times ``d_w * d_x`` with one FMA, the lanes summed as (0+4)+(2+6) +
(1+5)+(3+7). F32 follows ggml's two orders (tinyBLAS, or ggml_vec_dot_f32: ops.py).

Two implementations, chosen per CPU, computing identical K-quant and Q8_0 results:
- SIMD (x86 AVX2): ggml's method, unsigned x signed byte multiply-adds on weights unpacked
  in registers, plus software prefetch. K-quants: simd_mm.py's row tiles (up to 8 tokens
  share each unpacked block); Q8_0/Q4_0: block dots on simd.py's helpers.
- portable: each block unpacked into int16 values already multiplied by their sub-block
  scale, then plain int16 x int8 -> int32 loops that LLVM vectorizes. The fallback, and the
  cross-check of the SIMD path in the tests.

Parallelism: rows are split into chunks handed to Numba's threads (``numba.set_num_threads``
sets how many; small products stay on the calling thread); kernels release the GIL.
"""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType as QT
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from sdq.format.quants import qtype_of
from sdq.kernels.act_quant import ACT_TYPE, QActivation, quantize_activation
from sdq.kernels.jit import FLOAT_MATH, inline, kernel
from sdq.kernels.ops import SIMD_F32, dot_f32, fma32, reduce16
from sdq.kernels.quant import (
    Q4_0_BYTES,
    Q4_K_BYTES,
    Q5_K_BYTES,
    Q6_K_BYTES,
    Q8_0_BYTES,
    QK4_0,
    QK8_0,
    QK_K,
    as_bytes,
    dequantize,
    f16_at,
    kscale_min,
)
from sdq.kernels.simd import (
    HAVE_AVX2,
    _Emit,
    dot_q4_0,
    load_bf16,
    load_f16,
    prefetch,
)
from sdq.kernels.simd_mm import (
    REPACKED,
    TILED,
    product_order,
    q4_k_row,
    q5_k_row,
    q6_k_row,
)

CHUNKS_PER_THREAD = 2  # row chunks per thread: a little slack when a core is busy elsewhere
# Below this many weights x tokens a product runs on the calling thread alone: waking the
# other threads costs more than it saves (a few microseconds, far more on a busy machine).
# 2^18 rather than 2^16: tiny35's resident decode / llama.cpp's rose from 1.57, 1.32, 1.39 to
# 1.69, 1.37, 1.44 in three alternating `sdq bench resident` pairs (2 cores).
PARALLEL_MIN_WORK = 262_144  # 2^18
# Unsigned array offsets: Numba then skips the negative-index fix-up and LLVM sees
# contiguous loads it can vectorize (with signed offsets it emits byte-by-byte gathers).
U = np.uint64


# ---------------------------------------------------------------------------------------
# Block unpacking (inlined). Each writes the block's 256 values times their sub-block scale
# into w (int16) and returns the block's float scale(s). The byte arithmetic is kept in
# uint8/int16 so that LLVM vectorizes it.


@inline
def _unpack_q4_k(raw, o, w, mins):
    """Q4_K block at raw[o:o+144] -> w[256] = q * sc_j, mins[8]; returns (d, dmin)."""
    for p in range(4):  # 4 pairs of sub-blocks share 32 bytes (low, high nibbles)
        sc0, m0 = kscale_min(raw, o + 4, 2 * p)
        sc1, m1 = kscale_min(raw, o + 4, 2 * p + 1)
        mins[2 * p] = m0
        mins[2 * p + 1] = m1
        s0 = np.int16(sc0)
        s1 = np.int16(sc1)
        q = o + 16 + 32 * p
        for i in range(32):
            v = raw[U(q + i)]
            w[64 * p + i] = np.int16(v & np.uint8(15)) * s0
            w[64 * p + 32 + i] = np.int16(v >> np.uint8(4)) * s1
    return f16_at(raw, o), f16_at(raw, o + 2)


@inline
def _unpack_q5_k(raw, o, w, mins):
    """Q5_K block at raw[o:o+176] -> w[256] = q * sc_j, mins[8]; returns (d, dmin)."""
    for p in range(4):
        sc0, m0 = kscale_min(raw, o + 4, 2 * p)
        sc1, m1 = kscale_min(raw, o + 4, 2 * p + 1)
        mins[2 * p] = m0
        mins[2 * p + 1] = m1
        s0 = np.int16(sc0)
        s1 = np.int16(sc1)
        q = o + 48 + 32 * p
        for i in range(32):
            v = raw[U(q + i)]
            h = raw[U(o + 16 + i)] >> np.uint8(2 * p)
            lo = (v & np.uint8(15)) | ((h & np.uint8(1)) << np.uint8(4))
            hi = (v >> np.uint8(4)) | ((h & np.uint8(2)) << np.uint8(3))
            w[64 * p + i] = np.int16(lo) * s0
            w[64 * p + 32 + i] = np.int16(hi) * s1
    return f16_at(raw, o), f16_at(raw, o + 2)


@inline
def _unpack_q6_k(raw, o, w, s):
    """Q6_K block at raw[o:o+210] -> w[256] = (q + 32 as stored, unsigned) * sc; returns d.
    s: int16[16] scratch, left holding the block's scales."""
    for g in range(16):
        v = np.int16(raw[U(o + 192 + g)])
        s[g] = v - 256 if v > 127 else v
    for h in range(2):  # two halves of 128 values; value n = 128h + 32g + 16k + i
        for k in range(2):  # scale of value n is s[8h + 2g + k]
            s0 = s[8 * h + k]
            s1 = s[8 * h + 2 + k]
            s2 = s[8 * h + 4 + k]
            s3 = s[8 * h + 6 + k]
            for i in range(16):
                j = 16 * k + i
                lo0 = raw[U(o + 64 * h + j)]
                lo1 = raw[U(o + 64 * h + 32 + j)]
                hi = raw[U(o + 128 + 32 * h + j)]
                n = 128 * h + j
                q0 = np.uint8(lo0 & np.uint8(15)) | np.uint8(np.uint8(hi & np.uint8(3)) << 4)
                q1 = np.uint8(lo1 & np.uint8(15)) | np.uint8(np.uint8(hi & np.uint8(12)) << 2)
                q2 = np.uint8(lo0 >> np.uint8(4)) | np.uint8(hi & np.uint8(48))
                q3 = np.uint8(lo1 >> np.uint8(4)) | np.uint8(np.uint8(hi >> np.uint8(2)) & 48)
                w[n] = np.int16(np.uint8(q0)) * s0
                w[n + 32] = np.int16(np.uint8(q1)) * s1
                w[n + 64] = np.int16(np.uint8(q2)) * s2
                w[n + 96] = np.int16(np.uint8(q3)) * s3
    return f16_at(raw, o + 208)


# ---------------------------------------------------------------------------------------
# K-quants x Q8_K. qs int8 [T, cols], d f32 [T, nb], bs int16 [T, cols/16], out f32 [T, rows]
#
# ggml's x86 float orders (kquant_ref.py states them; the SIMD tiles in simd_mm.py compute the
# same numbers): per (row, token) either eight float lanes fed by the block's integer lanes
# (vec_dot_q*_K_q8_K), or, for Q4_K weights with a multiple of 8 rows, one float sum of the
# block's whole integer sum (ggml's repacked gemv/gemm_q4_K_8x8_q8_K).


@inline
def _lane_dot(w, qs, t, x0, isum):
    """isum[k] = sum over the block's 32-value chunks c of sum_{i = 4k..4k+3} w[32c + i] *
    qs[t, x0 + 32c + i], for k < 8 (w int16 [256]: quants times their sub-block scale)."""
    for k in range(8):
        s = np.int32(0)
        for c in range(8):
            for i in range(4):
                n = 32 * c + 4 * k + i
                s = np.int32(s + np.int32(w[n]) * np.int32(qs[t, x0 + n]))
        isum[k] = s


@inline
def _sub_min(mins, bs, t, b, j):
    """mins[j] * (the sum of the token's 32 quants of sub-block j of block b)."""
    o = b * 16 + 2 * j
    return np.int32(mins[j] * (np.int32(bs[t, o]) + np.int32(bs[t, o + 1])))


@inline
def _block_sums(isum, mins, bs, t, b):
    """(the block's integer dot: isum's 8 lanes summed, its min term: mins[j] x the token's
    quants of sub-block j, summed over j) of token t and block b."""
    tot, imin = np.int32(0), np.int32(0)
    for k in range(8):
        tot += isum[k]
        imin += _sub_min(mins, bs, t, b, k)
    return tot, imin


@inline
def _min_pair(mins, bs, t, b, p):
    """The min term of sub-blocks 2p and 2p+1 (ggml's pairs of sub-blocks and min lanes)."""
    return _sub_min(mins, bs, t, b, 2 * p) + _sub_min(mins, bs, t, b, 2 * p + 1)


@inline
def _fma_lanes(acc, t, dd, isum):
    """acc[t, k] = fma(dd, isum[k], acc[t, k]) for the eight lanes (one rounding each)."""
    for k in range(8):
        acc[t, k] = fma32(dd, np.float32(isum[k]), acc[t, k])


@inline
def _sub_dots(w, qs, t, x0, ssum):
    """ssum[j] = sum_i w[32j + i] * qs[t, x0 + 32j + i] for the block's 8 sub-blocks."""
    for j in range(8):
        s = np.int32(0)
        for i in range(32):
            s = np.int32(s + np.int32(w[32 * j + i]) * np.int32(qs[t, x0 + 32 * j + i]))
        ssum[j] = s


@inline
def _tiled_step(acc, t, dx, dw, dmw, s1, s2):
    """ggml's tiled block step: acc[t] = fma(fma(-dmin_w, s2, s1 * d_w), d_x, acc[t])."""
    res = fma32(-dmw, np.float32(s2), np.float32(s1) * dw)
    acc[t, 0] = fma32(res, dx, acc[t, 0])


@kernel(parallel=True)
def _mm_q4_k(raw, rows, cols, qs, d, bs, out, nch, order, ngemm):
    """Q4_K in ggml's `order` (simd_mm.VEC_DOT, TILED or REPACKED: one FMA per block (gemv)
    for tokens >= ngemm, one per pair of sub-blocks (gemm) for tokens < ngemm)."""
    T = qs.shape[0]
    nb = cols // QK_K
    for c in prange(nch):
        w = np.empty(QK_K, np.int16)  # [256] unpacked block, scales applied
        mins = np.empty(8, np.int32)  # [8]
        isum = np.empty(8, np.int32)  # [8] integer lanes (repacked: sub-block sums)
        acc = np.empty((T, 8), np.float32)  # [T, 8] float lanes (else lane 0 only)
        acc_m = np.empty((T, 4), np.float32)  # [T, 4] min lanes (else lane 0 only)
        for r in range(c * rows // nch, (c + 1) * rows // nch):
            acc[:] = 0
            acc_m[:] = 0
            for b in range(nb):
                dw, dmw = _unpack_q4_k(raw, (r * nb + b) * Q4_K_BYTES, w, mins)
                for t in range(T):
                    dx = d[t, b]
                    if order == REPACKED:
                        _sub_dots(w, qs, t, b * QK_K, isum)
                        sd, sm = dw * dx, dmw * dx
                        if t < ngemm:
                            for p in range(4):
                                ip = isum[2 * p] + isum[2 * p + 1]
                                mp = _min_pair(mins, bs, t, b, p)
                                acc[t, 0] = fma32(np.float32(ip), sd, acc[t, 0])
                                acc_m[t, 0] = fma32(np.float32(mp), sm, acc_m[t, 0])
                        else:
                            tot, imin = _block_sums(isum, mins, bs, t, b)
                            acc[t, 0] = fma32(np.float32(tot), sd, acc[t, 0])
                            acc_m[t, 0] = fma32(np.float32(imin), sm, acc_m[t, 0])
                        continue
                    _lane_dot(w, qs, t, b * QK_K, isum)
                    if order == TILED:
                        tot, imin = _block_sums(isum, mins, bs, t, b)
                        _tiled_step(acc, t, dx, dw, dmw, tot, imin)
                        continue
                    _fma_lanes(acc, t, dx * dw, isum)
                    dm = -(dx * dmw)
                    for m in range(4):
                        pm = _min_pair(mins, bs, t, b, m)
                        acc_m[t, m] = fma32(dm, np.float32(pm), acc_m[t, m])
            for t in range(T):
                if order == REPACKED:
                    out[t, r] = acc[t, 0] - acc_m[t, 0]
                elif order == TILED:
                    out[t, r] = acc[t, 0]
                else:
                    am = (acc_m[t, 0] + acc_m[t, 2]) + (acc_m[t, 1] + acc_m[t, 3])
                    out[t, r] = _hsum8(acc, t) + am


@kernel(parallel=True)
def _mm_q5_k(raw, rows, cols, qs, d, bs, out, nch, order):
    T = qs.shape[0]
    nb = cols // QK_K
    for c in prange(nch):
        w = np.empty(QK_K, np.int16)  # [256]
        mins = np.empty(8, np.int32)  # [8]
        isum = np.empty(8, np.int32)  # [8]
        acc = np.empty((T, 8), np.float32)  # [T, 8] (tiled: lane 0 only)
        summs = np.empty(T, np.float32)  # [T] the min term
        for r in range(c * rows // nch, (c + 1) * rows // nch):
            acc[:] = 0
            summs[:] = 0
            for b in range(nb):
                dw, dmw = _unpack_q5_k(raw, (r * nb + b) * Q5_K_BYTES, w, mins)
                for t in range(T):
                    _lane_dot(w, qs, t, b * QK_K, isum)
                    dx = d[t, b]
                    tot, imin = _block_sums(isum, mins, bs, t, b)
                    if order == TILED:
                        _tiled_step(acc, t, dx, dw, dmw, tot, imin)
                    else:
                        _fma_lanes(acc, t, dx * dw, isum)
                        summs[t] = fma32(-(dx * dmw), np.float32(imin), summs[t])
            for t in range(T):
                out[t, r] = acc[t, 0] if order == TILED else _hsum8(acc, t) + summs[t]


@kernel(parallel=True)
def _mm_q6_k(raw, rows, cols, qs, d, bs, out, nch, order):
    T = qs.shape[0]
    nb = cols // QK_K
    for c in prange(nch):
        w = np.empty(QK_K, np.int16)  # [256] (q + 32) * sc
        s = np.empty(16, np.int16)  # [16] scales
        isum = np.empty(8, np.int32)  # [8]
        acc = np.empty((T, 8), np.float32)  # [T, 8] (tiled: lane 0 only)
        for r in range(c * rows // nch, (c + 1) * rows // nch):
            acc[:] = 0
            for b in range(nb):
                dw = _unpack_q6_k(raw, (r * nb + b) * Q6_K_BYTES, w, s)
                for t in range(T):
                    _lane_dot(w, qs, t, b * QK_K, isum)
                    for k in range(8):  # minus 32 * (bsum x scale) of the lane's two groups
                        g0 = np.int32(bs[t, b * 16 + 2 * k]) * np.int32(s[2 * k])
                        g1 = np.int32(bs[t, b * 16 + 2 * k + 1]) * np.int32(s[2 * k + 1])
                        isum[k] -= np.int32(32) * (g0 + g1)
                    if order == TILED:
                        tot = np.int32(0)
                        for k in range(8):
                            tot += isum[k]
                        acc[t, 0] = fma32(np.float32(tot) * dw, d[t, b], acc[t, 0])
                    else:
                        _fma_lanes(acc, t, d[t, b] * dw, isum)
            for t in range(T):
                out[t, r] = acc[t, 0] if order == TILED else _hsum8(acc, t)


# ---------------------------------------------------------------------------------------
# 32-value blocks x Q8_0. qs int8 [T, cols], d f32 [T, cols/32]
# (Q4_0 weights are multiplied with Q8_0 activations: their blocks are the same QK8_0 values;
# Q4_0 keeps 32 per-value float lanes, Q8_0 ggml's eight.)


@inline
def _lanes_madd(acc, t, s, w, qs, x0):
    """acc[t, i] += s * (w[i] * qs[t, x0 + i]) for the 32 values of a block.

    Like ggml's SIMD code this keeps per-lane float accumulators (summed once per row)
    instead of reducing every 32-value block to one number."""
    for i in range(QK8_0):
        p = np.int32(np.int16(w[i]) * np.int16(qs[t, x0 + i]))
        acc[t, i] += s * np.float32(p)


@inline
def _lanes_sum(acc, t):
    tot = np.float32(0.0)
    for i in range(QK8_0):
        tot += acc[t, i]
    return tot


@inline
def _q8_0_lanes(acc, t, s, w, qs, x0):
    """ggml's x86 Q8_0 block step (vec_dot_q8_0_q8_0, llamafile's tinyBLAS): eight float
    lanes, lane k adding the block's integer products of values 4k..4k+3 times s with one
    rounding, acc[t, k] = fma(s, sum_i w[i] * qs[t, x0 + i], acc[t, k])."""
    for k in range(8):
        p = np.int32(0)
        for i in range(4 * k, 4 * k + 4):
            p += np.int32(np.int16(w[i]) * np.int16(qs[t, x0 + i]))
        acc[t, k] = fma32(s, np.float32(p), acc[t, k])


@inline
def _hsum8(acc, t):
    """ggml's x86 sum of eight float lanes: the two halves, then pairs within the half."""
    a0, a1 = acc[t, 0] + acc[t, 4], acc[t, 1] + acc[t, 5]
    a2, a3 = acc[t, 2] + acc[t, 6], acc[t, 3] + acc[t, 7]
    return (a0 + a2) + (a1 + a3)


@kernel(parallel=True)
def _mm_q8_0(raw, raw8, rows, cols, qs, d, out, nch):
    T = qs.shape[0]
    nb = cols // QK8_0
    for c in prange(nch):
        acc = np.empty((T, 8), np.float32)  # [T, 8] float lanes
        for r in range(c * rows // nch, (c + 1) * rows // nch):
            acc[:] = 0
            for b in range(nb):
                o = (r * nb + b) * Q8_0_BYTES
                dw = f16_at(raw, o)
                w = raw8[U(o + 2) : U(o + Q8_0_BYTES)]
                for t in range(T):
                    _q8_0_lanes(acc, t, dw * d[t, b], w, qs, b * QK8_0)
            for t in range(T):
                out[t, r] = _hsum8(acc, t)


@kernel(parallel=True)
def _mm_q4_0(raw, rows, cols, qs, d, out, nch):
    T = qs.shape[0]
    nb = cols // QK4_0
    for c in prange(nch):
        w = np.empty(QK4_0, np.int8)
        acc = np.empty((T, QK8_0), np.float32)
        for r in range(c * rows // nch, (c + 1) * rows // nch):
            acc[:] = 0
            for b in range(nb):
                o = (r * nb + b) * Q4_0_BYTES
                dw = f16_at(raw, o)
                for i in range(QK4_0 // 2):
                    v = raw[U(o + 2 + i)]
                    w[i] = np.int8(np.int8(v & np.uint8(15)) - np.int8(8))
                    w[QK4_0 // 2 + i] = np.int8(np.int8(v >> np.uint8(4)) - np.int8(8))
                for t in range(T):
                    _lanes_madd(acc, t, dw * d[t, b], w, qs, b * QK4_0)
            for t in range(T):
                out[t, r] = _lanes_sum(acc, t)


# ---------------------------------------------------------------------------------------
# The same products with ggml-style SIMD block dots (simd.py; x86 AVX2). Same integer block
# sums; for K-quants also the same float operations in the same order, so results equal the
# portable kernels' bit for bit (Q8_0/Q4_0: the portable kernels sum per lane, see above).


# Bytes: the SIMD kernels ask for the weights this far ahead of use. Measured here (1 thread,
# CPU time, decode matvec): 1 KB -> 4 KB made the 255 MB Q6_K output head 1.44x faster and
# cold expert matrices ~1.2x; 8 KB another ~1.05x on experts; 16 KB no better.
PREFETCH_AHEAD = 8192  # (simd_mm.PREFETCH_AHEAD: the same, for the K-quant tiles)


@inline
def _prefetch(raw, o, nbytes):
    """Software prefetch of the block bytes PREFETCH_AHEAD past raw[o:o+nbytes] (hardware
    prefetchers alone kept a decode matvec at ~50% of the memory bandwidth measured here)."""
    for k in range(0, nbytes, 64):
        prefetch(raw, o + PREFETCH_AHEAD + k)


@kernel(parallel=True)
def _mm_q4_k_simd(raw, rows, cols, qs, d, bs, out, nch, order, ngemm):
    T = qs.shape[0]
    nb = cols // QK_K
    for c in prange(nch):
        for r in range(c * rows // nch, (c + 1) * rows // nch):
            q4_k_row(raw, r, nb, qs, d, bs, T, out, order, ngemm)


@kernel(parallel=True)
def _mm_q5_k_simd(raw, rows, cols, qs, d, bs, out, nch, order):
    T = qs.shape[0]
    nb = cols // QK_K
    for c in prange(nch):
        for r in range(c * rows // nch, (c + 1) * rows // nch):
            q5_k_row(raw, r, nb, qs, d, bs, T, out, order)


@kernel(parallel=True)
def _mm_q6_k_simd(raw, rows, cols, qs, d, bs, out, nch, order):
    T = qs.shape[0]
    nb = cols // QK_K
    for c in prange(nch):
        for r in range(c * rows // nch, (c + 1) * rows // nch):
            q6_k_row(raw, r, nb, qs, d, bs, T, out, order)


_F32, _i32 = ir.FloatType(), ir.IntType(32)
_V8xf = ir.VectorType(_F32, 8)


@intrinsic
def _dot_q8_0_row(typingctx, raw, o, nb, x, xo, d):
    """One row of _mm_q8_0 with AVX2 (simd.py's signed byte products): the nb Q8_0 blocks
    from raw[o] times x[xo:xo + 32 nb] (int8) with activation scales d [nb], in ggml's eight
    lanes (one FMA per block), summed as _hsum8."""
    sig = types.float32(raw, o, nb, x, xo, d)

    def codegen(context, builder, sig, args):
        e = _Emit(context, builder, sig, args)
        _, o_, nb_, _, xo_, _ = args
        i64 = ir.IntType(64)
        o_, nb_, xo_ = (v if v.type == i64 else builder.sext(v, i64) for v in (o_, nb_, xo_))
        fma = e.fn("llvm.fma.v8f32", _V8xf, [_V8xf, _V8xf, _V8xf])
        acc = cgutils.alloca_once_value(builder, ir.Constant(_V8xf, None))  # registers
        with cgutils.for_range(builder, nb_) as loop:
            b = loop.index
            ob = builder.add(o_, builder.mul(b, ir.Constant(i64, Q8_0_BYTES)))
            hp = cgutils.pointer_add(builder, e.arrays[0].data, ob, ir.IntType(16).as_pointer())
            dw = builder.fpext(builder.bitcast(builder.load(hp, align=1), ir.HalfType()), _F32)
            dx = builder.load(builder.gep(e.arrays[5].data, [b]))
            s = builder.fmul(dw, dx)  # d_w * d_x, as ggml
            xb = builder.add(xo_, builder.mul(b, ir.Constant(i64, QK8_0)))
            lanes = e.signed_dot(e.load(0, e.off(ob, 2)), e.load(3, xb))  # <8 x i32>
            s8 = e.lanes(builder.insert_element(ir.Constant(_V8xf, None), s, _i32(0)), [0] * 8)
            f = builder.sitofp(lanes, _V8xf)
            builder.store(builder.call(fma, [s8, f, builder.load(acc)]), acc)
        v = builder.load(acc)
        lane = [builder.extract_element(v, _i32(k)) for k in range(8)]
        a = [builder.fadd(lane[k], lane[k + 4]) for k in range(4)]  # (0+4), (1+5), ...
        return builder.fadd(builder.fadd(a[0], a[2]), builder.fadd(a[1], a[3]))

    return sig, codegen


@kernel(parallel=True)
def _mm_q8_0_simd(raw, rows, cols, qs, d, out, nch):
    T = qs.shape[0]
    nb = cols // QK8_0
    for c in prange(nch):
        for r in range(c * rows // nch, (c + 1) * rows // nch):
            o = r * nb * Q8_0_BYTES
            _prefetch(raw, o, nb * Q8_0_BYTES)
            for t in range(T):
                out[t, r] = _dot_q8_0_row(raw, o, nb, qs, t * cols, d[t])


@kernel(parallel=True)
def _mm_q4_0_simd(raw, rows, cols, qs, d, out, nch):
    T = qs.shape[0]
    nb = cols // QK4_0
    for c in prange(nch):
        acc = np.empty(T, np.float32)
        for r in range(c * rows // nch, (c + 1) * rows // nch):
            acc[:] = 0
            for b in range(nb):
                o = (r * nb + b) * Q4_0_BYTES
                _prefetch(raw, o, Q4_0_BYTES)
                dw = load_f16(raw, o)
                for t in range(T):
                    isum = dot_q4_0(raw, o, qs, t * cols + b * QK4_0)
                    acc[t] += (dw * d[t, b]) * np.float32(isum)
            for t in range(T):
                out[t, r] = acc[t]


# ---------------------------------------------------------------------------------------
# Float weights x float activations (already rounded to the weight's format).


@inline
def _tinyblas_dot(w, x, acc):
    """w . x for w, x [n] (n a multiple of 16) as llamafile's tinyBLAS on AVX512: 16 lanes
    with FMA, summed as ops.reduce16."""
    acc[:SIMD_F32] = 0
    for o in range(0, w.shape[0], SIMD_F32):
        for i in range(SIMD_F32):
            acc[i] = fma32(w[o + i], x[o + i], acc[i])
    return reduce16(acc, 0)


@kernel(parallel=True)
def _mm_f32(wf, rows, cols, xf, out, nch, tiny):
    # ggml's F32 product: tinyBLAS lanes (tiny: ggml's mul_mat of 2+ tokens when tinyBLAS
    # takes the shape), else one ggml_vec_dot_f32 per row and token (ops.dot_f32)
    T = xf.shape[0]
    for c in prange(nch):
        acc = np.empty(64, np.float32)  # [64] float lanes
        for r in range(c * rows // nch, (c + 1) * rows // nch):
            w = wf[U(r * cols) : U((r + 1) * cols)]  # [cols]
            for t in range(T):
                if tiny:
                    out[t, r] = _tinyblas_dot(w, xf[t], acc)
                else:
                    out[t, r] = dot_f32(w, xf[t], acc)


@kernel(parallel=True, fastmath=FLOAT_MATH)
def _mm_f16(raw, rows, cols, xf, out, nch):
    T = xf.shape[0]
    for c in prange(nch):
        wrow = np.empty(cols, np.float32)
        for r in range(c * rows // nch, (c + 1) * rows // nch):
            for i in range(cols):  # half -> float (exact; vcvtph2ps where the CPU has F16C)
                wrow[i] = load_f16(raw, 2 * (r * cols + i))
            for t in range(T):
                s = np.float32(0.0)
                for i in range(cols):
                    s += wrow[i] * xf[t, i]
                out[t, r] = s


@kernel(parallel=True, fastmath=FLOAT_MATH)
def _mm_bf16(raw, rows, cols, xf, out, nch):
    T = xf.shape[0]
    for c in prange(nch):
        wrow = np.empty(cols, np.float32)
        for r in range(c * rows // nch, (c + 1) * rows // nch):
            for i in range(cols):
                wrow[i] = load_bf16(raw, 2 * (r * cols + i))
            for t in range(T):
                s = np.float32(0.0)
                for i in range(cols):
                    s += wrow[i] * xf[t, i]
                out[t, r] = s


# ---------------------------------------------------------------------------------------
# Public API


def _check_out(out, *shape):
    if out.dtype != np.float32 or out.shape != shape or not out.flags.c_contiguous:
        raise ValueError(
            f"out must be a C-contiguous float32 array of shape {shape}, "
            f"got {out.dtype} {out.shape}"
        )


def matmul_q(
    raw,
    qtype,
    rows: int,
    cols: int,
    qx: QActivation,
    out: np.ndarray,
    portable: bool = False,
    per_row: bool = False,
    repack: bool = True,
) -> None:
    """out[T, rows] = X @ W.T for activations already converted by quantize_activation.

    ``portable=True`` forces the plain-Numba kernels even where the SIMD ones can run (the
    two give identical results; tests compare them). ``per_row=True``: F32 weights are
    multiplied one dot product per row and token as ggml's mul_mat_id does for experts
    (ggml's mul_mat of 2+ tokens takes tinyBLAS instead, which sums in another order), and
    K-quant weights as one expert of mul_mat_id (simd_mm.product_order). ``repack=False``:
    the weights are one slice of a 3-D tensor multiplied by ggml's batched mul_mat, which
    ggml does not repack (K-quants never take the repacked Q4_K order)."""
    qt = qtype_of(qtype, compute=True)
    if qx.cols != cols:
        raise ValueError(f"activation length {qx.cols} != weight columns {cols}")
    if qx.qtype is not ACT_TYPE[qt]:
        raise ValueError(
            f"{qt.name} weights take {ACT_TYPE[qt].name} activations, got {qx.qtype.name}"
        )
    flat = as_bytes(raw, qt, rows, cols)
    out2 = out.reshape(qx.T, rows) if out.ndim == 1 else out
    _check_out(out2, qx.T, rows)
    kern, args = (_PORTABLE if portable or not HAVE_AVX2 else _FAST)[qt]
    threads = numba.get_num_threads()
    if threads > 1 and rows * cols * qx.T < PARALLEL_MIN_WORK:
        numba.set_num_threads(1)
        try:
            _call(kern, args, flat, rows, cols, qx, out2, 1, per_row, repack)
        finally:
            numba.set_num_threads(threads)
    else:
        nch = min(rows, threads * CHUNKS_PER_THREAD)
        _call(kern, args, flat, rows, cols, qx, out2, nch, per_row, repack)


def _call(kern, args, flat, rows, cols, qx, out2, nch, per_row, repack):
    if args in ("k4", "k"):  # K-quants: Q8_K activations, ggml's order for this product
        order, ngemm = product_order(args == "k4", rows, qx.T, per_row, repack)
        if args == "k4":
            kern(flat, rows, cols, qx.qs, qx.d, qx.bsums, out2, nch, order, ngemm)
        else:
            kern(flat, rows, cols, qx.qs, qx.d, qx.bsums, out2, nch, order)
    elif args == "0":  # 32-value blocks: Q8_0 activations
        kern(flat, rows, cols, qx.qs, qx.d, out2, nch)
    elif args == "f32":
        tiny = qx.T >= 2 and rows % 4 == 0 and cols % SIMD_F32 == 0 and not per_row
        kern(flat.view(np.float32), rows, cols, qx.xf, out2, nch, tiny)
    elif args == "f16":
        kern(flat, rows, cols, qx.xf, out2, nch)
    else:  # bf16
        kern(flat, rows, cols, qx.xf, out2, nch)


def _q8_0_portable(flat, rows, cols, qs, d, out, nch):
    _mm_q8_0(flat, flat.view(np.int8), rows, cols, qs, d, out, nch)


# weight type -> (kernel, argument kind)
_PORTABLE = {
    QT.Q4_K: (_mm_q4_k, "k4"),
    QT.Q5_K: (_mm_q5_k, "k"),
    QT.Q6_K: (_mm_q6_k, "k"),
    QT.Q8_0: (_q8_0_portable, "0"),
    QT.Q4_0: (_mm_q4_0, "0"),
    QT.F32: (_mm_f32, "f32"),
    QT.F16: (_mm_f16, "f16"),
    QT.BF16: (_mm_bf16, "bf16"),
}
_FAST = {
    **_PORTABLE,
    QT.Q4_K: (_mm_q4_k_simd, "k4"),
    QT.Q5_K: (_mm_q5_k_simd, "k"),
    QT.Q6_K: (_mm_q6_k_simd, "k"),
    QT.Q8_0: (_mm_q8_0_simd, "0"),
    QT.Q4_0: (_mm_q4_0_simd, "0"),
}


def matvec_q(raw, qtype, rows: int, cols: int, qx: QActivation, out: np.ndarray) -> None:
    """out[rows] = W @ x for one token's converted activations (qx.T == 1)."""
    if qx.T != 1:
        raise ValueError(f"matvec_q takes one token, got {qx.T}")
    _check_out(out, rows)
    matmul_q(raw, qtype, rows, cols, qx, out.reshape(1, rows))


def matvec(raw, qtype, rows: int, cols: int, x: np.ndarray, out: np.ndarray) -> None:
    """out[rows] = W[rows, cols] @ x[cols], W given as its GGUF bytes (x converted as ggml)."""
    _check_out(out, rows)
    matmul_q(raw, qtype, rows, cols, quantize_activation(x, qtype), out.reshape(1, rows))


def matmul(raw, qtype, rows: int, cols: int, X: np.ndarray, out: np.ndarray) -> None:
    """out[T, rows] = X[T, cols] @ W[rows, cols].T (X converted as ggml)."""
    matmul_q(raw, qtype, rows, cols, quantize_activation(X, qtype), out)


# ---------------------------------------------------------------------------------------
# NumPy reference: the same arithmetic (ggml's), written with dequantized integer blocks.


def matmul_ref(raw, qtype, rows: int, cols: int, X: np.ndarray) -> np.ndarray:
    """out[T, rows], computed as dequantized weights times dequantized activations in f64.

    Activations go through the same conversion as the kernels, so the only difference from
    the kernels is summation order and f32 rounding of partial sums.
    """
    qt = qtype_of(qtype, compute=True)
    qx = quantize_activation(np.atleast_2d(np.asarray(X, dtype=np.float32)), qt)
    w = dequantize(raw, qt, rows, cols).astype(np.float64)  # [rows, cols]
    if qx.xf is not None:
        xd = qx.xf.astype(np.float64)
    else:
        bs = cols // qx.d.shape[1]
        xd = qx.qs.astype(np.float64) * np.repeat(qx.d.astype(np.float64), bs, axis=1)
    return (xd @ w.T).astype(np.float32)
