"""`sdq routes simulate` and `sdq routes stats` on every shared trace file, and their errors."""

import json
from pathlib import Path

import pytest

from sdq.cli import main

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
FILES = sorted(p for p in TRACES.rglob("*") if p.suffix in (".json", ".jsonl", ".csv"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_simulate_every_trace(path, capsys):
    rc = main(
        [
            "routes",
            "simulate",
            str(path),
            "--policy",
            "lru,belady,fifo,lfu,pin",
            "--slots",
            "8,16,24",
            "--json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["results"]
    assert len(rows) == 15
    for s in (8, 16, 24):
        by = {r["policy"]: r["misses"] for r in rows if r["slots"] == s}
        assert by["belady"] <= min(by["lru"], by["fifo"], by["lfu"])


def test_simulate_global_scope_and_table(capsys):
    path = TRACES / "mixtral-8x7b" / "gsm8k_2_routing.jsonl"
    assert (
        main(
            [
                "routes",
                "simulate",
                str(path),
                "--scope",
                "global",
                "--slots",
                "96",
                "--policy",
                "lru,layer_lrfu,belady",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "misses_vs_belady" in out and "layer_lrfu" in out


def test_stats(capsys):
    path = TRACES / "deepseek-v2-lite" / "prompt_1002_data.csv"
    assert main(["routes", "stats", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["phase"] == "prefill" and out["union_saving"]["1"] == 0.0
    assert set(out["ngram_mean_accepted_k8"]) == {"2", "3", "4", "6", "8"}
    assert len(out["layer_popularity"]) == 26


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--slots", "1"], "below top_k"),
        (["--policy", "magic"], "unknown policy"),
        (["--phase", "prefill"], "no prefill tokens"),
        (["--policy", "layer_lrfu"], "needs --scope global"),
    ],
)
def test_user_mistakes_exit_2_with_one_line(argv, match, capsys):
    path = TRACES / "mixtral-8x7b" / "gsm8k_2_routing.jsonl"
    assert main(["routes", "simulate", str(path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sdq routes: error:") and match in err and "\n" not in err


def test_missing_file(capsys, tmp_path):
    assert main(["routes", "stats", str(tmp_path / "none.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_pin_ranked_on_other_sequences(capsys):
    granite = TRACES / "granite-3.0-1b-a400m" / "moe_expert_trace.json"
    argv = ["routes", "simulate", str(granite), "--policy", "pin,pin_other", "--slots", "16"]
    assert main([*argv, "--json"]) == 0
    by = {r["policy"]: r["misses"] for r in json.loads(capsys.readouterr().out)["results"]}
    assert by["pin"] <= by["pin_other"]  # a table ranked on the run itself cannot do worse
    single = TRACES / "deepseek-v2-lite" / "prompt_1002_data.csv"
    assert main(["routes", "simulate", str(single), "--policy", "pin_other"]) == 2
    assert "other sequences" in capsys.readouterr().err
