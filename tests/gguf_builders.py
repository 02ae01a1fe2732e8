"""Small GGUF files for the anatomy tests, written with gguf.GGUFWriter.

`write_model` returns the path plus the exact bytes written for every routed-expert tensor, so
tests can check the ExpertTable's offsets against the file independently of sdq.format.model.
F32/F16/Q8_0 tensors hold real quantized values (gguf.quants.quantize); K-quant tensors hold
random bytes of the right size (the anatomy never decodes them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGUFValueType, GGUFWriter
from gguf.constants import GGMLQuantizationType
from gguf.quants import quantize

from sdq.format.quants import block_facts

Q = GGMLQuantizationType


@dataclass
class Layout:
    arch: str = "qwen3moe"
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int | list = 2  # a list: per-layer values, as hybrids store them
    head_dim: int = 16
    n_expert: int = 4  # 0: dense model
    n_used: int = 2
    expert_ffn: int = 32
    dense_ffn: int = 96
    shared_ffn: int = 0  # > 0: shared expert tensors (qwen2moe / deepseek2)
    leading_dense: int = 0  # deepseek2: first layers use a dense FFN
    nextn: int = 0  # MTP layers appended after the decoder layers
    fused_gate_up: bool = False
    legacy_experts: bool = False  # one 2-D tensor per expert: blk.N.ffn_gate.E.weight
    tied: bool = False
    n_vocab: int = 100
    expert_qtypes: tuple | list = (Q.Q8_0, Q.Q8_0, Q.Q8_0)  # gate, up, down; list: per layer
    dense_qtype: GGMLQuantizationType = Q.F16
    extra_kv: dict = field(default_factory=dict)
    extra_tensors: dict = field(default_factory=dict)  # name -> (NumPy shape, qtype)
    tokenizer: dict | None = None  # tokenizer.* keys -> values; None: gpt2 with tokens tok0..


def _tensor(rng, shape_np: tuple[int, ...], qtype: GGMLQuantizationType) -> np.ndarray:
    """Data for a tensor of NumPy shape `shape_np` stored as qtype (bytes for block types)."""
    values = rng.standard_normal(shape_np).astype(np.float32) * 0.05
    if qtype == Q.F32:
        return values
    if qtype == Q.F16:
        return values.astype(np.float16)
    if qtype in (Q.Q8_0, Q.Q4_0, Q.BF16):
        return quantize(values, qtype)
    block, size = block_facts(qtype)
    *lead, cols = shape_np
    return rng.integers(0, 256, (*lead, cols // block * size), dtype=np.uint8)


def write_model(path: Path, lay: Layout, seed: int = 0) -> tuple[Path, dict[str, np.ndarray]]:
    """Write a model; returns (path, {tensor name: array as written}) for routed experts."""
    rng = np.random.default_rng(seed)
    D, F, E = lay.n_embd, lay.expert_ffn, lay.n_expert
    n_kv = max(lay.n_head_kv) if isinstance(lay.n_head_kv, list) else lay.n_head_kv
    w = GGUFWriter(path, lay.arch)
    n_block = lay.n_layer + lay.nextn
    w.add_block_count(n_block)
    w.add_context_length(4096)
    w.add_embedding_length(D)
    w.add_feed_forward_length(lay.dense_ffn)
    w.add_head_count(lay.n_head)
    w.add_head_count_kv(lay.n_head_kv)
    w.add_key_length(lay.head_dim)
    w.add_value_length(lay.head_dim)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    if E:
        w.add_expert_count(E)
        w.add_expert_used_count(lay.n_used)
        w.add_expert_feed_forward_length(F)
    if lay.shared_ffn:
        w.add_expert_shared_feed_forward_length(lay.shared_ffn)
    if lay.leading_dense:
        w.add_leading_dense_block_count(lay.leading_dense)
    if lay.nextn:
        w.add_nextn_predict_layers(lay.nextn)
    for key, value in lay.extra_kv.items():
        w.add_key_value(key, *value)
    if lay.tokenizer is None:
        w.add_tokenizer_model("gpt2")
        w.add_token_list([f"tok{i}" for i in range(lay.n_vocab)])
    else:
        add_key_values(w, lay.tokenizer)

    routed: dict[str, np.ndarray] = {}

    def add(name: str, shape_np: tuple[int, ...], qtype: GGMLQuantizationType) -> np.ndarray:
        data = _tensor(rng, shape_np, qtype)
        raw_dtype = None if qtype in (Q.F32, Q.F16) else qtype
        w.add_tensor(name, data, raw_dtype=raw_dtype)
        return data

    add("token_embd.weight", (lay.n_vocab, D), lay.dense_qtype)
    for i in range(n_block):
        b = f"blk.{i}"
        add(f"{b}.attn_norm.weight", (D,), Q.F32)
        add(f"{b}.attn_q.weight", (lay.n_head * lay.head_dim, D), lay.dense_qtype)
        add(f"{b}.attn_k.weight", (n_kv * lay.head_dim, D), lay.dense_qtype)
        add(f"{b}.attn_v.weight", (n_kv * lay.head_dim, D), lay.dense_qtype)
        add(f"{b}.attn_output.weight", (D, lay.n_head * lay.head_dim), lay.dense_qtype)
        add(f"{b}.ffn_norm.weight", (D,), Q.F32)
        if i >= lay.n_layer:
            add(f"{b}.nextn.eh_proj.weight", (D, 2 * D), lay.dense_qtype)
            add(f"{b}.nextn.enorm.weight", (D,), Q.F32)
        if not E or i < lay.leading_dense:
            add(f"{b}.ffn_gate.weight", (lay.dense_ffn, D), lay.dense_qtype)
            add(f"{b}.ffn_up.weight", (lay.dense_ffn, D), lay.dense_qtype)
            add(f"{b}.ffn_down.weight", (D, lay.dense_ffn), lay.dense_qtype)
            continue
        add(f"{b}.ffn_gate_inp.weight", (E, D), Q.F32)
        per_layer = isinstance(lay.expert_qtypes, list)
        qg, qu, qd = lay.expert_qtypes[i] if per_layer else lay.expert_qtypes
        if lay.legacy_experts:
            for e in range(E):
                for part, shape_np, qtype in (
                    ("gate", (F, D), qg),
                    ("up", (F, D), qu),
                    ("down", (D, F), qd),
                ):
                    name = f"{b}.ffn_{part}.{e}.weight"
                    routed[name] = add(name, shape_np, qtype)
        elif lay.fused_gate_up:
            name = f"{b}.ffn_gate_up_exps.weight"
            routed[name] = add(name, (E, 2 * F, D), qg)
        else:
            routed[f"{b}.ffn_gate_exps.weight"] = add(f"{b}.ffn_gate_exps.weight", (E, F, D), qg)
            routed[f"{b}.ffn_up_exps.weight"] = add(f"{b}.ffn_up_exps.weight", (E, F, D), qu)
        if not lay.legacy_experts:
            name = f"{b}.ffn_down_exps.weight"
            routed[name] = add(name, (E, D, F), qd)
        if lay.shared_ffn:
            add(f"{b}.ffn_gate_inp_shexp.weight", (D,), Q.F32)
            add(f"{b}.ffn_gate_shexp.weight", (lay.shared_ffn, D), lay.dense_qtype)
            add(f"{b}.ffn_up_shexp.weight", (lay.shared_ffn, D), lay.dense_qtype)
            add(f"{b}.ffn_down_shexp.weight", (D, lay.shared_ffn), lay.dense_qtype)
    for name, (shape_np, qtype) in lay.extra_tensors.items():
        add(name, shape_np, qtype)
    add("output_norm.weight", (D,), Q.F32)
    if not lay.tied:
        add("output.weight", (lay.n_vocab, D), lay.dense_qtype)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path), routed


_SCALAR_TYPES = {str: GGUFValueType.STRING, bool: GGUFValueType.BOOL, float: GGUFValueType.FLOAT32}


def _value_type(value) -> GGUFValueType:
    """The GGUF type a Python value is written as (int: UINT32, or INT32 when negative)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return GGUFValueType.INT32 if value < 0 else GGUFValueType.UINT32
    return _SCALAR_TYPES[type(value)]


