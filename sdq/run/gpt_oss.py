"""The gpt-oss forward pass (llama.cpp arch `gpt-oss`, LLM_ARCH_OPENAI_MOE).

Dimension key:
    T  tokens in the ubatch          D  n_embd                  E  experts    K  experts used
    H  query heads                   Hkv KV heads               Dh head dim   G = H / Hkv
    F  expert FFN size               C  context length (KV cache positions)
    W  sliding window (attention.sliding_window)

Per layer, against the qwen3moe pass in sdq.run.engine:

    a = rms_norm(x) ; q, k, v = a Wq + bq, a Wk + bk, a Wv + bv      # no q/k norms
    q, k = yarn_rope_neox(q, k)      # YaRN scaling (rope.scaling.*), per-layer freq base
    x += attention_with_sinks(q, cache) Wo + bo
         # each head's softmax also counts one extra logit (attn_sinks[h]) with no value;
         # sliding-window layers (even layers, or attention.sliding_window_pattern) see only
         # the last W positions, the others the whole context
    f = rms_norm(x) with post_attention_norm ; l = f Wr + br         # [T, E]
    top-K of l, softmax over the K chosen logits
    x += sum_k w_k (down_k(swiglu_oai(gate_k f + bg_k, up_k f + bu_k)) + bd_k)
         swiglu_oai(g, u) = min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1)

Expert weights are MXFP4 (sdq.kernels.mxfp4, Q8_0 activations) or any type matmul_q runs;
they are paged like any routed expert. The expert biases (ffn_*_exps.bias, E*(2F+D) floats
per layer) are small and stay resident with the dense weights. A full-attention layer keeps
a KV cache of C positions; a sliding-window layer a ring of W + n_ubatch - 1 (position p in
row p % R: sdq.run.workspace.swa_ring), which is what the memory plan counts.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numba
import numpy as np
from gguf.constants import GGMLQuantizationType

from sdq.errors import UnsupportedError
from sdq.kernels import mxfp4, ops
from sdq.kernels.act_quant import quantize_activation
from sdq.kernels.dot import matmul_q
from sdq.kernels.jit import FLOAT_MATH, kernel
from sdq.run.engine import Activations, DenseWeights, Engine, Matrix

ARCH = "gpt-oss"
SWIGLU_ALPHA = 1.702  # llama.cpp's constants for LLM_FFN_SWIGLU_OAI_MOE
SWIGLU_LIMIT = 7.0
MXFP4 = GGMLQuantizationType.MXFP4


# --- settings ------------------------------------------------------------------------------


@dataclass(frozen=True)
class YarnRope:
    """RoPE frequency settings as llama.cpp derives them from the rope.* keys."""

    n_dims: int
    freq_base: float
    freq_base_swa: float
    freq_scale: float  # 1 / rope.scaling.factor (1 without scaling)
    ext_factor: float  # 1 for YaRN, else 0
    attn_factor: float  # the magnitude factor before YaRN's own 1 + 0.1 ln(1/freq_scale)
    beta_fast: float
    beta_slow: float
    n_ctx_orig: int


@dataclass(frozen=True)
class GptOssSettings:
    sliding_window: int  # W; 0: no window
    swa_layers: frozenset[int]
    rope: YarnRope


def gpt_oss_settings(model) -> GptOssSettings:
    """The gpt-oss hyperparameters beyond ModelSpec, read with llama.cpp's keys and rules."""
    meta, spec, path = model.metadata, model.spec, model.path
    a = f"{spec.arch}."
    if a + "attention.sliding_window" not in meta:
        raise UnsupportedError(f"{path}: gpt-oss without {a}attention.sliding_window")
    window, swa = spec.sliding_window, frozenset(spec.swa_layers)
    scaling = str(meta.get(a + "rope.scaling.type", "linear"))
    if scaling not in ("none", "linear", "yarn"):
        raise UnsupportedError(f"{path}: rope scaling {scaling!r} (none, linear, yarn only)")
    factor = float(meta.get(a + "rope.scaling.factor", 0.0))
    freq_scale = 1.0 / factor if factor and scaling != "none" else 1.0
    ext = 1.0 if scaling == "yarn" else 0.0
    attn = 1.0
    if ext:
        f = np.float32(1.0) / np.float32(freq_scale)
        mscale = np.float32(1.0) if f <= 1 else np.float32(0.1) * np.log(f) + np.float32(1.0)
        attn = float(mscale / (np.float32(1.0) + np.float32(0.1) * np.log(f)))
    attn *= float(meta.get(a + "rope.scaling.attn_factor", 1.0))
    n_dims = int(meta.get(a + "rope.dimension_count", spec.head_dim))
    if n_dims != spec.head_dim:
        raise UnsupportedError(f"{path}: RoPE over {n_dims} of {spec.head_dim} head dims")
    rope = YarnRope(
        n_dims=n_dims,
        freq_base=spec.rope_base,
        freq_base_swa=float(meta.get(a + "rope.freq_base_swa", spec.rope_base)),
        freq_scale=freq_scale,
        ext_factor=ext,
        attn_factor=attn,
        beta_fast=32.0,
        beta_slow=1.0,
        n_ctx_orig=int(meta.get(a + "rope.scaling.original_context_length", spec.n_ctx_train)),
    )
    return GptOssSettings(window, swa, rope)


