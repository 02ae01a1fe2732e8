"""Matrix products on GGUF weight bytes: out[T, rows] = X[T, cols] @ W[rows, cols].T

Dimension key: T tokens (1 when decoding), rows/cols of the weight matrix, nb blocks per row.

The activations are first converted as ggml's CPU backend does (see act_quant.py): Q8_K for
K-quant weights, Q8_0 for Q8_0/Q4_0, F16/BF16/F32 for float weights. Each weight block is
then unpacked once into small integers already multiplied by their sub-block scale
(int16, |w| < 2^12) and dotted with the int8 activations of every token: one integer sum
per block and token, so the inner loops are plain int16 x int8 -> int32 reductions that LLVM
vectorizes, and a weight block is reused across all T tokens of a prefill ubatch (rows
outer, tokens inner). The float part per block is ggml's: ``d_w * d_x * isum`` (minus the
K-quant ``dmin * sum(min_j * bsum_j)`` term).

Parallelism: rows are split into chunks handed to Numba's threads (``numba.set_num_threads``
sets how many); kernels release the GIL.
"""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType as QT
from numba import prange

from sdq.kernels.act_quant import QActivation, quantize_activation
from sdq.kernels.jit import FLOAT_MATH, kernel
from sdq.kernels.quant import QK_K, as_bytes, dequantize, f16_at, kscale_min, qtype_of

CHUNKS_PER_THREAD = 2  # row chunks per thread: a little slack when a core is busy elsewhere


# ---------------------------------------------------------------------------------------
# K-quants x Q8_K. qs int8 [T, cols], d f32 [T, nb], bs int32 [T, cols/16], out f32 [T, rows]


