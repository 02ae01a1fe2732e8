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
the full-attention V/O carry the routing subspace as there: each full-attention block adds
`context_mix` times the attention-weighted mean of earlier tokens' routing coordinates. Norms
are 1 plus small noise so that a norm weight applied to the wrong vector shows up in the logits.

The delta-net blocks either carry the routing subspace too (`context_ema` > 0) or nothing
(0: Gaussian tensors scaled to keep activations O(1)). Carrying it, a block adds `context_mix`
times an exponential moving average, at rate `context_ema`, of the tokens' routing coordinates
less their mean over the vocabulary (so the average is specific to the text: an average of the
coordinates themselves drifts to the same point for every text, and every prompt would then
use the same experts), which the gated delta rule computes exactly when every token writes the
same key:

    k_t = q_t = u (fixed, from the common direction m)  =>  S_t u = (1 - beta) S_(t-1) u + beta v_t

so with beta = context_ema and no decay the state's read-out along u is the moving average of
v. The weights that make it so (every token carries m, so a row along m is a constant):

* attn_qkv: q and k rows along m only, one positive pattern per key head (after the conv and
  SiLU, then the L2 norm, a fixed unit vector: q = k); v rows a positive offset along m (so
  SiLU is nearly linear) plus A_h (P - mean m^T / |m.x|), which writes the token's routing
  coordinates less the vocabulary's mean into the value head through A_h [S, r] (orthonormal
  columns, orthogonal to the all-ones offset).
* ssm_conv1d: the current token only (taps 0, ..., 0, 1, plus small noise).
* ssm_beta along m: beta = context_ema. ssm_alpha along -m, ssm_dt 0, ssm_a -1: no decay.
* attn_gate along m: a constant SiLU gate; the gated RMS norm divides by the offset, leaving
  1 + c A_h (average of the coordinates).
* ssm_out: P^T A_h^T per value head (blind to the offset), scaled so that the block adds
  `context_mix` times the average's routing coordinates, as a full-attention block adds the
  mean's; plus full-rank noise as the attention blocks' V/O.
