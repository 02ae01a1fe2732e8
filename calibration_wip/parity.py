import sys; sys.path.insert(0, "/work/w34/tests")
from sdq.synth.build import build_model, resolve_config
from family_support import f32_logits_error, greedy_both, teacher_forced
cfg = resolve_config("tiny35", name="tiny35-ema", context_ema=0.2, context_mix=1.5)
p = build_model(cfg, "F32", 0)
err, a, b = f32_logits_error(p)
print("F32 worst error", err.max(), "top-1 agree", (a == b).mean())
ours, theirs, n = greedy_both(p, 32)
print("greedy identical", ours == theirs, len(set(ours)), "distinct of", len(ours))
q = build_model(cfg, "Q8_0", 0)
agree, e = teacher_forced(q, 260)
print("Q8_0 teacher-forced agreement", agree)
