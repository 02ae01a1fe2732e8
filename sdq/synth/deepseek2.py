"""What a synthetic deepseek2 (DeepSeek-V2-Lite-shaped) model adds to a qwen3moe one: its
tensors, keys and weights.

deepseek2 blocks use multi-head latent attention (sdq.run.mla): the query directly from
attn_q (V2-Lite has no low-rank query), the keys and values compressed by attn_kv_a_mqa to a
kv_lora_rank latent (normed by attn_kv_a_norm) plus one shared RoPE key, and per head
attn_k_b / attn_v_b, the split form llama.cpp's converter writes. RoPE rotates adjacent pairs
with YaRN scaling (rope.scaling.*; the converter stores 0.1 * mscale_all_dim as
yarn_log_multiplier). The first `n_dense_lead` blocks have a dense SwiGLU FFN, the others
routed experts (softmax router, weights times expert_weights_scale) plus `n_shared_expert`
shared experts, stored together as one ungated ffn_*_shexp FFN of n_shared * F rows.

Dimension key: D n_embd, E experts, F expert FFN, Fd dense FFN, H heads, Dk = head_dim (query
/ key head: non-RoPE + RoPE dims), P rope_dim, R kv_lora_rank, Dv v_head_dim.

Routed experts and routers come from `SynthWeights` as for qwen3moe (token-dependent
routing); the attention and dense / shared FFN tensors are Gaussian, scaled to keep
activations O(1); norms are 1 plus small noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sdq.errors import ParamsError
from sdq.synth import config as build
from sdq.synth.weights import SynthWeights, gaussian, rng_for, to_f16_values

ARCH = "deepseek2"


@dataclass(frozen=True)
class DeepSeek2Config(build.SynthConfig):
    """SynthConfig with deepseek2's extra dimensions (arch is always deepseek2; head_dim is
    the query/key head Dk, rope_dim its RoPE part)."""

    arch: str = ARCH
    q_lora_rank: int = 0  # Lq; 0: attn_q directly (V2-Lite), else attn_q_a / _a_norm / _b (V2)
    kv_lora_rank: int = 64  # R
    v_head_dim: int = 64  # Dv
    n_dense_lead: int = 1  # leading_dense_block_count
    dense_ffn: int = 512  # feed_forward_length of the dense blocks
    n_shared_expert: int = 2  # expert_shared_count: shared FFN rows = n_shared_expert * F
    expert_weights_scale: float = 1.0
    yarn_factor: float = 0.0  # rope.scaling.factor (0: no RoPE scaling)
    yarn_orig_ctx: int = 0  # rope.scaling.original_context_length
    yarn_mscale_all_dim: float = 0.0  # stored as yarn_log_multiplier = 0.1 * this
    # V3-style routing: sigmoid scores, a selection bias exp_probs_b, group-limited top-K
    gating: str = "softmax"  # or "sigmoid" (expert_gating_func)
    n_expert_groups: int = 0  # expert_group_count (0: no group limit)
    n_group_used: int = 0  # expert_group_used_count
    expert_weights_norm: bool = False

    def validate(self) -> DeepSeek2Config:
        super().validate()

        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ParamsError(f"synthetic model {self.name!r}: {what}")

        need(self.arch == ARCH, f"arch {self.arch!r} must be {ARCH}")
        need(self.n_head_kv == 1, "n_head_kv must be 1 (MLA is one KV head)")
        need(
            self.rope_dim % 2 == 0 and 2 <= self.rope_dim < self.head_dim,
            f"rope_dim {self.rope_dim} must be even and in 2..head_dim - 1",
        )
        for field in ("kv_lora_rank", "v_head_dim", "dense_ffn"):
            value = getattr(self, field)
            need(value > 0 and value % 32 == 0, f"{field} = {value}: a multiple of 32")
        need(0 <= self.n_dense_lead < self.n_layer, "n_dense_lead must leave an MoE block")
        need(self.n_shared_expert >= 1, "n_shared_expert must be >= 1")
        need(self.q_lora_rank % 32 == 0 and self.q_lora_rank >= 0, "q_lora_rank: 0 or 32k")
        need(self.gating in ("softmax", "sigmoid"), f"gating {self.gating!r}: softmax or sigmoid")
        if self.n_expert_groups > 1:
            need(self.n_expert % self.n_expert_groups == 0, "n_expert not a multiple of groups")
            need(0 < self.n_group_used < self.n_expert_groups, "0 < n_group_used < groups")
        return self

    def params(self) -> dict:
        out = super().params()
        defaults = {  # files written before these fields keep their cache names
            "q_lora_rank": 0,
            "gating": "softmax",
            "n_expert_groups": 0,
            "n_group_used": 0,
            "expert_weights_norm": False,
        }
        for name, value in defaults.items():
            if out[name] == value:
                del out[name]
        return out


PRESETS = {
    # shaped like DeepSeek-V2-Lite: MLA without a low-rank query, latent 64, RoPE 32 of 128
    # query/key dims, values 64, YaRN x4 (mscale_all_dim 0.707); the first block dense, 16
    # experts top-4 plus 2 shared, routed weights x1.5. attn_k_b / attn_v_b rows are too
    # short for K-quants (96 and 64), so they are Q8_0 in every quantized file
    "tiny-deepseek2": DeepSeek2Config(
        name="tiny-deepseek2",
        n_layer=4,
        n_expert=16,
        n_expert_used=4,
        n_head=4,
        n_head_kv=1,
        head_dim=128,
        rope_dim=32,
        rope_base=10_000.0,
        route_rank=8,
        expert_weights_scale=1.5,
        yarn_factor=4.0,
        yarn_orig_ctx=1024,
        yarn_mscale_all_dim=0.707,
        tensor_types=(("attn_k_b|attn_v_b", "Q8_0"),),
    ),
}


def shared_rows(cfg) -> int:
    return cfg.n_shared_expert * cfg.expert_ffn


def block_plan(cfg, layer: int, big) -> list[tuple[str, tuple[int, ...], type]]:
    """(name, NumPy shape, dtype) of block `layer`'s tensors, in file order."""
    D, F, E, H = cfg.n_embd, cfg.expert_ffn, cfg.n_expert, cfg.n_head
    Dk, P, R, Dv = cfg.head_dim, cfg.rope_dim, cfg.kv_lora_rank, cfg.v_head_dim
    b = f"blk.{layer}."
    plan = [
        (b + "attn_norm.weight", (D,), np.float32),
    ]
    Lq = cfg.q_lora_rank
    if Lq:
        plan += [
            (b + "attn_q_a.weight", (Lq, D), big),
            (b + "attn_q_a_norm.weight", (Lq,), np.float32),
            (b + "attn_q_b.weight", (H * Dk, Lq), big),
        ]
    else:
        plan.append((b + "attn_q.weight", (H * Dk, D), big))
    plan += [
        (b + "attn_kv_a_mqa.weight", (R + P, D), big),
        (b + "attn_kv_a_norm.weight", (R,), np.float32),
        (b + "attn_k_b.weight", (H, R, Dk - P), big),  # ggml [Dk - P, R, H]
        (b + "attn_v_b.weight", (H, Dv, R), big),  # ggml [R, Dv, H]
        (b + "attn_output.weight", (D, H * Dv), big),
        (b + "ffn_norm.weight", (D,), np.float32),
    ]
    if layer < cfg.n_dense_lead:
        Fd = cfg.dense_ffn
        plan += [
            (b + "ffn_gate.weight", (Fd, D), big),
            (b + "ffn_up.weight", (Fd, D), big),
            (b + "ffn_down.weight", (D, Fd), big),
        ]
        return plan
    Fs = shared_rows(cfg)
    plan += [
        (b + "ffn_gate_inp.weight", (E, D), np.float32),
        *([(b + "exp_probs_b.bias", (E,), np.float32)] if cfg.gating == "sigmoid" else []),
        (b + "ffn_gate_exps.weight", (E, F, D), big),
        (b + "ffn_up_exps.weight", (E, F, D), big),
        (b + "ffn_down_exps.weight", (E, D, F), big),
        (b + "ffn_gate_shexp.weight", (Fs, D), big),
        (b + "ffn_up_shexp.weight", (Fs, D), big),
        (b + "ffn_down_shexp.weight", (D, Fs), big),
    ]
    return plan


