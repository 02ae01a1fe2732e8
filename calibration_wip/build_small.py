from sdq.synth.build import build_model, resolve_config
import time
t0=time.time()
cfg = resolve_config("seed", name="seed-tiny-ema", n_embd=512, expert_ffn=128, n_head=8, head_dim=128, tensor_types=(), context_ema=0.2, context_mix=1.5)
print(build_model(cfg, "Q8_0", 0), f"{time.time()-t0:.0f} s")
