"""Weights of a synthetic qwen3moe model: random, with routing that behaves like a trained one.

Dimension key: V vocabulary, D n_embd, L layers, E experts, K experts used, F expert FFN,
H heads, Hkv KV heads, Dh head dim, r routing-subspace rank, T tokens.

Every value is drawn from a generator seeded by (seed, tensor name, chunk), so a tensor never
depends on the order in which others are made, and then rounded to float16: the F32, F16, Q8_0
and Q4_K_M files of one (config, seed) are encodings of exactly the same numbers.

How routing is made to look real (measured by `routing_stats`, compared with real traces by the
routing analysis):

* Geometry. One random orthonormal basis splits the residual space into a common direction `m`
  (every token has it), an r-dimensional *routing subspace* `P` and the rest.
* Tokens are grouped by what they are. Each vocabulary entry gets a class from its text
  (space + lowercase word, space + capitalised word, word piece, number, ASCII symbols, code-like
  mixes, whitespace, CJK, other scripts, partial UTF-8 bytes, control tokens) and one of
  `token_subgroups` hash subgroups inside it. Its embedding is `m`, plus, inside `P`, the sum of
  a class centroid, a subgroup centroid and a per-token offset, plus full-dimensional noise. Text in
  one language or style therefore lands in a few regions of `P`.
* Routers read `P` and `m`. Router row e of layer l is `P^T g_{l,e}` (g random per layer, so each
  layer maps token regions to its own experts) plus `b_{l,e} m`: because every token carries `m`,
  b acts as a per-expert bias, set to -zipf * ln(rank) over a random ranking of the layer's
  experts, which gives the skewed, per-layer popularity seen in real traces. A small full-rank
  noise term makes the choice depend on each token's own noise as well.
* Context drifts slowly. The value and output projections of attention carry the routing
  subspace through: `W_o W_v` restricted to `P` is `context_mix` times the identity (plus full-rank
  noise), so each layer adds the attention-weighted average of earlier tokens' `P` components to
  the residual. Later layers route on "this token in this context", and consecutive tokens share
  the context term: experts are reused over stretches of text, not drawn afresh per token.
* Everything else (Q, K, expert gate/up/down, output head) is Gaussian, scaled so that
  activations stay O(1) through the layers and the next-token logits have a spread of about
  `logit_std`, giving non-degenerate, input-dependent distributions.

`routing_preview` replays the routing of a token sequence on the embedding + context path only
(uniform causal attention, no expert outputs); it is the quick NumPy estimate of what the real
forward pass (llama.cpp or the sdq engine with a route log) will show.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property

import numpy as np

# Share of the embedding's mean square in the common direction, the routing subspace, the noise.
BETA_M, BETA_S, BETA_N = 0.35, 0.6, float(np.sqrt(1 - 0.35**2 - 0.6**2))
# Weights of class centroid, subgroup centroid and own offset in a token's subspace position.
_MIX = np.array([0.65, 0.5, 0.57])
A_CLASS, A_SUB, A_TOKEN = _MIX / np.linalg.norm(_MIX)
EMBED_CHUNK_ROWS = 32  # token_embd is drawn in chunks of this many rows (cheap random access)
OUTPUT_CHUNK_ROWS = 8192  # output.weight likewise

CLASSES_VERSION = 1  # bump when token_class changes
TOKEN_CLASSES = (
    "control",
    "bytes",  # not valid UTF-8 on its own (a piece of a multi-byte character)
    "whitespace",
    "number",
    "space_word",
    "space_capword",
    "word_piece",
    "symbol",
    "code",
    "cjk",
    "other_script",
)


def _key(name: str) -> list[int]:
    digest = hashlib.sha256(name.encode()).digest()
    return [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]


def rng_for(seed: int, name: str, chunk: int = 0) -> np.random.Generator:
    """The generator for one chunk of one tensor (independent of any other draw)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, *_key(name), chunk])))