def add_metadata(writer, cfg) -> None:
    """The deepseek2 keys llama.cpp reads, as its converter writes them (MLA as one KV head
    of R + P key dims and R value dims; the per-head sizes in *_mla)."""
    import gguf

    arch = ARCH
    replaced = {  # keys the common writer set for plain attention
        gguf.Keys.Attention.HEAD_COUNT_KV.format(arch=arch),
        gguf.Keys.Attention.KEY_LENGTH.format(arch=arch),
        gguf.Keys.Attention.VALUE_LENGTH.format(arch=arch),
        gguf.Keys.Rope.DIMENSION_COUNT.format(arch=arch),
        gguf.Keys.LLM.FEED_FORWARD_LENGTH.format(arch=arch),
    }
    for kv in writer.kv_data:
        for key in replaced:
            kv.pop(key, None)
    R, P = cfg.kv_lora_rank, cfg.rope_dim
    writer.add_head_count_kv(1)
    writer.add_key_length(R + P)
    writer.add_value_length(R)
    writer.add_key_length_mla(cfg.head_dim)
    writer.add_value_length_mla(cfg.v_head_dim)
    writer.add_rope_dimension_count(P)
    writer.add_feed_forward_length(cfg.dense_ffn)
    writer.add_leading_dense_block_count(cfg.n_dense_lead)
    writer.add_vocab_size(_n_vocab(writer))
    writer.add_q_lora_rank(cfg.q_lora_rank)  # required unless the depth is V2-Lite's
    writer.add_kv_lora_rank(R)
    writer.add_expert_shared_count(cfg.n_shared_expert)
    writer.add_expert_weights_scale(cfg.expert_weights_scale)
    if cfg.gating == "sigmoid":
        writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if cfg.expert_weights_norm:
        writer.add_expert_weights_norm(True)
    if cfg.n_expert_groups > 1:
        writer.add_expert_group_count(cfg.n_expert_groups)
        writer.add_expert_group_used_count(cfg.n_group_used)
    if cfg.yarn_factor:
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(cfg.yarn_factor)
        writer.add_rope_scaling_orig_ctx_len(cfg.yarn_orig_ctx)
        writer.add_rope_scaling_yarn_log_mul(0.1 * cfg.yarn_mscale_all_dim)


