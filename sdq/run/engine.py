"""The qwen3moe and qwen35moe forward passes: dense weights resident, routed experts served by
an expert source.

Dimension key:
    T  tokens in the ubatch          D  n_embd (hidden)           V  vocabulary
    H  query heads                   Hkv KV heads                 Dh head dim   G = H / Hkv
    E  routed experts per layer      K  experts used per token    F  expert FFN size
    U  distinct experts a ubatch routes to (union over its T tokens, U <= min(E, T*K))
    C  context length (KV cache positions)

One ubatch (`Engine.forward`) runs every layer over T tokens at positions pos0..pos0+T-1:

    x = embed(tokens)                                       # [T, D]
    per layer:
        a = rms_norm(x) ; q, k, v = a Wq, a Wk, a Wv        # [T, H*Dh], [T, Hkv*Dh] x2
        q, k = rms_norm per head (q_norm, k_norm), rope_neox
                (llama, granitemoe: no q/k norm, adjacent-pair rope_norm)
        k, v -> KV cache[pos0 : pos0+T] ; x += attention(q, cache) Wo
        f = rms_norm(x) ; p = softmax(f Wr)                 # [T, E]
        top-K of p, renormalised ; union of chosen experts -> expert source
        x += sum_k p_k * down_k(silu(gate_k f) * up_k f)    # experts that are ready first
    logits = output(rms_norm(x[-1]))                        # [V]

granitemoe scales the embeddings (embedding_scale), each attention and MoE output before its
residual add (residual_scale), the attention scores (attention.scale instead of 1/sqrt(Dh)) and
divides the logits by logit_scale.

qwen35moe (sdq.run.qwen35_reference states it in NumPy) replaces the attention of most blocks
by a gated delta-net (sdq.kernels.delta_net; its conv and recurrent states are workspace
buffers, zeroed by `reset`), gates the full attention's output with sigmoid values packed
with Q, rotates only the first rope_dim dims of each head, normalizes before the MoE with
post_attention_norm, and adds a shared expert behind a sigmoid gate to the routed experts'
sum. Its routed experts go through the expert source exactly as qwen3moe's.

qwen2moe adds biases to q, k and v, has no QK norm, keeps the top-K router weights as they
are (no renormalisation) and adds a resident shared expert behind a sigmoid gate (as
qwen35moe's). olmoe normalizes the whole q [H*Dh] and k [Hkv*Dh] projections (one RMS norm per
token, not per head) before RoPE, and does not renormalise either.

glm4moe adds q/k/v biases, rotates only the first rope.dimension_count dims of each head
(NeoX), normalizes before the FFN with post_attention_norm, runs a resident dense FFN
(`DenseFFN`: down(silu(gate f) * up f)) in its first leading_dense_block_count blocks, and
routes the others with sigmoid scores (sdq.kernels.routing): the exp_probs_b bias shifts the
selection only, expert groups limit it, the chosen scores (renormalised) times
expert_weights_scale weight the experts; an ungated shared expert adds to their sum. Its MTP
blocks (nextn) are not run.

gpt-oss runs in `sdq.run.gpt_oss.GptOssEngine` (`sdq.run.engines.make_engine` picks it):
attention with q/k/v/o biases, a sink logit per head and a sliding window on alternating
blocks, YaRN RoPE, a biased router (softmax over the chosen logits), and experts with biases
and the clamped SwiGLU, their weights MXFP4 (sdq.kernels.mxfp4) paged like any routed expert.

deepseek2 replaces the attention by multi-head latent attention (sdq.run.mla: one compressed
KV cache row of kv_lora_rank + RoPE dims per token, adjacent-pair RoPE with YaRN), and has
glm4moe's leading dense blocks and ungated shared experts, with softmax routing (V2) or the
sigmoid router above (V3-style files).

The expert source is anything with the pager's `acquire / wait / views / release` API: the
real `sdq.paging.cache.ExpertCache` (experts paged from the file into the arena) or
`ResidentExperts` (all experts copied to RAM; for the resident benchmark and tests). All
buffers come from the `Workspace` that the memory plan counted (sdq.run.workspace).
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass, field

import numba
import numpy as np
from gguf.constants import GGMLQuantizationType

from sdq.errors import ReadError, SdqError, UnsupportedError
from sdq.kernels import delta_net, ops, routing
from sdq.kernels.act_quant import quantize_activation
from sdq.kernels.dot import matmul_q
from sdq.kernels.expert import QBlocks, expert_ffn
from sdq.kernels.expert import supported as expert_kernel_supported
from sdq.run import mla
from sdq.run.matrix import Activations, Matrix
from sdq.run.workspace import Workspace

SUPPORTED_ARCHS = (
    "qwen3moe", "qwen35moe", "llama", "granitemoe", "qwen2moe", "olmoe", "glm4moe", "deepseek2",
    "gpt-oss",
)  # fmt: skip
PROFILE_CATEGORIES = ("attention", "router", "expert_compute", "io_wait", "barrier", "other")


@dataclass
class LayerWeights:
    attn_norm: np.ndarray  # [D]
    wq: Matrix  # [H*Dh, D]
    wk: Matrix  # [Hkv*Dh, D]
    wv: Matrix  # [Hkv*Dh, D]
    wo: Matrix  # [D, H*Dh]
    q_norm: np.ndarray | None  # [Dh]; None: no QK norm (llama, granitemoe); [H*Dh]: olmoe
    k_norm: np.ndarray | None  # [Dh] per head, or [Hkv*Dh] over the whole projection (olmoe)
    ffn_norm: np.ndarray  # [D] (ffn_norm, or post_attention_norm: glm4moe)
    router: Matrix | None  # [E, D]; None in a dense-FFN layer
    q_bias: np.ndarray | None = None  # [H*Dh] (qwen2moe); None: no bias
    k_bias: np.ndarray | None = None  # [Hkv*Dh]
    v_bias: np.ndarray | None = None  # [Hkv*Dh]
    shared: SharedExpert | None = None  # beside the routed experts (qwen2moe)
    dense: DenseFFN | None = None  # the FFN of a dense layer (leading_dense_block_count)
    exp_probs_b: np.ndarray | None = None  # [E] expert selection bias (sigmoid routers)


@dataclass
class DenseFFN:
    """A dense SwiGLU FFN, down(silu(gate x) * up x): the FFN of a leading dense layer
    (glm4moe, deepseek2), resident like every dense tensor."""

    gate: Matrix  # [Fd, D]
    up: Matrix  # [Fd, D]
    down: Matrix  # [D, Fd]


@dataclass
class GatedAttention:
    """A qwen35moe full-attention block's weights."""

    wq: Matrix  # [2*H*Dh, D]: per head Dh query rows, then Dh output-gate rows
    wk: Matrix  # [Hkv*Dh, D]
    wv: Matrix  # [Hkv*Dh, D]
    wo: Matrix  # [D, H*Dh]
    q_norm: np.ndarray  # [Dh]
    k_norm: np.ndarray  # [Dh]


