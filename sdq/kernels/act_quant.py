"""Quantization of activations (the right-hand side of a matrix product), as ggml's CPU backend.

ggml never multiplies a quantized weight by float activations: it first converts the
activation row to the weight type's ``vec_dot_type`` and then takes integer dot products
block by block. sdq does the same, so its rounding matches llama.cpp's:

| weight type          | activation format | block | stored per block                  |
| -------------------- | ----------------- | ----- | --------------------------------- |
| Q4_K, Q5_K, Q6_K     | Q8_K              | 256   | f32 d, int8 q[256], sums of 16 q  |
| Q8_0, Q4_0           | Q8_0              | 32    | f16 d, int8 q[32]                 |
| F16                  | F16               | -     | x rounded to half precision       |
| BF16                 | BF16              | -     | x rounded to bfloat16             |
| F32                  | F32               | -     | x as is                           |

Q8_0 follows ggml's x86 ``quantize_row_q8_0``: d = amax/127 stored as f16, q = round(x*127/amax)
with ties to even. Q8_K follows ``quantize_row_q8_K_ref``: the value of largest magnitude
maps to -127 (scale -127/max, ties to even, clamped at 127) and d = 1/scale.

Everything here is bit-exact with its NumPy reference (``*_ref``); fastmath is off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as QT

from sdq.errors import SdqError
from sdq.format.quants import qtype_of
from sdq.kernels.jit import inline, kernel
from sdq.kernels.quant import QK8_0, QK_K
from sdq.kernels.simd import round_f16

# The activation format each weight type is multiplied with (ggml's vec_dot_type).
ACT_TYPE = {
    QT.Q4_K: QT.Q8_K,
    QT.Q5_K: QT.Q8_K,
    QT.Q6_K: QT.Q8_K,
    QT.Q8_0: QT.Q8_0,
    QT.Q4_0: QT.Q8_0,
    QT.F16: QT.F16,
    QT.BF16: QT.BF16,
    QT.F32: QT.F32,
}


@dataclass
class QActivation:
    """Activations X [T, cols] converted once for all the matrices that multiply them.

    Q8_K / Q8_0: ``qs`` int8 [T, cols], ``d`` f32 [T, cols/block] (Q8_0's d already rounded
    to f16), ``bsums`` int16 [T, cols/16] (Q8_K only: sums of each 16 quants, |sum| <= 16 * 127).
    F32 / F16 / BF16: ``xf`` f32 [T, cols], holding values representable in that format.
    """

    qtype: QT  # activation format (Q8_K, Q8_0, F32, F16, BF16)
    T: int
    cols: int
    qs: np.ndarray | None = None
    d: np.ndarray | None = None
    bsums: np.ndarray | None = None
    xf: np.ndarray | None = None


# ---------------------------------------------------------------------------------------
# Rounding helpers (exact: powers of two scale exactly, rint ties to even).


@inline
def round_to_bits(v, bits, emin):
    """v (float32) rounded to nearest-even with ``bits`` significant bits, as float32.

    ``emin``: exponent (frexp convention) below which the format is subnormal. Values past
    the format's largest finite value are not handled here (callers check overflow).
    """
    a = float(v)
    if a == 0.0 or math.isinf(a) or math.isnan(a):
        return v
    _, e = math.frexp(a)  # a = m * 2**e, 0.5 <= |m| < 1
    if e < emin:
        e = emin
    ulp = math.ldexp(1.0, e - bits)
    return np.float32(np.rint(a / ulp) * ulp)


@inline
def to_f16(v):
    """float32 -> nearest IEEE half (ties to even, overflow to inf), returned as float32."""
    return round_f16(v)


@inline
def to_bf16(v):
    """float32 -> nearest bfloat16 (ties to even), returned as float32."""
    return round_to_bits(v, 8, -125)  # past the largest bfloat16 the cast gives inf


# ---------------------------------------------------------------------------------------
# Numba kernels. x: f32 [T, cols] (C order).


@kernel
def _quantize_q8_0(x, qs, d):
    T, cols = x.shape
    nb = cols // QK8_0
    for t in range(T):
        for b in range(nb):
            o = b * QK8_0
            amax = np.float32(0.0)
            for i in range(QK8_0):
                a = abs(x[t, o + i])
                if a > amax:
                    amax = a
            d[t, b] = to_f16(amax / np.float32(127.0))
            inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
            for i in range(QK8_0):
                qs[t, o + i] = np.int8(np.rint(x[t, o + i] * inv))


@kernel
def _quantize_q8_k(x, qs, d, bsums):
    T, cols = x.shape
    nb = cols // QK_K
    for t in range(T):
        for b in range(nb):
            o = b * QK_K
            amax = np.float32(0.0)
            vmax = np.float32(0.0)
            for i in range(QK_K):
                a = abs(x[t, o + i])
                if a > amax:
                    amax = a
                    vmax = x[t, o + i]
            if amax == 0:
                d[t, b] = 0
                for i in range(QK_K):
                    qs[t, o + i] = 0
                for g in range(QK_K // 16):
                    bsums[t, b * 16 + g] = 0
                continue
            iscale = np.float32(-127.0) / vmax
            for i in range(QK_K):
                q = np.rint(iscale * x[t, o + i])
                qs[t, o + i] = np.int8(min(q, np.float32(127.0)))
            for g in range(QK_K // 16):
                s = 0
                for i in range(16):
                    s += np.int32(qs[t, o + g * 16 + i])
                bsums[t, b * 16 + g] = s
            d[t, b] = np.float32(1.0) / iscale


@kernel
def _round_f16(x, out):
    T, cols = x.shape
    for t in range(T):
        for i in range(cols):
            out[t, i] = to_f16(x[t, i])


@kernel
def _round_bf16(x, out):
    T, cols = x.shape
    for t in range(T):
        for i in range(cols):
            out[t, i] = to_bf16(x[t, i])


def quantize_activation(x: np.ndarray, weight_qtype) -> QActivation:
    """Convert activations x [cols] or [T, cols] to the format ``weight_qtype`` multiplies."""
    wt = qtype_of(weight_qtype, compute=True)
    at = ACT_TYPE[wt]
    x2 = np.ascontiguousarray(x, dtype=np.float32)
    if x2.ndim == 1:
        x2 = x2.reshape(1, -1)
    T, cols = x2.shape
    if at == QT.Q8_K or at == QT.Q8_0:
        bs = QK_K if at == QT.Q8_K else QK8_0
        if cols % bs:
            raise ValueError(f"activation length {cols} is not a multiple of {at.name} block {bs}")
        qs = np.empty((T, cols), dtype=np.int8)
        d = np.empty((T, cols // bs), dtype=np.float32)
        try:
            if at == QT.Q8_K:
                bsums = np.empty((T, cols // 16), dtype=np.int16)
                _quantize_q8_k(x2, qs, d, bsums)
                return QActivation(at, T, cols, qs=qs, d=d, bsums=bsums)
            _quantize_q8_0(x2, qs, d)
            return QActivation(at, T, cols, qs=qs, d=d)
        except ZeroDivisionError:  # Q8_K: a block whose largest value is +-inf has no scale
            raise SdqError(
                f"activations [{T}, {cols}] for a {wt.name} product hold an infinite value: "
                "the model's weights overflow float32"
            ) from None
    if at == QT.F32:
        return QActivation(at, T, cols, xf=x2)
    xf = np.empty_like(x2)
    (_round_f16 if at == QT.F16 else _round_bf16)(x2, xf)
    return QActivation(at, T, cols, xf=xf)


# ---------------------------------------------------------------------------------------
# NumPy references.


def quantize_q8_0_ref(x: np.ndarray):
    """x f32 [T, cols] -> (qs int8 [T, cols], d f32 [T, cols/32])."""
    T, cols = x.shape
    xb = x.reshape(T, cols // QK8_0, QK8_0)
    amax = np.abs(xb).max(axis=-1)  # [T, nb]
    d = (amax / np.float32(127.0)).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    qs = np.rint(xb * inv[..., None]).astype(np.int8)
    return qs.reshape(T, cols), d


def quantize_q8_k_ref(x: np.ndarray):
    """x f32 [T, cols] -> (qs int8 [T, cols], d f32 [T, cols/256], bsums int16 [T, cols/16])."""
    T, cols = x.shape
    xb = x.reshape(T, cols // QK_K, QK_K)
    imax = np.abs(xb).argmax(axis=-1)[..., None]  # first index of the largest magnitude
    vmax = np.take_along_axis(xb, imax, axis=-1)  # [T, nb, 1], signed
    zero = vmax == 0
    with np.errstate(divide="ignore"):
        iscale = np.where(zero, np.float32(0), np.float32(-127.0) / vmax).astype(np.float32)
    qs = np.minimum(np.rint(xb * iscale), np.float32(127.0)).astype(np.int8)
    with np.errstate(divide="ignore"):
        d = np.where(zero[..., 0], np.float32(0), np.float32(1.0) / iscale[..., 0])
    bsums = qs.reshape(T, cols // 16, 16).astype(np.int32).sum(axis=-1).astype(np.int16)
    return qs.reshape(T, cols), d.astype(np.float32), bsums


def round_f16_ref(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # beyond the largest half -> inf, as intended
        return x.astype(np.float16).astype(np.float32)


def round_bf16_ref(x: np.ndarray) -> np.ndarray:
    n = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    n = ((n + (0x7FFF + ((n >> 16) & 1))) >> 16) << 16
    return n.astype(np.uint32).view(np.float32)