def yarn_corr_dims(n_dims: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float):
    """The first and last dims of YaRN's ramp between interpolation and extrapolation."""
    f32 = np.float32

    def dim(n_rot: float) -> np.float32:
        num = f32(n_dims) * np.log(f32(n_ctx_orig) / (f32(n_rot) * f32(2) * f32(math.pi)))
        return num / (f32(2) * np.log(f32(base)))

    low = max(0.0, float(np.floor(dim(beta_fast))))
    high = min(float(n_dims - 1), float(np.ceil(dim(beta_slow))))
    return low, high


def yarn_tables(positions: np.ndarray, rope: YarnRope, freq_base: float):
    """cos, sin [T, Dh/2] float32 for ops.rope_neox, as ggml's rope cache with YaRN
    (ops.rope_tables): theta runs pos * base^(-2i/Dh) in float32, interpolated by
    freq_scale where the ramp says, then cos/sin times the magnitude factor."""
    low, high = 0.0, 0.0
    if rope.ext_factor != 0.0:
        low, high = yarn_corr_dims(
            rope.n_dims, rope.n_ctx_orig, freq_base, rope.beta_fast, rope.beta_slow
        )
    yarn = ops.Yarn(rope.freq_scale, rope.ext_factor, rope.attn_factor, low, high)
    return ops.rope_tables(positions, freq_base, rope.n_dims, yarn)


# --- kernels -------------------------------------------------------------------------------


