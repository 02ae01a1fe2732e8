"""One routed expert over the tokens routed to it, in a single kernel call (prefill).

Dimension key: T ubatch tokens, K experts used per token, D hidden, F expert FFN size,
n tokens routed to this expert (n <= T).

    parts[t, k] = w[t, k] * down(silu(gate x_t) * up x_t)     for every (t, k) with ids[t, k] == e

The layer input x [T, D] is converted to Q8_K once per layer (quantize_activation); Q8_K is
row-wise, so gathering a token's quantized row (quants, scale, block sums) gives exactly the
bytes that converting the gathered float row would. The kernel then runs what the engine did
with one Python call per step: gather -> gate and up products -> silu(gate) * up -> Q8_K of
the hidden rows -> down product -> weighted scatter into parts. Each step is the same code as
the separate kernels (simd_mm's row tiles, act_quant's Q8_K conversion, ops.silu_mul's
formula), in the same order, so the results equal theirs bit for bit. Single-threaded: the
engine runs whole experts on several threads at once.

K-quant weights (Q4_K, Q5_K, Q6_K) on x86 AVX2 only (``supported``); other types go through
``sdq.kernels.dot.matmul_q`` one product at a time.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT

from sdq.errors import SdqError
from sdq.format.quants import qtype_of
from sdq.kernels.act_quant import QActivation, _quantize_q8_k
from sdq.kernels.jit import inline, kernel
from sdq.kernels.ops import SIMD_F32, silu_at
from sdq.kernels.quant import QK_K
from sdq.kernels.simd import HAVE_AVX2
from sdq.kernels.simd_mm import (
    REPACKED,
    TILED,
    TILED_MIN_TOKENS,
    VEC_DOT,
    q4_k_row,
    q5_k_row,
    q6_k_row,
)

_KIND = {QT.Q4_K: 4, QT.Q5_K: 5, QT.Q6_K: 6}  # weight type -> kind passed to the kernel


def supported(*qtypes) -> bool:
    """True when expert_ffn can run experts with these (gate, up, down) weight types."""
    return HAVE_AVX2 and all(qtype_of(q, compute=True) in _KIND for q in qtypes)


ALIGN = 64  # bytes: each QBlocks array starts on a cache line (the tiles' 32-byte loads from
# an array at 16 mod 32 would straddle two lines every other time)


def _sizes(n_tokens: int, cols: int) -> list[tuple[type, int]]:
    """(dtype, row length) of the QBlocks arrays, in buffer order."""
    return [
        (np.int8, cols),
        (np.float32, cols // QK_K),
        (np.int16, cols // 16),
    ]


def scratch_bytes(n_tokens: int, cols: int) -> int:
    """Bytes of one QBlocks view of n_tokens x cols, with room to align each array."""
    return (
        sum(
            -(-n_tokens * w * np.dtype(t).itemsize // ALIGN) * ALIGN
            for t, w in _sizes(n_tokens, cols)
        )
        + ALIGN
    )


class QBlocks:
    """Q8_K rows [T, cols] carved out of a caller's byte buffer: qs int8 [T, cols], d f32
    [T, cols/256], bsums int16 [T, cols/16]."""

    def __init__(self, buf: np.ndarray, T: int, cols: int):
        raw = buf.reshape(-1).view(np.uint8)
        need = scratch_bytes(T, cols)
        if raw.nbytes < need:
            raise ValueError(f"scratch of {raw.nbytes} bytes < {need} for Q8_K [{T}, {cols}]")
        o = -raw.ctypes.data % ALIGN
        arrays = []
        for dtype, width in _sizes(T, cols):
            n = T * width * np.dtype(dtype).itemsize
            arrays.append(raw[o : o + n].view(dtype).reshape(T, width))
            o += -(-n // ALIGN) * ALIGN
        self.qs, self.d, self.bsums = arrays


# One row loop per weight type, each its own compiled function (as dot.py's kernels), so
# LLVM sees a single tile type per loop. With all three tile types inlined into one loop the
# products ran ~1.8x (gate, up) and ~2.5x (down: D rows of only F/256 blocks) slower than
# dot.py's (mini-model shapes, 6 tokens, one thread). Each product takes the order ggml's
# mul_mat_id takes for one expert (simd_mm.product_order).


@kernel
def _product_q4_k(raw, rows, cols, n, qs, d, bs, out):
    """out[:n, r] = the tokens' products with every row r of Q4_K weights (one thread)."""
    nb = cols // QK_K
    if rows % 8 == 0:
        order = REPACKED
    else:
        order = TILED if n >= TILED_MIN_TOKENS else VEC_DOT
    for r in range(rows):
        q4_k_row(raw, r, nb, qs, d, bs, n, out, order, 0)


