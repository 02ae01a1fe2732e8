import sys, time
from sdq.synth.build import build_model, resolve_config
kw = dict(n_embd=1024, expert_ffn=256, tensor_types=())
for name, extra in (("ema", dict(context_ema=0.2, context_mix=1.8)), ("rand", {})):
    t0 = time.time()
    cfg = resolve_config("seed", name=f"seed-small-{name}", **kw, **extra)
    p = build_model(cfg, "Q8_0", 0)
    print(name, p, f"{time.time()-t0:.0f} s", flush=True)
