"""Quantized matrix-vector and matrix-matrix products on GGUF weight bytes."""

from __future__ import annotations

import numpy as np

from sdq.kernels.quant import dequantize


def matvec(raw, qtype, rows: int, cols: int, x: np.ndarray, out: np.ndarray) -> None:
    """out[rows] = W[rows, cols] @ x[cols] (W given as its GGUF bytes)."""
    w = dequantize(raw, qtype, rows, cols)  # [rows, cols]
    np.dot(w, np.asarray(x, dtype=np.float32), out=out)


def matmul(raw, qtype, rows: int, cols: int, X: np.ndarray, out: np.ndarray) -> None:
    """out[T, rows] = X[T, cols] @ W[rows, cols].T."""
    w = dequantize(raw, qtype, rows, cols)  # [rows, cols]
    np.dot(np.asarray(X, dtype=np.float32), w.T, out=out)
