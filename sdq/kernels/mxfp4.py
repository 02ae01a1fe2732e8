"""MXFP4 weights (GGML type 39): dequantization and matrix products, as ggml's CPU backend.

A block holds 32 values in 17 bytes: one E8M0 scale byte `e`, then 16 bytes of 4-bit E2M1
codes, value j in the low nibble of byte j and value 16 + j in its high nibble. A code c
decodes to KVALUES[c] * half(e), where KVALUES are the E2M1 values doubled (integers) and
half(e) = 2^(e - 128), the halved E8M0 scale (ggml_e8m0_to_fp32_half; e < 2 gives the
denormals 2^-128 and 2^-127 exactly as float32 bits).

ggml multiplies MXFP4 weights with Q8_0 activations (vec_dot_type Q8_0): per block, the
integer dot of the doubled codes with the int8 activations, times half(e) times the
activation block's f16 scale, summed over blocks in float32.

Dimension key: R weight rows, C columns (a multiple of 32), NB = C / 32 blocks per row,
T activation rows.
"""

from __future__ import annotations

import numba
import numpy as np
from gguf.constants import GGMLQuantizationType

from sdq.format.quants import block_facts
from sdq.kernels.dot import CHUNKS_PER_THREAD, PARALLEL_MIN_WORK
from sdq.kernels.jit import kernel
from sdq.kernels.ops import fma32, fma32_ref
from sdq.kernels.simd import HAVE_AVX2, dot_mxfp4

QK_MXFP4 = int(block_facts(GGMLQuantizationType.MXFP4).block_size)  # 32 values
BLOCK_BYTES = int(block_facts(GGMLQuantizationType.MXFP4).type_size)  # scale + 16 nibble bytes
KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)  # [16]


