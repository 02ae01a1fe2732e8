"""Small qwen3moe files for the engine tests, and a plain NumPy forward pass to check against.

The files have a 300-token vocabulary (the engine never tokenizes) so the output head is cheap;
F32 and Q8_0 weights are written with gguf-py. The reference forward pass dequantizes every
tensor with `gguf.quants.dequantize` and computes in float64, step by step as the qwen3moe
definition reads, with none of the engine's code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize


@dataclass(frozen=True)
class Dims:
    n_layer: int = 3
    n_embd: int = 96
    n_head: int = 6
    n_head_kv: int = 2  # GQA: 3 query heads per KV head
    head_dim: int = 32
    n_expert: int = 12
    n_used: int = 3
    expert_ffn: int = 64
    n_vocab: int = 300
    tied: bool = False
    rope_base: float = 10_000.0
    eos_id: int = 299


def write_model(path: Path, dims: Dims, qtype: Q = Q.F32, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    d = dims
    D, H, Hkv, Dh, E, F = d.n_embd, d.n_head, d.n_head_kv, d.head_dim, d.n_expert, d.expert_ffn
    w = GGUFWriter(path, "qwen3moe")
    w.add_block_count(d.n_layer)
    w.add_context_length(4096)
    w.add_embedding_length(D)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_key_length(Dh)
    w.add_value_length(Dh)
    w.add_rope_freq_base(d.rope_base)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(E)
    w.add_expert_used_count(d.n_used)
    w.add_expert_feed_forward_length(F)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([f"t{i}" for i in range(d.n_vocab)])
    w.add_eos_token_id(d.eos_id)

    def add(name, shape, scale=0.3, matrix=True):
        values = (rng.standard_normal(shape) * scale).astype(np.float32)
        if name.endswith("norm.weight"):
            values = 1.0 + values  # norms near 1, as trained models have
        if matrix and qtype != Q.F32:
            w.add_tensor(name, quantize(values, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, values)

    add("token_embd.weight", (d.n_vocab, D), 1.0)
    add("output_norm.weight", (D,), 0.1, matrix=False)
    if not d.tied:
        add("output.weight", (d.n_vocab, D), 0.3)
    for i in range(d.n_layer):
        b = f"blk.{i}."
        add(b + "attn_norm.weight", (D,), 0.1, matrix=False)
        add(b + "attn_q.weight", (H * Dh, D), 0.15)
        add(b + "attn_k.weight", (Hkv * Dh, D), 0.15)
        add(b + "attn_v.weight", (Hkv * Dh, D), 0.15)
        add(b + "attn_output.weight", (D, H * Dh), 0.15)
        add(b + "attn_q_norm.weight", (Dh,), 0.1, matrix=False)
        add(b + "attn_k_norm.weight", (Dh,), 0.1, matrix=False)
        add(b + "ffn_norm.weight", (D,), 0.1, matrix=False)
        add(b + "ffn_gate_inp.weight", (E, D), 0.5, matrix=False)
        add(b + "ffn_gate_exps.weight", (E, F, D), 0.15)
        add(b + "ffn_up_exps.weight", (E, F, D), 0.15)
        add(b + "ffn_down_exps.weight", (E, D, F), 0.15)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def reference_logits(model, tokens) -> np.ndarray:
    """[T, V] logits of every position, float64, from the file's dequantized weights."""
    s = model.spec
    H, Hkv, Dh, K = s.n_head, s.n_head_kv, s.head_dim, s.n_expert_used
    G = H // Hkv

    def weight(name):
        t = model.tensors[name]
        raw = np.asarray(model.tensor_data(name))
        if t.qtype in (Q.F32, Q.F16):
            return raw.astype(np.float64)
        return dequantize(raw, t.qtype).astype(np.float64).reshape(tuple(reversed(t.shape)))

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + s.rms_eps) * g

    def rope(x, pos):  # x [T, heads, Dh]; NEOX: pairs (i, i + Dh/2)
        half = Dh // 2
        theta = pos[:, None] * s.rope_base ** (-2.0 * np.arange(half) / Dh)  # [T, Dh/2]
        c, sn = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        x0, x1 = x[..., :half], x[..., half:]
        return np.concatenate([x0 * c - x1 * sn, x0 * sn + x1 * c], axis=-1)

    tokens = np.asarray(tokens)
    T = len(tokens)
    pos = np.arange(T, dtype=np.float64)
    x = weight("token_embd.weight")[tokens]  # [T, D]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for il in range(s.n_layer):
        b = f"blk.{il}."
        a = rms(x, weight(b + "attn_norm.weight"))
        q = (a @ weight(b + "attn_q.weight").T).reshape(T, H, Dh)
        k = (a @ weight(b + "attn_k.weight").T).reshape(T, Hkv, Dh)
        v = (a @ weight(b + "attn_v.weight").T).reshape(T, Hkv, Dh)
        q = rope(rms(q, weight(b + "attn_q_norm.weight")), pos)
        k = rope(rms(k, weight(b + "attn_k_norm.weight")), pos)
        att = np.empty((T, H, Dh))
        for h in range(H):
            sc = q[:, h] @ k[:, h // G].T / np.sqrt(Dh) + mask
            p = np.exp(sc - sc.max(-1, keepdims=True))
            att[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, h // G]
        x = x + att.reshape(T, H * Dh) @ weight(b + "attn_output.weight").T
        f = rms(x, weight(b + "ffn_norm.weight"))
        logits = f @ weight(b + "ffn_gate_inp.weight").T  # [T, E]
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        gate, up, down = (weight(b + f"ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
        moe = np.zeros_like(x)
        for t in range(T):
            top = np.argsort(-p[t])[:K]
            wts = p[t, top] / p[t, top].sum()
            for e, wt in zip(top, wts, strict=True):
                g, u = gate[e] @ f[t], up[e] @ f[t]
                moe[t] += wt * (down[e] @ (g / (1 + np.exp(-g)) * u))
        x = x + moe
    out = "output.weight" if "output.weight" in model.tensors else "token_embd.weight"
    return rms(x, weight("output_norm.weight")) @ weight(out).T
