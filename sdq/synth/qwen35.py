"""What a synthetic qwen35moe model adds to a qwen3moe one: its tensors, keys and weights.

qwen35moe (the Qwen3.5/3.6 MoE family) stacks blocks of two kinds: every
`full_attention_interval`-th block is full attention (Q packed with a sigmoid output gate, Q/K
RMS norms, multi-section partial RoPE), the others are gated delta-net linear attention (a
short causal conv over q/k/v, a per-head recurrent state). Every block has a post-attention
norm and an MoE FFN: routed experts plus one shared expert behind a sigmoid gate.

Dimension key: D n_embd, E experts, F expert FFN, Fs shared-expert FFN, H heads, Hkv KV heads,
Dh head dim, Hk / Hv delta-net key / value heads, S state size (key and value head dim),
C conv channels (2 Hk S + Hv S), Kc conv kernel.

Routed experts and routers come from `SynthWeights` as for qwen3moe (token-dependent routing);
the full-attention V/O carry the routing subspace as there. The linear-attention tensors are
Gaussian, scaled to keep activations O(1); norms are 1 plus small noise so that a norm weight
applied to the wrong vector shows up in the logits.
"""

from __future__ import annotations

import numpy as np

from sdq.synth.weights import SynthWeights, gaussian, rng_for, to_f16_values

ARCH = "qwen35moe"


def is_full_attention(cfg, layer: int) -> bool:
    """Whether block `layer` is full attention (llama.cpp's rule when no per-layer array)."""
    return (layer + 1) % cfg.full_attention_interval == 0


def dims(cfg) -> dict[str, int]:
    """Derived delta-net sizes."""
    S, Hk, Hv = cfg.ssm_state, cfg.ssm_k_heads, cfg.ssm_v_heads
    return {"key_dim": S * Hk, "value_dim": S * Hv, "conv_dim": 2 * S * Hk + S * Hv}


def block_plan(cfg, layer: int, big) -> list[tuple[str, tuple[int, ...], type]]:
    """(name, NumPy shape, dtype) of block `layer`'s tensors, in file order."""
    D, F, E, Fs = cfg.n_embd, cfg.expert_ffn, cfg.n_expert, cfg.shared_ffn
    H, Hkv, Dh = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    d = dims(cfg)
    b = f"blk.{layer}."
    plan = [(b + "attn_norm.weight", (D,), np.float32)]
    if is_full_attention(cfg, layer):
        plan += [
            (b + "attn_q.weight", (2 * H * Dh, D), big),  # per head: Dh query rows, Dh gate rows
            (b + "attn_k.weight", (Hkv * Dh, D), big),
            (b + "attn_v.weight", (Hkv * Dh, D), big),
            (b + "attn_output.weight", (D, H * Dh), big),
            (b + "attn_q_norm.weight", (Dh,), np.float32),
            (b + "attn_k_norm.weight", (Dh,), np.float32),
        ]
    else:
        plan += [
            (b + "attn_qkv.weight", (d["conv_dim"], D), big),
            (b + "attn_gate.weight", (d["value_dim"], D), big),
            (b + "ssm_conv1d.weight", (d["conv_dim"], cfg.ssm_conv_kernel), np.float32),
            (b + "ssm_dt.bias", (cfg.ssm_v_heads,), np.float32),
            (b + "ssm_a", (cfg.ssm_v_heads,), np.float32),
            (b + "ssm_beta.weight", (cfg.ssm_v_heads, D), big),
            (b + "ssm_alpha.weight", (cfg.ssm_v_heads, D), big),
            (b + "ssm_norm.weight", (cfg.ssm_state,), np.float32),
            (b + "ssm_out.weight", (D, d["value_dim"]), big),
        ]
    plan += [
        (b + "post_attention_norm.weight", (D,), np.float32),
        (b + "ffn_gate_inp.weight", (E, D), np.float32),
        (b + "ffn_gate_exps.weight", (E, F, D), big),
        (b + "ffn_up_exps.weight", (E, F, D), big),
        (b + "ffn_down_exps.weight", (E, D, F), big),
        (b + "ffn_gate_inp_shexp.weight", (D,), np.float32),
        (b + "ffn_gate_shexp.weight", (Fs, D), big),
        (b + "ffn_up_shexp.weight", (Fs, D), big),
        (b + "ffn_down_shexp.weight", (D, Fs), big),
    ]
    return plan


def add_metadata(writer, cfg) -> None:
    """The qwen35moe keys llama.cpp reads (on top of the common ones the caller writes)."""
    d = dims(cfg)
    writer.add_expert_shared_feed_forward_length(cfg.shared_ffn)
    writer.add_rope_dimension_sections(list(cfg.rope_sections))
    writer.add_ssm_conv_kernel(cfg.ssm_conv_kernel)
    writer.add_ssm_inner_size(d["value_dim"])
    writer.add_ssm_state_size(cfg.ssm_state)
    writer.add_ssm_time_step_rank(cfg.ssm_v_heads)
    writer.add_ssm_group_count(cfg.ssm_k_heads)
    writer.add_full_attention_interval(cfg.full_attention_interval)


def make_tensor(w: SynthWeights, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
    """Values of a qwen35moe-only tensor (float32, f16-rounded), or None for a shared kind."""
    cfg = w.cfg
    D = cfg.n_embd
    if name.endswith("norm.weight"):
        return to_f16_values(1.0 + 0.1 * rng_for(w.seed, name).standard_normal(shape))
    if not name.startswith("blk."):
        return None
    kind = name.split(".")[2]
    if kind == "attn_q":  # the qwen3moe construction's Q, a Gaussian gate after each head's rows
        H, Dh = cfg.n_head, cfg.head_dim
        q = w.attention(int(name.split(".")[1]))["attn_q"].reshape(H, Dh, D)  # [H, Dh, D]
        gate = gaussian(w.seed, name + ".gate", (H, Dh, D), 1 / np.sqrt(D))  # [H, Dh, D]
        return np.concatenate([q, gate], axis=1).reshape(shape)
    if kind in ("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha"):
        return gaussian(w.seed, name, shape, 1 / np.sqrt(D))
    if kind == "ssm_out":
        return gaussian(w.seed, name, shape, cfg.attn_noise / np.sqrt(shape[1]))
    if kind == "ssm_conv1d":  # [C, Kc]: mostly the current token, some of the previous ones
        taps = gaussian(w.seed, name, shape, 0.3)
        taps[:, -1] += 1.0
        return to_f16_values(taps)
    if kind == "ssm_dt":
        return gaussian(w.seed, name, shape, 0.5)
    if kind == "ssm_a":  # -exp(A_log): decay rates between about 0.14 and 2.7 per unit dt
        a_log = rng_for(w.seed, name).uniform(-2.0, 1.0, shape)
        return to_f16_values(-np.exp(a_log).astype(np.float32))
    if kind == "ffn_gate_inp_shexp":
        return gaussian(w.seed, name, shape, 1 / np.sqrt(D))
    if kind in ("ffn_gate_shexp", "ffn_up_shexp"):
        return gaussian(w.seed, name, shape, 1 / np.sqrt(D))
    if kind == "ffn_down_shexp":
        return gaussian(w.seed, name, shape, cfg.moe_gain / np.sqrt(shape[1]))
    return None
