"""NumPy reference of ggml's x86 K-quant products, float operation for float operation.

Dimension key: T tokens, rows/cols of the weight matrix, nb = cols/256 blocks per row,
k < 8 integer (and float) lanes, s < 8 sub-blocks of 32 values (Q4_K, Q5_K).

A K-quant x Q8_K product has an exact integer part and a float part whose order decides the
last bits. ggml's x86 build (AVX2 and up) takes one of four orders, by weight type, rows
and the number of tokens (simd_mm.product_order):

- vec_dot_q{4,5,6}_K_q8_K (fewer than 8 tokens): per block, eight int32 lanes, lane k
  holding the block's integer products of the values 32c + 4k .. 32c + 4k + 3 (c < 8)
  times their sub-block scale; ``acc[k] = fma(d_x * d_w, lane_k, acc[k])`` over the blocks,
  the lanes summed as ((0+4)+(2+6)) + ((1+5)+(3+7)). The min term is kept apart: Q4_K in
  four lanes (lane m: mins 2m and 2m+1 times their sub-block sums) with
  ``fma(-(d_x * dmin_w), ., .)``, summed as (0+2)+(1+3); Q5_K in one float,
  ``summs = fma(-(d_x * dmin_w), sum_s min_s * bsum_s, summs)``. Q6_K stores q + 32 and takes
  32 * (bsum_2k * sc_2k + bsum_2k+1 * sc_2k+1) off integer lane k.
- the tiled kernel (8 tokens or more; for mul_mat_id, 8 tokens routed to the expert): per
  block, s1 = the block's integer sum and s2 = sum_s min_s * bsum_s,
  ``acc = fma(fma(-dmin_w, s2, s1 * d_w), d_x, acc)`` (Q6_K: ``fma(s1 * d_w, d_x, acc)``).
- Q4_K weights whose row count is a multiple of 8 are repacked at load (CPU_REPACK,
  gemv/gemm_q4_K_8x8_q8_K): one float sum and one min sum per (row, token),
  ``acc = fma(isum, d_w * d_x, acc)`` and ``acc_min = fma(imin, dmin_w * d_x, acc_min)``,
  the result ``acc - acc_min``. gemv (the tokens past mul_mat's last multiple of 4, and every
  mul_mat_id product) takes one step per block; gemm (mul_mat's groups of 4 tokens) one per
  pair of sub-blocks (64 values).

The Numba kernels in dot.py (portable) and simd_mm.py (AVX2 tiles) compute exactly these
numbers; the tests compare them bit for bit with this module.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT

from sdq.format.quants import qtype_of
from sdq.kernels.ops import fma32_ref
from sdq.kernels.quant import (
    Q4_K_BYTES,
    Q5_K_BYTES,
    Q6_K_BYTES,
    QK_K,
    _blocks,
    _f16,
    _kscales_ref,
    _q4_nibbles,
)
from sdq.kernels.simd_mm import REPACKED, TILED, product_order


def hsum8_ref(v) -> np.ndarray:
    """v[..., 8] -> ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)) in float32."""
    v = np.asarray(v, np.float32)
    a = v[..., :4] + v[..., 4:]
    return (a[..., 0] + a[..., 2]) + (a[..., 1] + a[..., 3])


def _lanes(w, x):
    """Integer lanes: w [rows, nb, 256] (quants times sub-block scale), x [T, nb, 256]
    (Q8_K quants) -> [T, rows, nb, 8], lane k summing values 32c + 4k + i (c < 8, i < 4)."""
    w = w.reshape(w.shape[0], w.shape[1], 8, 8, 4).astype(np.int64)
    x = x.reshape(x.shape[0], x.shape[1], 8, 8, 4).astype(np.int64)
    return np.einsum("rbcki,tbcki->trbk", w, x)


def _weights(flat, qt, rows, nb):
    """(w [rows, nb, 256] int quants times scale, d_w [rows, nb], dmin_w [rows, nb] or None,
    mins [rows, nb, 8] or None, Q6_K scales [rows, nb, 16] or None)."""
    blk = _blocks(flat, qt)
    if qt is QT.Q6_K:
        ql = blk[:, 0:128].reshape(-1, 2, 1, 64).astype(np.int32)
        lo = (ql >> np.array([0, 4]).reshape(1, 1, 2, 1)) & 0xF
        qh = blk[:, 128:192].reshape(-1, 2, 1, 32).astype(np.int32)
        hi = (qh >> np.array([0, 2, 4, 6]).reshape(1, 1, 4, 1)) & 3
        q = lo.reshape(-1, QK_K) | (hi.reshape(-1, QK_K) << 4)  # q + 32, unsigned
        sc = blk[:, 192:208].view(np.int8).astype(np.int32)  # [rows * nb, 16]
        w = q * np.repeat(sc, 16, axis=1)
        d = _f16(blk[:, 208:Q6_K_BYTES])
        return (w.reshape(rows, nb, QK_K), d.reshape(rows, nb), None, None,
                sc.reshape(rows, nb, 16))  # fmt: skip
    d, dmin = _f16(blk[:, 0:2]).reshape(rows, nb), _f16(blk[:, 2:4]).reshape(rows, nb)
    sc, mn = _kscales_ref(blk[:, 4:16])
    if qt is QT.Q4_K:
        q = _q4_nibbles(blk[:, 16:Q4_K_BYTES])
    else:
        qh = blk[:, 16:48].astype(np.int32)[:, None, :] >> np.arange(8).reshape(1, 8, 1)
        q = _q4_nibbles(blk[:, 48:Q5_K_BYTES]) | ((qh & 1) << 4)
    w = (q * sc[:, :, None]).reshape(rows, nb, QK_K)
    return w, d, dmin, mn.reshape(rows, nb, 8), None


def kquant_matmul_ref(flat, qtype, rows: int, cols: int, qs, d, bsums, per_row=False, repack=True):
    """out [T, rows] of K-quant weight bytes times Q8_K activations (qs int8 [T, cols],
    d f32 [T, nb], bsums int16 [T, cols/16]) in the order ggml's x86 build takes for this
    product (simd_mm.product_order: mul_mat, or mul_mat_id's product for one expert)."""
    qt = qtype_of(qtype, compute=True)
    nb = cols // QK_K
    T = qs.shape[0]
    order, ngemm = product_order(qt is QT.Q4_K, rows, T, per_row, repack)
    w, dw, dmw, mins, sc6 = _weights(flat, qt, rows, nb)
    x = np.asarray(qs).reshape(T, nb, QK_K)
    dx = np.asarray(d, np.float32)[:, None, :]  # [T, 1, nb]
    lanes = _lanes(w, x)  # [T, rows, nb, 8]
    bs = np.asarray(bsums).astype(np.int64).reshape(T, 1, nb, 16)
    if mins is not None:
        sub = bs[..., 0::2] + bs[..., 1::2]  # [T, 1, nb, 8]: each sub-block's sum
        msum = mins[None].astype(np.int64) * sub  # [T, rows, nb, 8]
    if order == REPACKED:
        # [T, rows, nb, 4]: integer sums of each pair of sub-blocks (64 values)
        pair = np.einsum("rbpi,tbpi->trbp", w.reshape(rows, nb, 4, 64).astype(np.int64),
                         x.reshape(T, nb, 4, 64).astype(np.int64))  # fmt: skip
        mpair = msum[..., 0::2] + msum[..., 1::2]
        gemm = (np.arange(T) < ngemm)[:, None]  # [T, 1]
        acc = np.zeros((T, rows), np.float32)
        acc_min = np.zeros((T, rows), np.float32)
        for b in range(nb):
            sd, sm = dw[None, :, b] * dx[:, :, b], dmw[None, :, b] * dx[:, :, b]
            # gemv: one FMA per block
            acc_v = fma32_ref(pair[:, :, b].sum(-1).astype(np.float32), sd, acc)
            min_v = fma32_ref(mpair[:, :, b].sum(-1).astype(np.float32), sm, acc_min)
            for p in range(4):  # gemm: one FMA per pair of sub-blocks
                acc = fma32_ref(pair[:, :, b, p].astype(np.float32), sd, acc)
                acc_min = fma32_ref(mpair[:, :, b, p].astype(np.float32), sm, acc_min)
            acc, acc_min = np.where(gemm, acc, acc_v), np.where(gemm, acc_min, min_v)
        return acc - acc_min
    if qt is QT.Q6_K:
        corr = (bs.reshape(T, 1, nb, 8, 2) * sc6[None].reshape(1, rows, nb, 8, 2)).sum(-1)
        lanes = lanes - 32 * corr
    if order == TILED:  # per block: fma(fma(-dmin_w, s2, s1 * d_w), d_x, acc)
        acc = np.zeros((T, rows), np.float32)
        for b in range(nb):
            res = lanes[:, :, b].sum(-1).astype(np.float32) * dw[None, :, b]
            if mins is not None:
                s2 = msum[:, :, b].sum(-1).astype(np.float32)
                res = fma32_ref(-dmw[None, :, b], s2, res)
            acc = fma32_ref(res, dx[:, :, b], acc)
        return acc
    acc = np.zeros((T, rows, 8), np.float32)
    acc_m = np.zeros((T, rows, 4), np.float32)
    summs = np.zeros((T, rows), np.float32)
    for b in range(nb):
        dd = (dx[:, :, b] * dw[None, :, b])[..., None]  # [T, rows, 1]
        acc = fma32_ref(dd, lanes[:, :, b].astype(np.float32), acc)
        if qt is QT.Q4_K:
            dm = -(dx[:, :, b] * dmw[None, :, b])[..., None]
            prod = msum[:, :, b, 0::2] + msum[:, :, b, 1::2]  # [T, rows, 4]
            acc_m = fma32_ref(dm, prod.astype(np.float32), acc_m)
        elif qt is QT.Q5_K:
            dm = -(dx[:, :, b] * dmw[None, :, b])
            summs = fma32_ref(dm, msum[:, :, b].sum(-1).astype(np.float32), summs)
    out = hsum8_ref(acc)
    if qt is QT.Q4_K:
        out = out + ((acc_m[..., 0] + acc_m[..., 2]) + (acc_m[..., 1] + acc_m[..., 3]))
    elif qt is QT.Q5_K:
        out = out + summs
    return out