@dataclass
class DeltaNet:
    """A qwen35moe delta-net block's weights (Cc conv channels, Hv value heads, S state)."""

    wqkv: Matrix  # [Cc, D]
    wz: Matrix  # [Hv*S, D] output gate
    w_beta: Matrix  # [Hv, D]
    w_alpha: Matrix  # [Hv, D]
    conv: np.ndarray  # [Cc, Kc]
    dt_bias: np.ndarray  # [Hv]
    a: np.ndarray  # [Hv] -exp(A_log)
    norm: np.ndarray  # [S]
    wout: Matrix  # [D, Hv*S]


@dataclass
class SharedExpert:
    gate: Matrix  # [Fs, D]
    up: Matrix  # [Fs, D]
    down: Matrix  # [D, Fs]
    gate_inp: np.ndarray | None = None  # [1, D] sigmoid gate of the expert's output; None: ungated


@dataclass
class HybridLayer:
    """A qwen35moe block: a delta-net or gated full attention, then routed + shared experts."""

    attn_norm: np.ndarray  # [D]
    mixer: GatedAttention | DeltaNet
    ffn_norm: np.ndarray  # [D] post_attention_norm
    router: Matrix  # [E, D]
    shared: SharedExpert


@dataclass
class DenseWeights:
    """Every tensor but the routed experts, copied into anonymous memory (model.dense_bytes)."""

    token_embd: Matrix  # [V, D]
    output_norm: np.ndarray  # [D]
    output: Matrix  # [V, D] (token_embd when tied)
    layers: list[LayerWeights]

    @classmethod
    def load(cls, model) -> DenseWeights:
        """Read every dense tensor from the file into anonymous memory with pread: no file
        mapping, so the process never holds the weights twice (mapped pages + copy).

        Readahead is off and each tensor's pages are dropped from the page cache once copied:
        otherwise the kernel's readahead (up to read_ahead_kb, 8 MB on this project's test
        machine) pulls the start of the neighbouring expert tensors into the cache, so later
        "cold" expert reads partly hit RAM, and a memory cgroup is charged for the copy twice."""
        tensors = model.tensors
        with open(model.path, "rb", buffering=0) as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)

            def read(name: str) -> np.ndarray:
                info = tensors.get(name)
                if info is None:
                    raise UnsupportedError(f"{model.path}: tensor {name} is missing")
                like = model.tensor_data(name)  # a view, for shape and dtype; pages untouched
                out = np.empty(like.shape, like.dtype)
                _pread_into(f, out, info.offset, model.path, name)
                os.posix_fadvise(f.fileno(), info.offset, out.nbytes, os.POSIX_FADV_DONTNEED)
                return out

            def matrix(name: str) -> Matrix:
                raw = read(name)
                info = tensors[name]
                cols, rows = int(info.shape[0]), int(np.prod(info.shape[1:]))
                return Matrix(name, raw, int(info.qtype), rows, cols)

            def vector(name: str) -> np.ndarray:
                return read(name).astype(np.float32).reshape(-1)

            return cls._assemble(model, matrix, vector)

    @classmethod
    def _assemble(cls, model, matrix, vector) -> DenseWeights:
        tensors = model.tensors
        if model.spec.arch == "qwen35moe":
            _check_hybrid(model)
        if model.spec.arch == "gpt-oss":
            raise UnsupportedError(f"{model.path}: gpt-oss weights load with sdq.run.engines")
        embd = matrix("token_embd.weight")
        output = matrix("output.weight") if "output.weight" in tensors else embd
        layers = []
        if model.spec.arch == "deepseek2":  # multi-head latent attention (sdq.run.mla)
            mla.check(model)
            layers = mla.load_layers(model, matrix, vector, DenseFFN, SharedExpert)
            return cls(embd, vector("output_norm.weight"), output, layers)
        if model.spec.hybrid is not None:
            layers = [_hybrid_layer(model, il, matrix, vector) for il in range(model.spec.n_layer)]
        moe = frozenset(int(i) for i in model.spec.moe_layers)
        for il in range(model.spec.n_layer if model.spec.hybrid is None else 0):
            p = f"blk.{il}."
            layers.append(
                LayerWeights(
                    attn_norm=vector(p + "attn_norm.weight"),
                    wq=matrix(p + "attn_q.weight"),
                    wk=matrix(p + "attn_k.weight"),
                    wv=matrix(p + "attn_v.weight"),
                    wo=matrix(p + "attn_output.weight"),
                    q_norm=_optional(vector, tensors, p + "attn_q_norm.weight"),
                    k_norm=_optional(vector, tensors, p + "attn_k_norm.weight"),
                    ffn_norm=vector(_ffn_norm_name(tensors, p)),
                    router=matrix(p + "ffn_gate_inp.weight") if il in moe else None,
                    q_bias=_optional(vector, tensors, p + "attn_q.bias"),
                    k_bias=_optional(vector, tensors, p + "attn_k.bias"),
                    v_bias=_optional(vector, tensors, p + "attn_v.bias"),
                    shared=_shared_expert_weights(tensors, p, matrix, vector),
                    dense=None if il in moe else _dense_ffn(p, matrix),
                    exp_probs_b=_optional(vector, tensors, p + "exp_probs_b.bias"),
                )
            )
        return cls(embd, vector("output_norm.weight"), output, layers)


def _optional(read, tensors, name: str):
    """read(name), or None when the file has no such tensor."""
    return read(name) if name in tensors else None


def _ffn_norm_name(tensors, p: str) -> str:
    """The norm before block p's FFN: ffn_norm, or post_attention_norm (glm4moe)."""
    name = p + "ffn_norm.weight"
    post = p + "post_attention_norm.weight"
    return post if name not in tensors and post in tensors else name


def _dense_ffn(p: str, matrix) -> DenseFFN:
    """Block p's dense FFN (ffn_gate/up/down); a missing tensor is a one-line refusal."""
    return DenseFFN(
        gate=matrix(p + "ffn_gate.weight"),
        up=matrix(p + "ffn_up.weight"),
        down=matrix(p + "ffn_down.weight"),
    )


