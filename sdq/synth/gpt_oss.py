"""Synthetic gpt-oss models (llama.cpp arch `gpt-oss`): config, tensors, keys and weights.

A gpt-oss block: RMS norm, attention with q/k/v/o biases and one sink logit per head, NeoX
RoPE with YaRN scaling, a sliding window on even blocks; post-attention RMS norm; a router
with a bias picking the top-K experts (softmax over the chosen logits); experts with gate,
up and down biases and the clamped SwiGLU (alpha 1.702, limit 7). `MXFP4_MOE` quantizes
the experts to MXFP4 and the other matrices to Q8_0 with llama.cpp's quantizer.

Dimension key: D n_embd, E experts, F expert FFN, H heads, Hkv KV heads, Dh head dim.

Routers, attention matrices and experts come from `SynthWeights` as for qwen3moe (token- and
context-dependent routing); gate and up are scaled by `expert_gain` so that some
pre-activations pass the clamp at 7; biases and sinks are Gaussian; norms are 1 plus small
noise so that a norm applied to the wrong vector shows up in the logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sdq.errors import ParamsError
from sdq.synth import config as build
from sdq.synth.weights import SynthWeights, gaussian, rng_for, to_f16_values

ARCH = "gpt-oss"


@dataclass(frozen=True)
class GptOssConfig(build.SynthConfig):
    """SynthConfig with gpt-oss's extra settings (arch is always gpt-oss)."""

    arch: str = ARCH
    sliding_window: int = 16  # attention.sliding_window (even blocks)
    rope_scaling_factor: float = 32.0  # YaRN
    rope_orig_ctx: int = 4096  # rope.scaling.original_context_length
    bias_std: float = 0.1  # q/k/v/o and router biases
    sink_mean: float = 1.0  # attention sink logits ~ N(sink_mean, 1)
    expert_gain: float = 2.5  # gate and up weights times this
    expert_bias_std: float = 0.5  # gate / up / down biases

    def validate(self) -> GptOssConfig:
        super().validate()

        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ParamsError(f"synthetic model {self.name!r}: {what}")

        need(self.arch == ARCH, f"arch {self.arch!r} must be {ARCH}")
        need(self.sliding_window >= 1, "sliding_window must be >= 1")
        need(self.rope_scaling_factor >= 1.0, "rope_scaling_factor must be >= 1")
        return self


PRESETS = {
    # 4 blocks (0 and 2 with a 16-token window), 16 experts top-4, 8 query / 2 KV heads of 64
    # (H * Dh = 512 != n_embd as in gpt-oss), YaRN x32 over a 4096-token original context
    "tiny-gptoss": GptOssConfig(
        name="tiny-gptoss",
        n_layer=4,
        n_expert=16,
        n_expert_used=4,
        n_head=8,
        n_head_kv=2,
        head_dim=64,
        n_ctx_train=131072,
        rope_base=150000.0,
        rms_eps=1e-5,
        moe_gain=0.3,
    ),
}


def block_plan(cfg: GptOssConfig, layer: int, big) -> list[tuple[str, tuple[int, ...], type]]:
    """(name, NumPy shape, dtype) of block `layer`'s tensors in file order (llama.cpp's names)."""
    D, F, E = cfg.n_embd, cfg.expert_ffn, cfg.n_expert
    H, Hkv, Dh = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    b = f"blk.{layer}."
    f32 = np.float32
    return [
        (b + "attn_norm.weight", (D,), f32),
        (b + "attn_q.weight", (H * Dh, D), big),
        (b + "attn_q.bias", (H * Dh,), f32),
        (b + "attn_k.weight", (Hkv * Dh, D), big),
        (b + "attn_k.bias", (Hkv * Dh,), f32),
        (b + "attn_v.weight", (Hkv * Dh, D), big),
        (b + "attn_v.bias", (Hkv * Dh,), f32),
        (b + "attn_output.weight", (D, H * Dh), big),
        (b + "attn_output.bias", (D,), f32),
        (b + "attn_sinks.weight", (H,), f32),
        (b + "post_attention_norm.weight", (D,), f32),
        (b + "ffn_gate_inp.weight", (E, D), f32),
        (b + "ffn_gate_inp.bias", (E,), f32),
        (b + "ffn_gate_exps.weight", (E, F, D), big),
        (b + "ffn_gate_exps.bias", (E, F), f32),
        (b + "ffn_up_exps.weight", (E, F, D), big),
        (b + "ffn_up_exps.bias", (E, F), f32),
        (b + "ffn_down_exps.weight", (E, D, F), big),
        (b + "ffn_down_exps.bias", (E, D), f32),
    ]


def add_metadata(writer, cfg: GptOssConfig) -> None:
    """The gpt-oss keys llama.cpp reads beyond the common ones the caller writes."""
    from gguf.constants import RopeScalingType

    writer.add_sliding_window(cfg.sliding_window)
    writer.add_rope_scaling_type(RopeScalingType.YARN)
    writer.add_rope_scaling_factor(cfg.rope_scaling_factor)
    writer.add_rope_scaling_orig_ctx_len(cfg.rope_orig_ctx)


def make_tensor(w: SynthWeights, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
    """Values of a gpt-oss tensor (float32, f16-rounded), or None for a qwen3moe kind."""
    cfg = w.cfg
    if name.endswith("norm.weight"):
        return to_f16_values(1.0 + 0.1 * rng_for(w.seed, name).standard_normal(shape))
    if not name.startswith("blk."):
        return None
    layer, kind = int(name.split(".")[1]), name.split(".")[2]
    if name.endswith(".bias"):
        std = cfg.expert_bias_std if kind.endswith("_exps") else cfg.bias_std
        if kind == "ffn_down_exps":
            std *= cfg.moe_gain
        return gaussian(w.seed, name, shape, std)
    if kind == "attn_sinks":
        return gaussian(w.seed, name, shape, 1.0, cfg.sink_mean)
    if kind in ("ffn_gate_exps", "ffn_up_exps"):
        part = kind[len("ffn_") : -len("_exps")]
        out = np.stack([w.expert(layer, part, e) for e in range(shape[0])])  # [E, F, D]
        return to_f16_values(out * np.float32(cfg.expert_gain))
    return None
