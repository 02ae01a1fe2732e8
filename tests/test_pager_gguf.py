"""The pager on real GGUF files (sdq.format.model.open_model) and `sdq bench layer-miss`."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from gguf_builders import Layout, Q, write_model

from sdq.cli import main
from sdq.format.model import open_model
from sdq.paging.cache import CacheSettings, ExpertCache
from sdq.paging.reads import IOSettings
from sdq.run.plan import plan_for_slots


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    lay = Layout(n_layer=3, n_expert=8, n_used=2, expert_qtypes=(Q.Q8_0, Q.F16, Q.Q8_0))
    path, _ = write_model(tmp_path_factory.mktemp("gguf") / "m.gguf", lay)
    return path


@pytest.mark.parametrize("cache_mode", ["pagecache", "direct"])
def test_views_match_tensor_data(gguf_path, cache_mode):
    model = open_model(gguf_path)
    t = model.require_experts()
    data = gguf_path.read_bytes()
    cache = ExpertCache(
        model,
        plan_for_slots(model, 4, cache_mode),
        IOSettings(threads=2, cache_mode=cache_mode),
        CacheSettings(),
    )
    layer = t.layers[-1]
    h = cache.acquire(layer, [7, 0])
    for i, e in enumerate(h.experts):
        h.wait(i)
        for p, (part, view) in enumerate(zip(("gate", "up", "down"), h.views(i), strict=True)):
            ti = model.tensors[f"blk.{layer}.ffn_{part}_exps.weight"]
            per = ti.nbytes // t.n_expert  # experts lie back to back in the 3-D tensor
            want = np.frombuffer(data[ti.offset + e * per : ti.offset + (e + 1) * per], np.uint8)
            assert np.array_equal(view.reshape(-1), want)
            assert view.shape[0] == t.shapes[p][0]
    cache.release(h)
    cache.close()


def test_bench_layer_miss_runs_and_compares_modes(gguf_path, capsys):
    args = [
        "bench",
        "layer-miss",
        str(gguf_path),
        "--misses",
        "1,4",
        "--mode",
        "serial,parallel,split",
        "--split",
        "2",
        "--io-threads",
        "2,4",
        "--cache-mode",
        "dontneed",
        "--repeat",
        "3",
        "--json",
    ]
    assert main(args) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["cache_mode"] == "dontneed"
    labels = ["serial x2", "serial x4", "parallel x2", "parallel x4", "split2 x2", "split2 x4"]
    assert [(r["misses"], r["label"]) for r in d["rows"]] == [
        (m, lab) for m in (1, 4) for lab in labels
    ]
    one = {r["label"]: r["expert_bytes"] for r in d["rows"] if r["misses"] == 1}
    for r in d["rows"]:
        assert (
            r["median_ms"] > 0
            and r["gb_s"] > 0
            and r["best_other"].split()[0] != r["label"].split()[0]
        )
        assert r["expert_bytes"] > 0 and r["resident_before"] < 0.05
        # one time per repetition (a pair with any other configuration of the same misses)
        assert len(r["times_ms"]) == 3 and r["median_ms"] == sorted(r["times_ms"])[1]
        if r["misses"] == 4:  # 4 of the layer's experts: 4 times one expert's bytes or so
            assert 3 * one[r["label"]] < r["expert_bytes"] < 5 * one[r["label"]]
        # the ratio to the best other mode is taken among rows with the same misses
        best = min(
            (o for o in d["rows"] if o["misses"] == r["misses"] and o["mode"] != r["mode"]),
            key=lambda o: o["median_ms"],
        )
        assert r["best_other"] == best["label"]
        assert r["ratio_to_best_other"] == pytest.approx(r["median_ms"] / best["median_ms"])
    assert main(args[:3] + ["--experts", "2", "--io-threads", "2", "--repeat", "1"]) == 0
    assert "2 experts of one layer missing" in capsys.readouterr().out  # --experts: an alias
    assert main(args[:3] + ["--misses", "9"]) == 2
    assert "--misses 9: expected 1..8" in capsys.readouterr().err
    assert main(args[:-1]) == 0
    assert "cache mode: dontneed" in capsys.readouterr().out
    assert main(["bench", "layer-miss", str(gguf_path), "--mode", "fast"]) == 2
    assert "--mode 'fast'" in capsys.readouterr().err
    if hasattr(os, "O_DIRECT"):
        assert (
            main(
                args[:3]
                + [
                    "--experts",
                    "2",
                    "--mode",
                    "parallel",
                    "--io-threads",
                    "2",
                    "--cache-mode",
                    "direct",
                    "--repeat",
                    "1",
                ]
            )
            == 0
        )
