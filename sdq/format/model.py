"""GGUF anatomy: a model's spec, its tensor directory and where every routed expert lies on disk.

`open_model(path)` reads only the header (sdq.format.header); tensor data stays on disk and is
reached through zero-copy memory-mapped views (`Model.tensor_data`) or, for routed experts,
through absolute file offsets (`ExpertTable`) that the pager reads into its arena.

Dimension key: L MoE layers (ExpertTable rows), E experts, D n_embd, F expert FFN size.

Tensor names (llama.cpp convention, `blk.{i}.` prefix):
  routed experts   ffn_gate_exps, ffn_up_exps, ffn_down_exps (3-D: [cols, rows, E] in ggml order)
                   or a fused ffn_gate_up_exps ([D, 2F, E]; rows 0..F-1 gate, F..2F-1 up)
                   or, in early Mixtral files, 2-D ffn_gate.{e}, ffn_up.{e}, ffn_down.{e} per expert
  shared experts   ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp (+ ffn_gate_inp_shexp)
  dense FFN        ffn_gate, ffn_up, ffn_down (e.g. deepseek2's leading dense layers)
  MTP / nextn      blk.{i}.nextn.* in layers i >= n_layer (block_count - nextn_predict_layers)
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from gguf.constants import GGMLQuantizationType, GGUFValueType

from sdq.errors import GGUFError, UnsupportedError
from sdq.format.header import Header, read_header
from sdq.format.quants import SUPPORTED_COMPUTE, qtype_of, row_bytes, tensor_bytes

Q = GGMLQuantizationType
PARTS = ("gate", "up", "down")

# Architectures whose tensor layout sdq understands, with the default for normalizing the
# top-k router weights when the file has no `{arch}.expert_weights_norm` key.
# (None: dense architecture, no routing.)
ARCH_NORM_TOPK: dict[str, bool | None] = {
    "llama": True,  # Mixtral-style MoE in the llama arch: softmax over the selected experts
    "qwen2": None,
    "qwen3": None,
    "qwen2moe": False,
    "qwen3moe": True,
    "qwen3vlmoe": True,
    "qwen3next": True,
    "qwen35moe": True,
    "olmoe": False,
    "deepseek2": False,
    "gpt-oss": True,  # softmax over the selected logits
    "granitemoe": True,  # softmax over all experts, the selected renormalised
    "glm4moe": False,  # sigmoid scores; GLM-4.5 files set expert_weights_norm true
}

# Architectures whose top-k weights llama.cpp never renormalises, whatever the file says
FIXED_NORM_TOPK = ("qwen2moe", "olmoe")

# Router gating when the file has no `{arch}.expert_gating_func` key (sdq.kernels.routing)
ARCH_GATING: dict[str, str] = {"glm4moe": "sigmoid"}

# Architectures whose RoPE rotates adjacent pairs (2i, 2i+1) of a head (llama.cpp's "normal"
# RoPE); the others rotate i with i + n_rot/2 (NeoX).
ROPE_NORM_ARCHES = ("llama", "deepseek2", "granitemoe")
# Architectures with the granite scales (embedding, residual, attention, logit)
GRANITE_ARCHES = ("granitemoe",)
SWA_ARCHES = ("gpt-oss",)

_PLAIN_DTYPES = {
    Q.F32: np.float32,
    Q.F16: np.float16,
    Q.F64: np.float64,
    Q.I8: np.int8,
    Q.I16: np.int16,
    Q.I32: np.int32,
    Q.I64: np.int64,
}
_BLOCK = re.compile(r"blk\.(\d+)\.")
_ROUTED = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down|gate_up)_exps\.weight$")
# early Mixtral files: one 2-D tensor per expert and part, blk.N.ffn_gate.E.weight
_ROUTED_LEGACY = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)\.(\d+)\.weight$")


def is_routed(name: str) -> bool:
    """Whether a tensor holds routed-expert weights (paged, not resident)."""
    return bool(_ROUTED.match(name) or _ROUTED_LEGACY.match(name))


@dataclass(frozen=True)
class HybridSpec:
    """Gated delta-net ("linear attention") hyperparameters of a hybrid model (qwen35moe).

    Block i is a delta-net block when i is in `recurrent_layers`, else full attention. A
    delta-net block projects the input to q/k (k_heads heads of `state` dims each) and v
    (v_heads heads of `state` dims), runs a causal conv of `conv_kernel` taps over those
    `conv_channels`, and keeps per sequence a [v_heads, state, state] state.
    """

    recurrent_layers: tuple[int, ...]
    full_attention_interval: int
    conv_kernel: int
    inner_size: int  # v_heads * state
    state: int  # head dim of q, k and v
    k_heads: int  # ssm.group_count
    v_heads: int  # ssm.time_step_rank
    rope_dim: int  # rotated dims of each full-attention head (partial rotary)
    rope_sections: tuple[int, int, int, int]

    @property
    def conv_channels(self) -> int:
        return (2 * self.k_heads + self.v_heads) * self.state


@dataclass(frozen=True)
class MlaSpec:
    """Multi-head latent attention (deepseek2) and its RoPE scaling, as llama.cpp reads them.

    Each token's keys and values are compressed to a `kv_lora_rank` latent (attn_kv_a_mqa, then
    attn_kv_a_norm) plus one `rope_dim` RoPE key shared by every head; the KV cache keeps only
    those. Per head, attn_k_b [R, Dk - rope_dim] maps the query's non-RoPE part into the latent
    space and attn_v_b [Dv, R] maps the attended latent to the head's value.
    """

    q_lora_rank: int  # 0: attn_q directly (V2-Lite); else attn_q_a, attn_q_a_norm, attn_q_b
    kv_lora_rank: int  # R
    key_length: int  # Dk: one head's query/key size, non-RoPE + RoPE (key_length_mla)
    value_length: int  # Dv: one head's value size (value_length_mla)
    rope_dim: int  # RoPE dims of each head (rope.dimension_count)
    rope_scaling: str  # rope.scaling.type: "none", "linear" or "yarn"
    rope_factor: float  # rope.scaling.factor (0: none)
    rope_orig_ctx: int  # rope.scaling.original_context_length (default: context_length)
    yarn_log_mul: float  # rope.scaling.yarn_log_multiplier / 0.1, as llama.cpp uses it
    rope_attn_factor: float  # rope.scaling.attn_factor
    yarn_beta_fast: float
    yarn_beta_slow: float


@dataclass(frozen=True)
class ModelSpec:
    arch: str
    n_layer: int  # decoder layers of the forward pass (MTP/nextn layers excluded)
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_expert: int
    n_expert_used: int
    expert_ffn: int
    n_shared_expert: int
    shared_ffn: int  # rows of ffn_up_shexp: all shared experts together (deepseek2: n_shared * F)
    n_vocab: int
    n_ctx_train: int
    rope_base: float
    rms_eps: float
    norm_topk_prob: bool  # renormalize the top-k router weights to sum 1
    tied_embeddings: bool
    moe_layers: tuple[int, ...]
    n_nextn_layer: int = 0  # MTP layers stored after the decoder layers (block_count - n_layer)
    dense_ffn: int = 0  # feed_forward_length of dense FFN layers, 0 if none
    hybrid: HybridSpec | None = None  # delta-net blocks (qwen35moe), None for attention only
    rope_neox: bool = True  # RoPE pairs (i, i + n_rot/2); False: adjacent pairs (llama)
    # granite scales; 0: absent (embeddings, residual branches and logits unscaled, attention
    # scores scaled by 1/sqrt(head_dim))
    embedding_scale: float = 0.0  # token embeddings times this
    residual_scale: float = 0.0  # attention and FFN outputs times this before the residual add
    attention_scale: float = 0.0  # the attention scores' scale
    logit_scale: float = 0.0  # logits divided by this
    # routers beyond softmax-top-K (sdq.kernels.routing) and leading dense-FFN layers
    expert_gating: str = "softmax"  # "softmax" or "sigmoid" (expert_gating_func)
    expert_weights_scale: float = 1.0  # routed weights times this
    n_expert_groups: int = 0  # group-limited top-K: experts in this many groups (0/1: off)
    n_group_used: int = 0  # groups kept per token
    n_dense_lead: int = 0  # leading_dense_block_count: blocks 0..n-1 have a dense FFN
    rope_dim: int = 0  # rope.dimension_count: rotated dims of each head (0: head_dim)
    mla: MlaSpec | None = None  # multi-head latent attention (deepseek2), None: plain attention
    # sliding-window attention (gpt-oss): the layers in swa_layers see only the last
    # sliding_window positions (0: no window)
    sliding_window: int = 0
    swa_layers: tuple[int, ...] = ()


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]  # ggml order: shape[0] = row length (columns)
    offset: int  # absolute file offset
    nbytes: int

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1

    @property
    def row_bytes(self) -> int:
        return self.nbytes // self.rows


class Segment(NamedTuple):
    offset: int  # absolute file offset
    nbytes: int
    qtype: GGMLQuantizationType


@dataclass(frozen=True, eq=False)
class ExpertTable:
    """Every routed expert's gate/up/down bytes on disk.

    Row i of the arrays is model layer `layers[i]`; `segment`, `expert_bytes` and `row` take
    model layer numbers. For qwen3moe every layer is MoE, so row i is layer i.
    """

    layers: tuple[int, ...]  # MoE layer indices
    n_expert: int
    offsets: np.ndarray  # int64 [L, E, 3] absolute file offset, parts (gate, up, down)
    nbytes: np.ndarray  # int64 [L, E, 3]
    qtypes: np.ndarray  # int32 [L, 3] GGMLQuantizationType values
    shapes: tuple[tuple[int, int], ...]  # per part (rows, cols): gate/up (F, D), down (D, F)
    fused_gate_up: bool = False  # gate and up come from one ffn_gate_up_exps tensor

    @cached_property
    def _row_of(self) -> dict[int, int]:
        return {layer: i for i, layer in enumerate(self.layers)}

    def row(self, layer: int) -> int:
        try:
            return self._row_of[layer]
        except KeyError:
            raise GGUFError(
                f"layer {layer} has no routed experts (MoE layers: {_ranges(self.layers)})"
            ) from None

    def _check_expert(self, expert: int) -> None:
        if not 0 <= expert < self.n_expert:
            raise GGUFError(f"expert {expert} out of range (0..{self.n_expert - 1})")

    def segment(self, layer: int, expert: int, part: int | str) -> Segment:
        i = self.row(layer)
        self._check_expert(expert)
        p = PARTS.index(part) if part in PARTS else part
        if p not in (0, 1, 2):
            raise GGUFError(f"expert part {part!r} is not one of {PARTS} or 0..2")
        return Segment(
            int(self.offsets[i, expert, p]),
            int(self.nbytes[i, expert, p]),
            GGMLQuantizationType(int(self.qtypes[i, p])),
        )

    def expert_bytes(self, layer: int, expert: int) -> int:
        self._check_expert(expert)
        return int(self.nbytes[self.row(layer), expert].sum())

    @cached_property
    def max_expert_bytes(self) -> int:
        return int(self.nbytes.sum(axis=2).max())

    @property
    def total_bytes(self) -> int:
        return int(self.nbytes.sum())


@dataclass(eq=False)
class Model:
    path: Path
    spec: ModelSpec
    tensors: dict[str, TensorInfo]
    metadata: dict[str, Any]
    header: Header = field(repr=False)
    _experts: ExpertTable | None = field(default=None, repr=False)
    _map: np.memmap | None = field(default=None, repr=False)
    # the pack the pager reads experts from (sdq.paging.pack.Pack); None: this file
    pack: Any = field(default=None, repr=False)

    @property
    def has_experts(self) -> bool:
        return self._experts is not None

    def require_experts(self) -> ExpertTable:
        if self._experts is None:
            n = sum(1 for name in self.tensors if "_exps." in name)
            raise GGUFError(
                f"{self.path} has no routed experts (arch {self.spec.arch}, {n} *_exps tensors)"
            )
        return self._experts

    @property
    def experts(self) -> ExpertTable:
        return self.require_experts()

    def require_compute(self) -> None:
        """UnsupportedError when a tensor's quant type has no sdq kernel."""
        bad = [t for t in self.tensors.values() if t.qtype not in SUPPORTED_COMPUTE]
        if bad:
            types = sorted({t.qtype.name for t in bad})
            raise UnsupportedError(
                f"{self.path}: tensor {bad[0].name} is {bad[0].qtype.name}, which sdq cannot "
                f"compute ({len(bad)} tensors of type {', '.join(types)}; supported: "
                f"{', '.join(sorted(q.name for q in SUPPORTED_COMPUTE))})"
            )

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    @cached_property
    def routed_bytes(self) -> int:
        """Bytes of every routed-expert tensor (MTP layers included)."""
        return sum(t.nbytes for name, t in self.tensors.items() if is_routed(name))

    @property
    def dense_bytes(self) -> int:
        """Bytes of all tensors that are not routed experts."""
        return self.total_bytes - self.routed_bytes

    def tensor_data(self, name: str) -> np.ndarray:
        """Zero-copy view of a tensor's bytes in the mapped file.

        F32/F16 (and other one-value-per-element types with a NumPy dtype): an array of that
        dtype in NumPy order (ggml shape reversed). Block-quantized types and BF16: uint8
        [rows, row_bytes].
        """
        try:
            t = self.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path} has no tensor named {name!r}") from None
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        raw = self._map[t.offset : t.offset + t.nbytes]
        if t.qtype in _PLAIN_DTYPES:
            return raw.view(_PLAIN_DTYPES[t.qtype]).reshape(t.shape[::-1])
        return raw.reshape(t.rows, t.row_bytes)

    def close(self) -> None:
        """Drop the file mapping (views taken from it keep it alive until they go)."""
        self._map = None


