"""What a synthetic `llama`-with-experts (Mixtral) or `granitemoe` model changes in a qwen3moe
one: its tensors (no Q/K norms), its keys, and the per-expert ("legacy") tensor layout.

Both are llama blocks: attention with adjacent-pair ("normal") RoPE and no Q/K RMS norms, then
an MoE FFN whose router is a softmax over all experts with the chosen K renormalised.
granitemoe adds four scales: token embeddings times `embedding_scale`, each attention and FFN
output times `residual_scale` before its residual add, attention scores times
`attention.scale` (instead of 1/sqrt(Dh)), logits divided by `logit_scale`.

Early Mixtral GGUF files store each expert as its own 2-D tensors, blk.N.ffn_{gate,up,down}.E;
`split_experts` writes such a file from a merged one (same bytes, same metadata), so the two
layouts of one model hold exactly the same numbers in every quant type.

Dimension key: D n_embd, E experts, F expert FFN, H heads, Hkv KV heads, Dh head dim.

Weights come from `SynthWeights` as for qwen3moe (token- and context-dependent routing); norms
are 1 plus small noise so that a norm weight applied to the wrong vector shows in the logits.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from sdq.synth.weights import SynthWeights, rng_for, to_f16_values

ARCHES = ("llama", "granitemoe")
PARTS = ("gate", "up", "down")
LEGACY_SUFFIX = "-legacy"


def block_plan(cfg, layer: int, big) -> list[tuple[str, tuple[int, ...], type]]:
    """(name, NumPy shape, dtype) of block `layer`'s tensors, in file order."""
    D, F, E = cfg.n_embd, cfg.expert_ffn, cfg.n_expert
    H, Hkv, Dh = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    b = f"blk.{layer}."
    return [
        (b + "attn_norm.weight", (D,), np.float32),
        (b + "attn_q.weight", (H * Dh, D), big),
        (b + "attn_k.weight", (Hkv * Dh, D), big),
        (b + "attn_v.weight", (Hkv * Dh, D), big),
        (b + "attn_output.weight", (D, H * Dh), big),
        (b + "ffn_norm.weight", (D,), np.float32),
        (b + "ffn_gate_inp.weight", (E, D), np.float32),
        (b + "ffn_gate_exps.weight", (E, F, D), big),
        (b + "ffn_up_exps.weight", (E, F, D), big),
        (b + "ffn_down_exps.weight", (E, D, F), big),
    ]


def add_metadata(writer, cfg) -> None:
    """granitemoe's scales (llama.cpp requires logit_scale; the others are optional)."""
    if cfg.arch == "granitemoe":
        writer.add_float32(f"{cfg.arch}.logit_scale", cfg.logit_scale)
        writer.add_float32(f"{cfg.arch}.residual_scale", cfg.residual_scale)
        writer.add_float32(f"{cfg.arch}.embedding_scale", cfg.embedding_scale)
        writer.add_float32(f"{cfg.arch}.attention.scale", cfg.attention_scale)


def make_tensor(w: SynthWeights, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
    """Values of a tensor that differs from qwen3moe's (the norms), or None for a shared kind."""
    if name.endswith("norm.weight"):
        return to_f16_values(1.0 + 0.1 * rng_for(w.seed, name).standard_normal(shape))
    return None


def merged_config(cfg):
    """The config of the merged-layout model that a legacy-layout config is split from."""
    name = cfg.name.removesuffix(LEGACY_SUFFIX)
    return dataclasses.replace(cfg, legacy_experts=False, name=name)


def split_experts(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Write `src` (experts in 3-D ffn_*_exps tensors) to `dst` with one 2-D tensor per expert
    and part, blk.N.ffn_{gate,up,down}.E.weight; every other tensor and key unchanged."""
    import gguf
    from gguf.constants import GGMLQuantizationType, GGUFValueType

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub)
    for t in reader.tensors:
        qtype = GGMLQuantizationType(int(t.tensor_type))
        raw = None if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16) else qtype
        data = np.asarray(t.data)  # F32/F16: values [.., rows, cols]; else uint8 [.., rows, B]
        parts = t.name.split(".")
        if len(parts) == 4 and parts[2] in {f"ffn_{p}_exps" for p in PARTS}:
            kind = parts[2][: -len("_exps")]
            for e in range(data.shape[0]):
                name = f"blk.{parts[1]}.{kind}.{e}.weight"
                writer.add_tensor(name, np.ascontiguousarray(data[e]), raw_dtype=raw)
        else:
            writer.add_tensor(t.name, data, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(dst)
