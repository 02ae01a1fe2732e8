"""sdq.measure.experiments: alternating schedule, resumable journal (kill -9 included), medians and
spread, crash rows, settings and configuration keys."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from sdq.errors import ParamsError
from sdq.measure.experiments import execute
from sdq.measure.experiments.config import RunConfig
from sdq.measure.experiments.journal import Journal
from sdq.measure.experiments.runner import run_sweep, schedule
from sdq.measure.experiments.suites import Settings
from sdq.measure.experiments.summary import spread, summarize
from sdq.measure.limits import MemoryLimit


def _configs(model, labels=("A", "B", "C")):
    return [
        RunConfig("t", lab, ("chat", "-m", str(model), "--x", lab), str(model)) for lab in labels
    ]


def _fake_execute(calls):
    def run(config, repeat, **kw):
        calls.append((config.label, repeat))
        return {"key": config.key, "repeat": repeat, "label": config.label, "status": "ok"}

    return run


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + bytes(60))
    return path


def test_schedule_alternates_configurations_within_each_repeat(model):
    a, b, c = _configs(model)
    order = [(r, cfg.label) for r, cfg in schedule([a, b, c], 3)]
    assert order == [(r, lab) for r in range(3) for lab in "ABC"]


def test_sweep_runs_in_schedule_order_and_journals_every_run(model, tmp_path):
    calls = []
    journal = Journal(tmp_path / "s.jsonl")
    rows = run_sweep(_configs(model), 2, journal, progress=False, execute=_fake_execute(calls))
    assert calls == [("A", 0), ("B", 0), ("C", 0), ("A", 1), ("B", 1), ("C", 1)]
    assert [(r["label"], r["repeat"]) for r in rows] == calls
    assert len(journal.read()) == 6


def test_rerun_skips_what_the_journal_holds(model, tmp_path):
    configs = _configs(model)
    journal = Journal(tmp_path / "s.jsonl")
    # a journal left by an interrupted sweep: A0, B0, C0, A1 finished
    for r, cfg in schedule(configs, 2)[:4]:
        journal.append({"key": cfg.key, "repeat": r, "label": cfg.label, "status": "ok"})
    calls = []
    rows = run_sweep(configs, 2, journal, progress=False, execute=_fake_execute(calls))
    assert calls == [("B", 1), ("C", 1)]
    keys = [(r["key"], r["repeat"]) for r in journal.read()]
    assert len(keys) == len(set(keys)) == 6
    assert len(rows) == 6
    calls.clear()
    run_sweep(configs, 2, journal, progress=False, execute=_fake_execute(calls))
    assert calls == []  # nothing left to do
    run_sweep(configs, 3, journal, progress=False, execute=_fake_execute(calls))
    assert calls == [("A", 2), ("B", 2), ("C", 2)]  # a larger --repeat adds only new repeats


def test_a_changed_setting_is_a_new_configuration(model):
    a = RunConfig("t", "A", ("chat", "-m", str(model), "-n", "8"), str(model))
    same = RunConfig("t", "A", ("chat", "-m", str(model), "-n", "8"), str(model))
    other = RunConfig("t", "A", ("chat", "-m", str(model), "-n", "16"), str(model))
    limited = RunConfig("t", "A", a.args, str(model), MemoryLimit.mb("rlimit_data", 512), "dropped")
    assert a.key == same.key
    assert len({a.key, other.key, limited.key}) == 3
    assert a.key.startswith("A|")


def test_a_line_cut_by_a_kill_is_ignored_and_the_next_row_starts_a_new_line(tmp_path):
    j = Journal(tmp_path / "j.jsonl")
    j.append({"key": "A|1", "repeat": 0})
    with open(j.path, "ab") as f:
        f.write(b'{"key": "B|2", "rep')  # killed mid-write
    assert [r["key"] for r in j.read()] == ["A|1"]
    assert j.skipped_lines == 1
    j.append({"key": "B|2", "repeat": 0})
    assert j.done() == {("A|1", 0), ("B|2", 0)}


SWEEP_CHILD = textwrap.dedent(
    """
    import sys, time
    from sdq.measure.experiments.config import RunConfig
    from sdq.measure.experiments.journal import Journal
    from sdq.measure.experiments.runner import run_sweep

    model, journal = sys.argv[1], sys.argv[2]
    configs = [RunConfig("t", lab, ("chat", "-m", model, "--x", lab), model) for lab in "AB"]

    def slow(config, repeat, **kw):
        time.sleep(0.4)
        return {"key": config.key, "repeat": repeat, "label": config.label, "status": "ok"}

    run_sweep(configs, 4, Journal(journal), progress=False, execute=slow)
    """
)


def test_kill_9_mid_sweep_loses_only_the_run_in_flight(model, tmp_path):
    path = tmp_path / "sweep.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", SWEEP_CHILD, str(model), str(path)])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if path.exists() and len(Journal(path).read()) >= 3:
                break
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    finished = Journal(path).read()
    assert 3 <= len(finished) < 8  # killed mid-way
    calls = []
    configs = _configs(model, "AB")
    rows = run_sweep(configs, 4, Journal(path), progress=False, execute=_fake_execute(calls))
    assert len(calls) == 8 - len(finished)  # only what had not finished
    assert not set(calls) & {(r["label"], r["repeat"]) for r in finished}
    keys = [(r["key"], r["repeat"]) for r in Journal(path).read()]
    assert len(keys) == len(set(keys)) == 8
    assert [(r["label"], r["repeat"]) for r in rows] == [(lab, r) for r in range(4) for lab in "AB"]


def test_spread_is_median_min_max_and_relative_width():
    s = spread([3.0, 1.0, 10.0, 2.0])
    assert s == {"median": 2.5, "min": 1.0, "max": 10.0, "spread": pytest.approx(9 / 2.5), "n": 4}
    s = spread([4.0, None, float("nan"), 6.0, 5.0])
    assert (s["median"], s["n"], s["spread"]) == (5.0, 3, pytest.approx(0.4))
    empty = spread([])
    assert empty["n"] == 0 and math.isnan(empty["median"])


def test_summary_counts_crashes_and_takes_medians_of_ok_runs_only():
    runs = [
        {"label": "A", "status": "ok", "error_kind": "", "error": "", "x": 1.0},
        {"label": "A", "status": "ok", "error_kind": "", "error": "", "x": 3.0},
        {"label": "A", "status": "ok", "error_kind": "", "error": "", "x": 2.0},
        {"label": "B", "status": "crashed", "error_kind": "MemoryError", "error": "m", "x": None},
        {"label": "B", "status": "ok", "error_kind": "", "error": "", "x": 7.0},
        {"label": "C", "status": "refused", "error_kind": "PlanError", "error": "p", "x": None},
    ]
    t = summarize(runs, ["label"], ["x"], ["x"]).set_index("label")
    assert t.loc["A", "x"] == 2.0 and t.loc["A", "x min"] == 1.0 and t.loc["A", "x max"] == 3.0
    assert t.loc["A", "x spread"] == pytest.approx(1.0)
    assert (t.loc["B", "runs"], t.loc["B", "ok"], t.loc["B", "crashed"]) == (2, 1, 1)
    assert t.loc["B", "x"] == 7.0 and t.loc["B", "error"] == "MemoryError: m"
    assert (t.loc["C", "refused"], t.loc["C", "crashed"]) == (1, 0)
    assert math.isnan(t.loc["C", "x"])
    assert list(t.index) == ["A", "B", "C"]  # first-seen order, as scheduled


@pytest.mark.parametrize(
    "rc, stderr, timed_out, ooms, expected",
    [
        (0, "", False, 0, ("ok", "")),
        (-9, "", False, 1, ("crashed", "killed by the limit")),
        (-9, "", False, 0, ("crashed", "signal")),
        (-6, "what():  std::bad_alloc", False, 0, ("crashed", "std::bad_alloc")),
        (
            1,
            "Traceback ...\nMemoryError: Unable to allocate 1 GiB",
            False,
            0,
            ("crashed", "MemoryError"),
        ),
        (1, "OSError: [Errno 12] Cannot allocate memory", False, 0, ("crashed", "out of memory")),
        (
            2,
            "sdq chat: error: RAM budget 300 MB holds 0 expert slots",
            False,
            0,
            ("refused", "PlanError"),
        ),
        (
            1,
            "Traceback ...\nRuntimeError: can't start new thread",
            False,
            0,
            ("crashed", "thread not started"),
        ),
        (3, "boom", False, 0, ("crashed", "exit status")),
        (-9, "", True, 0, ("timeout", "timeout")),
    ],
)
def test_classify_names_how_a_run_ended(rc, stderr, timed_out, ooms, expected):
    status, kind, error = execute.classify(rc, stderr, timed_out, ooms, {} if rc == 0 else None)
    assert (status, kind) == expected
    assert "\n" not in error


def test_a_run_past_rlimit_data_is_a_recorded_row_not_a_failed_sweep(tiny_model, tmp_path):
    args = ("chat", "-m", str(tiny_model), "-p", "hello", "-n", "2", "--json")
    crash = RunConfig("memory", "tight", args, str(tiny_model), MemoryLimit.mb("rlimit_data", 120))
    journal = Journal(tmp_path / "memory.jsonl")
    (row,) = run_sweep([crash], 1, journal, progress=False, timeout_s=120)
    assert row["status"] == "crashed"
    kinds = ("MemoryError", "out of memory", "std::bad_alloc", "thread not started", "exit status")
    assert row["error_kind"] in kinds, row["error"]
    assert row["error"] and "\n" not in row["error"]
    assert row["limit_method"] == "rlimit_data" and row["limit_mb"] == 120
    assert row["file_cache"] == "dropped" and row["cached_before"] < 0.05
    assert row["result"] is None and row["peak_data_mb"] is not None
    assert journal.read()[0]["key"] == crash.key


def test_settings_from_params_section():
    s = Settings.from_mapping({"io_threads": [2, 4], "n_predict": 8, "reserve_mb": 32})
    assert s.io_threads == (2, 4) and s.n_predict == 8 and s.reserve_mb == 32.0
    with pytest.raises(ParamsError, match="unknown key 'threds'"):
        Settings.from_mapping({"threds": 2})
    with pytest.raises(ParamsError, match="io_threads must be a list"):
        Settings.from_mapping({"io_threads": 4})
    with pytest.raises(ParamsError, match="limits"):
        Settings.from_mapping({"limits": ["ulimit"]})
    assert Settings.from_mapping({"params_name": "x"}, strict=False) == Settings()


def test_cli_refuses_an_unknown_model(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "sdq", "experiments", "--suite", "io", "--model", "nope.gguf"]
        + ["--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2
    assert p.stderr.strip() == (
        "sdq experiments: error: --model nope.gguf: no such file and not a synthetic preset"
    )


def test_journal_rows_are_plain_json(tmp_path):
    import numpy as np

    j = Journal(tmp_path / "j.jsonl")
    j.append({"key": "A|1", "repeat": 0, "v": np.float32(1.5), "n": np.int64(3)})
    line = (tmp_path / "j.jsonl").read_text().strip()
    assert json.loads(line) == {"key": "A|1", "repeat": 0, "v": 1.5, "n": 3}


def test_cli_takes_suite_settings_from_the_notebook_sections(tmp_path):
    import argparse

    from sdq.commands import experiments as cmd

    params = tmp_path / "p.yaml"
    params.write_text(
        "03_io_ab:\n  n_predict: 6\n  io_threads: [2, 4]\n  split_repeat: 1\n"
        "04_memory_sweep:\n  ctx: 1024\n  limits: [cgroup]\n  operating_fraction: 0.4\n"
    )
    p = argparse.ArgumentParser()
    cmd.add_arguments(p)
    base = ["--suite", "all", "--model", "m", "--out", str(tmp_path), "--params", str(params)]
    args = p.parse_args(base)
    io = cmd._settings(args, "io")
    assert (io.n_predict, io.io_threads) == (6, (2, 4))
    mem = cmd._settings(args, "memory")
    assert (mem.memory_ctx, mem.limits, mem.operating_fraction) == (1024, ("cgroup",), 0.4)
    args = p.parse_args([*base, "--limit", "rlimit_data", "--repeat", "5"])
    mem = cmd._settings(args, "memory")
    assert (mem.limits, mem.reserve_limit, mem.repeat) == (("rlimit_data",), "rlimit_data", 5)


def test_a_run_that_found_the_file_cached_is_not_cold_and_left_out_of_medians():
    from sdq.measure.experiments.summary import is_cold, runs_frame

    def row(before, after, mode="dontneed", file_cache="dropped", v=1.0):
        return {
            "key": "A|1",
            "repeat": 0,
            "label": "A",
            "status": "ok",
            "error_kind": "",
            "error": "",
            "file_cache": file_cache,
            "cached_before": before,
            "cached_after": after,
            "result": {"cache_mode": mode, "decode_tok_s": v},
        }

    assert is_cold(row(0.0, 0.0)) is True
    assert is_cold(row(0.97, 0.0)) is False  # another process held the pages at the start
    assert is_cold(row(0.0, 0.4)) is True  # pages read ahead around its own reads
    assert is_cold(row(0.9, 0.9, file_cache="untouched")) is None
    frame = runs_frame([row(0.0, 0.0, v=2.0), row(0.97, 0.97, v=9.0), row(0.01, 0.3, v=4.0)])
    t = summarize(frame, ["label"], ["decode_tok_s"])
    assert (t.loc[0, "ok"], t.loc[0, "not cold"], t.loc[0, "decode_tok_s"]) == (2, 1, 3.0)


def test_rotated_schedule_runs_every_two_configurations_in_both_orders(model):
    configs = _configs(model, labels=("A", "B", "C"))
    plan = schedule(configs, 4, rotate=True)
    per_repeat = [[c.label for r, c in plan if r == k] for k in range(4)]
    assert per_repeat == [list("ABC"), list("CBA"), list("BCA"), list("ACB")]
    for x, y in (("A", "B"), ("A", "C"), ("B", "C")):
        for k in (0, 2):  # each two repeats: x before y once, y before x once
            first = [p.index(x) < p.index(y) for p in per_repeat[k : k + 2]]
            assert sorted(first) == [False, True]
    assert {p[0] for p in per_repeat} == {"A", "B", "C"}  # none always first
    two = [c.label for _, c in schedule(configs[:2], 4, rotate=True)]
    assert two == list("ABBABAAB")
    calls = []
    run_sweep(
        configs[:2],
        2,
        Journal(model.parent / "r.jsonl"),
        progress=False,
        execute=_fake_execute(calls),
        rotate=True,
    )
    assert calls == [("A", 0), ("B", 0), ("B", 1), ("A", 1)]


def test_io_suites_label_prefetch_and_page_cache_and_pass_them_on(tiny_model, tmp_path):
    from sdq.measure.experiments.suites import ROTATED_SUITES, SuiteBuilder

    s = Settings(
        serial_io_threads=4,
        ab_io_threads=4,
        io_threads=(2, 4),
        splits=(1, 4),
        split_io_threads=(4,),
        layer_miss_misses=(1, 2),
    )
    b = SuiteBuilder(str(tiny_model), s, tmp_path, progress=False)
    io = b.build("io")
    assert [c.label for c in io] == [
        "serial x4 prefetch off",
        "parallel x4 prefetch off",
        "serial x4 prefetch on",
        "parallel x4 prefetch on",
    ]
    for c in io:
        off = c.meta_dict["prefetch"] == "off"
        if off:
            assert c.args[c.args.index("--prefetch-next") + 1] == "0"
        else:
            assert "--prefetch-next" not in c.args  # on: the engine's default
        assert c.file_cache == "dropped" and "dontneed" in c.args
    threads = [c.label for c in b.build("threads")]
    assert threads == [c.label for c in io] + ["parallel x2 prefetch off"]  # x4 off: in io
    split = b.build("split")
    assert [c.label for c in split] == [
        f"split{k} x4 prefetch off {cache}" for cache in ("cold", "warm") for k in (1, 4)
    ]
    for c in split:
        warm = c.meta_dict["page_cache"] == "warm"
        mode = c.args[c.args.index("--cache-mode") + 1]
        assert (mode, c.file_cache) == (("pagecache", "warm") if warm else ("dontneed", "dropped"))
    assert len({c.key for c in split}) == 4
    (lm,) = b.build("layer-miss")
    assert lm.args[lm.args.index("--misses") + 1] == "1,2"
    assert not (tmp_path / "calibration.json").exists()  # the I/O suites need no calibration
    assert set(ROTATED_SUITES) == {"io", "threads", "split", "pack", "depth", "profile"}
    depth = b.build("depth")
    assert [c.label for c in depth] == ["parallel x4 prefetch on", "parallel x4 prefetch depth2"]
    assert "--prefetch-depth" not in depth[0].args  # on: one layer ahead, the default
    assert depth[1].args[depth[1].args.index("--prefetch-depth") + 1] == "2"
    assert "--prefetch-next" not in depth[1].args
    for bad in ("depth1", "depth5", "depthx"):
        with pytest.raises(ParamsError, match="prefetch"):
            s.replace(prefetch=bad)
    assert schedule(io, 2, rotate=True)[4][1] is io[-1]  # the second repeat starts reversed
    with pytest.raises(ParamsError, match="ab_prefetch"):
        s.replace(ab_prefetch=("sometimes",))
    with pytest.raises(ParamsError, match="split_cache"):
        s.replace(split_cache=("lukewarm",))


def _memory_builder(tiny_model, tmp_path, **kw):
    """A SuiteBuilder for the memory suites with a calibration written beforehand (no run)."""
    from sdq.measure.experiments.suites import SuiteBuilder
    from sdq.units import MIB

    s = Settings(memory_ctx=1024, limits=("rlimit_data", "cgroup"), threads=2, **kw)
    size = tiny_model.stat().st_size
    tag = f"{tiny_model.name}:{size}:t{s.threads}:v2"
    cal = {tag: {"rss_bytes": 250 * MIB, "data_bytes": 180 * MIB}}
    (tmp_path / "calibration.json").write_text(json.dumps(cal))
    return SuiteBuilder(str(tiny_model), s, tmp_path, progress=False)


def _flag(config, name):
    return float(next(a for a in config.args if a.startswith(name)).split("=", 1)[1])


def test_memory_suite_runs_the_seeds_sizing_with_its_reserve_scaled(
    tiny_model, tmp_path, monkeypatch
):
    """T9: plan and seed sizing at every ubatch under each limit, one budget and reserve; the
    seed's sizing runs as `--sizing seed` with the seed's 700 MB scaled by what its arithmetic
    leaves out (700 x U / 739), so the engine's arena is "budget - RSS now - dense - R"; by the
    plan's count that reserve holds fit_ubatch's buffers in the data segment and not a ubatch
    twice as large, as the seed's held 128's and not 256's. (The budget holds more slots than
    the tiny model has experts: the cap is lifted here.)"""
    import sdq.run.plan
    from sdq.measure.experiments.suites import SEED_LEFT_OUT_MB
    from sdq.run.plan import plan_memory

    monkeypatch.setattr(sdq.run.plan, "useful_slots", lambda *args: 1 << 40)

    b = _memory_builder(tiny_model, tmp_path, ubatches=(32, 64), fit_ubatch=32)
    configs = b.memory()
    assert [c.label for c in configs] == [
        f"{z} ub{u} {m}"
        for m in ("rlimit_data", "cgroup")
        for z in ("plan", "seed")
        for u in (32, 64)
    ]
    reserve, budget = b.t9_reserve_mb(), b.memory_budget_mb()
    assert SEED_LEFT_OUT_MB == 739.0
    assert reserve == pytest.approx(700 * b.sizing(32).left_out_mb / 739.0)
    assert reserve > 0
    for c in configs:
        meta = c.meta_dict
        assert _flag(c, "--ram-budget-mb") == pytest.approx(budget, abs=1e-3)
        assert c.limit.limit_mb == pytest.approx(budget)
        assert _flag(c, "--reserve-mb") == pytest.approx(reserve, abs=1e-3)
        seed = meta["sizing"] == "seed"
        assert ("--sizing" in c.args) == seed
        if seed:  # the seed's arithmetic: budget - RSS now - dense - R
            assert c.args[c.args.index("--sizing") + 1] == "seed"
            plan = plan_memory(
                b.m,
                budget,
                1024,
                meta["ubatch"],
                reserve_mb=reserve,
                rss_now=b.cal.process,
                cache_mode=b.s.cache_mode,
                io_threads=3 * b.s.threads,
                compute_threads=b.s.threads,
                sizing="seed",
            )
            arena = (budget - b.sizing(meta["ubatch"]).rss_mb - reserve) * 2**20 - plan.dense_bytes
            assert abs(plan.slots * plan.per_slot_bytes - arena) < plan.per_slot_bytes
    (need,) = b.memory_need()
    assert need.meta_dict["sizing"] == "seed" and need.meta_dict["ubatch"] == 64
    assert need.limit.method == "none"


def test_reserve_suite_turns_the_seeds_three_reserves_into_slot_counts(tiny_model, tmp_path):
    """T10's arms leave the seed's 2039 : 1936 : 1808 slots (reserve 700, 900, 1150 MB) at one
    budget, 1936 being operating_fraction of the experts; reserve 0 is the 700 MB arm. Beside
    them the seed's own sizing at its 700 and 900 MB reserves, scaled, under the reserve
    limit."""
    from sdq.measure.experiments.suites import SEED_RESERVE_SLOTS
    from sdq.run.plan import plan_memory

    b = _memory_builder(tiny_model, tmp_path, operating_fraction=1.0)
    arms = b.arena_arms()
    slots = b.operating_slots()
    base = b.cal.n_experts
    assert slots == {r: round(base * n / 1936) for r, n in SEED_RESERVE_SLOTS}
    assert _flag(arms[0], "--reserve-mb") == 0.0
    for c in arms:
        plan = plan_memory(
            b.m,
            _flag(c, "--ram-budget-mb"),
            1024,
            b.s.ubatch,
            reserve_mb=_flag(c, "--reserve-mb"),
            rss_now=b.cal.process,
            cache_mode=b.s.cache_mode,
            io_threads=3 * b.s.threads,
            compute_threads=b.s.threads,
        )
        assert plan.slots == c.meta_dict["target_slots"] == slots[c.meta_dict["seed_reserve_mb"]]
        assert "--sizing" not in c.args
    seeds = b.seed_reserve_rows()
    assert [(c.meta_dict["seed_reserve_mb"], c.limit.method) for c in seeds] == [
        (700, "rlimit_data"),
        (900, "rlimit_data"),
    ]
    for c in seeds:
        assert c.args[c.args.index("--sizing") + 1] == "seed"
        r = c.meta_dict["seed_reserve_mb"]
        assert _flag(c, "--reserve-mb") == pytest.approx(b.seed_reserve_mb(r), abs=1e-3)
        assert _flag(c, "--ram-budget-mb") == pytest.approx(b.reserve_budget_mb(), abs=1e-3)
    assert b.seed_reserve_mb(900) / b.seed_reserve_mb(700) == pytest.approx(900 / 700)
    assert [c.label for c in b.reserve()] == [c.label for c in arms + seeds]


def test_budget_suite_spans_the_plans_minimum_to_every_expert_at_each_reserve(tiny_model, tmp_path):
    """T10_budgets: `budget_steps` budgets per reserve, the first the plan's minimum + 1 MiB (a
    budget the plan accepts; a little over 1 MiB less it refuses), increasing, each run capped
    at its budget by `budget_limit`; the tiny file is smaller than the process, so the sweep
    ends where every routed expert has a slot."""
    from sdq.errors import PlanError
    from sdq.run.plan import plan_memory

    b = _memory_builder(tiny_model, tmp_path, budget_steps=4, budget_reserves=(0.0, 10.0))
    configs = b.budgets()
    assert len(configs) == 8
    for reserve, group in ((0.0, configs[:4]), (10.0, configs[4:])):
        budgets = [_flag(c, "--ram-budget-mb") for c in group]
        assert budgets == sorted(budgets) and len(set(budgets)) == 4
        for c in group:
            assert _flag(c, "--reserve-mb") == reserve
            assert c.limit.method == "cgroup" and c.limit.limit_mb == pytest.approx(
                _flag(c, "--ram-budget-mb"), abs=1e-3
            )

        def plan(budget, reserve=reserve):
            return plan_memory(
                b.m,
                budget,
                1024,
                b.s.ubatch,
                reserve_mb=reserve,
                rss_now=b.cal.process,
                cache_mode=b.s.cache_mode,
                io_threads=3 * b.s.threads,
                compute_threads=b.s.threads,
            )

        assert plan(budgets[0]).slots >= plan(budgets[0]).min_slots
        with pytest.raises(PlanError):
            plan(budgets[0] - 1.01)
        assert plan(budgets[-1]).slots >= b.cal.n_experts
