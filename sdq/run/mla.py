"""deepseek2's multi-head latent attention (MLA) block, its compressed KV cache and its YaRN RoPE.

Dimension key:
    T  tokens in the ubatch      D  n_embd        H  query heads     C  context (cache positions)
    R  kv_lora_rank (latent)     P  RoPE dims     Dk key/query head size (Dk - P non-RoPE dims)
    Dv value head size           Lq q_lora_rank (0: no low-rank query)

Per layer, for T tokens at positions p0..p0+T-1 (llama.cpp's graph with the absorbed
attn_k_b / attn_v_b, which turns MLA into one-KV-head attention over the latent):

    a = rms_norm(x)                                        # [T, D]
    q = a Wq  (or rms_norm(a Wq_a) Wq_b)                   # [T, H, Dk] = [nope | pe]
    kv = a Wkv_a                                           # [T, R + P] = [c | k_pe]
    q_pe, k_pe = rope(q_pe), rope(k_pe)                    # adjacent pairs, YaRN-scaled
    c = rms_norm(c)                                        # kv_a_norm
    cache[p0:p0+T] = [c | k_pe]                            # R + P floats per token and layer
    q_abs[h] = q_nope[h] Wk_b[h]^T                         # [T, R]: the query in latent space
    lat[h] = softmax(([q_abs[h] | q_pe[h]] . cache) * kq_scale) @ cache[:, :R]     # [T, R]
    out[h] = lat[h] Wv_b[h]^T                              # [T, Dv]
    x += concat_h(out) Wo

The attention itself is sdq.kernels.ops.attention with one KV head of R + P dims whose values
are the keys themselves (its last P output dims are not used). `mla_block_ref` states the same
block in float64 without the absorption (keys and values decompressed per head), so the test
checks the algebra as well as the code.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from sdq.errors import UnsupportedError
from sdq.kernels import ops


@dataclass
class MlaAttention:
    """One deepseek2 block's attention weights (Matrix objects of sdq.run.engine)."""

    wq: object | None  # [H*Dk, D]; None when the query is low-rank
    wq_a: object | None  # [Lq, D]
    q_a_norm: np.ndarray | None  # [Lq]
    wq_b: object | None  # [H*Dk, Lq]
    wkv_a: object  # [R + P, D]
    kv_a_norm: np.ndarray  # [R]
    wk_b: list  # H x [R, Dk - P]
    wv_b: list  # H x [Dv, R]
    wo: object  # [D, H*Dv]


@dataclass
class MlaLayer:
    """A deepseek2 block: MLA, then a dense FFN (leading blocks) or routed + shared experts."""

    attn_norm: np.ndarray  # [D]
    attn: MlaAttention
    ffn_norm: np.ndarray  # [D]
    dense: object | None  # sdq.run.engine.DenseFFN in the leading dense blocks, else None
    router: object | None  # [E, D] Matrix; None in dense blocks
    shared: object | None  # sdq.run.engine.SharedExpert (ungated); None in dense blocks
    exp_probs_b: np.ndarray | None = None  # [E] selection bias of sigmoid routers (V3)


# --- loading ---------------------------------------------------------------------------------


def check(model) -> None:
    """One-line refusals of deepseek2 files the engine cannot run."""
    spec, path = model.spec, model.path
    m = spec.mla
    if m is None:
        raise UnsupportedError(
            f"{path}: deepseek2 without attention.key_length_mla (legacy fused attn_kv_b); "
            "reconvert with a current llama.cpp (split attn_k_b / attn_v_b)"
        )
    if m.rope_dim % 2 or m.rope_dim >= m.key_length:
        raise UnsupportedError(f"{path}: RoPE dims {m.rope_dim} for key length {m.key_length}")
    for il in range(spec.n_layer):
        if f"blk.{il}.attn_k_b.weight" not in model.tensors:
            raise UnsupportedError(f"{path}: block {il} has no attn_k_b (fused attn_kv_b?)")