def _shared_expert_weights(tensors, p: str, matrix, vector) -> SharedExpert | None:
    """Block p's shared expert (ffn_*_shexp; gated when ffn_gate_inp_shexp is there), or None."""
    if p + "ffn_up_shexp.weight" not in tensors:
        return None
    gate_inp = _optional(vector, tensors, p + "ffn_gate_inp_shexp.weight")
    return SharedExpert(
        gate=matrix(p + "ffn_gate_shexp.weight"),
        up=matrix(p + "ffn_up_shexp.weight"),
        down=matrix(p + "ffn_down_shexp.weight"),
        gate_inp=None if gate_inp is None else gate_inp.reshape(1, -1),
    )


def _hybrid_layer(model, il: int, matrix, vector) -> HybridLayer:
    p, hy = f"blk.{il}.", model.spec.hybrid
    if il in hy.recurrent_layers:
        mixer = DeltaNet(
            wqkv=matrix(p + "attn_qkv.weight"),
            wz=matrix(p + "attn_gate.weight"),
            w_beta=matrix(p + "ssm_beta.weight"),
            w_alpha=matrix(p + "ssm_alpha.weight"),
            conv=vector(p + "ssm_conv1d.weight").reshape(hy.conv_channels, hy.conv_kernel),
            dt_bias=vector(p + "ssm_dt.bias"),
            a=vector(p + "ssm_a"),
            norm=vector(p + "ssm_norm.weight"),
            wout=matrix(p + "ssm_out.weight"),
        )
    else:
        mixer = GatedAttention(
            wq=matrix(p + "attn_q.weight"),
            wk=matrix(p + "attn_k.weight"),
            wv=matrix(p + "attn_v.weight"),
            wo=matrix(p + "attn_output.weight"),
            q_norm=vector(p + "attn_q_norm.weight"),
            k_norm=vector(p + "attn_k_norm.weight"),
        )
    return HybridLayer(
        attn_norm=vector(p + "attn_norm.weight"),
        mixer=mixer,
        ffn_norm=vector(p + "post_attention_norm.weight"),
        router=matrix(p + "ffn_gate_inp.weight"),
        shared=SharedExpert(
            gate=matrix(p + "ffn_gate_shexp.weight"),
            up=matrix(p + "ffn_up_shexp.weight"),
            down=matrix(p + "ffn_down_shexp.weight"),
            gate_inp=vector(p + "ffn_gate_inp_shexp.weight").reshape(1, -1),
        ),
    )


# --- expert sources -------------------------------------------------------------------------


class ResidentExperts:
    """Every routed expert copied into RAM; same API as sdq.paging.cache.ExpertCache, always a hit.

    Used by the resident benchmark (sdq against llama.cpp with everything in memory) and by
    tests that check the forward pass independently of the pager.
    """

    def __init__(self, model):
        table = model.require_experts() if hasattr(model, "require_experts") else model.experts
        self.table = table
        self._parts: dict[int, list[list[np.ndarray]]] = {}
        with open(model.path, "rb", buffering=0) as f:
            for li, layer in enumerate(table.layers):
                per_expert = []
                for e in range(table.n_expert):
                    parts = []
                    for o, n in zip(table.offsets[li, e], table.nbytes[li, e], strict=True):
                        part = np.empty(int(n), np.uint8)
                        _pread_into(f, part, int(o), model.path, f"layer {layer} expert {e}")
                        parts.append(part)
                    per_expert.append(parts)
                self._parts[int(layer)] = per_expert
        self.lookups = 0

    @property
    def stats(self) -> dict:
        return {"lookups": self.lookups, "hits": self.lookups, "misses": 0, "bytes_read": 0}

    def acquire(self, layer: int, expert_ids) -> _ResidentHandle:
        ids = [int(e) for e in expert_ids]
        self.lookups += len(ids)
        return _ResidentHandle(self._parts[layer], ids)

    def release(self, handle) -> None:
        pass

    def prefetch(self, layer: int, expert_ids) -> None:
        pass

    def close(self) -> None:
        self._parts.clear()


class _ResidentHandle:
    def __init__(self, parts, ids):
        self.parts, self.ids = parts, ids

    def ready_order(self) -> list[int]:
        return list(range(len(self.ids)))

    def wait(self, i: int) -> None:
        pass

    def views(self, i: int):
        return self.parts[self.ids[i]]


def _pread_into(f, out: np.ndarray, offset: int, path, what: str) -> None:
    """Fill `out` with the file's bytes at `offset` (ReadError on a short read)."""
    view = memoryview(out.reshape(-1).view(np.uint8))
    done = 0
    while done < len(view):
        n = os.preadv(f.fileno(), [view[done:]], offset + done)
        if n <= 0:
            raise ReadError(
                f"{path}: {what}: short read at byte {offset + done} ({done} of {len(view)} read)"
            )
        done += n


# --- the forward pass -----------------------------------------------------------------------


@dataclass
class Timers:
    """Seconds spent per op category (always collected; perf_counter costs ~0.1 us).

    The categories split the calling thread's wall time, so they add up to it (whatever no
    timer covers goes to `other` in sdq.run.generate):
        attention       norms, q/k/v/o products, rope, the KV cache and attention
        router          the router product, top-K, and the decode prefetch's next-layer guess
        io_wait         time spent blocked on expert reads (handle.wait)
        barrier         prefill with the expert worker pool: the workers' mean idle time once
                        every expert of the chunk was handed over, i.e. waiting for the slowest
                        worker (`pool_barrier`), measured from each expert's start and end time
        expert_compute  the rest of the MoE block: expert products, their sum, hand-offs
        other           embedding, output norm and head
    Not measured: the waits inside Numba's parallel kernels (prange loops end at an implicit
    barrier where the threads that finish first wait for the slowest). Timing them would need
    per-thread clocks inside the kernels; they stay in the category of the op that ran the
    kernel (attention, router, expert_compute). A decode step runs no worker pool, so its
    barrier is 0: not a measurement of the kernels' barriers.
    """

    seconds: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(PROFILE_CATEGORIES, 0.0)
    )
    # seconds that lie inside the categories, not beside them (sdq.measure.ceiling uses them):
    #   forward   the forward passes' wall time
    #   no_read   from a forward pass's start to its first expert request, and from its last
    #             expert release to its end: nothing is left to read then
    #   pager     inside the expert source's acquire / release / prefetch calls
    marks: dict[str, float] = field(
        default_factory=lambda: {"forward": 0.0, "no_read": 0.0, "pager": 0.0}
    )

    def add(self, category: str, dt: float) -> None:
        self.seconds[category] += dt

    def snapshot(self) -> dict[str, float]:
        return dict(self.seconds)


