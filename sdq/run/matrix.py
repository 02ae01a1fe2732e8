"""A weight matrix as the GGUF stores it, and the activations that multiply it, converted
once per quantized format (Q8_K, Q8_0, F16...) as ggml converts them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sdq.kernels import dequantize
from sdq.kernels.act_quant import ACT_TYPE, quantize_activation
from sdq.kernels.dot import matmul_q


@dataclass
class Matrix:
    """A weight matrix as stored in the GGUF: raw bytes (or floats), its type, [rows, cols]."""

    name: str
    raw: np.ndarray
    qtype: int
    rows: int
    cols: int
    # How ggml multiplies it (dot.matmul_q): one dot product per row and token (an F32
    # weight times strided activations), and whether ggml repacks it (3-D tensors: no)
    per_row: bool = False
    repack: bool = True

    def mul(self, acts: Activations, out: np.ndarray) -> None:  # X [T, cols] -> out [T, rows]
        qx = acts.of(self.qtype)
        matmul_q(self.raw, self.qtype, self.rows, self.cols, qx, out, per_row=self.per_row,
                 repack=self.repack)  # fmt: skip

    def rows_of(self, ids: np.ndarray) -> np.ndarray:  # [n] -> [n, cols] f32
        return dequantize(self.raw[ids], self.qtype, len(ids), self.cols)


class Activations:
    """Activations X [T, cols] converted (as ggml does: Q8_K, Q8_0, F16...) once per format,
    then shared by every matrix that multiplies them (q/k/v; all experts' gate and up)."""

    def __init__(self, x: np.ndarray):
        self.x = x
        self._by_format: dict = {}

    def of(self, weight_qtype):
        fmt = ACT_TYPE[weight_qtype]
        qx = self._by_format.get(fmt)
        if qx is None:
            qx = self._by_format[fmt] = quantize_activation(self.x, weight_qtype)
        return qx