def add_key_values(w: GGUFWriter, kv: dict) -> None:
    """Write metadata keys, each typed from its Python value; a list is an array typed from its
    first element (ints as INT32; gguf-py refuses empty arrays)."""
    for key, value in kv.items():
        if isinstance(value, list | tuple):
            first = value[0] if len(value) else ""
            sub = GGUFValueType.INT32 if type(first) is int else _value_type(first)
            w.add_key_value(key, list(value), GGUFValueType.ARRAY, sub_type=sub)
        else:
            w.add_key_value(key, value, _value_type(value))


def write_vocab(path: Path, kv: dict, arch: str = "llama") -> Path:
    """A vocabulary-only GGUF (no tensors) holding `kv`, as llama.cpp's ggml-vocab-*.gguf are."""
    w = GGUFWriter(path, arch)
    add_key_values(w, kv)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def copy_vocab(src: Path, dst: Path, **changes) -> Path:
    """A copy of the vocabulary-only GGUF `src` with some keys changed (`changes` maps
    `tokenizer.ggml.<key>` suffixes to new values, e.g. pre="dbrx")."""
    from sdq.format.header import read_header

    meta = dict(read_header(src).metadata)
    arch = meta.pop("general.architecture")
    meta.pop("general.alignment", None)
    meta.update({f"tokenizer.ggml.{k}": v for k, v in changes.items()})
    return write_vocab(dst, meta, arch)