def to_f16_values(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest float16 (kept as float32)."""
    return x.astype(np.float16).astype(np.float32)


def gaussian(seed: int, name: str, shape, scale: float, mean: float = 0.0) -> np.ndarray:
    """Values of one tensor: mean + scale x a standard normal drawn for `name`, f16-rounded."""
    out = rng_for(seed, name).standard_normal(shape, np.float32)
    out *= scale
    if mean:
        out += mean
    return to_f16_values(out)


def _byte_decoder() -> dict[str, int]:
    """Byte-level BPE: the printable character that stands for each byte value."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def token_class(token: str, token_type: int, decoder: dict[str, int]) -> int:
    """Index into TOKEN_CLASSES for one byte-level BPE token string."""
    if token_type != 1:
        return TOKEN_CLASSES.index("control")
    try:
        text = bytes(decoder[c] for c in token).decode("utf-8")
    except (KeyError, UnicodeDecodeError):
        return TOKEN_CLASSES.index("bytes")
    core = text.lstrip(" ")
    if not text.strip():
        name = "whitespace"
    elif core.isascii():
        if core.isdigit():
            name = "number"
        elif core.isalpha():
            if text.startswith(" "):
                name = "space_capword" if core[0].isupper() else "space_word"
            else:
                name = "word_piece"
        elif any(c.isalnum() for c in core):
            name = "code"
        else:
            name = "symbol"
    elif any(
        unicodedata.name(c, "").startswith(("CJK", "HIRAGANA", "KATAKANA", "HANGUL")) for c in core
    ):
        name = "cjk"
    else:
        name = "other_script"
    return TOKEN_CLASSES.index(name)


def token_classes(tokens: list[str], token_types: list[int]) -> np.ndarray:
    """[V] int8 class of every token."""
    decoder = _byte_decoder()
    return np.array(
        [token_class(t, k, decoder) for t, k in zip(tokens, token_types, strict=True)], np.int8
    )


@dataclass
class SynthWeights:
    """Draws every tensor of a synthetic model for one (config, seed). Arrays in NumPy order."""

    cfg: object  # sdq.synth.build.SynthConfig (duck-typed to avoid an import cycle)
    seed: int
    classes: np.ndarray  # [V] int8 token class (TOKEN_CLASSES)
    _attention_cache: tuple = (None, None)  # (layer, tensors): the writer asks four times

    # --- shared structure ------------------------------------------------------------------
    @cached_property
    def basis(self) -> np.ndarray:
        """[D, r+1] orthonormal: column 0 is the common direction m, columns 1.. span P."""
        D, r = self.cfg.n_embd, self.cfg.route_rank
        g = rng_for(self.seed, "structure.basis").standard_normal((D, r + 1))
        q, _ = np.linalg.qr(g)
        return q.astype(np.float32)

    @property
    def m(self) -> np.ndarray:  # [D]
        return self.basis[:, 0]

    @property
    def P(self) -> np.ndarray:  # [r, D]
        return self.basis[:, 1:].T

    @cached_property
    def subgroup(self) -> np.ndarray:
        """[V] subgroup of each token inside its class."""
        rng = rng_for(self.seed, "structure.subgroup")
        return rng.integers(0, self.cfg.token_subgroups, self.cfg_vocab, dtype=np.int32)

    @property
    def cfg_vocab(self) -> int:
        return len(self.classes)

    @cached_property
    def centroids(self) -> tuple[np.ndarray, np.ndarray]:
        """Class centroids [C, r] and subgroup centroids [C, S, r] in subspace coordinates."""
        rng = rng_for(self.seed, "structure.centroids")
        r, C, S = self.cfg.route_rank, len(TOKEN_CLASSES), self.cfg.token_subgroups
        return rng.standard_normal((C, r)), rng.standard_normal((C, S, r))

    def subspace_coords(self, ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """[n, r] unit-variance positions in P of tokens `ids` (own offsets drawn from rng)."""
        uc, us = self.centroids
        cls, sub = self.classes[ids], self.subgroup[ids]
        own = rng.standard_normal((len(ids), self.cfg.route_rank))
        return A_CLASS * uc[cls] + A_SUB * us[cls, sub] + A_TOKEN * own

    @cached_property
    def routing_mean(self) -> np.ndarray:
        """[r] mean position in P of the embeddings of the whole vocabulary (what a long
        average over text drifts to; the own offsets have mean zero)."""
        uc, us = self.centroids
        cls, sub = self.classes, self.subgroup[: self.cfg_vocab]
        mean = A_CLASS * uc[cls].mean(axis=0) + A_SUB * us[cls, sub].mean(axis=0)  # [r]
        return mean * (BETA_S * np.sqrt(self.cfg.n_embd / self.cfg.route_rank))

    # --- tensors ---------------------------------------------------------------------------
    def embedding_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of token_embd, [n, D] float32 (f16-rounded), chunk-aligned draws."""
        parts = []
        first = start // EMBED_CHUNK_ROWS
        for chunk in range(first, (stop - 1) // EMBED_CHUNK_ROWS + 1):
            c0 = chunk * EMBED_CHUNK_ROWS
            c1 = min(c0 + EMBED_CHUNK_ROWS, self.cfg_vocab)
            rows = self._embedding_chunk(chunk, c0, c1)
            parts.append(rows[max(start, c0) - c0 : min(stop, c1) - c0])
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def _embedding_chunk(self, chunk: int, c0: int, c1: int) -> np.ndarray:
        D, r = self.cfg.n_embd, self.cfg.route_rank
        rng = rng_for(self.seed, "token_embd.weight", chunk)
        z = self.subspace_coords(np.arange(c0, c1), rng) * (BETA_S * np.sqrt(D / r))  # [n, r]
        x = rng.standard_normal((c1 - c0, D), dtype=np.float32)  # [n, D] noise
        x *= BETA_N
        x += BETA_M * np.sqrt(D) * self.m
        P = self.P
        for j in range(r):  # x += z @ P, as r rank-1 updates (no BLAS call for small chunks)
            x += z[:, j : j + 1].astype(np.float32) * P[j]
        return to_f16_values(x)

    def embedding_rows_for(self, ids: np.ndarray) -> np.ndarray:
        """[T, D] embeddings of arbitrary token ids (draws only the chunks they fall in)."""
        ids = np.asarray(ids, dtype=np.int64)
        out = np.empty((len(ids), self.cfg.n_embd), np.float32)
        chunks = ids // EMBED_CHUNK_ROWS
        for chunk in np.unique(chunks):
            c0 = int(chunk) * EMBED_CHUNK_ROWS
            c1 = min(c0 + EMBED_CHUNK_ROWS, self.cfg_vocab)
            rows = self._embedding_chunk(int(chunk), c0, c1)
            sel = chunks == chunk
            out[sel] = rows[ids[sel] - c0]
        return out

    def output_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows of output.weight [n, D]: Gaussian, logits spread about `logit_std`."""
        D = self.cfg.n_embd
        parts = []
        for chunk in range(start // OUTPUT_CHUNK_ROWS, (stop - 1) // OUTPUT_CHUNK_ROWS + 1):
            c0 = chunk * OUTPUT_CHUNK_ROWS
            c1 = min(c0 + OUTPUT_CHUNK_ROWS, self.cfg_vocab)
            w = rng_for(self.seed, "output.weight", chunk).standard_normal((c1 - c0, D), np.float32)
            if getattr(self.cfg, "context_ema", 0.0):  # blind to the routing context (qwen35)
                w -= (w @ self.P.T) @ self.P
            w *= self.cfg.logit_std / np.sqrt(D)
            parts.append(to_f16_values(w)[max(start, c0) - c0 : min(stop, c1) - c0])
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def router(self, layer: int) -> np.ndarray:
        """[E, D] ffn_gate_inp of one layer (see the module docstring)."""
        cfg, D, r, E = self.cfg, self.cfg.n_embd, self.cfg.route_rank, self.cfg.n_expert
        rng = rng_for(self.seed, f"blk.{layer}.ffn_gate_inp.weight")
        g = rng.standard_normal((E, r))  # [E, r] where each expert sits in P
        rank = rng.permutation(E) + 1  # popularity rank of each expert in this layer
        bias = -cfg.zipf * np.log(rank)  # [E] logit offset from the common direction
        # token part: std of g . (P x) is BETA_S sqrt(D) for an embedding-like x
        w = (cfg.route_std / (BETA_S * np.sqrt(D))) * (g @ self.P)
        w += np.outer(bias / (BETA_M * np.sqrt(D)), self.m)
        w += rng.standard_normal((E, D)) * (cfg.router_noise / (BETA_N * np.sqrt(D)))
        return to_f16_values(w.astype(np.float32))

    def attention(self, layer: int) -> dict[str, np.ndarray]:
        """attn_q [H*Dh, D], attn_k / attn_v [Hkv*Dh, D], attn_output [D, H*Dh]."""
        if self._attention_cache[0] != layer:
            self._attention_cache = (layer, self._make_attention(layer))
        return self._attention_cache[1]

    def _make_attention(self, layer: int) -> dict[str, np.ndarray]:
        cfg, D, r = self.cfg, self.cfg.n_embd, self.cfg.route_rank
        H, Hkv, Dh = cfg.n_head, cfg.n_head_kv, cfg.head_dim
        pre = f"blk.{layer}."
        q = rng_for(self.seed, pre + "attn_q.weight").standard_normal((H * Dh, D), np.float32)
        k = rng_for(self.seed, pre + "attn_k.weight").standard_normal((Hkv * Dh, D), np.float32)
        q /= np.sqrt(D)
        k /= np.sqrt(D)
        rng_v = rng_for(self.seed, pre + "attn_v.weight")
        rng_o = rng_for(self.seed, pre + "attn_output.weight")
        # A_g: [Dh, r] orthonormal columns per KV group; V carries P through A_g
        a = [np.linalg.qr(rng_v.standard_normal((Dh, r)))[0] for _ in range(Hkv)]
        v_gain = np.sqrt(Dh / D) / BETA_S  # structured part of v has about unit RMS
        o_gain = cfg.context_mix / v_gain
        v = rng_v.standard_normal((Hkv * Dh, D)) * (cfg.attn_noise / np.sqrt(D))
        o = rng_o.standard_normal((D, H * Dh)) * (cfg.attn_noise / np.sqrt(H * Dh))
        for g in range(Hkv):
            v[g * Dh : (g + 1) * Dh] += v_gain * (a[g] @ self.P)
        per_group = H // Hkv
        for h in range(H):
            o[:, h * Dh : (h + 1) * Dh] += (o_gain / H) * (self.P.T @ a[h // per_group].T)
        return {
            "attn_q": to_f16_values(q),
            "attn_k": to_f16_values(k),
            "attn_v": to_f16_values(v.astype(np.float32)),
            "attn_output": to_f16_values(o.astype(np.float32)),
        }

    def expert(self, layer: int, part: str, e: int) -> np.ndarray:
        """Expert e's matrix: gate/up [F, D] ~ N(0, 1/D); down [D, F] ~ N(0, moe_gain^2/F)."""
        D, F = self.cfg.n_embd, self.cfg.expert_ffn
        if part == "down":
            shape, scale = (D, F), self.cfg.moe_gain / np.sqrt(F)
        else:
            shape, scale = (F, D), 1 / np.sqrt(D)
        w = rng_for(self.seed, f"blk.{layer}.ffn_{part}_exps.weight", e)
        out = w.standard_normal(shape, np.float32)
        out *= scale
        return to_f16_values(out)


# --- routing preview and statistics --------------------------------------------------------


def _rms_norm(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def routing_preview(weights: SynthWeights, token_ids) -> np.ndarray:
    """[T, L, K] experts chosen per token and layer on the embedding + context path.

    Approximates the forward pass by uniform causal attention whose output is the designed
    `context_mix` * P-projection of the context average, and leaves out expert outputs and the
    attention noise terms. A qwen35moe delta-net block adds the moving average at rate
    `context_ema` instead (sdq.synth.qwen35), or nothing when that is 0. Cheap: only the
    embedding chunks that hold the tokens are drawn.
    """
    cfg = weights.cfg
    ids = np.asarray(token_ids, dtype=np.int64)
    h = weights.embedding_rows_for(ids).astype(np.float64)  # [T, D]
    P = weights.P.astype(np.float64)  # [r, D]
    T = len(ids)
    counts = np.arange(1, T + 1)[:, None]
    out = np.empty((T, cfg.n_layer, cfg.n_expert_used), np.int32)
    for layer in range(cfg.n_layer):
        xp = _rms_norm(h) @ P.T  # [T, r]
        if cfg.arch == "qwen35moe" and (layer + 1) % cfg.full_attention_interval:
            mean = weights.routing_mean  # [r] the delta-net blocks average deviations from it
            ctx = _moving_average(xp - mean, cfg.context_ema) if cfg.context_ema else 0 * xp
        else:
            ctx = np.cumsum(xp, axis=0) / counts  # [T, r] causal mean
        h = h + cfg.context_mix * (ctx @ P)
        logits = _rms_norm(h) @ weights.router(layer).astype(np.float64).T  # [T, E]
        top = np.argsort(-logits, axis=1, kind="stable")[:, : cfg.n_expert_used]
        out[:, layer] = top
    return out


def _moving_average(x: np.ndarray, rate: float) -> np.ndarray:
    """[T, r] moving average of x [T, r] at `rate`, started from zero and divided by the weight
    it has gathered (1 - (1 - rate)^t): a delta-net block's normalized read-out."""
    out = np.empty_like(x)
    acc = np.zeros(x.shape[1])
    for t in range(len(x)):
        acc = (1.0 - rate) * acc + rate * x[t]
        out[t] = acc / (1.0 - (1.0 - rate) ** (t + 1))
    return out


def routing_stats(choices: np.ndarray, n_expert: int) -> dict[str, float]:
    """Reuse statistics of [T, L, K] expert choices, averaged over layers.

    prev_overlap: share of a token's experts also used by the previous token (uniform: K/E).
    top_quarter_share: share of all selections that go to a layer's most used E/4 experts
    (uniform: 0.25). lru_hit_rate_half: hit rate of a per-layer LRU cache of E/2 experts
    (uniform: about 0.5).
    """
    T, L, K = choices.shape
    overlap, share, lru = [], [], []
    for layer in range(L):
        sel = choices[:, layer]  # [T, K]
        sets = [set(row.tolist()) for row in sel]
        if T > 1:
            overlap.append(np.mean([len(sets[t] & sets[t - 1]) / K for t in range(1, T)]))
        counts = np.sort(np.bincount(sel.ravel(), minlength=n_expert))[::-1]
        share.append(counts[: max(1, n_expert // 4)].sum() / counts.sum())
        lru.append(_lru_hit_rate(sel, max(1, n_expert // 2)))
    return {
        "prev_overlap": float(np.mean(overlap)) if overlap else float("nan"),
        "uniform_prev_overlap": K / n_expert,
        "top_quarter_share": float(np.mean(share)),
        "lru_hit_rate_half": float(np.mean(lru)),
    }


def _lru_hit_rate(sel: np.ndarray, capacity: int) -> float:
    cache: OrderedDict[int, None] = OrderedDict()  # least recently used first
    hits = lookups = 0
    for row in sel:
        for e in row.tolist():
            lookups += 1
            if e in cache:
                hits += 1
                cache.move_to_end(e)
            else:
                cache[e] = None
                if len(cache) > capacity:
                    cache.popitem(last=False)
    return hits / lookups
