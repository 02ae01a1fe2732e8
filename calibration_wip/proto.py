"""Prototype: routing stats of a synthetic router with context carried by every block."""
import sys, time
import numpy as np
from sdq.synth.build import PRESETS, synth_weights
from sdq.format.tokenizer import Tokenizer
from sdq.analysis.reuse import only_once_fraction, union_reads

t0 = time.time()
cfg = PRESETS["seed"]
w = synth_weights(cfg, 0)
tok = Tokenizer.from_gguf("/root/.cache/sdq/models/sdq-synth-seed-Q4_K_M-seed0-b6a8d9a06216.gguf")
prompt = tok.encode("Explain in three sentences how SSD, RAM and CPU caches form a memory hierarchy.")
rng = np.random.default_rng(1)
gen = rng.integers(0, 150000, 48)  # a random model's output: tokens of any class
ids = np.concatenate([prompt, gen])

def rms(x): return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)

def route(ids, L=4, E=256, K=8, ema=0.3, mix=0.15, full_every=4, noise=1.0, route_std=2.0, zipf=0.5, tok_share=1.0):
    h = w.embedding_rows_for(ids).astype(np.float64)
    P = w.P.astype(np.float64)
    D = h.shape[1]
    T = len(ids)
    out = np.empty((T, L, K), np.int32)
    for l in range(L):
        xp = rms(h) @ P.T  # [T, r]
        if (l + 1) % full_every == 0:
            ctx = np.cumsum(xp, 0) / np.arange(1, T + 1)[:, None]
        else:
            ctx = np.empty_like(xp); acc = np.zeros(xp.shape[1])
            for t in range(T):
                acc = (1 - ema) * acc + ema * xp[t]; ctx[t] = acc
        h = h + mix * np.sqrt(D) * 0.6 * (ctx / (np.linalg.norm(ctx, axis=1, keepdims=True) / np.sqrt(ctx.shape[1]) + 1e-9)) @ P if mix else h
        r_ = rng_l = np.random.default_rng(100 + l)
        g = rng_l.standard_normal((E, P.shape[0]))
        bias = -zipf * np.log(rng_l.permutation(E) + 1)
        hn = rms(h)
        logits = route_std * (hn @ P.T) @ g.T / 0.6 + bias + noise * rng_l.standard_normal((T, E))
        out[:, l] = np.argsort(-logits, 1)[:, :K]
    return out

def stats(choices, n_decode=48):
    d = choices[-n_decode:]
    oo = only_once_fraction([d], 48)
    u, s = union_reads(d, 4)
    L = d.shape[1]
    distinct = sum(len(np.unique(d[:, l])) for l in range(L))
    ceiling = 1 - distinct / d[:, :, :].size
    return dict(only_once=round(oo, 3), u4_saving=round(1 - u / s, 3), ceiling=round(ceiling, 3))

for kw in [dict(mix=0), dict(), dict(mix=1.0), dict(mix=2.0, ema=0.1), dict(mix=3.0, ema=0.1, noise=0.5), dict(mix=5.0, ema=0.05, noise=0.3)]:
    print(kw, stats(route(ids, **kw)))
print(f"{time.time()-t0:.1f} s")
