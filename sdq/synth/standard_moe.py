"""What synthetic qwen2moe and olmoe models add to a qwen3moe one: their tensors, keys, weights.

Both are attention + MoE blocks like qwen3moe, with NeoX RoPE over the whole head and softmax
routing whose top-K weights are used as they are (llama.cpp never renormalises them for these
architectures):

* qwen2moe: q/k/v biases (`attn_{q,k,v}.bias`), no QK norm, and a shared expert
  (`ffn_{gate,up,down}_shexp`, FFN size `expert_shared_feed_forward_length`) whose output is
  scaled by sigmoid(`ffn_gate_inp_shexp` . x) and added to the routed experts' sum.
* olmoe: an RMS norm over the whole q and k projections (`attn_q_norm` [H*Dh], `attn_k_norm`
  [Hkv*Dh]) before RoPE; the expert FFN size is `feed_forward_length`.

llama.cpp creates attn_q and attn_output as [n_embd, n_embd] and olmoe's k norm as [n_embd]
for both families: H * Dh must equal n_embd, and olmoe needs Hkv = H (`validate`).

Dimension key: D n_embd, E experts, F expert FFN, Fs shared-expert FFN, H heads, Hkv KV heads,
Dh head dim.

Routed experts, routers and Q/K/V/O come from `SynthWeights` as for qwen3moe (token- and
context-dependent routing); the shared expert as qwen35moe's (`sdq.synth.qwen35`). Biases are
Gaussian; norms are 1 plus small noise, so that a norm weight applied to the wrong values (per
head instead of over the projection) shows up in the logits.
"""

from __future__ import annotations

import numpy as np

from sdq.synth import qwen35
from sdq.synth.weights import SynthWeights, rng_for, to_f16_values

ARCHES = ("qwen2moe", "olmoe")
# SynthConfig fields beyond qwen3moe's that each architecture uses (kept in params())
CONFIG_FIELDS = {"qwen2moe": ("arch", "shared_ffn"), "olmoe": ("arch",)}
# spread of the q/k/v biases, in units of a projection's typical value (about 1)
BIAS_STD = {"attn_q": 0.5, "attn_k": 0.5, "attn_v": 0.2}


def problems(cfg) -> list[str]:
    """What makes a config unusable for its architecture (empty when fine)."""
    out = []
    if cfg.n_head * cfg.head_dim != cfg.n_embd:
        out.append(
            f"n_head * head_dim = {cfg.n_head * cfg.head_dim} must equal n_embd {cfg.n_embd} "
            f"({cfg.arch}: llama.cpp makes attn_q and attn_output [n_embd, n_embd])"
        )
    if cfg.arch == "olmoe" and cfg.n_head_kv != cfg.n_head:
        out.append(
            f"n_head_kv {cfg.n_head_kv} must equal n_head {cfg.n_head} (olmoe: llama.cpp makes "
            "attn_k_norm [n_embd])"
        )
    if cfg.arch == "qwen2moe" and (cfg.shared_ffn < 1 or cfg.shared_ffn % 32):
        out.append(f"shared_ffn {cfg.shared_ffn} must be a positive multiple of 32")
    if cfg.tied_embeddings:
        out.append(f"{cfg.arch} needs output.weight (llama.cpp does not tie it)")
    return out


def block_plan(cfg, layer: int, big) -> list[tuple[str, tuple[int, ...], type]]:
    """(name, NumPy shape, dtype) of block `layer`'s tensors, in file order."""
    D, F, E, Fs = cfg.n_embd, cfg.expert_ffn, cfg.n_expert, cfg.shared_ffn
    H, Hkv, Dh = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    b = f"blk.{layer}."
    plan = [
        (b + "attn_norm.weight", (D,), np.float32),
        (b + "attn_q.weight", (H * Dh, D), big),
        (b + "attn_k.weight", (Hkv * Dh, D), big),
        (b + "attn_v.weight", (Hkv * Dh, D), big),
    ]
    if cfg.arch == "qwen2moe":
        plan += [
            (b + "attn_q.bias", (H * Dh,), np.float32),
            (b + "attn_k.bias", (Hkv * Dh,), np.float32),
            (b + "attn_v.bias", (Hkv * Dh,), np.float32),
        ]
    plan.append((b + "attn_output.weight", (D, H * Dh), big))
    if cfg.arch == "olmoe":
        plan += [
            (b + "attn_q_norm.weight", (H * Dh,), np.float32),
            (b + "attn_k_norm.weight", (Hkv * Dh,), np.float32),
        ]
    plan += [
        (b + "ffn_norm.weight", (D,), np.float32),
        (b + "ffn_gate_inp.weight", (E, D), np.float32),
        (b + "ffn_gate_exps.weight", (E, F, D), big),
        (b + "ffn_up_exps.weight", (E, F, D), big),
        (b + "ffn_down_exps.weight", (E, D, F), big),
    ]
    if cfg.arch == "qwen2moe":
        plan += [
            (b + "ffn_gate_inp_shexp.weight", (D,), np.float32),
            (b + "ffn_gate_shexp.weight", (Fs, D), big),
            (b + "ffn_up_shexp.weight", (Fs, D), big),
            (b + "ffn_down_shexp.weight", (D, Fs), big),
        ]
    return plan


def feed_forward_length(cfg) -> int:
    """`{arch}.feed_forward_length`: olmoe's expert FFN size; for qwen2moe what qwen3moe
    writes (llama.cpp reads qwen2moe's expert sizes from the expert keys)."""
    return cfg.expert_ffn if cfg.arch == "olmoe" else cfg.expert_ffn * cfg.n_expert_used


def add_metadata(writer, cfg) -> None:
    """The keys llama.cpp reads for these architectures on top of the common ones."""
    if cfg.arch == "qwen2moe":
        writer.add_expert_shared_feed_forward_length(cfg.shared_ffn)


def make_tensor(w: SynthWeights, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
    """Values of a tensor these architectures make differently (float32, f16-rounded), or None
    for one made as qwen3moe's."""
    if name.endswith("norm.weight"):
        return to_f16_values(1.0 + 0.1 * rng_for(w.seed, name).standard_normal(shape))
    if not name.startswith("blk."):
        return None
    kind = name.split(".")[2]
    if name.endswith(".bias"):
        values = rng_for(w.seed, name).standard_normal(shape, np.float32)  # [rows]
        values *= BIAS_STD[kind]
        return to_f16_values(values)
    if kind.endswith("_shexp"):
        return qwen35.make_tensor(w, name, shape)
    return None