def _n_vocab(writer) -> int:
    return build._n_vocab()


def make_tensor(w: SynthWeights, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
    """Values of a deepseek2-only tensor (float32, f16-rounded), or None for a shared kind."""
    cfg = w.cfg
    D = cfg.n_embd
    if name.endswith("norm.weight"):
        return to_f16_values(1.0 + 0.1 * rng_for(w.seed, name).standard_normal(shape))
    if not name.startswith("blk."):
        return None
    kind = name.split(".")[2]
    if kind == "exp_probs_b":  # [E] selection bias, about the spread of the sigmoid scores
        return gaussian(w.seed, name, shape, 0.1)
    if kind == "attn_q_b":
        return gaussian(w.seed, name, shape, 1 / np.sqrt(shape[1]))
    if kind in (
        "attn_q",
        "attn_q_a",
        "attn_kv_a_mqa",
        "ffn_gate",
        "ffn_up",
        "ffn_gate_shexp",
        "ffn_up_shexp",
    ):
        return gaussian(w.seed, name, shape, 1 / np.sqrt(D))
    if kind in ("attn_k_b", "attn_v_b"):  # [H, rows, cols]: unit-scale rows
        return gaussian(w.seed, name, shape, 1 / np.sqrt(shape[-1]))
    if kind == "attn_output":
        return gaussian(w.seed, name, shape, cfg.attn_noise / np.sqrt(shape[1]))
    if kind in ("ffn_down", "ffn_down_shexp"):
        return gaussian(w.seed, name, shape, cfg.moe_gain / np.sqrt(shape[1]))
    return None
