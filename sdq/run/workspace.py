"""Every buffer the forward pass holds, by name, shape and dtype — counted before allocation.

The memory plan (sdq.run.plan) sums `workspace_layout` to size the arena; the engine allocates
exactly these arrays through `Workspace`. Nothing the engine holds per run lives outside this
table (apart from the resident dense weights, which the plan counts from the GGUF).

Short-lived arrays made inside one op are not listed: a layer input converted to 8-bit blocks
(T x D bytes plus scales), the embedding rows of a ubatch and the RoPE tables ([T, D] and
[T, Dh/2] floats), row indices of the tokens routed to one expert. Together they stay below a
few T x max(D, F) floats (about 1 MB at T 128, D 2048) and come and go within one layer: the
plan's reserve covers them.

Dimension key: L layers, C context length, T ubatch tokens, D n_embd, H heads, Hkv KV heads,
Dh head dim, E experts, K experts used, F expert FFN size, V vocabulary, W compute threads
(a prefill ubatch runs whole experts on W threads at once, each with its own expert buffers).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def workspace_layout(
    spec, n_ctx: int, n_ubatch: int, workers: int = 1
) -> dict[str, tuple[tuple[int, ...], type]]:
    """name -> (shape, dtype) for the KV cache and the ubatch compute buffers."""
    L, C, T, W = spec.n_layer, n_ctx, n_ubatch, max(int(workers), 1)
    D, H, Hkv, Dh = spec.n_embd, spec.n_head, spec.n_head_kv, spec.head_dim
    E, K, F, V = spec.n_expert, spec.n_expert_used, spec.expert_ffn, spec.n_vocab
    hybrid = getattr(spec, "hybrid", None)
    if hybrid is not None:
        L -= len(hybrid.recurrent_layers)  # only the full-attention blocks have a KV cache
    layout = {
        # KV cache
        "k_cache": ((L, C, Hkv * Dh), np.float32),  # [L, C, Hkv*Dh]
        "v_cache": ((L, C, Hkv * Dh), np.float32),  # [L, C, Hkv*Dh]
        # ubatch compute buffers
        "x": ((T, D), np.float32),  # residual stream
        "xn": ((T, D), np.float32),  # normed input of attention / FFN
        "q": ((T, H * Dh), np.float32),
        "k": ((T, Hkv * Dh), np.float32),
        "v": ((T, Hkv * Dh), np.float32),
        "attn": ((T, H * Dh), np.float32),  # attention output before wo
        # attention scores: an upper bound of the rows sdq.kernels.ops.attention keeps
        # (one [C] row per head at a time)
        "scores": ((max(T, H), C), np.float32),
        "router": ((T, E), np.float32),
        "topk_ids": ((T, K), np.int32),
        "topk_w": ((T, K), np.float32),
        # one expert's buffers per compute thread: [W, T, .]
        "ffn_in": ((W, T, D), np.float32),  # the tokens routed to one expert, gathered
        "ffn_gate": ((W, T, F), np.float32),  # gate projection, then silu(gate) * up
        "ffn_up": ((W, T, F), np.float32),
        "ffn_down": ((W, T, D), np.float32),  # one expert's down projection
        # each token's K weighted expert outputs, in top-K order, whatever order the experts
        # were computed in (hits first, misses as their reads land): summed in that fixed order
        "ffn_parts": ((T, K, D), np.float32),
        "ffn_out": ((T, D), np.float32),  # weighted sum over the experts
        "logits": ((V,), np.float32),
    }
    if hybrid is not None:
        layout.update(_hybrid_layout(spec, hybrid, T))
    elif getattr(spec, "shared_ffn", 0):  # a shared expert beside the routed ones (qwen2moe)
        layout.update(_shared_expert_layout(spec, T))
    if has_dense_layers(spec):  # leading dense-FFN layers (glm4moe, deepseek2); output in ffn_out
        Fd = spec.dense_ffn
        layout["dense_gate"] = ((T, Fd), np.float32)  # gate projection, then silu(gate) * up
        layout["dense_up"] = ((T, Fd), np.float32)
    if getattr(spec, "sliding_window", 0) and spec.swa_layers:  # gpt-oss: windowed layers
        del layout["k_cache"], layout["v_cache"]
        layout.update(_sliding_window_layout(spec, C, T))
    if getattr(spec, "mla", None) is not None:  # deepseek2: a compressed KV cache (sdq.run.mla)
        from sdq.run.mla import workspace_layout as mla_layout

        for name in ("k_cache", "v_cache", "k", "v"):
            del layout[name]
        layout.update(mla_layout(spec, C, T))
    return layout


def swa_ring(spec, n_ctx: int, n_ubatch: int) -> int:
    """Positions a sliding-window layer's KV ring holds: a ubatch of T tokens at p0 writes
    p0..p0+T-1 and its first query still reads back to p0-W+1, so W + T - 1 (at most C).
    Position p lives in row p % ring."""
    return min(int(n_ctx), int(spec.sliding_window) + int(n_ubatch) - 1)


def _sliding_window_layout(spec, C: int, T: int) -> dict[str, tuple[tuple[int, ...], type]]:
    """The KV caches of a model with sliding-window layers (gpt-oss): the Lf full-attention
    layers keep [Lf, C, Hkv*Dh], the Ls windowed ones a ring [Ls, R, Hkv*Dh] (R = swa_ring)."""
    Ls = len(spec.swa_layers)
    Lf, R, KV = spec.n_layer - Ls, swa_ring(spec, C, T), spec.n_head_kv * spec.head_dim
    return {
        "k_cache": ((Lf, C, KV), np.float32),  # [Lf, C, Hkv*Dh]
        "v_cache": ((Lf, C, KV), np.float32),
        "swa_k_cache": ((Ls, R, KV), np.float32),  # [Ls, R, Hkv*Dh], row p % R
        "swa_v_cache": ((Ls, R, KV), np.float32),
    }


def has_dense_layers(spec) -> bool:
    """Whether some decoder layers have a dense FFN instead of routed experts."""
    moe = getattr(spec, "moe_layers", ())
    return getattr(spec, "hybrid", None) is None and 0 < len(moe) < spec.n_layer


def _hybrid_layout(spec, hy, T: int) -> dict[str, tuple[tuple[int, ...], type]]:
    """qwen35moe's extra buffers: the delta-net blocks' per-sequence states (named *cache:
    the plan counts them with the KV cache), their compute buffers and the shared expert's.

    Lr delta-net blocks, Kc conv taps, Cc conv channels, Hv value heads, S state size,
    Fs shared-expert FFN size."""
    Lr, Kc, Cc = len(hy.recurrent_layers), hy.conv_kernel, hy.conv_channels
    Hv, S = hy.v_heads, hy.state
    H, Dh = spec.n_head, spec.head_dim
    return {
        "conv_cache": ((Lr, Kc - 1, Cc), np.float32),  # the last Kc-1 conv inputs
        "ssm_cache": ((Lr, Hv, S, S), np.float32),  # the delta-net state
        "q": ((T, 2 * H * Dh), np.float32),  # per head: Dh query values, Dh output-gate values
        "q_heads": ((T, H * Dh), np.float32),  # the query values, contiguous
        "conv_window": ((Kc - 1 + T, Cc), np.float32),  # conv state rows, then the new inputs
        "conv_out": ((T, Cc), np.float32),  # silu(conv): q, k, v
        "z": ((T, Hv * S), np.float32),  # output gate, then the gated-normed output
        "lin": ((T, Hv * S), np.float32),  # delta-net output
        "alpha": ((T, Hv), np.float32),  # -> log decay g
        "beta": ((T, Hv), np.float32),
        **_shared_expert_layout(spec, T),
    }


def _shared_expert_layout(spec, T: int) -> dict[str, tuple[tuple[int, ...], type]]:
    """The shared expert's buffers (Fs shared-expert FFN size)."""
    Fs, D = spec.shared_ffn, spec.n_embd
    return {
        "shexp_gate": ((T, Fs), np.float32),
        "shexp_up": ((T, Fs), np.float32),
        "shexp_out": ((T, D), np.float32),
        "shexp_w": ((T, 1), np.float32),  # sigmoid gate of the shared expert
    }


