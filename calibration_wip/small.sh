cd /tmp/proto
cat > build_small.py <<'PY'
from sdq.synth.build import build_model, resolve_config
import time
t0=time.time()
cfg = resolve_config("seed", name="seed-tiny-ema", n_embd=512, expert_ffn=128, n_head=8, head_dim=128, tensor_types=(), context_ema=0.2, context_mix=1.5)
print(build_model(cfg, "Q8_0", 0), f"{time.time()-t0:.0f} s")
PY
M=$(PYTHONPATH=/work/w34 /work/main/.venv/bin/python build_small.py 2>/dev/null | tail -1); echo "$M"; M=${M% *}; M=${M% *}
t0=$(date +%s.%N)
PYTHONPATH=/work/w34 /work/main/.venv/bin/python -m sdq chat -m $M -p "Explain in three sentences how SSD, RAM and CPU caches form a memory hierarchy." -n 49 -t 2 --temp 0 --ignore-eos --route-log /tmp/proto/small.jsonl --json > /tmp/proto/small.out 2>/tmp/proto/small.err; echo "chat rc=$? $(echo "$(date +%s.%N) - $t0" | bc) s"
PYTHONPATH=/work/w34 /work/main/.venv/bin/python -m sdq routes stats /tmp/proto/small.jsonl --k 4 2>&1 | sed -n 2,12p
