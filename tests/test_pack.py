"""The pack (sdq.paging.pack): one record per expert, read with one request; mode merged reads
neighbouring records with one preadv. Its records hold the GGUF's bytes, its read tables match
the plain loop, generation through it is the same as through the GGUF, and a pack that does
not fit its model is refused in one line (or, found beside the model, skipped)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from gguf_builders import Layout, Q, write_model
from pager_support import plans_match_the_loop

from sdq.analysis.coactivation import coactivation_order, order_from_log
from sdq.cli import main
from sdq.errors import PackError
from sdq.format.model import open_model
from sdq.paging.cache import CacheSettings, ExpertCache
from sdq.paging.pack import (
    default_path,
    find_pack,
    open_pack,
    write_pack,
)
from sdq.paging.reads import (
    ExpertReader,
    IOSettings,
    SlotLayout,
)
from sdq.run.plan import plan_for_slots


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    # parts of different types and sizes, none a multiple of 4096
    lay = Layout(n_layer=3, n_expert=8, n_used=2, expert_qtypes=(Q.Q8_0, Q.F16, Q.Q8_0))
    path, _ = write_model(tmp_path_factory.mktemp("gguf") / "m.gguf", lay)
    return path


@pytest.fixture(scope="module")
def route_log(tmp_path_factory, gguf_path):
    """A route log in which experts (1, 6) and (2, 5) of every layer are chosen together."""
    model = open_model(gguf_path)
    path = tmp_path_factory.mktemp("log") / "routes.jsonl"
    pairs = [(1, 6), (2, 5), (1, 6), (0, 3), (1, 6), (2, 5), (7, 4)]
    with open(path, "w") as f:
        for pos, pair in enumerate(pairs):
            for layer in model.require_experts().layers:
                rec = {"phase": "decode", "pos": pos, "layer": layer, "experts": list(pair)}
                f.write(json.dumps({**rec, "weights": []}) + "\n")
    return path


@pytest.fixture(scope="module")
def packed(tmp_path_factory, gguf_path, route_log):
    model = open_model(gguf_path)
    out = tmp_path_factory.mktemp("pack") / "m.sdqpack"
    write_pack(model, out, order_from_log(route_log, model.require_experts()), "the log")
    model.pack = open_pack(model, out)
    return model


def test_records_hold_the_gguf_bytes(packed, gguf_path):
    model = packed
    gguf, pack = model.require_experts(), model.pack
    data, blob = gguf_path.read_bytes(), pack.path.read_bytes()
    for row in range(len(gguf.layers)):
        for e in range(gguf.n_expert):
            start = int(pack.table.offsets[row, e, 0])
            assert start % 4096 == 0
            for p in range(3):
                a, n = int(gguf.offsets[row, e, p]), int(gguf.nbytes[row, e, p])
                b = int(pack.table.offsets[row, e, p])
                assert b - start == pack.starts[row][p] and b % 4096 == 0
                assert blob[b : b + n] == data[a : a + n]
    assert len(blob) == int(pack.table.offsets[-1, pack.order[-1, -1], 0]) + pack.record_bytes[-1]


def test_the_route_log_puts_experts_used_together_side_by_side(packed):
    pos = packed.pack.position  # [L, E]
    for row in range(pos.shape[0]):
        assert abs(pos[row, 1] - pos[row, 6]) == 1
        assert abs(pos[row, 2] - pos[row, 5]) == 1
        assert packed.pack.order[row, 0] in (1, 6)  # the most used pair leads


def test_coactivation_order_is_a_greedy_chain():
    ids = np.array([[[0, 3]], [[0, 3]], [[0, 3]], [[2, 1]], [[3, 1]]])  # [T=5, L=1, K=2]
    # use: 0:3, 3:4, 1:2, 2:1; chain from 3 (most used): 0 (3 together), then 1 (its use
    # beats 2's, both 0 with 0), then 2
    assert coactivation_order(ids, 4).tolist() == [[3, 0, 1, 2]]
    rng = np.random.default_rng(0)
    many = rng.integers(0, 16, (40, 3, 2))
    many[:, :, 1] = (many[:, :, 0] + 1 + rng.integers(0, 15, (40, 3))) % 16
    order = coactivation_order(many, 16)
    assert (np.sort(order, axis=1) == np.arange(16)).all()


@pytest.mark.parametrize("cache_mode", ["pagecache", "dontneed", "direct"])
def test_pack_read_tables_match_the_loop(packed, cache_mode):
    t = packed.pack.table
    layout = SlotLayout.for_pack(packed.pack, cache_mode)
    reader = ExpertReader(packed.pack.path, t, layout, IOSettings(threads=2, cache_mode=cache_mode))
    try:
        modes = ["serial", "parallel", "split", "merged"]
        for mode, row, experts, reads in plans_match_the_loop(reader, layout, modes, 80, seed=5):
            if mode in ("serial", "parallel"):
                assert len(reads) == len(experts)  # one read per expert
                assert (reads[:, 2] == packed.pack.record_bytes[row]).all()
    finally:
        reader.close()


@pytest.mark.parametrize("cache_mode", ["pagecache", "direct"])
@pytest.mark.parametrize("mode", ["parallel", "merged"])
def test_cache_views_from_the_pack_are_the_gguf_bytes(packed, gguf_path, cache_mode, mode):
    model = packed
    gguf = model.require_experts()
    data = gguf_path.read_bytes()
    cache = ExpertCache(
        model,
        plan_for_slots(model, 6, cache_mode),
        IOSettings(threads=3, mode=mode, cache_mode=cache_mode),
        CacheSettings(),
    )
    try:
        for row, layer in enumerate(gguf.layers):
            # neighbours in the pack's order: one merged read in mode merged
            ids = [int(e) for e in model.pack.order[row, 2:5]]
            h = cache.acquire(layer, ids)
            for i, e in enumerate(h.experts):
                h.wait(i)
                for p, view in enumerate(h.views(i)):
                    a, n = int(gguf.offsets[row, e, p]), int(gguf.nbytes[row, e, p])
                    assert view.reshape(-1).tobytes() == data[a : a + n]
            cache.release(h)
        assert cache.stats["reads"] == 3 * len(gguf.layers)  # one per expert
    finally:
        cache.close()


def test_merged_reads_share_a_group_per_run(packed):
    t = packed.pack.table
    layout = SlotLayout.for_pack(packed.pack, "direct")
    io = IOSettings(threads=2, mode="merged", cache_mode="direct")
    reader = ExpertReader(packed.pack.path, t, layout, io)
    try:
        order = packed.pack.order[0]
        experts = [int(order[5]), int(order[1]), int(order[4]), int(order[2])]  # runs 1-2, 4-5
        reads, _ = reader.plan(0, experts, [4096 * (1 + k) * layout.slot_bytes for k in range(4)])
        assert reads[:, 6].tolist() == [0, 0, 1, 1]  # two groups, each one task
        assert reads[:, 5].tolist() == [0, 0, 1, 1]
        assert (reads[1:2, 1] == reads[0:1, 1] + reads[0:1, 2]).all()
    finally:
        reader.close()


def test_chat_through_the_pack_matches_the_gguf(tiny_model, tmp_path, capsys):
    log = tmp_path / "routes.jsonl"
    base = ["chat", "-m", str(tiny_model), "-p", "The pack", "-n", "10", "--temp", "0"]
    base += ["--max-slots", "10", "--json"]
    assert main([*base, "--pack", "none", "--route-log", str(log)]) == 0
    want = json.loads(capsys.readouterr().out)
    pack = tmp_path / "tiny.sdqpack"
    assert main(["pack", str(tiny_model), "-o", str(pack), "--route-log", str(log)]) == 0
    assert "co-activation" in capsys.readouterr().out
    for cache_mode, mode in [
        ("direct", "merged"),
        ("dontneed", "parallel"),
        ("pagecache", "split"),
    ]:
        args = [*base, "--pack", str(pack), "--cache-mode", cache_mode, "--io-mode", mode]
        assert main(args) == 0
        got = json.loads(capsys.readouterr().out)
        assert got["expert_file"] == "pack" and want["expert_file"] == "gguf"
        assert got["text"] == want["text"]
        assert got["expert_cache"]["reads"] < want["expert_cache"]["reads"]


def test_a_pack_of_another_model_is_refused(tmp_path, gguf_path, capsys):
    other_lay = Layout(n_layer=3, n_expert=8, n_used=2, expert_qtypes=(Q.Q8_0, Q.F16, Q.Q8_0))
    other, _ = write_model(tmp_path / "other.gguf", other_lay, seed=1)
    pack = write_pack(open_model(other), tmp_path / "other.sdqpack")
    model = open_model(gguf_path)
    with pytest.raises(PackError, match="packed from another file"):
        open_pack(model, pack)
    # found beside the model: skipped with a note, the GGUF is read
    beside = tmp_path / "m.gguf"
    beside.write_bytes(gguf_path.read_bytes())
    os.replace(pack, default_path(beside))
    notes = []
    assert find_pack(open_model(beside), None, warn=notes.append) is None
    assert len(notes) == 1 and "packed from another file" in notes[0]
    assert find_pack(open_model(beside), "none") is None
    with pytest.raises(PackError):
        find_pack(open_model(beside), str(default_path(beside)))


def test_damaged_packs_are_refused_in_one_line(tmp_path, gguf_path, capsys):
    model = open_model(gguf_path)
    good = write_pack(model, tmp_path / "good.sdqpack")
    blob = good.read_bytes()
    cases = {
        "truncated": blob[: len(blob) - 4096],
        "not a pack": b"GGUF" + blob[4:],
        "header cut": blob[:20],
        "bad json": blob[:12] + b"{" * 40 + blob[52:],
    }
    for name, data in cases.items():
        bad = tmp_path / f"{name.replace(' ', '_')}.sdqpack"
        bad.write_bytes(data)
        with pytest.raises(PackError) as err:
            open_pack(model, bad)
        assert str(bad) in str(err.value) and "\n" not in str(err.value), name
        assert main(["pack", str(gguf_path), "-o", str(bad), "--check"]) == 2
        assert str(bad) in capsys.readouterr().err
    assert main(["chat", "-m", str(gguf_path), "-p", "x", "--pack", str(tmp_path / "no")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_bench_layer_miss_reads_the_pack_too(packed, gguf_path, capsys):
    args = ["bench", "layer-miss", str(gguf_path), "--pack", str(packed.pack.path)]
    args += ["--misses", "1,3", "--mode", "parallel", "--io-threads", "2", "--repeat", "3"]
    assert main([*args, "--cache-mode", "direct", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    labels = [(r["misses"], r["label"], r["source"]) for r in rows]
    assert labels == [
        (m, lab, src)
        for m in (1, 3)
        for lab, src in [("parallel x2", "gguf"), ("pack x2", "pack"), ("pack merged x2", "pack")]
    ]
    split = [*args[:-6], "--mode", "serial,split", "--split", "2", "--io-threads", "2"]
    assert main([*split, "--repeat", "2", "--cache-mode", "direct", "--json"]) == 0
    split_rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["label"] for r in split_rows if r["misses"] == 1] == [
        "serial x2",
        "split2 x2",
        "pack split2 x2",
        "pack merged x2",
    ]
    for r in rows:  # same experts, same bytes; the pack reads whole 4096-aligned records
        same = [o for o in rows if o["misses"] == r["misses"]]
        assert {o["expert_bytes"] for o in same} == {r["expert_bytes"]}
        assert len(r["times_ms"]) == 3 and r["resident_before"] < 0.05


def test_the_pack_suite_names_its_arms(packed, gguf_path, tmp_path):
    from sdq.errors import ParamsError
    from sdq.measure.experiments.suites import Settings, SuiteBuilder

    with pytest.raises(ParamsError, match="pack_path"):
        SuiteBuilder(str(gguf_path), Settings(), tmp_path, progress=False).build("pack")
    s = Settings(pack_path=str(packed.pack.path), pack_io_threads=3)
    configs = SuiteBuilder(str(gguf_path), s, tmp_path, progress=False).build("pack")
    assert [c.label for c in configs] == [
        "gguf x3 prefetch off",
        "pack x3 prefetch off",
        "pack split3 x3 prefetch off",
        "pack merged x3 prefetch off",
    ]
    p = str(packed.pack.path)
    assert [c.args[c.args.index("--pack") + 1] for c in configs] == ["none", p, p, p]
    assert [c.pack for c in configs] == ["", p, p, p]
    assert [c.meta_dict["io_mode"] for c in configs] == ["parallel", "parallel", "split", "merged"]
    assert [c.args[c.args.index("--io-split") + 1] for c in configs] == ["1", "1", "3", "1"]


def test_a_route_log_of_another_model_is_refused_in_one_line(gguf_path, tmp_path, capsys):
    log = tmp_path / "other.jsonl"
    log.write_text(json.dumps({"phase": "decode", "pos": 0, "layer": 0, "experts": [1, 2]}) + "\n")
    out = tmp_path / "m.sdqpack"
    assert main(["pack", str(gguf_path), "-o", str(out), "--route-log", str(log)]) == 2
    err = capsys.readouterr().err
    assert str(log) in err and len(err.strip().splitlines()) == 1
    assert not out.exists() and not out.with_name(out.name + ".tmp").exists()


def test_bench_layer_miss_runs_fio_beside_it(packed, gguf_path, capsys):
    from sdq.measure.fio import fio_binary

    args = ["bench", "layer-miss", str(gguf_path), "--pack", str(packed.pack.path), "--fio"]
    args += ["--misses", "2", "--mode", "parallel", "--io-threads", "4", "--repeat", "3"]
    assert main([*args, "--cache-mode", "dontneed"]) == 2  # fio would re-read cached pages
    assert "--cache-mode direct" in capsys.readouterr().err
    code = main([*args, "--cache-mode", "direct", "--json"])
    if fio_binary() is None:
        assert code == 2 and "fio is not installed" in capsys.readouterr().err
        return
    assert code == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    jobs = {r["label"]: r["fio_jobs"] for r in rows}
    # 2 experts: 6 segment reads on 4 threads; the pack: 2 reads (merged: 1 or 2)
    assert jobs["parallel x4"] == 4 and jobs["pack x4"] == 2 and jobs["pack merged x4"] in (1, 2)
    for r in rows:
        assert r["fio_gb_s"] > 0 and r["ratio_to_fio"] == pytest.approx(
            r["device_gb_s"] / r["fio_gb_s"]
        )
        assert r["fio_page_bytes"] in (4096, 2 << 20)
    records = set(packed.pack.record_bytes)
    for r in rows:
        sizes = {int(part.split("/")[0]) for part in r["fio_bssplit"].split(":")}
        assert (sizes <= records) == (r["source"] == "pack")  # fio reads what sdq read