def workspace_bytes(spec, n_ctx: int, n_ubatch: int, workers: int = 1) -> dict[str, int]:
    """name -> bytes, for the plan."""
    return {
        name: int(np.prod(shape)) * np.dtype(dtype).itemsize
        for name, (shape, dtype) in workspace_layout(spec, n_ctx, n_ubatch, workers).items()
    }


@dataclass
class Workspace:
    """The allocated buffers; attribute access by name (ws.x, ws.k_cache, ...).

    `grown` (from `allocate`): how far allocating them grew the process's data segment
    (VmData, what RLIMIT_DATA counts), measured from /proc/self/status before and after each
    group, in bytes: "kv" the KV cache (buffers named *cache, allocated first), "compute" the
    ubatch compute buffers; empty where /proc is not there. A measurement, not the layout's
    sum: malloc may place a buffer in heap it already holds, or round it up.
    """

    buffers: dict[str, np.ndarray]
    grown: dict[str, int] = field(default_factory=dict)

    @classmethod
    def allocate(cls, spec, n_ctx: int, n_ubatch: int, workers: int = 1) -> Workspace:
        layout = workspace_layout(spec, n_ctx, n_ubatch, workers)
        groups = {
            "kv": [n for n in layout if n.endswith("cache")],
            "compute": [n for n in layout if not n.endswith("cache")],
        }
        buffers, grown = {}, {}
        for group, names in groups.items():
            before = _data_segment()
            for name in names:
                shape, dtype = layout[name]
                buffers[name] = np.zeros(shape, dtype)
            after = _data_segment()
            if before is not None and after is not None:
                grown[group] = after - before
        return cls({name: buffers[name] for name in layout}, grown)

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self.buffers[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers.values())


def _data_segment() -> int | None:
    """VmData of this process in bytes; None without /proc."""
    from sdq.proc import proc_status_kib

    kib = proc_status_kib("/proc/self/status", ("VmData",))
    return kib["VmData"] * 1024 if "VmData" in kib else None