@kernel
def _product_q5_k(raw, rows, cols, n, qs, d, bs, out):
    nb = cols // QK_K
    order = TILED if n >= TILED_MIN_TOKENS else VEC_DOT
    for r in range(rows):
        q5_k_row(raw, r, nb, qs, d, bs, n, out, order)


@kernel
def _product_q6_k(raw, rows, cols, n, qs, d, bs, out):
    nb = cols // QK_K
    order = TILED if n >= TILED_MIN_TOKENS else VEC_DOT
    for r in range(rows):
        q6_k_row(raw, r, nb, qs, d, bs, n, out, order)


@inline
def _product(kind, raw, rows, cols, n, qs, d, bs, out):
    if kind == 4:
        _product_q4_k(raw, rows, cols, n, qs, d, bs, out)
    elif kind == 5:
        _product_q5_k(raw, rows, cols, n, qs, d, bs, out)
    else:
        _product_q6_k(raw, rows, cols, n, qs, d, bs, out)


@kernel
def _expert_ffn(
    e, ids, weights, kinds, gate, up, down, F, D,
    xqs, xd, xbs, qs, qd, qbs, g, u, hqs, hd, hbs, dout, parts,
):  # fmt: skip
    T, K = ids.shape
    # tokens routed to e, in token order, and e's place in each one's top-K
    rows = np.empty(T, np.int64)
    slots = np.empty(T, np.int64)
    n = 0
    for t in range(T):
        for k in range(K):
            if ids[t, k] == e:
                rows[n] = t
                slots[n] = k
                n += 1
                break  # a token picks an expert at most once
    if n == 0:
        return 0
    for j in range(n):  # gather the tokens' Q8_K rows
        t = rows[j]
        qs[j, :] = xqs[t, :]
        qd[j, :] = xd[t, :]
        qbs[j, :] = xbs[t, :]
    _product(kinds[0], gate, F, D, n, qs, qd, qbs, g)
    _product(kinds[1], up, F, D, n, qs, qd, qbs, u)
    simd = F - F % SIMD_F32
    for j in range(n):  # silu(gate) * up, as ops.silu_mul
        for i in range(F):
            g[j, i] = silu_at(g[j, i], i < simd) * u[j, i]
    _quantize_q8_k(g[:n], hqs[:n], hd[:n], hbs[:n])
    _product(kinds[2], down, D, F, n, hqs, hd, hbs, dout)
    for j in range(n):  # weighted, into e's place in each token's top-K
        w = weights[rows[j], slots[j]]
        for i in range(D):
            parts[rows[j], slots[j], i] = dout[j, i] * w
    return n


def _kinds(qtypes: tuple, _memo: dict = {}):  # noqa: B006 (a cache)
    got = _memo.get(qtypes)
    if got is None:
        got = _memo[qtypes] = tuple(_KIND[qtype_of(q, compute=True)] for q in qtypes)
    return got


def expert_ffn(
    e: int,
    ids: np.ndarray,
    weights: np.ndarray,
    qtypes,
    views,
    F: int,
    D: int,
    qx: QActivation,
    in_q: QBlocks,
    hid_q: QBlocks,
    g: np.ndarray,
    u: np.ndarray,
    dout: np.ndarray,
    parts: np.ndarray,
) -> int:
    """parts[t, k] = weights[t, k] * down(silu(gate x_t) * up x_t) for ids[t, k] == e;
    returns the number of tokens routed to e.

    ids int32 [T, K], weights f32 [T, K]; qtypes and views: (gate, up, down) weight types and
    raw bytes (gate, up [F, D]; down [D, F]); qx: the layer input x [T, D] as Q8_K; in_q
    [>=T, D] and hid_q [>=T, F]: scratch for the gathered input and the hidden rows; g, u
    [>=T, F], dout [>=T, D]: f32 scratch; parts f32 [T, K, D]. hid_q may share memory with u
    (u is dead once silu(gate) * up is in g)."""
    kinds = _kinds(tuple(qtypes))
    gate, up, down = (np.ascontiguousarray(v).reshape(-1) for v in views)
    try:
        return int(
            _expert_ffn(
                e,
                ids,
                weights,
                kinds,
                gate,
                up,
                down,
                F,
                D,
                qx.qs,
                qx.d,
                qx.bsums,
                in_q.qs,
                in_q.d,
                in_q.bsums,
                g,
                u,
                hid_q.qs,
                hid_q.d,
                hid_q.bsums,
                dout,
                parts,
            )  # fmt: skip
        )
    except ZeroDivisionError:  # Q8_K of a hidden row holding +-inf
        raise SdqError(
            f"expert {e}: hidden activations [{F}] hold an infinite value: the model's"
            " weights overflow float32"
        ) from None
