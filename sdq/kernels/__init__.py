"""Numba kernels: dequantization, quantized matrix-vector / matrix-matrix products, ops.

    dequantize(raw, qtype, rows, cols) -> f32 [rows, cols]
    matvec(raw, qtype, rows, cols, x [cols], out [rows])        out = W @ x
    matmul(raw, qtype, rows, cols, X [T, cols], out [T, rows])  out = X @ W.T

    qx = quantize_activation(x, qtype)     # convert once, reuse for several matrices
    matvec_q(raw, qtype, rows, cols, qx, out [rows])
    matmul_q(raw, qtype, rows, cols, qx, out [T, rows])

``raw`` is a weight matrix's bytes exactly as stored in the GGUF file (uint8, flat or
[rows, row_bytes]; F32/F16 tensors may also be given as float arrays). Activations are
converted as ggml's CPU backend does (Q8_K for K-quants, Q8_0 for Q8_0/Q4_0, F16/BF16 for
those float weights), see act_quant.py. Norms, RoPE, attention, router: sdq.kernels.ops.
qwen35moe's gated delta-net (conv, L2 norm, the recurrent state): sdq.kernels.delta_net.
Routers with sigmoid scores, a selection bias or expert groups (glm4moe): sdq.kernels.routing.
Quant types, block sizes and the types the kernels compute with (SUPPORTED_COMPUTE):
sdq.format.quants; the block sizes the kernels are written for are named in quant.py.

May import: sdq.format (quant facts) and the base modules; nothing that runs a model.
"""

from sdq.kernels.act_quant import ACT_TYPE, QActivation, quantize_activation
from sdq.kernels.dot import matmul, matmul_q, matvec, matvec_q
from sdq.kernels.quant import dequantize

__all__ = [
    "ACT_TYPE",
    "QActivation",
    "dequantize",
    "matmul",
    "matmul_q",
    "matvec",
    "matvec_q",
    "quantize_activation",
]
