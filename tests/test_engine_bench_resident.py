"""`sdq bench resident` on the tiny model: both engines run, medians and ratios reported."""

import json

from sdq.cli import main


def test_bench_resident_reports_both_engines(tiny_model, capsys):
    rc = main(["bench", "resident", str(tiny_model), "-n", "4", "-r", "2", "-b", "16", "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    r = json.loads(out)
    for engine in ("sdq", "llama.cpp"):
        for key in ("prefill_tok_s", "decode_tok_s"):
            runs = r[f"{engine}_{key}_all"]
            assert len(runs) == 2 and all(v > 0 for v in runs)
            assert min(runs) <= r[f"{engine}_{key}"] <= max(runs)  # the median
    assert r["ratio_decode_tok_s"] == r["sdq_decode_tok_s"] / r["llama.cpp_decode_tok_s"]
    assert r["n_prompt"] > 16 and "without AMX" in r["llama_settings"]


def test_bench_resident_table(tiny_model, capsys):
    rc = main(["bench", "resident", str(tiny_model), "-n", "3", "-r", "1"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "sdq/llama" in out and "decode tok/s" in out and "llama.cpp" in out
