"""Numba kernels: dequantization, quantized matrix-vector / matrix-matrix products, ops.

    dequantize(raw, qtype, rows, cols) -> f32 [rows, cols]
    matvec(raw, qtype, rows, cols, x [cols], out [rows])        out = W @ x
    matmul(raw, qtype, rows, cols, X [T, cols], out [T, rows])  out = X @ W.T

``raw`` is a weight matrix's bytes exactly as stored in the GGUF file (uint8, flat or
[rows, row_bytes]; F32/F16 tensors may also be given as float arrays).
"""

from sdq.kernels.dot import matmul, matvec
from sdq.kernels.quant import SUPPORTED, dequantize, qtype_of

__all__ = ["SUPPORTED", "dequantize", "matmul", "matvec", "qtype_of"]
