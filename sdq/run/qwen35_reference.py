"""NumPy reference forward pass of a qwen35moe model: the slow, plain statement of what the
engine computes, checked against llama.cpp's logits (tests/test_qwen35moe.py).

Weights are dequantized to float64 once per use; activations stay float64 (llama.cpp quantizes
activations for quantized weights, so on Q8_0 / Q4_K files the two agree in argmax, not bits).

Dimension key: T tokens, D n_embd, V vocabulary, H / Hkv heads, Dh head dim, E experts,
K experts used, Hk / Hv delta-net key / value heads, S delta-net head dim, C conv channels.

Per block (llama.cpp's qwen35moe graph):

    h   = x + mixer(rms_norm(x) * attn_norm)        mixer: delta-net or gated full attention
    out = h + moe(rms_norm(h) * post_attention_norm) + sigmoid(h' . w_shexp_gate) * shared(h')

where h' is the normed h. Full attention: Q rows come in per-head pairs [query Dh, gate Dh],
Q/K RMS-normed per head, NeoX RoPE on the first rope_dim dims, softmax(QK^T / sqrt(Dh)) V,
times sigmoid(gate), then attn_output. The delta-net is sdq.kernels.delta_net.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sdq.errors import UnsupportedError
from sdq.format.model import Model
from sdq.kernels.delta_net import (
    causal_conv_ref,
    gated_delta_rule_ref,
    gated_rms_norm_ref,
    l2_norm_ref,
    rope_partial_ref,
    softplus_ref,
)
from sdq.kernels.quant import dequantize


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


@dataclass
class ReferenceState:
    """Per-sequence memory: K/V of full-attention blocks, conv and delta-net states."""

    k: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> [P, Hkv, Dh]
    v: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> [P, Hkv, Dh]
    conv: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> [Kc-1, C]
    delta: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> [Hv, S, S]
    n_past: int = 0


class Qwen35Reference:
    """forward(tokens) -> logits [T, V], keeping the sequence's state between calls."""

    def __init__(self, model: Model):
        spec = model.spec
        if spec.arch != "qwen35moe" or spec.hybrid is None:
            raise UnsupportedError(
                f"{model.path}: the qwen35moe reference needs a qwen35moe file with its ssm.* "
                f"keys (arch {spec.arch})"
            )
        self.model, self.spec, self.hy = model, spec, spec.hybrid
        self.state = ReferenceState()

    def reset(self) -> None:
        self.state = ReferenceState()

    def w(self, name: str) -> np.ndarray:
        """A tensor's values as float64, NumPy order ([rows, cols] for matrices)."""
        t = self.model.tensors[name]
        cols = t.shape[0]
        rows = t.rows
        values = dequantize(self.model.tensor_data(name), t.qtype, rows, cols, name)
        return values.astype(np.float64).reshape(t.shape[::-1])

    def forward(self, tokens) -> np.ndarray:
        spec = self.spec
        ids = np.asarray(tokens, np.int64)
        emb = self.model.tensors["token_embd.weight"]
        raw = self.model.tensor_data("token_embd.weight")
        x = np.stack(
            [dequantize(raw[i : i + 1], emb.qtype, 1, spec.n_embd)[0] for i in ids]
        ).astype(np.float64)  # [T, D]
        positions = self.state.n_past + np.arange(len(ids))  # [T]
        for layer in range(spec.n_layer):
            b = f"blk.{layer}."
            normed = _rms(x, self.w(b + "attn_norm.weight"), spec.rms_eps)
            if layer in self.hy.recurrent_layers:
                x = x + self._delta_net(layer, normed)
            else:
                x = x + self._attention(layer, normed, positions)
            normed = _rms(x, self.w(b + "post_attention_norm.weight"), spec.rms_eps)
            x = x + self._moe(layer, normed)
        self.state.n_past += len(ids)
        x = _rms(x, self.w("output_norm.weight"), spec.rms_eps)
        head = "output.weight" if "output.weight" in self.model.tensors else "token_embd.weight"
        return x @ self.w(head).T  # [T, V]

    def _attention(self, layer: int, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        spec, b = self.spec, f"blk.{layer}."
        T, H, Hkv, Dh = len(x), spec.n_head, spec.n_head_kv, spec.head_dim
        qg = (x @ self.w(b + "attn_q.weight").T).reshape(T, H, 2, Dh)  # [T, H, 2, Dh]
        q, gate = qg[:, :, 0], qg[:, :, 1].reshape(T, H * Dh)  # [T, H, Dh], [T, H*Dh]
        k = (x @ self.w(b + "attn_k.weight").T).reshape(T, Hkv, Dh)  # [T, Hkv, Dh]
        v = (x @ self.w(b + "attn_v.weight").T).reshape(T, Hkv, Dh)  # [T, Hkv, Dh]
        q = _rms(q, self.w(b + "attn_q_norm.weight"), spec.rms_eps)
        k = _rms(k, self.w(b + "attn_k_norm.weight"), spec.rms_eps)
        q = rope_partial_ref(q, positions, spec.rope_base, self.hy.rope_dim)
        k = rope_partial_ref(k, positions, spec.rope_base, self.hy.rope_dim)
        st = self.state
        st.k[layer] = np.concatenate([st.k.get(layer, k[:0]), k])  # [P, Hkv, Dh]
        st.v[layer] = np.concatenate([st.v.get(layer, v[:0]), v])
        K, V = st.k[layer], st.v[layer]
        P = len(K)
        out = np.empty((T, H, Dh))  # [T, H, Dh]
        group = H // Hkv
        for h in range(H):
            scores = q[:, h] @ K[:, h // group].T / np.sqrt(Dh)  # [T, P]
            causal = np.arange(P)[None, :] > positions[:, None]
            scores[causal] = -np.inf
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            out[:, h] = p @ V[:, h // group]
        out = out.reshape(T, H * Dh) * _sigmoid(gate)
        return out @ self.w(b + "attn_output.weight").T  # [T, D]

    def _delta_net(self, layer: int, x: np.ndarray) -> np.ndarray:
        spec, hy, b = self.spec, self.hy, f"blk.{layer}."
        T, S, Hk, Hv = len(x), hy.state, hy.k_heads, hy.v_heads
        mixed = x @ self.w(b + "attn_qkv.weight").T  # [T, C]
        z = (x @ self.w(b + "attn_gate.weight").T).reshape(T, Hv, S)  # [T, Hv, S]
        beta = _sigmoid(x @ self.w(b + "ssm_beta.weight").T)  # [T, Hv]
        alpha = x @ self.w(b + "ssm_alpha.weight").T  # [T, Hv]
        g = softplus_ref(alpha + self.w(b + "ssm_dt.bias")) * self.w(b + "ssm_a")  # [T, Hv]
        st = self.state
        conv_state = st.conv.get(layer, np.zeros((hy.conv_kernel - 1, hy.conv_channels)))
        conv, st.conv[layer] = causal_conv_ref(mixed, self.w(b + "ssm_conv1d.weight"), conv_state)
        conv = _silu(conv)  # [T, C]
        q = l2_norm_ref(conv[:, : Hk * S].reshape(T, Hk, S), spec.rms_eps)  # [T, Hk, S]
        k = l2_norm_ref(conv[:, Hk * S : 2 * Hk * S].reshape(T, Hk, S), spec.rms_eps)
        v = conv[:, 2 * Hk * S :].reshape(T, Hv, S)  # [T, Hv, S]
        delta = st.delta.get(layer, np.zeros((Hv, S, S)))
        o, st.delta[layer] = gated_delta_rule_ref(q, k, v, g, beta, delta)  # [T, Hv, S]
        o = gated_rms_norm_ref(o, self.w(b + "ssm_norm.weight"), z, spec.rms_eps)
        return o.reshape(T, Hv * S) @ self.w(b + "ssm_out.weight").T  # [T, D]

    def _moe(self, layer: int, x: np.ndarray) -> np.ndarray:
        spec, b = self.spec, f"blk.{layer}."
        logits = x @ self.w(b + "ffn_gate_inp.weight").T  # [T, E]
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        top = np.argsort(-probs, axis=1, kind="stable")[:, : spec.n_expert_used]  # [T, K]
        weights = np.take_along_axis(probs, top, axis=1)  # [T, K]
        weights /= weights.sum(axis=1, keepdims=True)
        gate_all = self.w(b + "ffn_gate_exps.weight")  # [E, F, D]
        up_all = self.w(b + "ffn_up_exps.weight")  # [E, F, D]
        down_all = self.w(b + "ffn_down_exps.weight")  # [E, D, F]
        out = np.zeros_like(x)  # [T, D]
        for t in range(len(x)):
            for e, wt in zip(top[t], weights[t], strict=True):
                act = _silu(gate_all[e] @ x[t]) * (up_all[e] @ x[t])  # [F]
                out[t] += wt * (down_all[e] @ act)
        if b + "ffn_up_shexp.weight" in self.model.tensors:
            act = _silu(x @ self.w(b + "ffn_gate_shexp.weight").T) * (
                x @ self.w(b + "ffn_up_shexp.weight").T
            )  # [T, Fs]
            shared = act @ self.w(b + "ffn_down_shexp.weight").T  # [T, D]
            gate = _sigmoid(x @ self.w(b + "ffn_gate_inp_shexp.weight"))  # [T]
            out += shared * gate[:, None]
        return out
