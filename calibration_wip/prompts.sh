cd /tmp/proto
for M in $(ls /root/.cache/sdq/models/sdq-synth-seed-small-ema-Q8_0-seed0-4bb0e95d5fb4.gguf /root/.cache/sdq/models/sdq-synth-seed-tiny-ema-Q8_0-*.gguf); do
 echo "== $(basename $M)"
 i=0
 for P in "Explain in three sentences how SSD, RAM and CPU caches form a memory hierarchy." "Write a short story about a lighthouse keeper who finds a message in a bottle." "List five differences between Python and C for a new programmer." "What is the capital of France, and why did it become the capital?"; do
  i=$((i+1))
  PYTHONPATH=/work/w34 /work/main/.venv/bin/python -m sdq chat -m $M -p "$P" -n 49 -t 2 --temp 0 --ignore-eos --route-log /tmp/proto/p$i.jsonl --json > /dev/null 2>/tmp/proto/p.err || tail -1 /tmp/proto/p.err
  PYTHONPATH=/work/w34 /work/main/.venv/bin/python -m sdq routes stats /tmp/proto/p$i.jsonl --k 4 --json 2>/dev/null | python3 -c "
import json,sys
d=json.load(sys.stdin)
print(json.dumps({k:v for k,v in d.items() if not isinstance(v,(list,dict))})[:300])" 
 done
done
