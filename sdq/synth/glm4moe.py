"""Synthetic glm4moe (GLM-4.5 layout) models: config, tensors, keys and weights.

A glm4moe block: RMS norm, attention with q/k/v biases (optional per-head Q/K RMS norms),
NeoX RoPE on the first `rope_dim` dims of each head, post-attention RMS norm, then either a
dense SwiGLU FFN (the first `n_dense_lead` blocks) or routed experts picked by a sigmoid router
(selection shifted by the per-expert `exp_probs_b` bias, optionally limited to the best expert
groups), weighted by the unbiased sigmoid scores (renormalised, times `expert_weights_scale`),
plus ungated shared experts. `n_nextn` MTP blocks follow the decoder blocks; sdq lists them
and never runs them.

Dimension key: D n_embd, E experts, F expert FFN, Fs shared-expert FFN (F x shared count),
Fd dense FFN, H heads, Hkv KV heads, Dh head dim.

Routed experts, routers and attention come from `SynthWeights` as for qwen3moe
(token- and context-dependent routing); biases, dense and shared FFNs are Gaussian, norms 1
plus small noise so that a norm applied to the wrong vector shows up in the logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sdq.errors import ParamsError
from sdq.synth import config as build
from sdq.synth.weights import SynthWeights, gaussian, rng_for, to_f16_values

ARCH = "glm4moe"


@dataclass(frozen=True)
class Glm4MoeConfig(build.SynthConfig):
    """SynthConfig with glm4moe's extra dimensions (arch is always glm4moe)."""

    arch: str = ARCH
    n_dense_lead: int = 1  # leading_dense_block_count
    dense_ffn: int = 512  # feed_forward_length of the dense blocks
    n_shared_expert: int = 1  # expert_shared_count: shared FFN rows = n_shared_expert * F
    n_expert_groups: int = 0  # expert_group_count (0: no group limit)
    n_group_used: int = 0  # expert_group_used_count
    expert_weights_scale: float = 1.0
    expert_weights_norm: bool = True
    qk_norm: bool = False  # GLM-4.5-Air has none, GLM-4.5 has per-head Q/K norms
    n_nextn: int = 1  # MTP blocks after the decoder blocks
    bias_std: float = 0.1  # spread of the q/k/v biases and of exp_probs_b

    def validate(self) -> Glm4MoeConfig:
        super().validate()

        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ParamsError(f"synthetic model {self.name!r}: {what}")

        need(self.arch == ARCH, f"arch {self.arch!r} must be {ARCH}")
        need(0 <= self.n_dense_lead < self.n_layer, "n_dense_lead must leave an MoE block")
        need(self.dense_ffn % 32 == 0 and self.dense_ffn > 0, "dense_ffn: a multiple of 32")
        need(self.n_shared_expert >= 0, "n_shared_expert must be >= 0")
        need(
            self.rope_dim % 2 == 0 and 2 <= self.rope_dim <= self.head_dim,
            f"rope_dim {self.rope_dim} must be even and in 2..head_dim",
        )
        if self.n_expert_groups > 1:
            need(self.n_expert % self.n_expert_groups == 0, "n_expert not a multiple of groups")
            need(0 < self.n_group_used < self.n_expert_groups, "0 < n_group_used < groups")
            per = self.n_expert // self.n_expert_groups
            need(self.n_expert_used <= per * self.n_group_used, "too few experts in used groups")
        need(self.n_nextn >= 0, "n_nextn must be >= 0")
        return self

    @property
    def shared_rows(self) -> int:
        return self.n_shared_expert * self.expert_ffn

    @property
    def k_quant_ready(self) -> bool:
        return super().k_quant_ready and self.dense_ffn % build.K_QUANT_BLOCK == 0


PRESETS = {
    # 3 decoder blocks (1 dense, 2 MoE) + 1 MTP block; 16 experts in 4 groups, 2 groups and 4
    # experts per token; partial RoPE over half of each head; q/k/v biases, no QK norm (as
    # GLM-4.5-Air); every matrix row a multiple of 256 (Q4_K_M without fallback types)
    "tiny-glm4moe": Glm4MoeConfig(
        name="tiny-glm4moe",
        n_layer=3,
        n_expert=16,
        n_expert_used=4,
        n_expert_groups=4,
        n_group_used=2,
        expert_weights_scale=1.5,
        n_head=4,
        n_head_kv=2,
        head_dim=64,
        rope_dim=32,
        dense_ffn=512,
        route_rank=8,
    ),
}