def load_layers(model, matrix, vector, dense_ffn, shared_expert) -> list[MlaLayer]:
    """Every block's weights; matrix / vector read one tensor (sdq.run.engine.DenseWeights),
    dense_ffn / shared_expert build the engine's DenseFFN / SharedExpert from three matrices."""
    spec = model.spec
    m, H = spec.mla, spec.n_head
    layers = []
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        low_rank = m.q_lora_rank > 0
        attn = MlaAttention(
            wq=None if low_rank else matrix(p + "attn_q.weight"),
            wq_a=matrix(p + "attn_q_a.weight") if low_rank else None,
            q_a_norm=vector(p + "attn_q_a_norm.weight") if low_rank else None,
            wq_b=matrix(p + "attn_q_b.weight") if low_rank else None,
            wkv_a=matrix(p + "attn_kv_a_mqa.weight"),
            kv_a_norm=vector(p + "attn_kv_a_norm.weight"),
            # ggml: wk_b times the permuted (strided) q_nope: one dot per row and token;
            # wv_b times the attention's contiguous output: as any mul_mat
            wk_b=per_head(matrix(p + "attn_k_b.weight"), H, per_row=True),
            wv_b=per_head(matrix(p + "attn_v_b.weight"), H, per_row=False),
            wo=matrix(p + "attn_output.weight"),
        )
        dense = il < spec.n_dense_lead
        layers.append(
            MlaLayer(
                attn_norm=vector(p + "attn_norm.weight"),
                attn=attn,
                ffn_norm=vector(p + "ffn_norm.weight"),
                dense=dense_ffn(
                    matrix(p + "ffn_gate.weight"),
                    matrix(p + "ffn_up.weight"),
                    matrix(p + "ffn_down.weight"),
                )
                if dense
                else None,
                router=None if dense else matrix(p + "ffn_gate_inp.weight"),
                shared=None
                if dense or not spec.n_shared_expert
                else shared_expert(
                    matrix(p + "ffn_gate_shexp.weight"),
                    matrix(p + "ffn_up_shexp.weight"),
                    matrix(p + "ffn_down_shexp.weight"),
                ),
                exp_probs_b=vector(p + "exp_probs_b.bias")
                if p + "exp_probs_b.bias" in model.tensors
                else None,
            )
        )
    return layers


def per_head(mat, H: int, per_row: bool) -> list:
    """A 3-D tensor [H, rows, cols] (ggml [cols, rows, H]) as H matrices [rows, cols] that
    share its bytes (rows of one head are contiguous in any type); ggml does not repack
    3-D weights of a mul_mat."""
    rows = mat.rows // H
    raw = mat.raw.reshape(mat.rows, -1)  # [H*rows, cols] floats or [H*rows, row bytes]
    return [
        type(mat)(
            f"{mat.name}[{h}]",
            raw[h * rows : (h + 1) * rows],
            mat.qtype,
            rows,
            mat.cols,
            per_row=per_row,
            repack=False,
        )  # fmt: skip
        for h in range(H)
    ]


# --- RoPE with YaRN, and the attention scale -------------------------------------------------


@dataclass(frozen=True)
class RopeScaling:
    """What llama.cpp's context derives from the rope.scaling.* keys (float32 throughout)."""

    freq_scale: float  # 1 / factor (1: none)
    ext_factor: float  # 1 for YaRN, else 0
    attn_factor: float  # the magnitude factor handed to the RoPE op
    corr_low: float  # YaRN correction dims: below low, pure extrapolation ...
    corr_high: float  # ... above high, pure interpolation
    kq_scale: float  # attention scores' scale (YaRN mscale^2 / sqrt(Dk))


def rope_scaling(spec) -> RopeScaling:
    m, f32 = spec.mla, np.float32
    scaled = m.rope_scaling != "none" and m.rope_factor > 0
    freq_scale = f32(1.0) / f32(m.rope_factor) if scaled else f32(1.0)
    ext = f32(1.0) if m.rope_scaling == "yarn" else f32(0.0)
    attn = f32(1.0)
    if ext != 0:
        factor = f32(1.0) / freq_scale

        def mscale_of(scale, mscale):
            return f32(1.0) if scale <= 1 else f32(0.1) * f32(mscale) * f32(math.log(scale)) + 1

        if m.yarn_log_mul != 0:
            all_dims = f32(m.yarn_log_mul)
            mscale = all_dims if all_dims != 1 else f32(1.0)  # deepseek2: mscale = mscale_all_dim
            attn = f32(mscale_of(factor, mscale) / mscale_of(factor, all_dims))
        else:
            attn = f32(mscale_of(factor, 1.0))
        attn = f32(attn * (f32(1.0) / (f32(1.0) + f32(0.1) * f32(math.log(factor)))))
    attn = f32(attn * f32(m.rope_attn_factor))
    ln_inv = f32(math.log(f32(1.0) / freq_scale))
    org = f32(attn * (f32(1.0) + f32(0.1) * ln_inv))
    mscale = f32(org * (f32(1.0) + f32(0.1) * f32(m.yarn_log_mul) * ln_inv))
    kq_scale = f32(mscale * mscale / f32(math.sqrt(m.key_length)))
    low, high = _corr_dims(m.rope_dim, m.rope_orig_ctx, spec.rope_base, m)
    return RopeScaling(float(freq_scale), float(ext), float(attn), low, high, float(kq_scale))