class Engine:
    """Runs ubatches through the model; owns the KV cache position."""

    def __init__(
        self,
        model,
        experts,
        workspace: Workspace,
        n_ctx: int,
        n_ubatch: int,
        weights: DenseWeights | None = None,
    ):
        spec = model.spec
        if spec.arch not in SUPPORTED_ARCHS:
            raise UnsupportedError(f"{model.path}: architecture {spec.arch!r} is not supported")
        if spec.arch == "qwen35moe":
            _check_hybrid(model)
        elif spec.n_shared_expert and spec.arch == "qwen3moe":
            raise UnsupportedError(
                f"{model.path}: {spec.n_shared_expert} shared experts (qwen3moe has none)"
            )
        if spec.arch == "deepseek2":
            mla.check(model)
        if spec.arch in ("llama", "granitemoe"):
            _check_llama(model)
        if spec.n_head % spec.n_head_kv:
            raise UnsupportedError(
                f"{model.path}: n_head {spec.n_head} not a multiple of n_head_kv {spec.n_head_kv}"
            )
        self.model, self.spec, self.experts, self.ws = model, spec, experts, workspace
        self.n_ctx, self.n_ubatch = n_ctx, n_ubatch
        self.weights = weights if weights is not None else DenseWeights.load(model)
        self.moe_layers = frozenset(int(i) for i in spec.moe_layers)
        dense = [il for il in range(spec.n_layer) if il not in self.moe_layers]
        if dense and (spec.hybrid is not None or not spec.dense_ffn):
            raise UnsupportedError(
                f"{model.path}: {len(dense)} dense-FFN layers"
                f" ({spec.arch} layers are all MoE, or no feed_forward_length)"
            )
        if spec.expert_gating not in ("softmax", "sigmoid"):
            raise UnsupportedError(f"{model.path}: expert gating {spec.expert_gating!r}")
        self.expert_shapes = _expert_shapes(spec)
        table = model.experts
        if getattr(table, "fused_gate_up", False):
            raise UnsupportedError(f"{model.path}: fused gate_up expert tensors")
        self.expert_qtypes = {  # layer -> GGML type of (gate, up, down)
            int(layer): tuple(int(t) for t in table.qtypes[i])
            for i, layer in enumerate(table.layers)
        }
        mxfp4 = int(GGMLQuantizationType.MXFP4)
        if spec.arch != "gpt-oss" and any(mxfp4 in q for q in self.expert_qtypes.values()):
            raise UnsupportedError(f"{model.path}: MXFP4 experts outside gpt-oss")
        self._layer = -1
        self.timers = Timers()
        self.route_log = None  # sdq.paging.route_log.RouteLog: one JSON line per token and layer
        # decode: after a layer's experts are requested, guess the experts of each of the next
        # prefetch_depth layers and prefetch the prefetch_next most probable of each (0: off)
        self.prefetch_next = 0
        self.prefetch_depth = 1
        # decode guesses per depth: depth -> [experts guessed, of them the layer then routed to]
        self.guess_counts: dict[int, list[int]] = {}
        self._guesses: dict[int, list[tuple[int, np.ndarray]]] = {}  # layer -> [(depth, ids [w])]
        self.phase = "prefill"
        self.n_past = 0
        hy = spec.hybrid
        # workspace row of each block's KV cache / delta-net state
        recurrent = hy.recurrent_layers if hy is not None else ()
        attn = [il for il in range(spec.n_layer) if il not in recurrent]
        self.kv_row = {il: i for i, il in enumerate(attn)}
        self.state_row = {il: i for i, il in enumerate(recurrent)}
        self.reset()

    def reset(self) -> None:
        """Forget the sequence: the KV cache position and the delta-net states."""
        self.n_past = 0
        if self.spec.hybrid is not None:
            self.ws.conv_cache[...] = 0.0
            self.ws.ssm_cache[...] = 0.0

    # -- one ubatch --------------------------------------------------------------------------

    def forward(self, tokens, logits: str = "last") -> np.ndarray | None:
        """Run tokens [T] (T <= n_ubatch) at positions n_past.. ; return logits.

        logits: "last" -> ws.logits [V] for the last token; "all" -> a new array [T, V]
        (tests and teacher forcing only; not counted by the memory plan); "none" -> None.
        """
        tokens = np.asarray(tokens, dtype=np.int64)
        T = int(tokens.shape[0])
        if not 0 < T <= self.n_ubatch:
            raise ValueError(f"ubatch of {T} tokens; must be 1..{self.n_ubatch}")
        if self.n_past + T > self.n_ctx:
            raise SdqError(
                f"context overflow: {self.n_past} tokens in the KV cache + {T} new"
                f" > context length {self.n_ctx} (-c)"
            )
        if int(tokens.max()) >= self.spec.n_vocab or int(tokens.min()) < 0:
            raise SdqError(f"token id out of range 0..{self.spec.n_vocab - 1}")
        t0 = time.perf_counter()
        self._t_forward, self._t_released = t0, None  # marks: no_read
        self._guesses.clear()  # a guess is judged in the forward pass that made it
        ws, w = self.ws, self.weights
        x = ws.x[:T]  # [T, D]
        x[:] = w.token_embd.rows_of(tokens)
        if self.spec.embedding_scale:  # granitemoe
            x *= np.float32(self.spec.embedding_scale)
        positions = np.arange(self.n_past, self.n_past + T, dtype=np.float32)
        hy = self.spec.hybrid
        n_rot = hy.rope_dim if hy is not None else (self.spec.rope_dim or self.spec.head_dim)
        if self.spec.mla is not None:  # deepseek2: adjacent-pair RoPE with YaRN
            self._rope = mla.rope_tables(self.spec, positions)
        else:
            self._rope = ops.rope_tables(positions, self.spec.rope_base, n_rot)
        self.timers.add("other", time.perf_counter() - t0)

        for il, lw in enumerate(w.layers):
            if isinstance(lw, HybridLayer):
                if isinstance(lw.mixer, DeltaNet):
                    self._delta_net_block(il, lw, T)
                else:
                    self._gated_attention_block(il, lw, T)
            elif isinstance(lw, mla.MlaLayer):
                mla.attention_block(self, il, lw, T)
            else:
                self._attention_block(il, lw, T)
            self._moe_block(il, lw, T)
        self.n_past += T

        t0 = time.perf_counter()
        xn = ws.xn[:T]
        if logits == "none":
            out = None
        elif logits == "last":
            ops.rms_norm(x[T - 1 : T], w.output_norm, self.spec.rms_eps, xn[:1])
            w.output.mul(Activations(xn[:1]), ws.logits.reshape(1, -1))
            out = ws.logits
        else:
            ops.rms_norm(x, w.output_norm, self.spec.rms_eps, xn)
            out = np.empty((T, self.spec.n_vocab), np.float32)
            w.output.mul(Activations(xn), out)
        if out is not None and self.spec.logit_scale:  # granitemoe: logits / logit_scale
            out *= np.float32(1.0) / np.float32(self.spec.logit_scale)
        t_end = time.perf_counter()
        self.timers.add("other", t_end - t0)
        marks = self.timers.marks
        marks["forward"] += t_end - self._t_forward
        last = self._t_released if self._t_released is not None else self._t_forward
        marks["no_read"] += t_end - last
        return out

    def _attention_block(self, il: int, lw: LayerWeights, T: int) -> None:
        t0 = time.perf_counter()
        s, ws = self.spec, self.ws
        H, Hkv, Dh, eps = s.n_head, s.n_head_kv, s.head_dim, s.rms_eps
        p0 = self.n_past
        x, xn = ws.x[:T], ws.xn[:T]  # [T, D]
        q, k, v = ws.q[:T], ws.k[:T], ws.v[:T]  # [T, H*Dh], [T, Hkv*Dh], [T, Hkv*Dh]
        ops.rms_norm(x, lw.attn_norm, eps, xn)
        acts = Activations(xn)
        lw.wq.mul(acts, q)
        lw.wk.mul(acts, k)
        lw.wv.mul(acts, v)
        for proj, bias in ((q, lw.q_bias), (k, lw.k_bias), (v, lw.v_bias)):
            if bias is not None:
                proj += bias
        q3 = q.reshape(T, H, Dh)
        k3 = k.reshape(T, Hkv, Dh)
        if lw.q_norm is not None:
            _qk_norm(q, q3, lw.q_norm, eps)
            _qk_norm(k, k3, lw.k_norm, eps)
        cos, sin = self._rope  # [T, Dh/2] each, for this ubatch's positions
        rope = ops.rope_neox if s.rope_neox else ops.rope_norm
        n_rot = s.rope_dim or Dh
        if n_rot < Dh:  # partial RoPE (glm4moe): the first n_rot dims of each head
            rope(q3[:, :, :n_rot], cos, sin)
            rope(k3[:, :, :n_rot], cos, sin)
        else:
            rope(q3, cos, sin)
            rope(k3, cos, sin)
        ws.k_cache[il, p0 : p0 + T] = k
        ws.v_cache[il, p0 : p0 + T] = v
        attn = ws.attn[:T]  # [T, H*Dh]
        ops.attention(
            q3,
            ws.k_cache[il],
            ws.v_cache[il],
            p0,
            Hkv,
            ws.scores,
            attn.reshape(T, H, Dh),
            s.attention_scale or None,
        )
        lw.wo.mul(Activations(attn), xn)  # xn reused as the projection's output [T, D]
        if s.residual_scale:  # granitemoe
            xn *= np.float32(s.residual_scale)
        x += xn
        self.timers.add("attention", time.perf_counter() - t0)

    def _gated_attention_block(self, il: int, lw: HybridLayer, T: int) -> None:
        """qwen35moe full attention: Q packed with a sigmoid output gate, partial RoPE."""
        t0 = time.perf_counter()
        s, ws, m = self.spec, self.ws, lw.mixer
        H, Hkv, Dh, eps = s.n_head, s.n_head_kv, s.head_dim, s.rms_eps
        n_rot, p0, row = s.hybrid.rope_dim, self.n_past, self.kv_row[il]
        x, xn = ws.x[:T], ws.xn[:T]  # [T, D]
        qg, k, v = ws.q[:T], ws.k[:T], ws.v[:T]  # [T, 2*H*Dh], [T, Hkv*Dh], [T, Hkv*Dh]
        ops.rms_norm(x, lw.attn_norm, eps, xn)
        acts = Activations(xn)
        m.wq.mul(acts, qg)
        m.wk.mul(acts, k)
        m.wv.mul(acts, v)
        qg4 = qg.reshape(T, H, 2, Dh)
        q3 = ws.q_heads[:T].reshape(T, H, Dh)
        q3[:] = qg4[:, :, 0]
        k3 = k.reshape(T, Hkv, Dh)
        ops.rms_norm(q3, m.q_norm, eps, q3)
        ops.rms_norm(k3, m.k_norm, eps, k3)
        cos, sin = self._rope  # [T, n_rot/2] each
        ops.rope_neox(q3[:, :, :n_rot], cos, sin)
        ops.rope_neox(k3[:, :, :n_rot], cos, sin)
        ws.k_cache[row, p0 : p0 + T] = k
        ws.v_cache[row, p0 : p0 + T] = v
        attn = ws.attn[:T]  # [T, H*Dh]
        attn3 = attn.reshape(T, H, Dh)
        ops.attention(q3, ws.k_cache[row], ws.v_cache[row], p0, Hkv, ws.scores, attn3)
        gate = ws.q_heads[:T].reshape(T, H, Dh)  # q3 is spent: its buffer takes the gate
        gate[:] = qg4[:, :, 1]
        ops.sigmoid(gate)
        attn3 *= gate  # attn * sigmoid(gate)
        m.wo.mul(Activations(attn), xn)  # xn reused as the projection's output [T, D]
        x += xn
        self.timers.add("attention", time.perf_counter() - t0)

    def _delta_net_block(self, il: int, lw: HybridLayer, T: int) -> None:
        """qwen35moe gated delta-net: conv over q/k/v, the recurrent state, gated norm."""
        t0 = time.perf_counter()
        s, ws, m, hy = self.spec, self.ws, lw.mixer, self.spec.hybrid
        Kc, S, Hk, Hv, eps = hy.conv_kernel, hy.state, hy.k_heads, hy.v_heads, s.rms_eps
        row = self.state_row[il]
        x, xn = ws.x[:T], ws.xn[:T]  # [T, D]
        ops.rms_norm(x, lw.attn_norm, eps, xn)
        acts = Activations(xn)
        window = ws.conv_window[: Kc - 1 + T]  # [Kc-1+T, Cc]
        window[: Kc - 1] = ws.conv_cache[row]
        m.wqkv.mul(acts, window[Kc - 1 :])
        ws.conv_cache[row] = window[T:]  # the last Kc-1 inputs
        conv = ws.conv_out[:T]  # [T, Cc]
        delta_net.causal_conv_silu(window, m.conv, conv)
        z, alpha, beta = ws.z[:T], ws.alpha[:T], ws.beta[:T]  # [T, Hv*S], [T, Hv] x2
        m.wz.mul(acts, z)
        m.w_alpha.mul(acts, alpha)
        m.w_beta.mul(acts, beta)
        delta_net.decay_and_beta(alpha, m.dt_bias, m.a, beta)
        q = conv[:, : Hk * S].reshape(T, Hk, S)
        k = conv[:, Hk * S : 2 * Hk * S].reshape(T, Hk, S)
        v = conv[:, 2 * Hk * S :].reshape(T, Hv, S)
        delta_net.l2_norm_heads(q, eps)
        delta_net.l2_norm_heads(k, eps)
        lin = ws.lin[:T]  # [T, Hv*S]
        lin3 = lin.reshape(T, Hv, S)
        delta_net.gated_delta_rule(q, k, v, alpha, beta, ws.ssm_cache[row], lin3)
        ops.rms_norm(lin3, m.norm, eps, lin3)
        ops.silu_mul(z.reshape(T, Hv, S), lin3)  # z = silu(z) * rms_norm(o), per head
        m.wout.mul(Activations(z), xn)  # xn reused as the projection's output [T, D]
        x += xn
        self.timers.add("attention", time.perf_counter() - t0)

    def _shared_expert(self, lw, T: int, acts: Activations, out: np.ndarray):
        """out += sigmoid(xn . w_gate) * down(silu(gate xn) * up xn); acts holds xn [T, D].
        Without a gate vector (sh.gate_inp None) the expert's output is added as it is."""
        ws, sh = self.ws, lw.shared
        g, u, d, w = ws.shexp_gate[:T], ws.shexp_up[:T], ws.shexp_out[:T], ws.shexp_w[:T]
        sh.gate.mul(acts, g)
        sh.up.mul(acts, u)
        ops.silu_mul(g, u)
        sh.down.mul(Activations(g), d)
        if sh.gate_inp is None:
            out += d
            return
        f32 = GGMLQuantizationType.F32
        matmul_q(sh.gate_inp, f32, 1, sh.gate_inp.shape[1], acts.of(f32), w)  # as ggml's mul_mat
        ops.sigmoid(w, silu_ratio=self.spec.arch == "qwen2moe")  # as each graph computes it
        d *= w
        out += d

    def _route(self, lw, logits: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> None:
        """Router logits [T, E] -> the K chosen experts ids [T, K] and their weights [T, K]:
        softmax (qwen3moe...) or sigmoid with a selection bias and expert groups (glm4moe),
        renormalised per norm_topk_prob, times expert_weights_scale."""
        s = self.spec
        scale = s.expert_weights_scale
        bias = getattr(lw, "exp_probs_b", None)  # [E] or None
        if s.expert_gating != "softmax" or bias is not None or s.n_expert_groups > 1:
            routing.route_topk(
                logits, s.expert_gating, bias, s.n_expert_used, s.norm_topk_prob, scale, ids,
                weights, s.n_expert_groups, s.n_group_used,
            )  # fmt: skip
            return
        ops.softmax_topk(logits, s.n_expert_used, s.norm_topk_prob, ids, weights)
        if scale != 1.0:
            weights *= np.float32(scale)

    def _dense_ffn_block(self, lw: LayerWeights, T: int) -> None:
        """A dense layer's FFN: x += down(silu(gate xn) * up xn), all weights resident."""
        t0 = time.perf_counter()
        s, ws, f = self.spec, self.ws, lw.dense
        x, xn, out = ws.x[:T], ws.xn[:T], ws.ffn_out[:T]  # [T, D]
        g, u = ws.dense_gate[:T], ws.dense_up[:T]  # [T, Fd]
        ops.rms_norm(x, lw.ffn_norm, s.rms_eps, xn)
        acts = Activations(xn)
        f.gate.mul(acts, g)
        f.up.mul(acts, u)
        ops.silu_mul(g, u)
        f.down.mul(Activations(g), out)
        x += out
        self.timers.add("other", time.perf_counter() - t0)

    def _moe_block(self, il: int, lw: LayerWeights, T: int) -> None:
        if getattr(lw, "dense", None) is not None:
            self._dense_ffn_block(lw, T)
            return
        t0 = time.perf_counter()
        s, ws = self.spec, self.ws
        K = s.n_expert_used
        x, xn = ws.x[:T], ws.xn[:T]  # [T, D]
        ops.rms_norm(x, lw.ffn_norm, s.rms_eps, xn)
        router = ws.router[:T]  # [T, E]
        acts = Activations(xn)
        lw.router.mul(acts, router)
        ids, weights = ws.topk_ids[:T], ws.topk_w[:T]  # [T, K]
        self._route(lw, router, ids, weights)
        if self.route_log is not None:
            self.route_log.write_batch(self.phase, self.n_past, il, ids, weights)
        if T == 1 and il in self._guesses:
            self._judge_guesses(il, ids[0])
        union = np.unique(ids)  # [U]
        t1 = time.perf_counter()
        self.timers.add("router", t1 - t0)

        self._layer = il
        out = ws.ffn_out[:T]  # [T, D]
        wait_s = 0.0
        # a prefill ubatch may route to more experts than the arena can pin at once
        step = int(getattr(self.experts, "max_acquire", len(union)) or len(union))
        guess_s = 0.0
        barrier_s = 0.0
        marks = self.timers.marks
        for c in range(0, len(union), step):
            chunk = union[c : c + step]
            ta = time.perf_counter()
            if il == 0 and c == 0:
                marks["no_read"] += ta - self._t_forward  # the forward's first expert request
            handle = self.experts.acquire(il, chunk)
            marks["pager"] += time.perf_counter() - ta
            if self.prefetch_next and T == 1 and il + 1 < len(self.weights.layers):
                guess_s = self._prefetch_ahead(il)
            try:
                waited, barrier = self._run_experts(chunk, handle, ids, weights, T, acts)
                wait_s += waited
                barrier_s += barrier
            finally:
                tr = time.perf_counter()
                self.experts.release(handle)
                self._t_released = time.perf_counter()
                marks["pager"] += self._t_released - tr
        parts = ws.ffn_parts[:T]  # [T, K, D]
        out[:] = parts[:, 0]
        for k in range(1, K):  # top-K order: the sum does not depend on which experts were hits
            out += parts[:, k]
        if lw.shared is not None:  # qwen35moe, qwen2moe
            self._shared_expert(lw, T, acts, out)
        if s.residual_scale:  # granitemoe
            out *= np.float32(s.residual_scale)
        x += out
        t2 = time.perf_counter()
        self.timers.add("io_wait", wait_s)
        self.timers.add("router", guess_s)
        if barrier_s:
            self.timers.add("barrier", barrier_s)
        self.timers.add("expert_compute", t2 - t1 - wait_s - guess_s - barrier_s)

    def _prefetch_ahead(self, il: int) -> float:
        """Decode: the routers of layers il+1 .. il+prefetch_depth, each applied to the residual
        as it is now (before layer il's expert output and the attention of the layers between
        are added), guess those layers' experts; the pager starts reading them behind il's
        misses, the nearest layer first (its guess is the surest). Returns the seconds spent."""
        t0 = time.perf_counter()
        s, ws, layers = self.spec, self.ws, self.weights.layers
        if ws.router.shape[0] < 2:
            return 0.0
        xin, logits = ws.ffn_in[0, :1], ws.router[1:2]  # [1, D], [1, E]: idle in a decode step
        ids, w = ws.topk_ids[1:2], ws.topk_w[1:2]  # [1, K]
        pager_s = 0.0
        for depth in range(1, self.prefetch_depth + 1):
            target = il + depth
            if target >= len(layers) or getattr(layers[target], "router", None) is None:
                continue  # past the last layer, or a dense layer (no experts to guess)
            nxt = layers[target]
            ops.rms_norm(ws.x[:1], nxt.ffn_norm, s.rms_eps, xin)
            if nxt.router.qtype == GGMLQuantizationType.F32:  # one BLAS matvec, no thread to wake
                np.dot(nxt.router.raw, xin[0], out=logits[0])
            else:
                nxt.router.mul(Activations(xin), logits)
            self._route(nxt, logits, ids, w)
            guess = ids[0, : self.prefetch_next].copy()  # [w] most probable first
            self._guesses.setdefault(target, []).append((depth, guess))
            tp = time.perf_counter()
            self.experts.prefetch(target, guess)
            pager_s += time.perf_counter() - tp
        self.timers.marks["pager"] += pager_s
        return time.perf_counter() - t0

    def _judge_guesses(self, il: int, routed) -> None:
        """Counts, per depth, the guessed experts of layer il that its routing `routed` [K]
        then chose (cached or not: this is the guess's accuracy, not the pager's)."""
        chosen = {int(e) for e in routed}
        for depth, guess in self._guesses.pop(il):
            c = self.guess_counts.setdefault(depth, [0, 0])
            c[0] += len(guess)
            c[1] += sum(int(e) in chosen for e in guess)

    def _run_experts(
        self, chunk, handle, ids, weights, T: int, acts: Activations
    ) -> tuple[float, float]:
        """Compute the chunk's experts as their bytes become ready; return the seconds spent
        waiting for them and the worker pool's barrier seconds (`pool_barrier`; 0 without
        the pool).

        Prefill with n > 1 Numba threads: an expert gets ~T*K/E tokens, too little work to
        split its rows across threads (every product would wake the other threads). Whole
        experts go to n worker threads instead, each running single-threaded kernels on its
        own buffers, so one worker's Python between products overlaps another's kernels.
        This thread waits for each expert's bytes (in ready order) and hands it on; its wait
        time, reported as io_wait, may then overlap the workers' compute. Once the last
        expert is handed over it waits for the workers; the workers' mean idle time in that
        window is the barrier (`pool_barrier`), the rest of the window expert compute.

        Prefill with K-quant experts: the layer input is converted to Q8_K once here, and each
        expert is one kernel call (sdq.kernels.expert) that gathers its tokens' Q8_K rows."""
        order = _ready_order(handle, len(chunk))
        workers = min(numba.get_num_threads(), self.ws.ffn_in.shape[0]) if T > 1 else 1
        qtypes = self.expert_qtypes[self._layer]
        qx = acts.of(qtypes[0]) if T > 1 and expert_kernel_supported(*qtypes) else None
        wait_s = 0.0
        if workers == 1:
            for i in order:
                tw = time.perf_counter()
                handle.wait(i)
                wait_s += time.perf_counter() - tw
                e, views = int(chunk[i]), handle.views(i)
                if qx is not None:
                    self._expert_q8k(e, views, ids, weights, qx, self._fused_bufs(0))
                else:
                    self._expert(e, views, ids, weights, T, acts)
            return wait_s, 0.0
        pool = self._expert_pool(workers)
        futures = []
        t_handed = None
        try:
            for i in order:
                tw = time.perf_counter()
                handle.wait(i)
                wait_s += time.perf_counter() - tw
                e, views = int(chunk[i]), handle.views(i)
                futures.append(pool.submit(self._expert_on_worker, e, views, ids, weights, T, qx))
            t_handed = time.perf_counter()
        finally:
            wait_all(futures)  # no worker may still read a slot when the handle is released
        t_end = time.perf_counter()
        spans = [f.result() for f in futures]  # a worker's error is raised here
        return wait_s, pool_barrier(spans, workers, t_handed, t_end)

    def _expert_pool(self, workers: int) -> ThreadPoolExecutor:
        pool = getattr(self, "_pool", None)
        if pool is None or pool._max_workers != workers:
            if pool is not None:
                pool.shutdown()
            pool = self._pool = ThreadPoolExecutor(workers, thread_name_prefix="sdq-expert")
            self._worker_bufs = threading.local()
            self._worker_ids = iter(range(workers))  # worker i uses the workspace's buffers [i]
        return pool

    def close(self) -> None:
        """Stops the prefill worker threads (if any ran)."""
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown()
            self._pool = None

    def _expert_on_worker(self, e: int, views, ids, weights, T: int, qx) -> tuple[float, float]:
        """_expert (or _expert_q8k when qx, the layer input as Q8_K, is given) on a pool
        thread: single-threaded kernels, the thread's own expert buffers (row i of the
        workspace's ffn_in, ffn_gate, ffn_up, ffn_down [W, T, .], which the memory plan
        counts for W compute threads). -> (start, end) perf_counter seconds of the work."""
        t0 = time.perf_counter()
        numba.set_num_threads(1)  # this thread's kernels only
        local = self._worker_bufs
        if not hasattr(local, "i"):
            local.i = next(self._worker_ids)
        if qx is not None:
            self._expert_q8k(e, views, ids, weights, qx, self._fused_bufs(local.i))
            return t0, time.perf_counter()
        ws, i = self.ws, local.i
        bufs = (ws.ffn_in[i], ws.ffn_gate[i], ws.ffn_up[i], ws.ffn_down[i])
        self._expert(e, views, ids, weights, T, None, bufs)
        return t0, time.perf_counter()

    def _fused_bufs(self, i: int):
        """Worker i's buffers for _expert_q8k: ffn_in[i] holds the gathered Q8_K input rows
        and ffn_up[i], once silu(gate) * up is in ffn_gate[i], the hidden rows' Q8_K (both
        need about 2.2 bytes per value of the 4 they have)."""
        cache = self.__dict__.setdefault("_fused", {})
        bufs = cache.get(i)
        if bufs is None:
            ws = self.ws
            (F, D), _, _ = self.expert_shapes
            Tub = ws.ffn_in.shape[1]
            in_q, hid_q = QBlocks(ws.ffn_in[i], Tub, D), QBlocks(ws.ffn_up[i], Tub, F)
            bufs = cache[i] = (in_q, hid_q, ws.ffn_gate[i], ws.ffn_up[i], ws.ffn_down[i])
        return bufs

    def _expert_q8k(self, e: int, views, ids, weights, qx, bufs) -> None:
        """_expert for a prefill ubatch with K-quant experts, in one kernel call: qx is the
        layer input xn [T, D] as Q8_K; e's tokens' rows are gathered from it (Q8_K is
        row-wise, so this equals converting the gathered floats)."""
        (F, D), _, _ = self.expert_shapes
        qtypes = self.expert_qtypes[self._layer]
        expert_ffn(e, ids, weights, qtypes, views, F, D, qx, *bufs, self.ws.ffn_parts)

    def _expert(
        self, e: int, views, ids, weights, T: int, acts: Activations | None, bufs=None
    ) -> None:
        """ffn_parts[t, k] = w[t, k] * down(silu(gate x_t) * up x_t) for the tokens t routed to
        e, k being e's place in t's top-K.

        acts: the layer's normed input xn [T, D], converted once for every expert (decode).
        bufs: (ffn_in [>=T, D], ffn_gate [>=T, F], ffn_up [>=T, F], ffn_down [>=T, D]) scratch;
        default the workspace's first set."""
        ws = self.ws
        bufs = bufs or (ws.ffn_in[0], ws.ffn_gate[0], ws.ffn_up[0], ws.ffn_down[0])
        ffn_in, ffn_gate, ffn_up, ffn_down = bufs
        (F, D), _, _ = self.expert_shapes
        gq, uq, dq = self.expert_qtypes[self._layer]
        gate_raw, up_raw, down_raw = views
        if T == 1:
            rows = slice(0, 1)
            slots = int(np.flatnonzero(ids[0] == e)[0])
            w = weights[0, slots]
            n = 1
        else:
            rows, slots = np.nonzero(ids == e)  # tokens routed to e, and where in their top-K
            w = weights[rows, slots][:, None]  # [n, 1]
            n = rows.shape[0]
            xin = ffn_in[:n]  # [n, D]
            np.take(ws.xn[:T], rows, axis=0, out=xin)
            acts = Activations(xin)
        g, u, d = ffn_gate[:n], ffn_up[:n], ffn_down[:n]  # [n, F] [n, F] [n, D]
        matmul_q(gate_raw, gq, F, D, acts.of(gq), g, per_row=True)  # as ggml's mul_mat_id
        matmul_q(up_raw, uq, F, D, acts.of(uq), u, per_row=True)
        ops.silu_mul(g, u)
        matmul_q(down_raw, dq, D, F, quantize_activation(g, dq), d, per_row=True)
        d *= w
        ws.ffn_parts[rows, slots] = d  # a token picks an expert at most once


def _check_hybrid(model) -> None:
    """One-line refusals of qwen35moe files the engine cannot run."""
    spec, path = model.spec, model.path
    hy = spec.hybrid
    if hy is None:
        raise UnsupportedError(f"{path}: qwen35moe without its ssm.* (delta-net) keys")
    if spec.n_shared_expert != 1 or not spec.shared_ffn:
        raise UnsupportedError(
            f"{path}: {spec.n_shared_expert} shared experts of {spec.shared_ffn} rows; "
            "qwen35moe has one"
        )
    if hy.rope_dim > spec.head_dim or hy.rope_dim % 2:
        raise UnsupportedError(f"{path}: RoPE dims {hy.rope_dim} for head dim {spec.head_dim}")
    for il in range(spec.n_layer):
        if il not in hy.recurrent_layers and f"blk.{il}.attn_q.weight" not in model.tensors:
            raise UnsupportedError(f"{path}: block {il} has no attn_q (fused attn_qkv?)")
    if "blk.0.ssm_ba.weight" in model.tensors:
        raise UnsupportedError(f"{path}: fused ssm_ba tensors (separate ssm_alpha/ssm_beta only)")


def _qk_norm(x: np.ndarray, x3: np.ndarray, weight: np.ndarray, eps: float) -> None:
    """RMS norm in place of each head of x3 [T, H, Dh] when weight is [Dh], or of each whole
    row of x [T, H*Dh] (the same array) when weight is [H*Dh] (olmoe)."""
    rows = x3 if weight.shape[0] == x3.shape[-1] else x
    ops.rms_norm(rows, weight, eps, rows)


def _check_llama(model) -> None:
    """One-line refusals of llama / granitemoe files whose RoPE the engine does not scale."""
    spec, path = model.spec, model.path
    factors = sorted(name for name in model.tensors if name.startswith("rope_"))
    if factors:
        raise UnsupportedError(f"{path}: RoPE frequency factors ({factors[0]}) are not supported")
    factor = model.metadata.get(f"{spec.arch}.rope.scaling.factor", 1.0)
    kind = model.metadata.get(f"{spec.arch}.rope.scaling.type", "none")
    if kind != "none" and factor not in (0.0, 1.0):
        raise UnsupportedError(f"{path}: RoPE scaling {kind!r} x{factor} is not supported")


def pool_barrier(spans, workers: int, t_handed: float, t_end: float) -> float:
    """Seconds the average worker of a pool of `workers` threads waited for the others after
    the last task was handed over at t_handed, until the last one ended at t_end:
    (workers x (t_end - t_handed) - the tasks' busy time inside that window) / workers.

    spans: (start, end) of every task, on the perf_counter clock of t_handed and t_end (one
    worker's tasks never overlap). Idle time before t_handed is not counted: the workers then
    wait for the hand-over (the reads: io_wait), not for each other. >= 0; 0 for one worker
    that runs the whole window."""
    window = t_end - t_handed
    if workers < 1 or window <= 0:
        return 0.0
    busy = sum(max(0.0, min(end, t_end) - max(start, t_handed)) for start, end in spans)
    return max(0.0, (workers * window - busy) / workers)


def _expert_shapes(spec):
    D, F = spec.n_embd, spec.expert_ffn
    return (F, D), (F, D), (D, F)  # gate, up: [F, D]; down: [D, F]


def _ready_order(handle, n: int) -> list[int]:
    """Order in which to compute a layer's experts: those already in RAM first, so that the
    compute overlaps the reads of the misses."""
    order = getattr(handle, "ready_order", None)
    return order() if order is not None else list(range(n))