# ---------------------------------------------------------------------------------------------
# opening


def open_model(path: str | os.PathLike) -> Model:
    """Read a GGUF model's header and derive its spec and expert table. Touches no tensor data."""
    header = read_header(path)
    path = header.path
    meta = header.metadata
    tensors = _tensor_infos(header)

    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise GGUFError(f"{path}: metadata has no general.architecture")
    if arch not in ARCH_NORM_TOPK:
        raise UnsupportedError(
            f"{path}: unknown architecture {arch!r} (known: {', '.join(sorted(ARCH_NORM_TOPK))})"
        )
    n_split = meta.get("split.count", 1)
    if _is_int(n_split) and n_split > 1:
        raise UnsupportedError(
            f"{path}: one shard of a split GGUF (split.count {n_split}); merge the shards into "
            "one file first (llama-gguf-split --merge)"
        )
    keys = _Keys(path, meta, header.value_types, arch)
    n_block = keys.int("block_count", minimum=1, maximum=4096)
    n_nextn = keys.int("nextn_predict_layers", default=0, maximum=n_block - 1)
    n_layer = n_block - n_nextn
    n_embd = keys.int("embedding_length", minimum=1)
    experts = _expert_table(path, tensors, n_layer, n_embd)

    n_head = keys.int("attention.head_count", minimum=1)
    n_expert = keys.int("expert_count", default=0)
    if experts is not None and n_expert not in (0, experts.n_expert):
        raise GGUFError(
            f"{path}: {arch}.expert_count is {n_expert} but the expert tensors hold "
            f"{experts.n_expert} experts"
        )
    n_expert = experts.n_expert if experts is not None else n_expert
    n_expert_used = keys.int("expert_used_count", default=0, maximum=max(n_expert, 0))
    expert_ffn = experts.shapes[0][0] if experts is not None else 0
    meta_ffn = keys.int("expert_feed_forward_length", default=0)
    if experts is not None and meta_ffn not in (0, expert_ffn):
        raise GGUFError(
            f"{path}: {arch}.expert_feed_forward_length is {meta_ffn} but "
            f"ffn_down_exps rows are {expert_ffn} long"
        )

    shexp = next((t for name, t in tensors.items() if name.endswith("ffn_up_shexp.weight")), None)
    shared_ffn = shexp.shape[1] if shexp is not None and len(shexp.shape) == 2 else 0
    if not shared_ffn:
        shared_ffn = keys.int("expert_shared_feed_forward_length", default=0)
    n_shared = keys.int("expert_shared_count", default=1 if shexp is not None else 0)

    norm_default = ARCH_NORM_TOPK[arch]
    norm = meta.get(f"{arch}.expert_weights_norm", bool(norm_default))
    if arch in FIXED_NORM_TOPK:  # llama.cpp's graph ignores the key for these
        norm = ARCH_NORM_TOPK[arch]
    tokens = meta.get("tokenizer.ggml.tokens")
    embd = tensors.get("token_embd.weight")
    if isinstance(tokens, list) and tokens:
        n_vocab = len(tokens)
    elif f"{arch}.vocab_size" in meta:
        n_vocab = keys.int("vocab_size", minimum=1)
    elif embd is not None and len(embd.shape) == 2:
        n_vocab = embd.shape[1]
    else:
        raise GGUFError(f"{path}: no vocabulary (tokenizer.ggml.tokens, token_embd.weight)")

    spec = ModelSpec(
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=keys.int("attention.head_count_kv", default=n_head, minimum=1),
        head_dim=keys.int("attention.key_length", default=n_embd // n_head, minimum=1),
        n_expert=n_expert,
        n_expert_used=n_expert_used,
        expert_ffn=expert_ffn,
        n_shared_expert=n_shared,
        shared_ffn=shared_ffn,
        n_vocab=n_vocab,
        n_ctx_train=keys.int("context_length", default=0),
        rope_base=keys.float("rope.freq_base", default=10000.0),
        rms_eps=keys.float(
            "attention.layer_norm_rms_epsilon",
            default=keys.float("attention.layer_norm_epsilon", default=1e-6),
        ),
        norm_topk_prob=bool(norm),
        tied_embeddings="output.weight" not in tensors,
        moe_layers=experts.layers if experts is not None else (),
        n_nextn_layer=n_nextn,
        dense_ffn=keys.int("feed_forward_length", default=0),
        hybrid=_hybrid_spec(path, keys, n_block, n_layer) if arch in HYBRID_ARCHES else None,
        mla=_mla_spec(path, keys) if arch in MLA_ARCHES else None,
        rope_neox=arch not in ROPE_NORM_ARCHES,
        **_routing_keys(keys, arch),
        **(_granite_scales(keys) if arch in GRANITE_ARCHES else {}),
        **(_sliding_window_keys(keys, n_layer) if arch in SWA_ARCHES else {}),
    )
    return Model(path, spec, tensors, meta, header, experts)


MLA_ARCHES = ("deepseek2",)


def _mla_spec(path: Path, keys: _Keys) -> MlaSpec | None:
    """deepseek2's attention keys; None for a file with the legacy fused attn_kv_b (no
    key_length_mla): its anatomy can be shown, the engine refuses it (llama.cpp's converter
    now writes the split attn_k_b / attn_v_b)."""
    if f"{keys.arch}.attention.key_length_mla" not in keys.meta:
        return None
    rank = keys.int("attention.kv_lora_rank", minimum=1)
    key_length = keys.int("attention.key_length_mla", minimum=2)
    rope_dim = keys.int("rope.dimension_count", minimum=2, maximum=key_length - 1)
    scaling = keys.meta.get(f"{keys.arch}.rope.scaling.type", "linear")
    if scaling not in ("none", "linear", "yarn"):
        raise UnsupportedError(f"{path}: rope.scaling.type {scaling!r} (none, linear, yarn)")
    factor = keys.meta.get(f"{keys.arch}.rope.scaling.factor", 0.0)
    log_mul = keys.meta.get(f"{keys.arch}.rope.scaling.yarn_log_multiplier", 0.0)
    return MlaSpec(
        q_lora_rank=keys.int("attention.q_lora_rank", default=0),
        kv_lora_rank=rank,
        key_length=key_length,
        value_length=keys.int("attention.value_length_mla", minimum=1),
        rope_dim=rope_dim,
        rope_scaling=scaling,
        rope_factor=float(np.float32(factor)),
        rope_orig_ctx=keys.int(
            "rope.scaling.original_context_length", default=keys.int("context_length", default=0)
        ),
        yarn_log_mul=float(np.float32(log_mul) / np.float32(0.1)),
        rope_attn_factor=keys.float("rope.scaling.attn_factor", default=1.0),
        yarn_beta_fast=keys.float("rope.scaling.yarn_beta_fast", default=32.0),
        yarn_beta_slow=keys.float("rope.scaling.yarn_beta_slow", default=1.0),
    )


HYBRID_ARCHES = ("qwen35moe",)


def _routing_keys(keys: _Keys, arch: str) -> dict[str, Any]:
    """Router, dense-lead and partial-RoPE keys as llama.cpp reads them (defaults: absent)."""
    gating = keys.int("expert_gating_func", default=0)
    if gating not in (0, 1, 2):
        raise UnsupportedError(
            f"{keys.path}: {arch}.expert_gating_func {gating} (1 softmax and 2 sigmoid only)"
        )
    return {
        "expert_gating": {1: "softmax", 2: "sigmoid"}.get(gating, ARCH_GATING.get(arch, "softmax")),
        "expert_weights_scale": keys.float("expert_weights_scale", default=1.0),
        "n_expert_groups": keys.int("expert_group_count", default=0),
        "n_group_used": keys.int("expert_group_used_count", default=0),
        "n_dense_lead": keys.int("leading_dense_block_count", default=0),
        "rope_dim": keys.int("rope.dimension_count", default=0),
    }


def _sliding_window_keys(keys: _Keys, n_layer: int) -> dict[str, Any]:
    """attention.sliding_window and the layers it applies to, by llama.cpp's rule: the
    sliding_window_pattern array flags each layer; an integer n (default 2) makes layer il
    slide when il % n < n - 1 (n = 0: every layer). No window key: no layer slides."""
    window = keys.int("attention.sliding_window", default=0)
    if not window:
        return {}
    pattern = keys.meta.get(f"{keys.arch}.attention.sliding_window_pattern", 2)
    if isinstance(pattern, list):
        layers = tuple(il for il, on in enumerate(pattern[:n_layer]) if on)
    else:
        n = keys.int("attention.sliding_window_pattern", default=2, maximum=1 << 20)
        layers = tuple(il for il in range(n_layer) if n == 0 or il % n < n - 1)
    return {"sliding_window": window, "swa_layers": layers}


def _granite_scales(keys: _Keys) -> dict[str, float]:
    """granitemoe's scales as llama.cpp reads them: logit_scale required, the others optional."""
    return {
        "embedding_scale": keys.float("embedding_scale", default=0.0),
        "residual_scale": keys.float("residual_scale", default=0.0),
        "attention_scale": keys.float("attention.scale", default=0.0),
        "logit_scale": keys.float("logit_scale"),
    }


def _hybrid_spec(path: Path, keys: _Keys, n_block: int, n_layer: int) -> HybridSpec | None:
    """The delta-net keys, read as llama.cpp reads them (which blocks are recurrent included).

    None when the file has no ssm.* keys: its anatomy can still be shown, but it cannot run.
    """
    if f"{keys.arch}.ssm.state_size" not in keys.meta:
        return None
    state = keys.int("ssm.state_size", minimum=1)
    v_heads = keys.int("ssm.time_step_rank", minimum=1)
    k_heads = keys.int("ssm.group_count", minimum=1)
    inner = keys.int("ssm.inner_size", minimum=1)
    if inner != state * v_heads or v_heads % k_heads:
        raise UnsupportedError(
            f"{path}: delta-net sizes inner {inner}, state {state}, {v_heads} value heads, "
            f"{k_heads} key heads: sdq needs inner = state * value heads and value heads a "
            "multiple of key heads"
        )
    interval = keys.int("full_attention_interval", default=4, minimum=1)
    flags = keys.meta.get(f"{keys.arch}.attention.recurrent_layers")
    if isinstance(flags, list):
        recurrent = tuple(i for i in range(n_layer) if i < len(flags) and flags[i])
    else:
        recurrent = tuple(i for i in range(n_layer) if (i + 1) % interval != 0)
    sections = keys.meta.get(f"{keys.arch}.rope.dimension_sections", [0, 0, 0, 0])
    if not isinstance(sections, list) or not all(_is_int(x) for x in sections):
        raise GGUFError(f"{path}: metadata {keys.arch}.rope.dimension_sections is not integers")
    sections = (list(sections) + [0, 0, 0, 0])[:4]
    head_dim = keys.int("attention.key_length", minimum=1)
    return HybridSpec(
        recurrent_layers=recurrent,
        full_attention_interval=interval,
        conv_kernel=keys.int("ssm.conv_kernel", minimum=1, maximum=64),
        inner_size=inner,
        state=state,
        k_heads=k_heads,
        v_heads=v_heads,
        rope_dim=keys.int("rope.dimension_count", default=head_dim, minimum=2, maximum=head_dim),
        rope_sections=tuple(int(x) for x in sections),
    )


class _Keys:
    """Typed access to `{arch}.*` metadata with one-line errors."""

    _REQUIRED = object()

    def __init__(self, path: Path, meta: dict, meta_types: dict, arch: str):
        self.path, self.meta, self.meta_types, self.arch = path, meta, meta_types, arch

    def _get(self, key: str, default):
        full = f"{self.arch}.{key}"
        if full in self.meta:
            return full, self.meta[full]
        if default is self._REQUIRED:
            raise GGUFError(f"{self.path}: metadata key {full} is missing")
        return full, None

    def int(self, key: str, default=_REQUIRED, minimum: int = 0, maximum: int = 1 << 40) -> int:
        full, value = self._get(key, default)
        if value is None:
            return default
        if isinstance(value, list) and value and all(_is_int(v) for v in value):
            value = max(value)  # per-layer arrays (hybrids): the largest layer sizes the buffers
        if not _is_int(value) or not minimum <= value <= maximum:
            raise GGUFError(
                f"{self.path}: metadata {full} = {_short(value)} is not an "
                f"integer in [{minimum}, {maximum}]"
            )
        return int(value)

    def float(self, key: str, default=_REQUIRED) -> float:
        full, value = self._get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise GGUFError(
                f"{self.path}: metadata {full} = {_short(value)} is not a positive number"
            )
        if self.meta_types.get(full) == GGUFValueType.FLOAT32:
            return float(str(np.float32(value)))  # shortest text of the stored float32: 1e-06
        return float(value)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _tensor_infos(header: Header) -> dict[str, TensorInfo]:
    """Validate every directory entry against the quant table, the alignment and the file size."""
    path, out = header.path, {}
    for raw in header.tensors:
        qtype = qtype_of(raw.type_value, f"{path}: tensor {raw.name}")
        nbytes = tensor_bytes(qtype, raw.dims, what=f"{path}: tensor {raw.name}")
        if raw.rel_offset % header.alignment:
            raise GGUFError(
                f"{path}: tensor {raw.name} offset {raw.rel_offset} is not a multiple "
                f"of the alignment {header.alignment}"
            )
        out[raw.name] = TensorInfo(
            raw.name, qtype, raw.dims, header.data_offset + raw.rel_offset, nbytes
        )
    previous = None
    for t in sorted(out.values(), key=lambda t: t.offset):
        if t.offset + t.nbytes > header.file_size:
            raise GGUFError(
                f"{path}: tensor {t.name} data ends at byte {t.offset + t.nbytes}, beyond the end "
                f"of the file ({header.file_size} bytes)"
            )
        if previous is not None and t.offset < previous.offset + previous.nbytes:
            raise GGUFError(f"{path}: tensors {previous.name} and {t.name} overlap")
        previous = t
    return out


@dataclass(frozen=True)
class _LayerExperts:
    offsets: np.ndarray  # int64 [E, 3]
    nbytes: np.ndarray  # int64 [E, 3]
    qtypes: tuple[int, int, int]
    shapes: tuple[tuple[int, int], ...]  # per part (rows, cols)
    fused: bool = False


def _bad_shape(path: Path, t: TensorInfo, expected) -> GGUFError:
    return GGUFError(
        f"{path}: tensor {t.name} has shape {list(t.shape)}, expected {list(expected)}"
    )


def _merged_layer(path: Path, layer: int, parts: dict[str, TensorInfo], D: int) -> _LayerExperts:
    """One layer whose experts are stacked in 3-D tensors [cols, rows, E]."""
    if "down" not in parts or not ({"gate", "up"} <= parts.keys() or "gate_up" in parts):
        raise UnsupportedError(
            f"{path}: layer {layer}: routed experts {sorted(parts)} do not form gate/up/down "
            "(need ffn_gate_exps + ffn_up_exps or ffn_gate_up_exps, and ffn_down_exps)"
        )
    if "gate_up" in parts and ({"gate", "up"} & parts.keys()):
        raise GGUFError(f"{path}: layer {layer} has ffn_gate_up_exps and separate gate/up experts")
    down = parts["down"]
    if len(down.shape) != 3 or down.shape[1] != D:
        raise _bad_shape(path, down, ["F", D, "E"])
    F, E = down.shape[0], down.shape[2]
    if "gate_up" in parts:
        gu = parts["gate_up"]
        if gu.shape != (D, 2 * F, E):
            raise _bad_shape(path, gu, (D, 2 * F, E))
        rb = row_bytes(gu.qtype, D)
        # expert e holds 2F rows: its gate rows first, then its up rows
        entries = [(gu, 0, 2 * F * rb), (gu, F * rb, 2 * F * rb)]
    else:
        entries = []
        for t in (parts["gate"], parts["up"]):
            if t.shape != (D, F, E):
                raise _bad_shape(path, t, (D, F, E))
            entries.append((t, 0, t.nbytes // E))
    entries.append((down, 0, down.nbytes // E))
    shapes = ((F, D), (F, D), (D, F))
    experts = np.arange(E, dtype=np.int64)[:, None]  # [E, 1]
    base = np.array([t.offset + start for t, start, _ in entries], np.int64)  # [3]
    stride = np.array([step for _, _, step in entries], np.int64)  # [3]
    size = np.array(  # [3] bytes of one expert's part
        [row_bytes(t.qtype, shapes[p][1]) * shapes[p][0] for p, (t, _, _) in enumerate(entries)],
        np.int64,
    )
    return _LayerExperts(
        offsets=base + experts * stride,
        nbytes=np.broadcast_to(size, (E, 3)).copy(),
        qtypes=tuple(int(t.qtype) for t, _, _ in entries),
        shapes=shapes,
        fused="gate_up" in parts,
    )


def _legacy_layer(
    path: Path, layer: int, parts: dict[tuple[str, int], TensorInfo], D: int
) -> _LayerExperts:
    """One layer stored as one 2-D tensor per expert and part (early Mixtral GGUF files)."""
    E = 1 + max(e for _, e in parts)
    missing = [f"ffn_{p}.{e}" for e in range(E) for p in PARTS if (p, e) not in parts]
    if missing:
        raise GGUFError(f"{path}: layer {layer}: per-expert tensors missing: {missing[:4]}")
    F = parts[("down", 0)].shape[0]
    shapes = ((F, D), (F, D), (D, F))
    offsets = np.zeros((E, 3), np.int64)
    nbytes = np.zeros((E, 3), np.int64)
    qtypes = []
    for p, part in enumerate(PARTS):
        first = parts[(part, 0)]
        qtypes.append(int(first.qtype))
        rows, cols = shapes[p]
        for e in range(E):
            t = parts[(part, e)]
            if t.shape != (cols, rows):
                raise _bad_shape(path, t, (cols, rows))
            if t.qtype != first.qtype:
                raise UnsupportedError(
                    f"{path}: layer {layer}: experts of ffn_{part} mix {t.qtype.name} and "
                    f"{first.qtype.name}"
                )
            offsets[e, p], nbytes[e, p] = t.offset, t.nbytes
    return _LayerExperts(offsets, nbytes, tuple(qtypes), shapes)


def _expert_table(path: Path, tensors: dict[str, TensorInfo], n_layer: int, D: int):
    """ExpertTable over the decoder layers, or None for a model without routed experts."""
    merged: dict[int, dict[str, TensorInfo]] = {}
    legacy: dict[int, dict[tuple[str, int], TensorInfo]] = {}
    for name, t in tensors.items():
        if m := _ROUTED.match(name):
            merged.setdefault(int(m.group(1)), {})[m.group(2)] = t
        elif m := _ROUTED_LEGACY.match(name):
            legacy.setdefault(int(m.group(1)), {})[(m.group(2), int(m.group(3)))] = t
    layers = tuple(sorted(i for i in merged.keys() | legacy.keys() if i < n_layer))
    if not layers:
        return None
    per_layer: list[_LayerExperts] = []
    for layer in layers:
        if layer in merged and layer in legacy:
            raise GGUFError(f"{path}: layer {layer} has both stacked and per-expert tensors")
        if layer in merged:
            lx = _merged_layer(path, layer, merged[layer], D)
        else:
            lx = _legacy_layer(path, layer, legacy[layer], D)
        first = per_layer[0] if per_layer else lx
        if lx.offsets.shape != first.offsets.shape or lx.shapes != first.shapes:
            raise UnsupportedError(
                f"{path}: layer {layer} has {len(lx.offsets)} experts of shapes {lx.shapes}, "
                f"layer {layers[0]} has {len(first.offsets)} of {first.shapes}"
            )
        per_layer.append(lx)
    return ExpertTable(
        layers=layers,
        n_expert=len(per_layer[0].offsets),
        offsets=np.stack([lx.offsets for lx in per_layer]),  # [L, E, 3]
        nbytes=np.stack([lx.nbytes for lx in per_layer]),  # [L, E, 3]
        qtypes=np.array([lx.qtypes for lx in per_layer], np.int32),  # [L, 3]
        shapes=per_layer[0].shapes,
        fused_gate_up=any(lx.fused for lx in per_layer),
    )


def _printable(value):
    """Metadata strings keep undecodable bytes as surrogates; show them as U+FFFD instead."""
    if not isinstance(value, str):
        return None
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _ranges(layers) -> str:
    layers = list(layers)
    if not layers:
        return "none"
    out, start, prev = [], layers[0], layers[0]
    for x in layers[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ", ".join(out)


# ---------------------------------------------------------------------------------------------
# anatomy: what `sdq info` prints and notebook 00 tabulates


def tensor_class(name: str, n_layer: int, recurrent_layers=()) -> str:
    """The role of a tensor, from its name: one of TENSOR_CLASSES.

    In the blocks listed in `recurrent_layers` (delta-net blocks of a hybrid) the attn_*
    projections are linear attention.
    """
    m = _BLOCK.match(name)
    if "nextn" in name or "mtp" in name or (m and int(m.group(1)) >= n_layer):
        return "mtp"
    if m and int(m.group(1)) in recurrent_layers and ".attn_" in name and "norm" not in name:
        return "linear_attention"
    if is_routed(name):
        return "routed_experts"
    if "_exps" in name:
        return "routed_expert_extras"  # per-expert biases / scales, kept resident
    if "_shexp" in name:
        return "shared_expert"
    if ".ffn_gate_inp." in name or ".exp_probs_b" in name:
        return "router"
    if "norm" in name:
        return "norms"
    if ".attn_" in name:
        return "attention"
    if ".ssm_" in name:
        return "linear_attention"
    if re.search(r"\.ffn_(gate|up|down)\.", name):
        return "dense_ffn"
    if name.startswith("token_embd"):
        return "embeddings"
    if name.startswith("output."):
        return "output"
    return "other"


TENSOR_CLASSES = (
    "routed_experts",
    "routed_expert_extras",
    "shared_expert",
    "router",
    "attention",
    "linear_attention",
    "dense_ffn",
    "norms",
    "embeddings",
    "output",
    "mtp",
    "other",
)


def anatomy(model: Model, layer: int | None = None, expert: int = 0) -> dict[str, Any]:
    """Everything `sdq info` shows, as one JSON-ready dict (no tensor data is read).

    The T2 segments are those of `expert` in `layer` (default: the first MoE layer).
    """
    spec, tensors = model.spec, model.tensors
    by_type: Counter[str] = Counter()
    bytes_by_type: Counter[str] = Counter()
    by_class: Counter[str] = Counter()
    bytes_by_class: Counter[str] = Counter()
    for name, t in tensors.items():
        by_type[t.qtype.name] += 1
        bytes_by_type[t.qtype.name] += t.nbytes
        c = tensor_class(name, spec.n_layer, spec.hybrid.recurrent_layers if spec.hybrid else ())
        by_class[c] += 1
        bytes_by_class[c] += t.nbytes
    mtp_names = [n for n in tensors if "nextn" in n or "mtp" in n]
    out: dict[str, Any] = {
        "path": str(model.path),
        "file_bytes": model.header.file_size,
        "gguf_version": model.header.version,
        "alignment": model.header.alignment,
        "data_offset": model.header.data_offset,
        "name": _printable(model.metadata.get("general.name")),
        "file_type": model.metadata.get("general.file_type"),
        "spec": asdict(spec),
        "n_tensors": len(tensors),
        "tensor_types": {
            k: {"count": by_type[k], "bytes": bytes_by_type[k]} for k in sorted(by_type)
        },
        "tensor_classes": {
            c: {"count": by_class[c], "bytes": bytes_by_class[c]}
            for c in TENSOR_CLASSES
            if by_class[c]
        },
        "total_bytes": model.total_bytes,
        "dense_bytes": model.dense_bytes,
        "routed_expert_bytes": model.routed_bytes,  # MTP layers' experts included
        "mtp": {
            "present": bool(mtp_names) or spec.n_nextn_layer > 0,
            "nextn_predict_layers": spec.n_nextn_layer,
            "tensors": len(mtp_names),
            "bytes": sum(tensors[n].nbytes for n in mtp_names),
            # everything in the MTP role: nextn tensors plus whole layers >= n_layer
            "role_tensors": by_class["mtp"],
            "role_bytes": bytes_by_class["mtp"],
        },
        "unsupported_compute": sorted(
            {t.qtype.name for t in tensors.values() if t.qtype not in SUPPORTED_COMPUTE}
        ),
        "experts": None,
    }
    if model.has_experts:
        ex = model.experts
        layer = ex.layers[0] if layer is None else layer
        segments = []
        for p, part in enumerate(PARTS):
            seg = ex.segment(layer, expert, p)
            rows, cols = ex.shapes[p]
            segments.append(
                {
                    "layer": layer,
                    "expert": expert,
                    "part": part,
                    "offset": seg.offset,
                    "nbytes": seg.nbytes,
                    "qtype": seg.qtype.name,
                    "rows": rows,
                    "cols": cols,
                }
            )
        out["experts"] = {
            "moe_layers": len(ex.layers),
            "layers": _ranges(ex.layers),
            "n_expert": ex.n_expert,
            "n_expert_used": spec.n_expert_used,
            "fused_gate_up": ex.fused_gate_up,
            "expert_bytes": ex.expert_bytes(layer, expert),
            "max_expert_bytes": ex.max_expert_bytes,
            "layer_bytes": int(ex.nbytes[ex.row(layer)].sum()),
            "table_bytes": ex.total_bytes,
            "segments": segments,  # table T2: one expert's gate/up/down
            # quant mixes (Q4_K_M) vary by layer: part -> qtype -> layers holding it
            "part_qtypes": {
                part: {
                    GGMLQuantizationType(int(q)).name: _ranges(
                        [ly for ly, lq in zip(ex.layers, ex.qtypes[:, p], strict=True) if lq == q]
                    )
                    for q in np.unique(ex.qtypes[:, p])
                }
                for p, part in enumerate(PARTS)
            },
        }
    return out
