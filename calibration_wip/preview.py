import sys, time, dataclasses, itertools
import numpy as np
from sdq.synth.build import PRESETS, synth_weights
from sdq.synth.weights import routing_preview
from sdq.format.tokenizer import Tokenizer
from sdq.analysis.reuse import only_once_fraction, union_reads
tok = Tokenizer.from_gguf("/root/.cache/sdq/models/sdq-synth-seed-Q4_K_M-seed0-b6a8d9a06216.gguf")
prompt = tok.encode("Explain in three sentences how SSD, RAM and CPU caches form a memory hierarchy.")
rng = np.random.default_rng(1)
ids = np.concatenate([prompt, rng.integers(0, 150000, 48)])
base = synth_weights(PRESETS["seed"], 0)

def stats(d):
    oo = only_once_fraction([d], 48)
    u, s = union_reads(d, 4)
    distinct = sum(len(np.unique(d[:, l])) for l in range(d.shape[1]))
    flat = (d[:, :, :] + 256 * np.arange(d.shape[1])[None, :, None]).ravel()
    counts = np.sort(np.bincount(flat, minlength=256 * d.shape[1]))[::-1]
    pin = counts[: int(0.2 * counts.size)].sum() / counts.sum()
    return dict(oo=round(oo, 3), u4=round(1 - u / s, 3), ceil=round(1 - distinct / d.size, 3), pin=round(pin, 3))

def run(**kw):
    cfg = dataclasses.replace(PRESETS["seed"], **kw)
    w = dataclasses.replace(base, cfg=cfg)
    return stats(routing_preview(w, ids)[-48:])

print("now", run())
for ema, mix in itertools.product([0.1, 0.2, 0.3], [0.5, 1.0, 1.5]):
    print(ema, mix, run(context_ema=ema, context_mix=mix))
