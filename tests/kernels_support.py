"""Random GGUF blocks for the kernel tests: random bytes with sane f16 scales."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT

from sdq.format.quants import block_facts

QUANTIZED = [QT.Q8_0, QT.Q4_0, QT.Q4_K, QT.Q5_K, QT.Q6_K]
FLOATS = [QT.F32, QT.F16, QT.BF16]

# byte offsets of the f16 scales inside each block type
_F16_SCALES = {QT.Q8_0: [0], QT.Q4_0: [0], QT.Q4_K: [0, 2], QT.Q5_K: [0, 2], QT.Q6_K: [208]}


def random_matrix(rng: np.random.Generator, qtype: QT, rows: int, cols: int, scale=0.05):
    """uint8 [rows, row_bytes]: random quants, f16 scales uniform in (-scale, scale)."""
    bs, ts = block_facts(qtype)
    nb = rows * cols // bs
    if qtype in FLOATS:
        x = rng.standard_normal(rows * cols).astype(np.float32)
        if qtype == QT.F32:
            return x.view(np.uint8).reshape(rows, -1)
        if qtype == QT.F16:
            return x.astype(np.float16).view(np.uint8).reshape(rows, -1)
        return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1)
    raw = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
    for off in _F16_SCALES[qtype]:
        d = rng.uniform(-scale, scale, size=nb).astype(np.float16)
        raw[:, off : off + 2] = d.view(np.uint8).reshape(nb, 2)
    return raw.reshape(rows, -1)