def _corr_dims(n_dims: int, n_ctx_orig: int, base: float, m) -> tuple[float, float]:
    def dim(n_rot: float) -> float:
        n_rot32 = np.float32(n_rot)
        ratio = np.float32(n_ctx_orig) / (n_rot32 * np.float32(2 * math.pi))
        return float(
            np.float32(n_dims) * np.float32(math.log(ratio)) / (2 * np.float32(math.log(base)))
        )

    low = math.floor(dim(m.yarn_beta_fast))
    high = math.ceil(dim(m.yarn_beta_slow))
    return float(max(0, low)), float(min(n_dims - 1, high))


def rope_tables(spec, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [T, P/2] float32 for ops.rope_norm, with YaRN's interpolation ramp and
    magnitude factor folded in, computed as ggml's RoPE cache does."""
    sc = rope_scaling(spec)
    yarn = ops.Yarn(sc.freq_scale, sc.ext_factor, sc.attn_factor, sc.corr_low, sc.corr_high)
    return ops.rope_tables(positions, spec.rope_base, spec.mla.rope_dim, yarn)


# --- the block -------------------------------------------------------------------------------


def attention_block(engine, il: int, lw: MlaLayer, T: int) -> None:
    """x += MLA(rms_norm(x)) for the ubatch's T tokens; fills the layer's compressed cache."""
    from sdq.run.matrix import Activations

    t0 = time.perf_counter()
    s, ws, a = engine.spec, engine.ws, lw.attn
    m = s.mla
    H, R, P, Dv, eps = s.n_head, m.kv_lora_rank, m.rope_dim, m.value_length, s.rms_eps
    nope, p0 = m.key_length - P, engine.n_past
    x, xn = ws.x[:T], ws.xn[:T]  # [T, D]
    ops.rms_norm(x, lw.attn_norm, eps, xn)
    acts = Activations(xn)
    q = ws.q[:T]  # [T, H*Dk]
    if a.wq is not None:
        a.wq.mul(acts, q)
    else:
        qa = ws.q_a[:T]  # [T, Lq]
        a.wq_a.mul(acts, qa)
        ops.rms_norm(qa, a.q_a_norm, eps, qa)
        a.wq_b.mul(Activations(qa), q)
    kv = ws.kv_a[:T]  # [T, R + P]
    a.wkv_a.mul(acts, kv)
    q3 = q.reshape(T, H, m.key_length)
    cos, sin = engine._rope  # [T, P/2] each
    ops.rope_norm(q3[:, :, nope:], cos, sin)
    ops.rope_norm(kv.reshape(T, 1, R + P)[:, :, R:], cos, sin)
    ops.rms_norm(kv[:, :R], a.kv_a_norm, eps, kv[:, :R])
    cache = ws.kv_cache[engine.kv_row[il]]  # [C, R + P]
    cache[p0 : p0 + T] = kv
    qm = ws.q_mla[:T].reshape(T, H, R + P)  # [T, H, R + P]
    qm[:, :, R:] = q3[:, :, nope:]
    lat = ws.attn_latent[:T].reshape(T, H, R + P)  # [T, H, R + P]; the last P dims unused
    attn = ws.attn[:T]  # [T, H*Dv]
    q_abs, v_h = ws.mla_q_abs[:T], ws.mla_v[:T]  # [T, R], [T, Dv]: one head's
    for h in range(H):
        qn = np.ascontiguousarray(q3[:, h, :nope])  # [T, Dk - P]
        a.wk_b[h].mul(Activations(qn), q_abs)
        qm[:, h, :R] = q_abs
    ops.attention(qm, cache, cache, p0, 1, ws.scores, lat, rope_scaling_of(engine).kq_scale)
    for h in range(H):
        lh = np.ascontiguousarray(lat[:, h, :R])  # [T, R]
        a.wv_b[h].mul(Activations(lh), v_h)
        attn[:, h * Dv : (h + 1) * Dv] = v_h
    a.wo.mul(Activations(attn), xn)  # xn reused as the projection's output [T, D]
    x += xn
    engine.timers.add("attention", time.perf_counter() - t0)


def rope_scaling_of(engine) -> RopeScaling:
    sc = engine.__dict__.get("_mla_scaling")
    if sc is None:
        sc = engine._mla_scaling = rope_scaling(engine.spec)
    return sc


def workspace_layout(spec, n_ctx: int, T: int) -> dict[str, tuple[tuple[int, ...], type]]:
    """MLA's buffers: the compressed cache (named *cache: the plan counts it as the KV cache)
    replaces k_cache / v_cache; q, k, v and attn take MLA's sizes."""
    m = spec.mla
    H, R, P, Dk, Dv = spec.n_head, m.kv_lora_rank, m.rope_dim, m.key_length, m.value_length
    out = {
        "kv_cache": ((spec.n_layer, n_ctx, R + P), np.float32),  # [L, C, R + P]
        "q": ((T, H * Dk), np.float32),
        "kv_a": ((T, R + P), np.float32),  # latent and RoPE key of the ubatch
        "q_mla": ((T, H * (R + P)), np.float32),  # absorbed query and RoPE query
        "attn_latent": ((T, H * (R + P)), np.float32),  # attention output in latent space
        "mla_q_abs": ((T, R), np.float32),  # one head's query in latent space
        "mla_v": ((T, Dv), np.float32),  # one head's value output
        "attn": ((T, H * Dv), np.float32),
    }
    if m.q_lora_rank:
        out["q_a"] = ((T, m.q_lora_rank), np.float32)
    return out


# --- NumPy reference -------------------------------------------------------------------------


def mla_block_ref(model, il: int, x: np.ndarray, p0: int, cache_x: np.ndarray) -> np.ndarray:
    """float64 MLA of block il without the absorption: x [T, D] new tokens at p0.., cache_x
    [p0, D] the block inputs of the earlier positions (their keys and values are recomputed).
    Returns the attention output projected by attn_output [T, D] (before the residual add).
    Weights dequantized with gguf-py; RoPE tables from rope_tables (float32, as llama.cpp)."""
    from gguf.quants import dequantize

    s = model.spec
    m, H = s.mla, s.n_head
    R, P, Dk, Dv = m.kv_lora_rank, m.rope_dim, m.key_length, m.value_length
    nope = Dk - P

    def w(name):
        t = model.tensors[name]
        raw = np.asarray(model.tensor_data(name))
        if t.qtype in (0, 1):
            return raw.astype(np.float64)
        return dequantize(raw, t.qtype).astype(np.float64).reshape(tuple(reversed(t.shape)))

    def rms(v, g):
        v = v.astype(np.float64)
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + s.rms_eps) * g

    def rope(v, cos, sin):  # v [N, heads, P], adjacent pairs
        out = np.empty_like(v)
        c, sn = cos[:, None, :], sin[:, None, :]
        out[..., 0::2] = v[..., 0::2] * c - v[..., 1::2] * sn
        out[..., 1::2] = v[..., 0::2] * sn + v[..., 1::2] * c
        return out

    b = f"blk.{il}."
    xs = np.concatenate([cache_x, x]).astype(np.float64)  # [n, D] every position so far
    n, T = len(xs), len(x)
    cos, sin = rope_tables(s, np.arange(n, dtype=np.float32))
    cos, sin = cos.astype(np.float64), sin.astype(np.float64)
    a = rms(xs, w(b + "attn_norm.weight"))  # [n, D]
    if m.q_lora_rank:
        qa = rms(a @ w(b + "attn_q_a.weight").T, w(b + "attn_q_a_norm.weight"))
        q = (qa @ w(b + "attn_q_b.weight").T).reshape(n, H, Dk)
    else:
        q = (a @ w(b + "attn_q.weight").T).reshape(n, H, Dk)
    kv = a @ w(b + "attn_kv_a_mqa.weight").T  # [n, R + P]
    c = rms(kv[:, :R], w(b + "attn_kv_a_norm.weight"))  # [n, R]
    k_pe = rope(kv[:, None, R:], cos, sin)[:, 0]  # [n, P]
    q_pe = rope(q[:, :, nope:], cos, sin)  # [n, H, P]
    k_b = w(b + "attn_k_b.weight").reshape(H, R, nope)  # [H, R, nope]
    v_b = w(b + "attn_v_b.weight").reshape(H, Dv, R)  # [H, Dv, R]
    sc = rope_scaling(s)
    out = np.empty((T, H, Dv))
    for h in range(H):
        keys = np.concatenate([c @ k_b[h], k_pe], axis=1)  # [n, Dk]: decompressed keys
        vals = c @ v_b[h].T  # [n, Dv]
        qh = np.concatenate([q[p0:, h, :nope], q_pe[p0:, h]], axis=1)  # [T, Dk]
        scores = qh @ keys.T * sc.kq_scale  # [T, n]
        scores[np.arange(n)[None, :] > (p0 + np.arange(T))[:, None]] = -np.inf
        pr = np.exp(scores - scores.max(1, keepdims=True))
        out[:, h] = (pr / pr.sum(1, keepdims=True)) @ vals
    return out.reshape(T, H * Dv) @ w(b + "attn_output.weight").T