def block_plan(cfg: Glm4MoeConfig, layer: int, big) -> list[tuple[str, tuple[int, ...], type]]:
    """(name, NumPy shape, dtype) of block `layer`'s tensors in file order (llama.cpp's names);
    blocks from n_layer on are MTP blocks."""
    D, F, E, Fs, Fd = cfg.n_embd, cfg.expert_ffn, cfg.n_expert, cfg.shared_rows, cfg.dense_ffn
    H, Hkv, Dh = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    b = f"blk.{layer}."
    f32 = np.float32
    plan = [
        (b + "attn_norm.weight", (D,), f32),
        (b + "attn_q.weight", (H * Dh, D), big),
        (b + "attn_k.weight", (Hkv * Dh, D), big),
        (b + "attn_v.weight", (Hkv * Dh, D), big),
        (b + "attn_q.bias", (H * Dh,), f32),
        (b + "attn_k.bias", (Hkv * Dh,), f32),
        (b + "attn_v.bias", (Hkv * Dh,), f32),
        (b + "attn_output.weight", (D, H * Dh), big),
    ]
    if cfg.qk_norm:
        plan += [(b + "attn_q_norm.weight", (Dh,), f32), (b + "attn_k_norm.weight", (Dh,), f32)]
    plan.append((b + "post_attention_norm.weight", (D,), f32))
    if layer < cfg.n_dense_lead:
        return plan + [
            (b + "ffn_gate.weight", (Fd, D), big),
            (b + "ffn_up.weight", (Fd, D), big),
            (b + "ffn_down.weight", (D, Fd), big),
        ]
    plan += [
        (b + "ffn_gate_inp.weight", (E, D), f32),
        (b + "exp_probs_b.bias", (E,), f32),
        (b + "ffn_gate_exps.weight", (E, F, D), big),
        (b + "ffn_up_exps.weight", (E, F, D), big),
        (b + "ffn_down_exps.weight", (E, D, F), big),
    ]
    if Fs:
        plan += [
            (b + "ffn_gate_shexp.weight", (Fs, D), big),
            (b + "ffn_up_shexp.weight", (Fs, D), big),
            (b + "ffn_down_shexp.weight", (D, Fs), big),
        ]
    if layer >= cfg.n_layer:  # MTP block
        plan += [
            (b + "nextn.eh_proj.weight", (D, 2 * D), big),
            (b + "nextn.enorm.weight", (D,), f32),
            (b + "nextn.hnorm.weight", (D,), f32),
            (b + "nextn.shared_head_norm.weight", (D,), f32),
        ]
    return plan


def add_metadata(writer, cfg: Glm4MoeConfig) -> None:
    """The glm4moe keys llama.cpp reads (on top of the common ones the caller writes)."""
    from gguf.constants import ExpertGatingFuncType

    writer.add_leading_dense_block_count(cfg.n_dense_lead)
    writer.add_expert_shared_count(cfg.n_shared_expert)
    writer.add_expert_weights_scale(cfg.expert_weights_scale)
    writer.add_expert_weights_norm(cfg.expert_weights_norm)
    writer.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
    if cfg.n_expert_groups > 1:
        writer.add_expert_group_count(cfg.n_expert_groups)
        writer.add_expert_group_used_count(cfg.n_group_used)
    writer.add_nextn_predict_layers(cfg.n_nextn)


def make_tensor(w: SynthWeights, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
    """Values of a glm4moe-only tensor (float32, f16-rounded), or None for a shared kind."""
    cfg = w.cfg
    if name.endswith("norm.weight"):
        return to_f16_values(1.0 + 0.1 * rng_for(w.seed, name).standard_normal(shape))
    if not name.startswith("blk."):
        return None
    kind = name.split(".")[2]
    if name.endswith(".bias"):  # attn_{q,k,v}.bias, exp_probs_b.bias
        return gaussian(w.seed, name, shape, cfg.bias_std)
    if kind in ("ffn_gate", "ffn_up", "ffn_gate_shexp", "ffn_up_shexp"):
        return gaussian(w.seed, name, shape, 1 / np.sqrt(shape[1]))
    if kind in ("ffn_down", "ffn_down_shexp"):
        return gaussian(w.seed, name, shape, cfg.moe_gain / np.sqrt(shape[1]))
    if kind == "nextn":
        return gaussian(w.seed, name, shape, 1 / np.sqrt(shape[1]))
    return None