"""

from __future__ import annotations

import numpy as np

from sdq.synth.weights import BETA_M, BETA_S, SynthWeights, gaussian, rng_for, to_f16_values

ARCH = "qwen35moe"

# Pre-activations of the delta-net context construction (see the module docstring).
QK_PRE = 4.0  # mean q/k pre-activation: SiLU nearly linear, the direction fixed
V_BIAS = 4.0  # offset of every value entry: SiLU nearly linear around it
V_GAIN = 2.0  # value entries per unit routing coordinate (times A_h's spread)
Z_PRE = 3.0  # output gate pre-activation
NO_DECAY = -10.0  # ssm_alpha pre-activation: softplus(-10) = 4.5e-5, exp(g) ~ 1
CONTEXT_NOISE = 0.05  # spread of the token-dependent noise in q, k, beta, gate pre-activations
V_NOISE = 0.5  # spread of the value entries' other features of the token: the average carries
# them too, and ssm_out's full-rank part passes them on (context for the next-token logits)


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
    carried = cfg.context_ema and kind in CONTEXT_KINDS
    if carried:
        return delta_net_context(w, int(name.split(".")[1]))[kind]
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


CONTEXT_KINDS = ("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha", "ssm_conv1d", "ssm_dt", "ssm_a")
CONTEXT_KINDS += ("ssm_out",)


def _silu(x: float) -> float:
    return x / (1.0 + np.exp(-x))


def _silu_slope(x: float) -> float:
    s = 1.0 / (1.0 + np.exp(-x))
    return s * (1.0 + x * (1.0 - s))


def delta_net_context(w: SynthWeights, layer: int) -> dict[str, np.ndarray]:
    """The tensors of delta-net block `layer` that carry a moving average of the routing
    subspace (module docstring), float32 and f16-rounded, keyed by tensor kind."""
    cache = w.__dict__.setdefault("_delta_net_cache", {})
    if layer in cache:
        return cache[layer]
    cfg = w.cfg
    D, r, S = cfg.n_embd, cfg.route_rank, cfg.ssm_state
    Hk, Hv, Kc = cfg.ssm_k_heads, cfg.ssm_v_heads, cfg.ssm_conv_kernel
    m, P = w.m.astype(np.float64), w.P.astype(np.float64)  # [D], [r, D]
    along_m = BETA_M * np.sqrt(D)  # m . x for a normalized residual x
    coord = BETA_S * np.sqrt(D / r)  # spread of each routing coordinate P x
    rng = rng_for(w.seed, f"blk.{layer}.delta_net_context")
    noise = CONTEXT_NOISE / np.sqrt(D)

    # q and k [Hk * S, D]: one positive pattern per key head, q = k
    pattern = 0.5 + np.abs(rng.standard_normal((Hk, S)))  # [Hk, S]
    pattern *= QK_PRE / pattern.mean(axis=1, keepdims=True)
    qk = np.outer(pattern.ravel(), m) / along_m  # [Hk * S, D]
    qk += rng.standard_normal(qk.shape) * noise
    # v [Hv * S, D]: offset plus the routing coordinates through A_h [S, r]
    a = []
    for _ in range(Hv):  # orthonormal columns orthogonal to the all-ones offset
        basis = np.linalg.qr(np.column_stack([np.ones(S), rng.standard_normal((S, r))]))[0]
        a.append(basis[:, 1:])  # [S, r]
    # read P x - mean: the tokens' deviation from the vocabulary's mean position (every token
    # carries m, so the constant comes in along m); an average of deviations is specific to the
    # text, where an average of positions drifts to the same mean for every text
    centred = P - np.outer(w.routing_mean, m) / along_m  # [r, D]
    v = np.concatenate([V_BIAS * np.outer(np.ones(S), m) / along_m + V_GAIN * ah @ centred / coord
                        for ah in a])  # fmt: skip
    v += rng.standard_normal(v.shape) * (V_NOISE / np.sqrt(D))
    qkv = np.concatenate([qk, qk.copy(), v])  # [2 Hk S + Hv S, D]: q, k, v

    taps = 0.02 * rng.standard_normal((qkv.shape[0], Kc))  # [C, Kc]
    taps[:, -1] = 1.0
    beta_logit = np.log(cfg.context_ema / (1.0 - cfg.context_ema))
    beta = np.outer(np.full(Hv, beta_logit), m) / along_m  # [Hv, D]
    alpha = np.outer(np.full(Hv, NO_DECAY), m) / along_m  # [Hv, D]
    gate = np.outer(np.full(Hv * S, Z_PRE), m) / along_m  # [Hv S, D]

    # the gated norm leaves silu(Z_PRE) * (1 + slope * V_GAIN / silu(V_BIAS) * A_h avg) per
    # head; ssm_out sums the heads' A_h^T parts back into P at context_mix per coordinate
    carried = _silu(Z_PRE) * _silu_slope(V_BIAS) * V_GAIN / _silu(V_BIAS)
    gain = cfg.context_mix * coord / (carried * Hv)
    out = rng.standard_normal((D, Hv * S)) * (cfg.attn_noise / np.sqrt(Hv * S))
    for h, ah in enumerate(a):
        head = out[:, h * S : (h + 1) * S]  # [D, S] view
        head -= head.mean(axis=1, keepdims=True)  # blind to the offset: no constant output
        head += gain * (P.T @ ah.T)
    tensors = {
        "attn_qkv": qkv,
        "attn_gate": gate,
        "ssm_beta": beta,
        "ssm_alpha": alpha,
        "ssm_conv1d": taps,
        "ssm_dt": np.zeros(Hv),
        "ssm_a": -np.ones(Hv),
        "ssm_out": out,
    }
    cache.clear()  # one block at a time, as the writer asks
    cache[layer] = {k: to_f16_values(t.astype(np.float32)) for k, t in tensors.items()}
    return cache[layer]
