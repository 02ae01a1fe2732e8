"""sdq bench peers: /proc/<pid>/io parsing, run order, medians, the cgroup cap, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sdq.errors import ParamsError
from sdq.measure import limits
from sdq.measure.peers import (
    PeersResult,
    decode_bound_tok_s,
    io_ceiling_tok_s,
    mark_same_tokens,
    median_rows,
    parse_proc_io,
    private_copy,
    read_proc_io,
    run_order,
)

PROC_IO = """rchar: 323934931
wchar: 323929600
syscr: 632687
syscw: 632675
read_bytes: 1052672
write_bytes: 323932160
cancelled_write_bytes: 0
"""


def test_parse_proc_io():
    d = parse_proc_io(PROC_IO)
    assert d["read_bytes"] == 1052672
    assert d["rchar"] == 323934931
    assert d["cancelled_write_bytes"] == 0
    assert len(d) == 7
    assert parse_proc_io("garbage\nread_bytes: x\n") == {}


def test_read_proc_io_counts_device_reads_of_this_process():
    d = read_proc_io()
    assert {"read_bytes", "rchar", "write_bytes"} <= d.keys()
    assert read_proc_io(os.getpid())["rchar"] >= d["rchar"]


def test_run_order_alternates_two_and_rotates_three():
    assert [run_order(["a", "b"], r) for r in range(3)] == [["a", "b"], ["b", "a"], ["a", "b"]]
    orders = [run_order(["a", "b", "c"], r) for r in range(3)]
    for position in range(3):  # every system takes every position once
        assert sorted(o[position] for o in orders) == ["a", "b", "c"]


def test_median_rows_uses_successful_runs_only():
    rows = [
        {"system": "sdq", "cap_mb": 900, "status": "ok", "decode_tok_s": 3.0, "n": 1},
        {"system": "sdq", "cap_mb": 900, "status": "ok", "decode_tok_s": 1.0, "n": 1},
        {"system": "sdq", "cap_mb": 900, "status": "ok", "decode_tok_s": 2.5, "n": 1},
        {"system": "sdq", "cap_mb": 900, "status": "killed", "decode_tok_s": 99.0},
        {"system": "llama-mmap", "cap_mb": 900, "status": "killed"},
    ]
    med = {m["system"]: m for m in median_rows(rows, ("system", "cap_mb"))}
    assert med["sdq"]["decode_tok_s"] == 2.5
    assert (med["sdq"]["runs"], med["sdq"]["ok_runs"]) == (4, 3)
    assert med["sdq"]["status"] == "3 of 4 runs finished; killed"  # not "ok": one run failed
    assert med["llama-mmap"]["status"] == "killed" and med["llama-mmap"]["ok_runs"] == 0
    assert "decode_tok_s" not in med["llama-mmap"]
    ok = median_rows(rows[:3], ("system", "cap_mb"))
    assert ok[0]["status"] == "ok"


def test_pairs_are_runs_of_the_same_repeat_where_both_finished():
    res = PeersResult({}, "cgroup", "")

    def row(system, repeat, tok_s, status="ok"):
        return {
            "mode": "capped",
            "cap_mb": 900.0,
            "system": system,
            "repeat": repeat,
            "status": status,
            "decode_tok_s": tok_s,
        }

    res.rows = [
        row("sdq", 0, 10.0),
        row("llama-mmap", 0, 2.0),
        row("llama-mmap", 1, 3.0),
        row("sdq", 1, 12.0),
        row("sdq", 2, 11.0),
        row("llama-mmap", 2, None, "killed"),  # no pair: one side failed
        row("sdq", 3, 9.0),  # no pair: the peer did not run
    ]
    assert res.pairs("capped", 900.0, "llama-mmap") == [(2.0, 10.0), (3.0, 12.0)]
    assert res.pairs("capped", 1200.0, "llama-mmap") == []


def test_a_failed_system_is_not_run_again_at_that_cap(monkeypatch, tiny_model):
    from sdq.measure import peers

    calls = []

    def fake_run_one(system, settings, cond, repeat=0, python=None):
        calls.append((cond.cap_mb, system, repeat))
        ok = not (system == "llama-lazy" or (system == "sdq" and cond.cap_mb < 100))
        return {
            "system": system,
            "mode": "capped",
            "cap_mb": cond.cap_mb,
            "repeat": repeat,
            "status": "ok" if ok else "killed",
            "generated_ids": [1, 2],
            **dict.fromkeys(
                ("decode_tok_s", "prefill_tok_s", "device_mb_per_token", "peak_rss_mb"), 1.0
            ),
        }

    monkeypatch.setattr(peers, "run_one", fake_run_one)
    s = peers.PeerSettings(model=str(tiny_model), prompt_ids=(1, 2, 3), tokens=2)
    res = peers.run_peers(
        s,
        [50, 200],
        3,
        resident=False,
        capped_systems=("sdq", "llama-mmap"),
        systems_at={200: ("sdq", "llama-mmap", "llama-lazy")},
        method="rlimit_data",
        copy_model=False,
    )
    assert [c for c in calls if c[1] == "sdq" and c[0] == 50] == [(50.0, "sdq", 0)]
    assert len([c for c in calls if c[1] == "llama-mmap"]) == 6
    assert [c for c in calls if c[1] == "llama-lazy"] == [(200.0, "llama-lazy", 0)]
    assert len([c for c in calls if c[0] == 200 and c[1] == "sdq"]) == 3
    with_retry = len(calls)
    calls.clear()
    peers.run_peers(
        s, [50], 3, resident=False, method="rlimit_data", copy_model=False, retry_failed=True
    )
    assert len([c for c in calls if c[1] == "sdq"]) == 3 and with_retry == 11
    summary = {(r["cap_mb"], r["system"]): r for r in res.summary()}
    assert summary[(50.0, "sdq")]["status"] == "killed"
    assert "bound_tok_s" not in summary[(50.0, "sdq")]  # no bound for a run that did not finish


@pytest.mark.slow
def test_teacher_forced_agreement_on_the_tiny_model(tiny_model):
    from sdq.format.model import open_model
    from sdq.format.tokenizer import Tokenizer
    from sdq.measure.peers import PeerSettings, teacher_forced

    model = open_model(tiny_model)
    ids = Tokenizer.from_metadata(model.metadata, source=str(tiny_model)).encode(
        "How does a program larger than memory run?"
    )
    s = PeerSettings(model=str(tiny_model), prompt_ids=tuple(ids), tokens=2)
    n = 48
    r = teacher_forced(s, n)
    assert r["status"] == "ok"
    assert len(r["tokens"]) == n and r["tokens"][: len(ids)] == list(ids)
    for ref in ("llama", "llama_f16kv"):
        assert len(r[f"{ref}_top"]) == len(r[f"{ref}_margin"]) == len(r[f"{ref}_rel_err"]) == n
        assert min(r[f"{ref}_margin"]) >= 0
    # the sequence is llama.cpp's own greedy continuation: its argmax at each generated
    # position is the next token
    assert r["llama_top"][len(ids) - 1 : n - 1] == r["tokens"][len(ids) :]
    # same weights, same activation quantization, F32 KV on both sides (tests/test_llama_parity)
    assert r["llama_agree"] >= 0.95 * n
    assert sorted(r["llama_rel_err"])[n // 2] < 1e-5
    with pytest.raises(Exception, match="needs more than the prompt"):
        teacher_forced(s, len(ids))


def test_same_tokens_against_the_first_llama_run():
    rows = [
        {"system": "sdq", "status": "ok", "generated_ids": [1, 2, 3]},
        {"system": "llama", "status": "ok", "generated_ids": [1, 2, 3]},
        {"system": "sdq", "status": "ok", "generated_ids": [1, 2, 4]},
        {"system": "sdq", "status": "killed"},
    ]
    mark_same_tokens(rows)
    assert [r.get("same_tokens") for r in rows] == [1, 1, 0, None]
    assert [r.get("agree_tokens") for r in rows] == [3, 3, 2, None]


def test_io_ceiling():
    assert io_ceiling_tok_s(100.0, 1000.0) == pytest.approx(10.0)
    assert io_ceiling_tok_s(0.0, 1000.0) is None  # nothing read: no I/O bound
    assert io_ceiling_tok_s(100.0, None) is None


def test_bound_is_the_slower_of_io_and_compute():
    assert decode_bound_tok_s(9.0, 29.0) == (9.0, "io")  # a small cap: the reads limit
    assert decode_bound_tok_s(40.0, 29.0) == (29.0, "compute")  # little read: compute limits
    assert decode_bound_tok_s(None, 29.0) == (29.0, "compute")
    assert decode_bound_tok_s(None, None) == (None, None)


def test_summary_and_ratios_name_the_bound():
    def row(mode, cap, system, tok_s, mb=None):
        return {
            "mode": mode,
            "cap_mb": cap,
            "system": system,
            "status": "ok",
            "decode_tok_s": tok_s,
            "sdq_ssd_mb_per_token": mb,
        }

    res = PeersResult({}, "cgroup", "", bandwidth_mb_s=1000.0)
    res.rows = [
        row("resident", None, "sdq", 30.0),
        row("capped", 1000.0, "sdq", 8.0, mb=100.0),  # I/O ceiling 10 tok/s < resident 30
        row("capped", 1500.0, "sdq", 15.0, mb=25.0),  # I/O ceiling 40 tok/s > resident 30
    ]
    sdq = {r["cap_mb"]: r for r in res.summary() if r["mode"] == "capped"}
    assert (sdq[1000.0]["bound_tok_s"], sdq[1000.0]["bound_by"]) == (10.0, "io")
    assert (sdq[1500.0]["bound_tok_s"], sdq[1500.0]["bound_by"]) == (30.0, "compute")
    assert sdq[1500.0]["io_ceiling_tok_s"] == pytest.approx(40.0)
    got = {(r["cap_mb"], r["vs"]): r["decode_ratio"] for r in res.ratios()}
    assert got[(1000.0, "bound")] == pytest.approx(0.8) == got[(1000.0, "io-ceiling")]
    assert got[(1500.0, "bound")] == pytest.approx(0.5)
    assert got[(1500.0, "io-ceiling")] == pytest.approx(15.0 / 40.0)


def test_private_copy_is_cold_and_removed(tmp_path):
    src = tmp_path / "m.gguf"
    src.write_bytes(os.urandom(1 << 20))
    with private_copy(src) as copy:
        assert copy != src and copy.read_bytes() == src.read_bytes()
        limits.drop_file_cache(copy)
        assert limits.file_resident_fraction(copy) < 0.5
    assert not copy.exists()


CGROUP_OK, CGROUP_WHY = limits.cgroup_status()


@pytest.mark.skipif(not CGROUP_OK, reason=f"cgroup v1 memory not writable here: {CGROUP_WHY}")
def test_cgroup_limits_a_child_and_is_removed():
    cap = 64 * 1_000_000
    hog = "b = bytearray(200 * 1000 * 1000); b[::4096] = b'x' * len(b[::4096])"
    with limits.MemoryCgroup(cap) as cg:
        assert int((cg.path / "memory.limit_in_bytes").read_text()) <= cap
        p = subprocess.run([sys.executable, "-c", hog], preexec_fn=cg.preexec, check=False)
        assert p.returncode == -9  # the OOM killer, not a Python error
        assert cg.oom_kills() >= 1 or cg.failcnt() >= 1
        assert cg.peak_bytes() <= cap + 4096
        path = cg.path
    assert not path.exists()


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sdq", "bench", "peers", *argv],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_cli_bad_cap_is_one_line_error(tiny_model):
    p = _cli(str(tiny_model), "--ram-cap-mb", "lots", "--tokens", "3", "--repeat", "1")
    assert p.returncode == 2
    assert "error: --ram-cap-mb 'lots'" in p.stderr
    assert "Traceback" not in p.stderr


def test_cli_tiny_model_resident_and_capped(tiny_model):
    p = _cli(
        str(tiny_model),
        "--ram-cap-mb",
        "700",
        "--tokens",
        "3",
        "--repeat",
        "1",
        "--systems",
        "sdq,llama-mmap",
        "--json",
    )
    assert p.returncode == 0, p.stderr[-2000:]
    d = json.loads(p.stdout)
    runs = {(r["mode"], r["system"]): r for r in d["runs"]}
    assert set(runs) == {
        ("resident", "sdq"),
        ("resident", "llama"),
        ("capped", "sdq"),
        ("capped", "llama-mmap"),
    }
    for key, r in runs.items():
        assert r["status"] == "ok", (key, r["status"])
        assert r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0
        assert r["n_decode"] == 2
    first = {r["generated_ids"][0] for r in runs.values()}
    assert len(first) == 1  # the same greedy first token (from prefill) in every run
    if d["limit_method"] == "cgroup":
        capped = runs[("capped", "llama-mmap")]
        assert capped["cache"] == "cold" and capped["cached_share_before"] < 0.05
        assert 0 < capped["cgroup_peak_mb"] <= 700
        assert capped["load_device_mb"] + capped["prefill_device_mb"] > 0  # read from the device
    ratios = {(q["mode"], q["vs"]): q for q in d["ratios"]}
    resident = (
        runs[("resident", "sdq")]["decode_tok_s"] / runs[("resident", "llama")]["decode_tok_s"]
    )
    assert ratios[("resident", "llama")]["decode_ratio"] == pytest.approx(resident)


def test_rlimit_data_fallback_runs_and_says_so(tiny_model):
    from sdq.measure.peers import Condition, PeerSettings, run_one

    s = PeerSettings(model=str(tiny_model), prompt_ids=(14990, 1052, 11, 1246), tokens=2)
    row = run_one("llama-mmap", s, Condition(700, "rlimit_data"))
    assert row["status"] == "ok", row["status"]
    assert row["limit_method"] == "rlimit_data" and row["cache"] == "cold"
    assert "cgroup_peak_mb" not in row  # no group: no page-cache accounting to report


def test_peer_settings_from_and_to_run_settings(tiny_model):
    from sdq.measure.peers import PeerSettings
    from sdq.run.settings import RunSettings

    run = RunSettings(
        model=str(tiny_model), n_ctx=64, n_ubatch=128, threads=3, n_predict=5, reserve_mb=50.0
    )
    s = PeerSettings.from_run(run, "Hello", omp_wait_policy="ACTIVE")
    assert (s.tokens, s.threads, s.ctx, s.ubatch, s.reserve_mb) == (5, 3, 64, 64, 50.0)
    assert s.prompt_ids and s.omp_wait_policy == "ACTIVE" and s.sdq_cache_mode == "pagecache"
    child = s.run_settings(resident=False, budget_mib=700.0)
    assert (child.n_predict, child.n_ctx, child.n_ubatch, child.threads) == (5, 64, 64, 3)
    assert child.ram_budget_mb == 700.0 and child.reserve_mb == 50.0 and not child.stop_at_eos
    assert child.sampler.temp == 0.0
    assert s.run_settings(resident=True, budget_mib=None).reserve_mb is None


def test_warm_runs_follow_each_cold_cap_and_read_less(tiny_model):
    from sdq.measure.peers import PeerSettings, run_peers

    s = PeerSettings(model=str(tiny_model), prompt_ids=(14990, 1052, 11, 1246), tokens=3)
    res = run_peers(
        s,
        [700],
        1,
        resident=False,
        capped_systems=("sdq", "llama-mmap"),
        warm_systems=("sdq", "llama-mmap"),
    )
    rows = {(r["mode"], r["system"]): r for r in res.rows}
    assert set(rows) == {(m, x) for m in ("capped", "warm") for x in ("sdq", "llama-mmap")}
    for (mode, system), r in rows.items():
        assert r["status"] == "ok", (mode, system, r["status"])
        assert r["cache"] == ("warm" if mode == "warm" else "cold")
    # the warm-up generation brought the model's pages (llama.cpp) and experts (sdq) in:
    # the measured prefill after it reads less from the device than a cold one
    for system in ("sdq", "llama-mmap"):
        cold, warm = rows[("capped", system)], rows[("warm", system)]
        assert warm["prefill_device_mb"] < cold["prefill_device_mb"] + cold["load_device_mb"]
    modes = [(r["mode"], r["cap_mb"]) for r in res.summary()]
    assert modes.index(("capped", 700.0)) < modes.index(("warm", 700.0))


def test_children_run_with_one_openblas_thread_unless_told(monkeypatch):
    """The peers' children start with `python -m sdq.measure.peers`, not through sdq.cli: they
    get the same single OpenBLAS thread (its spinning threads took the cores from the compute)."""
    import sdq.measure.peers as peers

    seen = []

    class FakePopen:
        def __init__(self, cmd, **kw):
            seen.append(kw["env"])
            self.returncode = 0

        def communicate(self, timeout=None):
            return "", ""

    monkeypatch.setattr(peers.subprocess, "Popen", FakePopen)
    s = peers.PeerSettings(model="m.gguf", prompt_ids=(1, 2))
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    peers._spawn(["x"], None, s)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    peers._spawn(["x"], None, s)
    assert [e["OPENBLAS_NUM_THREADS"] for e in seen] == ["1", "3"]
    assert all(e["OMP_WAIT_POLICY"] == s.omp_wait_policy for e in seen)


def test_only_the_warm_systems_run_warm(monkeypatch):
    """`warm_systems` picks which capped systems also run warm; the others run cold only."""
    from sdq.measure import peers

    calls = []

    def fake_run_one(system, settings, cond, repeat=0):
        calls.append((system, cond.mode, cond.cap_mb))
        return {"system": system, "mode": cond.mode, "cap_mb": cond.cap_mb, "status": "failed"}

    monkeypatch.setattr(peers, "run_one", fake_run_one)
    s = peers.PeerSettings(model=__file__, prompt_ids=(1, 2), tokens=2)
    peers.run_peers(
        s,
        [500, 900],
        2,
        resident=False,
        capped_systems=("sdq", "llama-mmap"),
        warm_systems=("sdq",),
        method="rlimit_data",
        copy_model=False,
        retry_failed=True,
    )
    assert sorted(set(calls)) == sorted(
        {(x, "capped", c) for x in ("sdq", "llama-mmap") for c in (500.0, 900.0)}
        | {("sdq", "warm", c) for c in (500.0, 900.0)}
    )
    assert len(calls) == 2 * 6  # two repeats of each condition
    with pytest.raises(ParamsError, match="capped system 'llama'"):
        peers.run_peers(s, [500], 1, resident=False, warm_systems=("llama",), copy_model=False)


def test_an_emulated_device_is_passed_to_sdq_and_needs_the_page_cache():
    from sdq.measure.peers import PeerSettings

    device = "data/devices/seed-000-ssd.json"
    s = PeerSettings(
        model="m.gguf",
        prompt_ids=(1,),
        tokens=2,
        sdq_device_model=device,
        sdq_cache_mode="pagecache",
    )
    s.validate()
    assert s.run_settings(resident=False, budget_mib=900.0).device_model == device
    direct = PeerSettings(model="m.gguf", prompt_ids=(1,), tokens=2, sdq_device_model=device)
    with pytest.raises(ParamsError, match="expected 'pagecache'"):
        direct.validate()
