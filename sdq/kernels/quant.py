"""Dequantization of GGUF tensor bytes to float32, one Numba kernel per block format.

Block layouts (bytes per block / values per block), as stored in GGUF files:

- Q8_0  34/32:  f16 d, int8 q[32];                       x = d * q
- Q4_0  18/32:  f16 d, u8 qs[16] (low nibbles = values 0..15, high = 16..31);
                                                         x = d * (nibble - 8)
- Q4_K 144/256: f16 d, f16 dmin, u8 scales[12] (eight 6-bit scale/min pairs), u8 qs[128];
                sub-block j of 32 values: x = (d * sc_j) * q - (dmin * m_j)
- Q5_K 176/256: like Q4_K plus u8 qh[32] before qs: bit j of qh[l] is bit 4 of value l of
                sub-block j
- Q6_K 210/256: u8 ql[128] (low 4 bits), u8 qh[64] (high 2 bits), int8 scales[16], f16 d;
                16 values per scale: x = (d * sc) * (q - 32)
- F32 / F16 / BF16: plain arrays (BF16 = the top 16 bits of an f32).

The block sizes (values and bytes) are the constants below (QK_K, QK8_0, Q4_K_BYTES, ...),
taken from sdq.format.quants' table and shared by every kernel module; the offsets inside a
block are the layouts above.

The float operations happen in the same order, in float32, as in gguf-py's reference, so
results are bit-identical (fastmath is off for these kernels, see jit.py). Each Numba kernel
has a NumPy reference (``*_ref``) beside it; tests compare them bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
from gguf import GGMLQuantizationType as QT

from sdq.errors import UnsupportedError
from sdq.format.quants import block_facts, qtype_of, row_bytes
from sdq.kernels.jit import inline, kernel

# Block sizes the kernels are written for, from sdq.format.quants' table (Numba compiles
# module-level ints as constants, so a name costs nothing over the literal).
QK_K = block_facts(QT.Q4_K).block_size  # values per K-quant super-block (256)
QK8_0 = block_facts(QT.Q8_0).block_size  # values per Q8_0 block (32)
QK4_0 = block_facts(QT.Q4_0).block_size  # values per Q4_0 block (32)
Q8_0_BYTES = block_facts(QT.Q8_0).type_size  # 34
Q4_0_BYTES = block_facts(QT.Q4_0).type_size  # 18
Q4_K_BYTES = block_facts(QT.Q4_K).type_size  # 144
Q5_K_BYTES = block_facts(QT.Q5_K).type_size  # 176
Q6_K_BYTES = block_facts(QT.Q6_K).type_size  # 210


def _tensor(name: str | None) -> str | None:
    """How the quant table's errors name a kernel's weight matrix."""
    return f"tensor {name}" if name else None


def as_bytes(raw: np.ndarray, qtype: QT, rows: int, cols: int, name: str | None = None):
    """Flat uint8 view of a weight matrix's bytes, checked against (rows, cols).

    The view is read-only: file memmaps are read-only, arena slots are not, and Numba
    compiles a separate specialization for each; handing it one kind halves compile time."""
    if (
        type(raw) is np.ndarray
        and raw.ndim == 1
        and raw.dtype == np.uint8
        and not raw.flags.writeable
        and raw.size == rows * row_bytes(qtype, cols, _tensor(name) or "weights")
    ):
        return raw  # already what the kernels take (e.g. the view returned last time)
    raw = np.asarray(raw)
    if not raw.flags.c_contiguous:
        raw = np.ascontiguousarray(raw)
    flat = raw.reshape(-1).view(np.uint8)
    need = rows * row_bytes(qtype, cols, _tensor(name) or "weights")
    if flat.size < need:
        where = f" for tensor {name}" if name else ""
        raise UnsupportedError(
            f"{flat.size} bytes given{where}, {need} needed for {rows} x {cols} {qtype.name}"
        )
    view = flat[:need]
    view.flags.writeable = False
    return view


# ---------------------------------------------------------------------------------------
# Scalar helpers shared by the kernels (inlined).


@inline
def f16_at(b, i):
    """The IEEE half at bytes b[i], b[i+1] (little endian) as float32, exactly."""
    h = np.int32(b[i]) | (np.int32(b[i + 1]) << 8)
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:
        v = np.float32(math.ldexp(float(m), -24))
    elif e == 31:
        v = np.float32(np.inf) if m == 0 else np.float32(np.nan)
    else:
        v = np.float32(math.ldexp(float(m + 1024), e - 25))
    return -v if h & 0x8000 else v


@inline
def kscale_min(s, o, j):
    """6-bit (scale, min) of sub-block j from the 12 packed bytes s[o:o+12] (Q4_K, Q5_K)."""
    if j < 4:
        sc = np.int32(s[o + j]) & 63
        mn = np.int32(s[o + j + 4]) & 63
    else:
        sc = (np.int32(s[o + j + 4]) & 0xF) | ((np.int32(s[o + j - 4]) >> 6) << 4)
        mn = (np.int32(s[o + j + 4]) >> 4) | ((np.int32(s[o + j]) >> 6) << 4)
    return sc, mn


# ---------------------------------------------------------------------------------------
# Numba kernels: raw [nb * type_size] uint8 -> out [nb * block_size] float32


@kernel
def dequant_q8_0(raw, out):
    nb = out.size // QK8_0
    for b in range(nb):
        o = b * Q8_0_BYTES
        d = f16_at(raw, o)
        for i in range(QK8_0):
            q = np.int32(raw[o + 2 + i])
            q = q - 256 if q > 127 else q
            out[b * QK8_0 + i] = np.float32(q) * d


@kernel
def dequant_q4_0(raw, out):
    nb = out.size // QK4_0
    for b in range(nb):
        o = b * Q4_0_BYTES
        d = f16_at(raw, o)
        for i in range(QK4_0 // 2):
            v = np.int32(raw[o + 2 + i])
            out[b * QK4_0 + i] = d * np.float32((v & 0xF) - 8)
            out[b * QK4_0 + QK4_0 // 2 + i] = d * np.float32((v >> 4) - 8)


@kernel
def dequant_q4_k(raw, out):
    nb = out.size // QK_K
    for b in range(nb):
        o = b * Q4_K_BYTES
        d = f16_at(raw, o)
        dmin = f16_at(raw, o + 2)
        for j in range(8):
            sc, mn = kscale_min(raw, o + 4, j)
            dl = d * np.float32(sc)
            ml = dmin * np.float32(mn)
            q = o + 16 + (j >> 1) * 32
            shift = 4 * (j & 1)
            y = b * QK_K + j * 32
            for i in range(32):
                out[y + i] = dl * np.float32((np.int32(raw[q + i]) >> shift) & 0xF) - ml


@kernel
def dequant_q5_k(raw, out):
    nb = out.size // QK_K
    for b in range(nb):
        o = b * Q5_K_BYTES
        d = f16_at(raw, o)
        dmin = f16_at(raw, o + 2)
        for j in range(8):
            sc, mn = kscale_min(raw, o + 4, j)
            dl = d * np.float32(sc)
            ml = dmin * np.float32(mn)
            q = o + 48 + (j >> 1) * 32
            shift = 4 * (j & 1)
            y = b * QK_K + j * 32
            for i in range(32):
                lo = (np.int32(raw[q + i]) >> shift) & 0xF
                hi = (np.int32(raw[o + 16 + i]) >> j) & 1
                out[y + i] = dl * np.float32(lo | (hi << 4)) - ml


@kernel
def dequant_q6_k(raw, out):
    nb = out.size // QK_K
    for b in range(nb):
        o = b * Q6_K_BYTES
        d = f16_at(raw, o + 208)
        for n in range(QK_K):
            h = n >> 7  # which 128-value half
            r = n & 127
            lo = (np.int32(raw[o + 64 * h + (r & 63)]) >> (4 * (r >> 6))) & 0xF
            hi = (np.int32(raw[o + 128 + 32 * h + (r & 31)]) >> (2 * (r >> 5))) & 3
            s = np.int32(raw[o + 192 + (n >> 4)])
            s = s - 256 if s > 127 else s
            out[b * QK_K + n] = (d * np.float32(s)) * np.float32((lo | (hi << 4)) - 32)


_DEQUANT_KERNELS = {
    QT.Q8_0: dequant_q8_0,
    QT.Q4_0: dequant_q4_0,
    QT.Q4_K: dequant_q4_k,
    QT.Q5_K: dequant_q5_k,
    QT.Q6_K: dequant_q6_k,
}


def dequantize(raw, qtype, rows: int, cols: int, name: str | None = None) -> np.ndarray:
    """Float32 [rows, cols] values of a GGUF matrix given its raw bytes.

    ``raw``: uint8 [rows, row_bytes] or flat (a memmap view or an arena slot), or an
    F32/F16 array as returned for float tensors. Any other type raises UnsupportedError;
    a row length that is not a whole number of blocks, GGUFError.
    """
    qt = qtype_of(qtype, _tensor(name), compute=True)
    flat = as_bytes(raw, qt, rows, cols, name)
    if qt == QT.F32:
        return flat.view(np.float32).reshape(rows, cols).copy()
    if qt == QT.F16:
        return flat.view(np.float16).astype(np.float32).reshape(rows, cols)
    if qt == QT.BF16:
        return (flat.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(rows, cols)
    out = np.empty(rows * cols, dtype=np.float32)
    _DEQUANT_KERNELS[qt](flat, out)
    return out.reshape(rows, cols)


# ---------------------------------------------------------------------------------------
# NumPy references (vectorized; written from the block layouts above).


def _blocks(raw, qtype):
    flat = np.asarray(raw).reshape(-1).view(np.uint8)
    return flat.reshape(-1, block_facts(qtype).type_size)


def _f16(b):  # [nb, 2] uint8 -> [nb, 1] float32
    return b.copy().view(np.float16).astype(np.float32)


def dequant_q8_0_ref(raw):
    blk = _blocks(raw, QT.Q8_0)
    return (blk[:, 2:].view(np.int8).astype(np.float32) * _f16(blk[:, :2])).reshape(-1)


def dequant_q4_0_ref(raw):
    blk = _blocks(raw, QT.Q4_0)
    qs = blk[:, 2:]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.int32) - 8  # [nb, 32]
    return (_f16(blk[:, :2]) * q.astype(np.float32)).reshape(-1)


def _kscales_ref(s):
    """[nb, 12] packed bytes -> (scales [nb, 8], mins [nb, 8]) as int32."""
    s = s.astype(np.int32)
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc, mn


def _q4_nibbles(qs):
    """[nb, 128] bytes -> [nb, 8, 32] values: pairs of sub-blocks share 32 bytes (low, high)."""
    q = qs.reshape(-1, 4, 1, 32).astype(np.int32) >> np.array([0, 4]).reshape(1, 1, 2, 1)
    return (q & 0xF).reshape(-1, 8, 32)


def dequant_q4_k_ref(raw):
    blk = _blocks(raw, QT.Q4_K)
    d, dmin = _f16(blk[:, 0:2]), _f16(blk[:, 2:4])
    sc, mn = _kscales_ref(blk[:, 4:16])
    q = _q4_nibbles(blk[:, 16:Q4_K_BYTES]).astype(np.float32)
    dl = (d * sc.astype(np.float32))[:, :, None]
    ml = (dmin * mn.astype(np.float32))[:, :, None]
    return (dl * q - ml).reshape(-1)


def dequant_q5_k_ref(raw):
    blk = _blocks(raw, QT.Q5_K)
    d, dmin = _f16(blk[:, 0:2]), _f16(blk[:, 2:4])
    sc, mn = _kscales_ref(blk[:, 4:16])
    qh = blk[:, 16:48].astype(np.int32)[:, None, :] >> np.arange(8).reshape(1, 8, 1)
    q = (_q4_nibbles(blk[:, 48:Q5_K_BYTES]) | ((qh & 1) << 4)).astype(np.float32)
    dl = (d * sc.astype(np.float32))[:, :, None]
    ml = (dmin * mn.astype(np.float32))[:, :, None]
    return (dl * q - ml).reshape(-1)


def dequant_q6_k_ref(raw):
    blk = _blocks(raw, QT.Q6_K)
    ql = blk[:, 0:128].reshape(-1, 2, 1, 64).astype(np.int32)
    lo = (ql >> np.array([0, 4]).reshape(1, 1, 2, 1)) & 0xF  # [nb, 2, 2, 64]
    qh = blk[:, 128:192].reshape(-1, 2, 1, 32).astype(np.int32)
    hi = (qh >> np.array([0, 2, 4, 6]).reshape(1, 1, 4, 1)) & 3  # [nb, 2, 4, 32]
    q = lo.reshape(-1, QK_K) | (hi.reshape(-1, QK_K) << 4)
    sc = blk[:, 192:208].view(np.int8).astype(np.float32)  # [nb, 16]
    d = _f16(blk[:, 208:Q6_K_BYTES])
    ds = np.repeat(d * sc, 16, axis=1)  # [nb, 256]
    return (ds * (q - 32).astype(np.float32)).reshape(-1)


DEQUANT_REFS = {
    QT.Q8_0: dequant_q8_0_ref,
    QT.Q4_0: dequant_q4_0_ref,
    QT.Q4_K: dequant_q4_k_ref,
    QT.Q5_K: dequant_q5_k_ref,
    QT.Q6_K: dequant_q6_k_ref,
}


def dequantize_ref(raw, qtype, rows: int, cols: int) -> np.ndarray:
    """NumPy reference of :func:`dequantize` (float types are plain conversions)."""
    qt = qtype_of(qtype, compute=True)
    flat = as_bytes(raw, qt, rows, cols)
    if qt in (QT.F32, QT.F16, QT.BF16):
        return dequantize(flat, qt, rows, cols)
    return DEQUANT_REFS[qt](flat).reshape(rows, cols)