def half_scale_ref(e: np.ndarray) -> np.ndarray:
    """E8M0 bytes [n] -> 2^(e - 128) float32 [n]."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


HALF_SCALES = half_scale_ref(np.arange(256))  # [256] f32, indexed by the scale byte


@kernel
def _dequantize(blocks, kv, hs, out):  # blocks uint8 [N, 17]; hs f32 [256]; out f32 [N, 32]
    for b in range(blocks.shape[0]):
        d = hs[blocks[b, 0]]
        for j in range(16):
            q = blocks[b, 1 + j]
            out[b, j] = d * np.float32(kv[q & 0x0F])
            out[b, j + 16] = d * np.float32(kv[q >> 4])


def dequantize(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """MXFP4 bytes of a [rows, cols] matrix -> float32 [rows, cols]."""
    if cols % QK_MXFP4:
        raise ValueError(f"MXFP4 row length {cols} is not a multiple of {QK_MXFP4}")
    nb = rows * cols // QK_MXFP4
    blocks = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)[: nb * BLOCK_BYTES]
    out = np.empty((nb, QK_MXFP4), np.float32)  # [N, 32]
    _dequantize(blocks.reshape(nb, BLOCK_BYTES), KVALUES, HALF_SCALES, out)
    return out.reshape(rows, cols)


def dequantize_ref(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """NumPy reference of `dequantize`."""
    blocks = np.asarray(raw).reshape(-1).view(np.uint8).reshape(-1, BLOCK_BYTES)  # [N, 17]
    d = half_scale_ref(blocks[:, 0])[:, None]  # [N, 1]
    qs = blocks[:, 1:]  # [N, 16]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=1)  # [N, 32]
    return (d * KVALUES[codes].astype(np.float32)).reshape(rows, cols)


# --- products with Q8_0 activations -------------------------------------------------------


@kernel(parallel=True)
def _matmul(w, kv, hs, xq, xd, out):  # w uint8 [R, NB*17]; xq int8 [T, C]; xd f32 [T, NB]
    R = w.shape[0]
    T, nb = xd.shape
    for r in numba.prange(R):
        for t in range(T):
            acc = np.float32(0.0)
            for b in range(nb):
                o = b * BLOCK_BYTES
                d = xd[t, b] * hs[w[r, o]]
                s1 = 0
                s2 = 0
                for j in range(16):
                    q = w[r, o + 1 + j]
                    s1 += np.int32(xq[t, b * 32 + j]) * np.int32(kv[q & 0x0F])
                    s2 += np.int32(xq[t, b * 32 + 16 + j]) * np.int32(kv[q >> 4])
                acc = fma32(np.float32(s1 + s2), d, acc)
            out[t, r] = acc


@kernel(parallel=True)
def _matmul_simd(w, hs, xq, xd, out, nch):  # as _matmul, one AVX2 block product per (b, t)
    R = w.shape[0]
    T, nb = xd.shape
    flat = w.reshape(-1)
    for c in numba.prange(nch):
        acc = np.empty(T, np.float32)
        for r in range(c * R // nch, (c + 1) * R // nch):
            acc[:] = 0
            for b in range(nb):
                o = (r * nb + b) * BLOCK_BYTES
                scale = hs[flat[o]]
                for t in range(T):
                    isum = dot_mxfp4(flat, o, xq, t * nb * 32 + b * 32)
                    acc[t] = fma32(np.float32(isum), xd[t, b] * scale, acc[t])
            for t in range(T):
                out[t, r] = acc[t]


def matmul(
    raw: np.ndarray, rows: int, cols: int, qx, out: np.ndarray, portable: bool = False
) -> None:
    """out[T, rows] = X @ W.T for MXFP4 weights W [rows, cols] and X already converted to
    Q8_0 (sdq.kernels.act_quant.QActivation of qtype Q8_0). Where the CPU has AVX2 the block
    products use vpshufb + vpmaddubsw (sdq.kernels.simd.dot_mxfp4), else plain Numba;
    ``portable=True`` forces the latter. Both sum each row's blocks in the same order: the
    same floats, and those of ggml's x86 build for weights it repacks (rows % 8 == 0, as an
    expert's rows are: gemv/gemm_mxfp4_8x8_q8_0, one FMA per block,
    ``acc = fma(isum, e * d_x, acc)``). Other row counts take ggml's vec_dot_mxfp4_q8_0,
    which sums in eight lanes over alternate blocks: there the two agree to float rounding."""
    if cols % QK_MXFP4 or qx.cols != cols:
        raise ValueError(f"MXFP4 product: {cols} weight columns, {qx.cols} activations")
    w = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    w = w[: rows * cols // QK_MXFP4 * BLOCK_BYTES].reshape(rows, -1)  # [R, NB*17]
    out2 = out.reshape(qx.T, rows)
    if portable or not HAVE_AVX2:
        _matmul(w, KVALUES, HALF_SCALES, qx.qs, qx.d, out2)
        return
    xq = np.ascontiguousarray(qx.qs).reshape(-1)  # [T*C] int8
    threads = numba.get_num_threads()
    if threads > 1 and rows * cols * qx.T < PARALLEL_MIN_WORK:  # too small to wake threads
        numba.set_num_threads(1)
        try:
            _matmul_simd(w, HALF_SCALES, xq, qx.d, out2, 1)
        finally:
            numba.set_num_threads(threads)
    else:
        _matmul_simd(w, HALF_SCALES, xq, qx.d, out2, min(rows, threads * CHUNKS_PER_THREAD))


def matmul_ref(raw: np.ndarray, rows: int, cols: int, xq: np.ndarray, xd: np.ndarray):
    """NumPy reference of `matmul`: xq int8 [T, C], xd f32 [T, NB] -> f32 [T, rows]."""
    blocks = np.asarray(raw).reshape(-1).view(np.uint8).reshape(rows, cols // 32, BLOCK_BYTES)
    d = half_scale_ref(blocks[..., 0].reshape(-1)).reshape(rows, -1)  # [R, NB]
    qs = blocks[..., 1:]  # [R, NB, 16]
    codes = KVALUES[np.concatenate([qs & 0x0F, qs >> 4], axis=-1)].astype(np.int32)  # [R,NB,32]
    T = xq.shape[0]
    x = xq.reshape(T, -1, 32).astype(np.int32)  # [T, NB, 32]
    sums = np.einsum("rbj,tbj->trb", codes, x).astype(np.float32)  # [T, R, NB]
    scale = (xd[:, None, :] * d[None, :, :]).astype(np.float32)  # [T, R, NB]
    out = np.zeros((T, rows), np.float32)
    for b in range(scale.shape[2]):  # block order, one FMA per block as the kernel
        out = fma32_ref(sums[:, :, b], scale[:, :, b], out)
    return out
