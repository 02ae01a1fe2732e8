"""Engine route-log statistics of a seed-shaped model (n_embd 512) for a few knob settings,
over four prompts (49 greedy tokens each)."""
import json, subprocess, sys, os
import numpy as np
from sdq.synth.build import build_model, resolve_config
from sdq.analysis.readers import read_trace
from sdq.analysis.reuse import only_once_fraction, union_reads
PROMPTS = ["Explain in three sentences how SSD, RAM and CPU caches form a memory hierarchy.",
           "Write a short story about a lighthouse keeper who finds a message in a bottle.",
           "List five differences between Python and C for a new programmer.",
           "What is the capital of France, and why did it become the capital?"]
env = dict(os.environ, PYTHONPATH="/work/w34")
for knobs in [dict(context_mix=1.5, router_noise=0.5), dict(context_mix=2.0), dict(context_mix=2.5), dict(context_mix=2.0, context_ema=0.1)]:
    kw = dict(context_ema=0.2, **knobs)
    cfg = resolve_config("seed", name="seed-tiny-cal", n_embd=512, expert_ffn=128, n_head=8, head_dim=128, tensor_types=(), **kw)
    path = build_model(cfg, "Q8_0", 0)
    oo, u4, ceil, dist = [], [], [], []
    for i, p in enumerate(PROMPTS):
        log = f"/tmp/proto/cal{i}.jsonl"
        out = subprocess.run([sys.executable, "-m", "sdq", "chat", "-m", str(path), "-p", p, "-n", "49", "-t", "2", "--temp", "0", "--ignore-eos", "--route-log", log, "--json"], capture_output=True, text=True, env=env, check=True)
        ids = json.loads(out.stdout.strip().splitlines()[-1])["generated_ids"]
        tr = read_trace(log, "engine", n_expert=256)
        from sdq.analysis.tables import engine_source
        b = engine_source(tr, "x").blocks()[0]
        oo.append(only_once_fraction([b], 48)); u, s = union_reads(b, 4); u4.append(1 - u / s)
        ceil.append(1 - sum(len(np.unique(b[:, l])) for l in range(b.shape[1])) / b.size); dist.append(len(set(ids)))
    print(kw, "one-offs %.1f%% [%s]" % (100*np.mean(oo), " ".join(f"{100*x:.1f}" for x in oo)), "U4 %.1f%%" % (100*np.mean(u4)), "ceiling %.1f%%" % (100*np.mean(ceil)), "distinct tokens", dist, flush=True)
    os.unlink(path)