@kernel(parallel=True)
def _mm_q4_k(raw, rows, cols, qs, d, bs, out, nch):
    T = qs.shape[0]
    nb = cols // QK_K
    for c in prange(nch):
        w = np.empty(QK_K, np.int16)  # unpacked block, scales applied
        mins = np.empty(8, np.int32)
        acc = np.empty(T, np.float32)
        for r in range(c * rows // nch, (c + 1) * rows // nch):
            acc[:] = 0
            for b in range(nb):
                o = (r * nb + b) * 144
                dw = f16_at(raw, o)
                dmw = f16_at(raw, o + 2)
                for p in range(4):  # 4 pairs of sub-blocks share 32 bytes (low, high nibbles)
                    sc0, m0 = kscale_min(raw, o + 4, 2 * p)
                    sc1, m1 = kscale_min(raw, o + 4, 2 * p + 1)
                    mins[2 * p] = m0
                    mins[2 * p + 1] = m1
                    q = o + 16 + 32 * p
                    for i in range(32):
                        v = np.int16(raw[q + i])
                        w[64 * p + i] = (v & 15) * sc0
                        w[64 * p + 32 + i] = (v >> 4) * sc1
                for t in range(T):
                    x0 = b * QK_K
                    isum = 0
                    for i in range(QK_K):
                        isum += np.int32(w[i]) * np.int32(qs[t, x0 + i])
                    msum = 0
                    for j in range(8):
                        msum += mins[j] * (bs[t, b * 16 + 2 * j] + bs[t, b * 16 + 2 * j + 1])
                    dx = d[t, b]
                    acc[t] += (dx * dw) * np.float32(isum) - (dx * dmw) * np.float32(msum)
            for t in range(T):
                out[t, r] = acc[t]


@kernel(parallel=True)
def _mm_q5_k(raw, rows, cols, qs, d, bs, out, nch):
    T = qs.shape[0]
    nb = cols // QK_K
    for c in prange(nch):
        w = np.empty(QK_K, np.int16)
        mins = np.empty(8, np.int32)
        acc = np.empty(T, np.float32)
        for r in range(c * rows // nch, (c + 1) * rows // nch):
            acc[:] = 0
            for b in range(nb):
                o = (r * nb + b) * 176
                dw = f16_at(raw, o)
                dmw = f16_at(raw, o + 2)
                for p in range(4):
                    sc0, m0 = kscale_min(raw, o + 4, 2 * p)
                    sc1, m1 = kscale_min(raw, o + 4, 2 * p + 1)
                    mins[2 * p] = m0
                    mins[2 * p + 1] = m1
                    q = o + 48 + 32 * p
                    for i in range(32):
                        v = np.int16(raw[q + i])
                        h = np.int16(raw[o + 16 + i]) >> (2 * p)
                        w[64 * p + i] = ((v & 15) | ((h & 1) << 4)) * sc0
                        w[64 * p + 32 + i] = ((v >> 4) | ((h & 2) << 3)) * sc1
                for t in range(T):
                    x0 = b * QK_K
                    isum = 0
                    for i in range(QK_K):
                        isum += np.int32(w[i]) * np.int32(qs[t, x0 + i])
                    msum = 0
                    for j in range(8):
                        msum += mins[j] * (bs[t, b * 16 + 2 * j] + bs[t, b * 16 + 2 * j + 1])
                    dx = d[t, b]
                    acc[t] += (dx * dw) * np.float32(isum) - (dx * dmw) * np.float32(msum)
            for t in range(T):
                out[t, r] = acc[t]


@kernel(parallel=True)
def _mm_q6_k(raw, rows, cols, qs, d, bs, out, nch):
    T = qs.shape[0]
    nb = cols // QK_K
    for c in prange(nch):
        w = np.empty(QK_K, np.int16)
        s = np.empty(4, np.int16)
        acc = np.empty(T, np.float32)
        for r in range(c * rows // nch, (c + 1) * rows // nch):
            acc[:] = 0
            for b in range(nb):
                o = (r * nb + b) * 210
                dw = f16_at(raw, o + 208)
                for h in range(2):  # two halves of 128 values
                    for k in range(2):  # 16-value groups within the 32 bytes of qh
                        # value n = 128h + 32g + 16k + i, its scale is sc[8h + 2g + k]
                        for g in range(4):
                            sv = np.int16(raw[o + 192 + 8 * h + 2 * g + k])
                            s[g] = sv - 256 if sv > 127 else sv
                        for i in range(16):
                            j = 16 * k + i
                            lo0 = np.int16(raw[o + 64 * h + j])
                            lo1 = np.int16(raw[o + 64 * h + 32 + j])
                            hi = np.int16(raw[o + 128 + 32 * h + j])
                            n = 128 * h + j
                            w[n] = (((lo0 & 15) | ((hi & 3) << 4)) - 32) * s[0]
                            w[n + 32] = (((lo1 & 15) | ((hi & 12) << 2)) - 32) * s[1]
                            w[n + 64] = (((lo0 >> 4) | (hi & 48)) - 32) * s[2]
                            w[n + 96] = (((lo1 >> 4) | ((hi & 192) >> 2)) - 32) * s[3]
                for t in range(T):
                    x0 = b * QK_K
                    isum = 0
                    for i in range(QK_K):
                        isum += np.int32(w[i]) * np.int32(qs[t, x0 + i])
                    acc[t] += (d[t, b] * dw) * np.float32(isum)
            for t in range(T):
                out[t, r] = acc[t]


# ---------------------------------------------------------------------------------------
# 32-value blocks x Q8_0. qs int8 [T, cols], d f32 [T, cols/32]


@kernel(parallel=True)
def _mm_q8_0(raw, raw8, rows, cols, qs, d, out, nch):
    T = qs.shape[0]
    nb = cols // 32
    for c in prange(nch):
        acc = np.empty(T, np.float32)
        for r in range(c * rows // nch, (c + 1) * rows // nch):
            acc[:] = 0
            for b in range(nb):
                o = (r * nb + b) * 34
                dw = f16_at(raw, o)
                for t in range(T):
                    isum = 0
                    for i in range(32):
                        isum += np.int32(raw8[o + 2 + i]) * np.int32(qs[t, b * 32 + i])
                    acc[t] += (dw * d[t, b]) * np.float32(isum)
            for t in range(T):
                out[t, r] = acc[t]


@kernel(parallel=True)
def _mm_q4_0(raw, rows, cols, qs, d, out, nch):
    T = qs.shape[0]
    nb = cols // 32
    for c in prange(nch):
        w = np.empty(32, np.int8)
        acc = np.empty(T, np.float32)
        for r in range(c * rows // nch, (c + 1) * rows // nch):
            acc[:] = 0
            for b in range(nb):
                o = (r * nb + b) * 18
                dw = f16_at(raw, o)
                for i in range(16):
                    v = np.int8(raw[o + 2 + i] & 15)
                    w[i] = v - 8
                    w[16 + i] = np.int8(raw[o + 2 + i] >> 4) - 8
                for t in range(T):
                    isum = 0
                    for i in range(32):
                        isum += np.int32(w[i]) * np.int32(qs[t, b * 32 + i])
                    acc[t] += (dw * d[t, b]) * np.float32(isum)
            for t in range(T):
                out[t, r] = acc[t]


# ---------------------------------------------------------------------------------------
# Float weights x float activations (already rounded to the weight's format).


@kernel(parallel=True, fastmath=FLOAT_MATH)
def _mm_f32(wf, rows, cols, xf, out, nch):
    T = xf.shape[0]
    for c in prange(nch):
        for r in range(c * rows // nch, (c + 1) * rows // nch):
            for t in range(T):
                s = np.float32(0.0)
                for i in range(cols):
                    s += wf[r * cols + i] * xf[t, i]
                out[t, r] = s


@kernel(parallel=True, fastmath=FLOAT_MATH)
def _mm_f16(w16, lut, rows, cols, xf, out, nch):
    T = xf.shape[0]
    for c in prange(nch):
        wrow = np.empty(cols, np.float32)
        for r in range(c * rows // nch, (c + 1) * rows // nch):
            for i in range(cols):
                wrow[i] = lut[w16[r * cols + i]]
            for t in range(T):
                s = np.float32(0.0)
                for i in range(cols):
                    s += wrow[i] * xf[t, i]
                out[t, r] = s


@kernel(parallel=True, fastmath=FLOAT_MATH)
def _mm_bf16(w16, rows, cols, xf, out, nch):
    T = xf.shape[0]
    for c in prange(nch):
        bits = np.empty(cols, np.uint32)
        wrow = bits.view(np.float32)
        for r in range(c * rows // nch, (c + 1) * rows // nch):
            for i in range(cols):
                bits[i] = np.uint32(w16[r * cols + i]) << 16
            for t in range(T):
                s = np.float32(0.0)
                for i in range(cols):
                    s += wrow[i] * xf[t, i]
                out[t, r] = s


_F16_LUT = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


# ---------------------------------------------------------------------------------------
# Public API


def _check_out(out, T, rows):
    if out.dtype != np.float32 or out.shape != (T, rows) or not out.flags.c_contiguous:
        raise ValueError(
            f"out must be a C-contiguous float32 array of shape {(T, rows)}, "
            f"got {out.dtype} {out.shape}"
        )


def matmul_q(raw, qtype, rows: int, cols: int, qx: QActivation, out: np.ndarray) -> None:
    """out[T, rows] = X @ W.T for activations already converted by quantize_activation."""
    qt = qtype_of(qtype)
    if qx.cols != cols:
        raise ValueError(f"activation length {qx.cols} != weight columns {cols}")
    flat = as_bytes(raw, qt, rows, cols)
    out2 = out.reshape(qx.T, rows) if out.ndim == 1 else out
    _check_out(out2, qx.T, rows)
    nch = min(rows, numba.get_num_threads() * CHUNKS_PER_THREAD)
    if qt == QT.Q4_K:
        _mm_q4_k(flat, rows, cols, qx.qs, qx.d, qx.bsums, out2, nch)
    elif qt == QT.Q5_K:
        _mm_q5_k(flat, rows, cols, qx.qs, qx.d, qx.bsums, out2, nch)
    elif qt == QT.Q6_K:
        _mm_q6_k(flat, rows, cols, qx.qs, qx.d, qx.bsums, out2, nch)
    elif qt == QT.Q8_0:
        _mm_q8_0(flat, flat.view(np.int8), rows, cols, qx.qs, qx.d, out2, nch)
    elif qt == QT.Q4_0:
        _mm_q4_0(flat, rows, cols, qx.qs, qx.d, out2, nch)
    elif qt == QT.F32:
        _mm_f32(flat.view(np.float32), rows, cols, qx.xf, out2, nch)
    elif qt == QT.F16:
        _mm_f16(flat.view(np.uint16), _F16_LUT, rows, cols, qx.xf, out2, nch)
    else:  # BF16
        _mm_bf16(flat.view(np.uint16), rows, cols, qx.xf, out2, nch)


def matvec_q(raw, qtype, rows: int, cols: int, qx: QActivation, out: np.ndarray) -> None:
    """out[rows] = W @ x for one token's converted activations (qx.T == 1)."""
    if qx.T != 1:
        raise ValueError(f"matvec_q takes one token, got {qx.T}")
    matmul_q(raw, qtype, rows, cols, qx, out.reshape(1, rows))


def matvec(raw, qtype, rows: int, cols: int, x: np.ndarray, out: np.ndarray) -> None:
    """out[rows] = W[rows, cols] @ x[cols], W given as its GGUF bytes (x converted as ggml)."""
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
    qt = qtype_of(qtype)
    qx = quantize_activation(np.atleast_2d(np.asarray(X, dtype=np.float32)), qt)
    w = dequantize(raw, qt, rows, cols).astype(np.float64)  # [rows, cols]
    if qx.xf is not None:
        xd = qx.xf.astype(np.float64)
    else:
        bs = cols // qx.d.shape[1]
        xd = qx.qs.astype(np.float64) * np.repeat(qx.d.astype(np.float64), bs, axis=1)
    return (xd @ w.T).astype(np.float32)
