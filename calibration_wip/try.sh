rm -f /root/.cache/sdq/models/sdq-synth-seed-small-ema-*
cd /tmp/proto && PYTHONPATH=/work/w34 nice -n 5 /work/main/.venv/bin/python /tmp/proto/build_ema.py 2>&1 | grep -v warning | head -1
for n in ema; do M=$(ls /root/.cache/sdq/models/sdq-synth-seed-small-$n-Q8_0-seed0-*.gguf); PYTHONPATH=/work/w34 /work/main/.venv/bin/python -m sdq chat -m $M -p "Explain in three sentences how SSD, RAM and CPU caches form a memory hierarchy." -n 49 -t 2 --temp 0 --ignore-eos --route-log /tmp/proto/$n.jsonl --json > /tmp/proto/$n.out 2>/tmp/proto/$n.err; echo "$n rc=$?"; PYTHONPATH=/work/w34 /work/main/.venv/bin/python -m sdq routes stats /tmp/proto/$n.jsonl --k 4 2>&1 | sed -n 2,4p; python3 -c "
import json
d=json.loads(open('/tmp/proto/$n.out').read().strip().splitlines()[-1])
print(len(set(d['generated_ids'])), 'distinct of', len(d['generated_ids']), repr(d.get('text','')[:100]))"; done
