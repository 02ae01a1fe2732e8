"""`sdq chat` end to end on the tiny Q4_K_M model: paged under a small arena, resident, errors."""

import json
import subprocess
import sys

import pytest

from sdq.cli import main
from sdq.format.model import open_model

PROMPT = "Explain in two sentences why a disk is slower than memory, and what a cache does."
FIGURES = (
    "decode_tok_s prefill_tok_s ttft_ms hit_rate prefetch_hit_rate prefetch_accuracy "
    "reads_avoided ssd_mb_per_token prefetch_mb_per_token expert_io_ms_per_token "
    "expert_compute_ms_per_token total_ms_per_token peak_rss_mb swap_mb slots"
).split()


def chat_json(*args):
    """`sdq chat --json` in its own process, so each run's RSS (which the plan counts) is
    that of a fresh command, not of this test process."""
    cmd = [sys.executable, "-m", "sdq", "chat", "--json", "--temp", "0", "-c", "256", "-b", "16"]
    proc = subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_paged_chat_matches_resident(tiny_model, tmp_path):
    spec = open_model(tiny_model).spec
    common = ("-m", str(tiny_model), "-p", PROMPT, "-n", "12", "--ignore-eos")
    paging = ("--reserve-mb", "32", "--io-threads", "6")
    roomy = chat_json(*common, *paging, "--ram-budget-mb", "4000")
    small = spec.n_expert_used + 3  # fewer slots than a prefill ubatch's experts: evictions
    log = tmp_path / "routes.jsonl"
    paged = chat_json(
        *common, *paging, "--ram-budget-mb", "4000", "--max-slots", str(small), "--route-log", log
    )
    resident = chat_json(*common, "--resident")
    assert paged["generated_ids"] == resident["generated_ids"] == roomy["generated_ids"]
    assert len(paged["generated_ids"]) == 12 and paged["text"] == resident["text"]
    assert paged["prompt"] == PROMPT and len(paged["prompt_ids"]) > 16  # more than one ubatch
    assert all(name in paged for name in FIGURES)
    total_experts = spec.n_layer * spec.n_expert
    assert paged["slots"] == small and roomy["slots"] >= total_experts
    assert roomy["hit_rate"] > paged["hit_rate"] and paged["expert_cache"]["evictions"] > 0
    assert 0.0 <= paged["hit_rate"] < 1.0 and paged["ssd_mb_per_token"] > 0
    # prefetch-served lookups are misses: hits + prefetch hits never exceed the lookups, and
    # reads_avoided counts every byte read, prefetches included
    assert paged["hit_rate"] + paged["prefetch_hit_rate"] <= 1.0
    assert paged["reads_avoided"] < 1.0 and paged["prefetch_mb_per_token"] >= 0
    assert paged["settings"]["plan"]["slots"] == paged["slots"]
    lines = log.read_text().splitlines()
    positions = len(paged["prompt_ids"]) + paged["n_decode"]
    assert len(lines) == positions * spec.n_layer


def test_streaming_text_then_figures_and_profile(tiny_model, capsys):
    rc = main(["chat", "-m", str(tiny_model), "-p", PROMPT, "-n", "6", "--resident"])
    rc |= main(["chat", "-m", str(tiny_model), "-p", PROMPT, "-n", "6", "--resident", "--profile"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "decode_tok_s" in out and "peak_rss_mb" in out
    for category in ("attention", "router", "expert_compute", "io_wait", "barrier", "other"):
        assert category in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["-c", "8", "-b", "8"], "context overflow: prompt"),
        (["--ram-budget-mb", "50"], "minimum budget"),
        (["-b", "0"], "-b 0 must be >= 1"),
    ],
)
def test_user_errors_are_one_line(tiny_model, capsys, args, message):
    rc = main(["chat", "-m", str(tiny_model), "-p", PROMPT, "-n", "4", *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("sdq chat: error: ") and message in err and err.count("\n") == 1


def test_io_profile_fills_io_settings_unless_given(tiny_model, tmp_path):
    profile = tmp_path / "io.json"
    profile.write_text(
        json.dumps({"version": 1, "io_threads": 5, "io_split": 2, "cache_mode": "direct"})
    )
    common = ("-m", tiny_model, "-p", PROMPT, "-n", "2", "--io-profile", profile)
    from_profile = chat_json(*common)["settings"]
    assert (from_profile["io_threads"], from_profile["io_split"]) == (5, 2)
    assert from_profile["io_mode"] == "split"
    explicit = chat_json(*common, "--io-threads", "3", "--io-mode", "parallel")["settings"]
    assert (explicit["io_threads"], explicit["io_mode"]) == (3, "parallel")


def test_bad_io_profile_is_one_line(tiny_model, tmp_path, capsys):
    profile = tmp_path / "io.json"
    profile.write_text('{"version": 1, "io_threads": 0, "io_split": 1, "cache_mode": "direct"}')
    rc = main(["chat", "-m", str(tiny_model), "-p", PROMPT, "--io-profile", str(profile)])
    err = capsys.readouterr().err
    assert rc == 2 and "io_threads must be an integer" in err and err.count("\n") == 1