@kernel(parallel=True, fastmath=FLOAT_MATH)
def _attention_sinks(q, k_cache, v_cache, p0, Hkv, scale, sinks, window, out):
    T, H, Dh = q.shape
    R = k_cache.shape[0]  # position p in row p % R (R > every position: a plain cache)
    G = H // Hkv
    for th in numba.prange(T * H):
        t = th // H
        h = th % H
        c0 = (h // G) * Dh
        pos = p0 + t
        lo = max(0, pos - window + 1) if window > 0 else 0
        n = pos - lo + 1
        scores = np.empty(n, np.float32)
        m = sinks[h]
        for j in range(n):
            r = (lo + j) % R
            s = np.float32(0.0)
            for i in range(Dh):
                s += q[t, h, i] * k_cache[r, c0 + i]
            s *= scale
            scores[j] = s
            if s > m:
                m = s
        total = np.exp(sinks[h] - m)
        for j in range(n):
            e = np.exp(scores[j] - m)
            scores[j] = e
            total += e
        for i in range(Dh):
            out[t, h, i] = 0.0
        inv = np.float32(1.0) / total
        for j in range(n):
            r = (lo + j) % R
            p = scores[j] * inv
            for i in range(Dh):
                out[t, h, i] += p * v_cache[r, c0 + i]


def _check_cache(k_cache, p0: int, T: int, window: int, H: int, Hkv: int) -> None:
    """A cache of R rows holds what the ubatch reads: every position (R >= p0 + T) or, for a
    window W, the ring of the last W + T - 1 (sdq.run.workspace.swa_ring)."""
    R = k_cache.shape[0]
    need = p0 + T if window <= 0 else min(p0 + T, window + T - 1)
    if H % Hkv or R < need:
        raise ValueError(
            f"attention: {H} heads over {Hkv} KV heads, cache {k_cache.shape} for positions"
            f" {p0}..{p0 + T - 1} (window {window})"
        )


def attention_sinks(q, k_cache, v_cache, p0: int, Hkv: int, sinks, window: int, out) -> None:
    """Causal GQA attention of T tokens at p0..p0+T-1 whose per-head softmax also counts the
    sink logit sinks[h]; with window W > 0 a query at p sees keys p-W+1..p only.

    q [T, H, Dh]; k_cache, v_cache [R, Hkv*Dh] holding position p in row p % R: R > p0+T-1
    for a plain cache, R >= W + T - 1 for a window's ring; out [T, H, Dh]."""
    T, H, Dh = q.shape
    _check_cache(k_cache, p0, T, window, H, Hkv)
    scale = np.float32(1.0 / math.sqrt(Dh))
    _attention_sinks(q, k_cache, v_cache, p0, Hkv, scale, sinks, int(window), out)


def attention_sinks_ref(q, k_cache, v_cache, p0: int, Hkv: int, sinks, window: int):
    """NumPy reference of `attention_sinks` -> [T, H, Dh]."""
    T, H, Dh = q.shape
    R = k_cache.shape[0]
    G = H // Hkv
    out = np.zeros((T, H, Dh), np.float32)
    for t in range(T):
        pos = p0 + t
        lo = max(0, pos - window + 1) if window > 0 else 0
        rows = np.arange(lo, pos + 1) % R  # [n] ring rows of positions lo..pos
        for h in range(H):
            kv = h // G
            k = k_cache[rows, kv * Dh : (kv + 1) * Dh]  # [n, Dh]
            v = v_cache[rows, kv * Dh : (kv + 1) * Dh]  # [n, Dh]
            s = (k @ q[t, h]) / np.float32(math.sqrt(Dh))  # [n]
            m = max(float(s.max()), float(sinks[h]))
            e = np.exp(s - m)
            out[t, h] = (e @ v) / (e.sum() + np.exp(sinks[h] - m))
    return out


@kernel(fastmath=FLOAT_MATH)
def _swiglu_oai(gate, up, alpha, limit):  # flat views, in place into gate
    for i in range(gate.shape[0]):
        x = min(gate[i], limit)
        y = min(max(up[i], -limit), limit)
        gate[i] = x / (np.float32(1.0) + np.exp(alpha * -x)) * (y + np.float32(1.0))


def swiglu_oai(gate: np.ndarray, up: np.ndarray) -> None:
    """gate = swiglu_oai(gate, up), in place (llama.cpp's alpha 1.702, limit 7)."""
    _swiglu_oai(
        gate.reshape(-1), up.reshape(-1), np.float32(SWIGLU_ALPHA), np.float32(SWIGLU_LIMIT)
    )


def swiglu_oai_ref(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    x = np.minimum(gate, np.float32(SWIGLU_LIMIT))
    y = np.clip(up, -np.float32(SWIGLU_LIMIT), np.float32(SWIGLU_LIMIT))
    return (x / (1 + np.exp(np.float32(SWIGLU_ALPHA) * -x)) * (y + 1)).astype(np.float32)


def expert_matmul(raw, qtype: int, rows: int, cols: int, x: np.ndarray, out: np.ndarray):
    """out [n, rows] = x [n, cols] W.T for an expert matrix of any supported type."""
    if int(qtype) == MXFP4:
        mxfp4.matmul(raw, rows, cols, quantize_activation(x, GGMLQuantizationType.Q8_0), out)
    else:  # one expert of ggml's mul_mat_id
        matmul_q(raw, qtype, rows, cols, quantize_activation(x, qtype), out, per_row=True)


# --- weights -------------------------------------------------------------------------------


class BiasedMatrix(Matrix):
    """A matrix whose products add a bias row: out = X W.T + b."""

    bias: np.ndarray  # [rows]

    def mul(self, acts: Activations, out: np.ndarray) -> None:
        super().mul(acts, out)
        out += self.bias


def _biased(m: Matrix, bias: np.ndarray | None) -> Matrix:
    if bias is None:
        return m
    b = BiasedMatrix(m.name, m.raw, m.qtype, m.rows, m.cols)
    b.bias = bias
    return b


@dataclass
class GptOssLayer:
    attn_norm: np.ndarray  # [D]
    wq: Matrix  # [H*Dh, D] (+ bias)
    wk: Matrix  # [Hkv*Dh, D] (+ bias)
    wv: Matrix  # [Hkv*Dh, D] (+ bias)
    wo: Matrix  # [D, H*Dh] (+ bias)
    sinks: np.ndarray  # [H]
    ffn_norm: np.ndarray  # [D] post_attention_norm
    router: Matrix  # [E, D] + bias [E]
    gate_b: np.ndarray  # [E, F]
    up_b: np.ndarray  # [E, F]
    down_b: np.ndarray  # [E, D]
    shared: None = None  # no shared expert (read by Engine._moe_block)
    dense: None = None  # every layer is MoE


def assemble_weights(model, matrix, vector) -> DenseWeights:
    """DenseWeights of a gpt-oss file, from DenseWeights.load's tensor readers."""
    spec, tensors = model.spec, model.tensors
    E, F, D = spec.n_expert, spec.expert_ffn, spec.n_embd

    def optional(name: str) -> np.ndarray | None:
        return vector(name) if name in tensors else None

    layers = []
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        layers.append(
            GptOssLayer(
                attn_norm=vector(p + "attn_norm.weight"),
                wq=_biased(matrix(p + "attn_q.weight"), optional(p + "attn_q.bias")),
                wk=_biased(matrix(p + "attn_k.weight"), optional(p + "attn_k.bias")),
                wv=_biased(matrix(p + "attn_v.weight"), optional(p + "attn_v.bias")),
                wo=_biased(matrix(p + "attn_output.weight"), vector(p + "attn_output.bias")),
                sinks=vector(p + "attn_sinks.weight"),
                ffn_norm=vector(p + "post_attention_norm.weight"),
                router=_biased(matrix(p + "ffn_gate_inp.weight"), vector(p + "ffn_gate_inp.bias")),
                gate_b=vector(p + "ffn_gate_exps.bias").reshape(E, F),
                up_b=vector(p + "ffn_up_exps.bias").reshape(E, F),
                down_b=vector(p + "ffn_down_exps.bias").reshape(E, D),
            )
        )
    embd = matrix("token_embd.weight")
    output = matrix("output.weight") if "output.weight" in tensors else embd
    return DenseWeights(embd, vector("output_norm.weight"), output, layers)


# --- the engine ----------------------------------------------------------------------------


class GptOssWeights(DenseWeights):
    """DenseWeights.load reading a gpt-oss file's layers (assemble_weights)."""

    @classmethod
    def _assemble(cls, model, matrix, vector) -> DenseWeights:
        return assemble_weights(model, matrix, vector)


class GptOssEngine(Engine):
    """Engine with gpt-oss's attention block and expert FFN (biases, clamped SwiGLU)."""

    def __init__(self, model, experts, workspace, n_ctx, n_ubatch, weights=None):
        if model.spec.arch != ARCH:
            raise UnsupportedError(f"{model.path}: {model.spec.arch} is not gpt-oss")
        self.settings = gpt_oss_settings(model)
        weights = weights if weights is not None else GptOssWeights.load(model)
        super().__init__(model, experts, workspace, n_ctx, n_ubatch, weights=weights)
        swa = self.settings.swa_layers if self.settings.sliding_window else frozenset()
        self._swa_row = {il: i for i, il in enumerate(sorted(swa))}  # layer -> ring row
        self._full_row = {
            il: i for i, il in enumerate(l for l in range(model.spec.n_layer) if l not in swa)
        }
        self._tables: dict[float, tuple[np.ndarray, np.ndarray]] = {}
        self._tables_at = (-1, -1)

    def _rope_for(self, il: int, T: int):
        """cos, sin [T, Dh/2] of this ubatch's positions for layer il's frequency base."""
        if self._tables_at != (self.n_past, T):
            self._tables.clear()
            self._tables_at = (self.n_past, T)
        r = self.settings.rope
        base = r.freq_base_swa if il in self.settings.swa_layers else r.freq_base
        tables = self._tables.get(base)
        if tables is None:
            positions = np.arange(self.n_past, self.n_past + T, dtype=np.float32)
            tables = self._tables[base] = yarn_tables(positions, r, base)
        return tables

    def _kv_for(self, il: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Layer il's K and V cache [R, Hkv*Dh] and its window (0: none): a windowed layer's
        ring of R = W + n_ubatch - 1 rows, or a full layer's C rows."""
        s, ws = self.settings, self.ws
        if il in s.swa_layers and s.sliding_window:
            row = self._swa_row[il]
            return ws.swa_k_cache[row], ws.swa_v_cache[row], s.sliding_window
        row = self._full_row[il]
        return ws.k_cache[row], ws.v_cache[row], 0

    def _route(self, lw, logits: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> None:
        """Router logits [T, E] (bias added) -> top-K ids [T, K] and the softmax of the K
        chosen logits [T, K] (softmax over all, renormalised over the chosen: the same)."""
        ops.softmax_topk(logits, self.spec.n_expert_used, True, ids, weights)

    def _attention_block(self, il: int, lw: GptOssLayer, T: int) -> None:
        t0 = time.perf_counter()
        s, ws = self.spec, self.ws
        H, Hkv, Dh = s.n_head, s.n_head_kv, s.head_dim
        p0 = self.n_past
        x, xn = ws.x[:T], ws.xn[:T]  # [T, D]
        q, k, v = ws.q[:T], ws.k[:T], ws.v[:T]  # [T, H*Dh], [T, Hkv*Dh], [T, Hkv*Dh]
        ops.rms_norm(x, lw.attn_norm, s.rms_eps, xn)
        acts = Activations(xn)
        lw.wq.mul(acts, q)
        lw.wk.mul(acts, k)
        lw.wv.mul(acts, v)
        q3, k3 = q.reshape(T, H, Dh), k.reshape(T, Hkv, Dh)
        cos, sin = self._rope_for(il, T)  # [T, Dh/2] each
        ops.rope_neox(q3, cos, sin)
        ops.rope_neox(k3, cos, sin)
        k_cache, v_cache, window = self._kv_for(il)  # [R, Hkv*Dh] each
        rows = np.arange(p0, p0 + T) % k_cache.shape[0]  # [T] ring rows (plain: p0..p0+T-1)
        k_cache[rows] = k
        v_cache[rows] = v
        attn = ws.attn[:T]  # [T, H*Dh]
        attention_sinks(q3, k_cache, v_cache, p0, Hkv, lw.sinks, window, attn.reshape(T, H, Dh))
        lw.wo.mul(Activations(attn), xn)  # xn reused as the projection's output [T, D]
        x += xn
        self.timers.add("attention", time.perf_counter() - t0)

    def _expert(self, e: int, views, ids, weights, T: int, acts, bufs=None) -> None:
        """ffn_parts[t, k] = w[t, k] * (down(swiglu_oai(gate x + bg, up x + bu)) + bd) for the
        tokens t routed to e (k: e's place in t's top-K)."""
        ws = self.ws
        bufs = bufs or (ws.ffn_in[0], ws.ffn_gate[0], ws.ffn_up[0], ws.ffn_down[0])
        ffn_in, ffn_gate, ffn_up, ffn_down = bufs
        (F, D), _, _ = self.expert_shapes
        gq, uq, dq = self.expert_qtypes[self._layer]
        lw = self.weights.layers[self._layer]
        gate_raw, up_raw, down_raw = views
        rows, slots = np.nonzero(ids[:T] == e)  # tokens routed to e, and where in their top-K
        n = rows.shape[0]
        w = weights[rows, slots][:, None]  # [n, 1]
        xin = ffn_in[:n]  # [n, D]
        np.take(ws.xn[:T], rows, axis=0, out=xin)
        g, u, d = ffn_gate[:n], ffn_up[:n], ffn_down[:n]  # [n, F] [n, F] [n, D]
        expert_matmul(gate_raw, gq, F, D, xin, g)
        expert_matmul(up_raw, uq, F, D, xin, u)
        g += lw.gate_b[e]
        u += lw.up_b[e]
        swiglu_oai(g, u)
        expert_matmul(down_raw, dq, D, F, g, d)
        d += lw.down_b[e]
        d *= w
        ws.ffn_parts[rows, slots] = d  # a token picks an expert at most once
