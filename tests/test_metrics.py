"""The decode figures that judge the pager and the time breakdown, against hand counts.

hit_rate counts arena hits only (a lookup a prefetch's read served is a miss and a
prefetch hit), reads_avoided comes from bytes (prefetch reads, used or not, are reads), the
profile's categories add up to the total in every run, and the barrier category is measured
from the expert worker pool's task times.

Dimension key: K experts used per token; b1, b2 one expert's bytes in the fake model's layers
1 and 2 (the pager's stand-in model, tests/pager_support.py).
"""

from __future__ import annotations

import time

import numba
import numpy as np
import pytest
from engine_support import Dims, write_model
from gguf.constants import GGMLQuantizationType as Q
from pager_support import make_model

from sdq.format.model import open_model
from sdq.measure.experiments.summary import additive_breakdown, profile_frame
from sdq.paging.cache import CacheSettings, ExpertCache
from sdq.run.engine import PROFILE_CATEGORIES, Engine, ResidentExperts, pool_barrier
from sdq.run.plan import plan_for_slots
from sdq.run.workspace import Workspace


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("metrics") / "experts.bin", n_layers=3, k=2)


def expert_bytes(model, row: int) -> int:
    return int(model.experts.nbytes[row, 0].sum())


def acquire(cache, layer, ids):
    h = cache.acquire(layer, ids)
    for i in range(len(ids)):
        h.wait(i)
    cache.release(h)
    return h.hits


@pytest.mark.parametrize("policy", ["lru", "layer_lrfu"])
def test_prefetch_served_lookups_are_not_hits(model, policy):
    """Two tokens over layers 1 and 2, layer 2's experts prefetched; counted by hand."""
    l1, l2 = model.experts.layers[:2]
    b1, b2 = expert_bytes(model, 0), expert_bytes(model, 1)
    cs = CacheSettings(policy=policy)
    with ExpertCache(model, plan_for_slots(model, 8, cache=cs), settings=cs) as cache:
        # token 0
        assert acquire(cache, l1, [0, 1]) == (False, False)  # 2 misses, 2 reads
        assert cache.prefetch(l2, [2, 3]) == 2  # 2 prefetch reads
        assert acquire(cache, l2, [2, 5]) == (False, False)  # 2: prefetch hit; 5: a read
        # token 1
        assert acquire(cache, l1, [0, 1]) == (True, True)
        assert cache.prefetch(l2, [2, 4]) == 1  # 2 is cached: only 4 is read
        assert acquire(cache, l2, [2, 3]) == (True, False)  # 3: prefetched a token ago
        s = cache.stats
    assert (s["lookups"], s["hits"], s["misses"]) == (8, 3, 5)
    assert (s["prefetches"], s["prefetch_hits"]) == (3, 2)
    assert s["hit_rate"] == 3 / 8 and s["prefetch_hit_rate"] == 2 / 8
    assert s["expert_bytes_read"] == 2 * b1 + 4 * b2  # 0, 1; 2, 3, 5 and the unused 4
    assert s["prefetch_bytes_read"] == 3 * b2  # page cache mode: device bytes = expert bytes
    assert s["lookup_expert_bytes"] == 4 * b1 + 4 * b2
    assert s["reads_avoided"] == pytest.approx(1 - (2 * b1 + 4 * b2) / (4 * b1 + 4 * b2))
    assert s["layers"][l1] == [4, 2, 2] and s["layers"][l2] == [4, 1, 3]


def test_streamed_prefetches_are_misses_and_wrong_guesses_are_reads(model):
    """lrfu_bypass: prefetches wait in streaming slots; one used, one dropped unused."""
    l1, l2 = model.experts.layers[:2]
    b1, b2 = expert_bytes(model, 0), expert_bytes(model, 1)
    cs = CacheSettings(policy="lrfu_bypass", prefetch_slots=2)
    with ExpertCache(model, plan_for_slots(model, 8, cache=cs), settings=cs) as cache:
        acquire(cache, l1, [0, 1])
        assert cache.prefetch(l2, [2, 3]) == 2
        assert acquire(cache, l2, [2, 5]) == (False, False)  # 2 from its streaming slot
        assert acquire(cache, l1, [0, 1]) == (True, True)
        s = cache.stats
    assert (s["lookups"], s["hits"], s["misses"]) == (6, 2, 4)
    assert (s["prefetch_hits"], s["prefetch_unused"]) == (1, 1)
    assert s["expert_bytes_read"] == 2 * b1 + 3 * b2  # the wrong guess 3 was read too
    assert s["reads_avoided"] == pytest.approx(1 - (2 * b1 + 3 * b2) / (4 * b1 + 2 * b2))


def test_pool_barrier_by_hand():
    # window 1.0 .. 3.0, two workers: one busy all of it, the other 0.5 s of it
    assert pool_barrier([(0.5, 3.0), (0.8, 1.5)], 2, 1.0, 3.0) == pytest.approx(0.75)
    assert pool_barrier([(0.0, 3.0)], 1, 1.0, 3.0) == 0.0  # one worker cannot wait for others
    assert pool_barrier([(1.0, 2.0), (1.0, 2.0)], 2, 1.0, 2.0) == 0.0  # balanced
    assert pool_barrier([(1.0, 2.0)], 3, 1.0, 2.0) == pytest.approx(2 / 3)  # 2 never got work
    assert pool_barrier([], 2, 2.0, 1.0) == 0.0  # empty window


def check_additive(profile: dict) -> None:
    for phase, cats in profile.items():
        parts = [cats[c] for c in PROFILE_CATEGORIES]
        assert sum(parts) == pytest.approx(cats["total"], rel=1e-9, abs=1e-9), phase
        assert cats["barrier"] >= 0.0, phase


@pytest.fixture(scope="module")
def q8_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "q8.gguf"
    return open_model(write_model(path, Dims(), qtype=Q.Q8_0, seed=5))


def test_an_imbalanced_pool_shows_a_barrier(q8_model, monkeypatch):
    """Prefill with 2 expert workers where expert 0 takes 0.1 s and the others nothing: the
    other worker waits for it at each layer's end, and the barrier category measures it."""
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs 2 Numba threads")
    spec, T = q8_model.spec, 8
    ws = Workspace.allocate(spec, 32, T, workers=2)
    engine = Engine(q8_model, ResidentExperts(q8_model), ws, 32, T)
    slow = 0.1
    calls = []

    def fake_expert(e, *args, **kwargs):
        calls.append(e)
        if e == 0:
            time.sleep(slow)

    monkeypatch.setattr(engine, "_expert", fake_expert)
    monkeypatch.setattr(engine, "_expert_q8k", fake_expert)
    tokens = np.arange(T) * 7 % spec.n_vocab
    n_before = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        t0 = time.perf_counter()
        engine.forward(tokens, "none")
        wall = time.perf_counter() - t0
    finally:
        numba.set_num_threads(n_before)
        engine.close()
    slow_layers = calls.count(0)  # layers whose experts included expert 0
    assert slow_layers > 0 and len(calls) > slow_layers
    barrier = engine.timers.seconds["barrier"]
    # the other worker idles for about `slow` of each slow layer: half of it per worker
    assert barrier > 0.3 * slow * slow_layers
    assert barrier <= slow * slow_layers + 0.05 and barrier < wall


def test_a_paged_run_adds_up_and_counts_bytes(tiny_model):
    """A real tiny-model run (paged, prefetching, 2 threads): each phase's categories plus
    other are its total; the pager's all-miss bytes are its lookups times their layer's
    expert bytes; hit and prefetch-hit rates are the counters' ratios."""
    from sdq.run.session import RunSettings, Session

    model = open_model(tiny_model)
    K = model.spec.n_expert_used
    settings = RunSettings(
        model=str(tiny_model),
        n_ctx=128,
        n_ubatch=16,
        threads=2,
        n_predict=10,
        stop_at_eos=False,
        ram_budget_mb=4000,
        reserve_mb=32,
        max_slots=K * model.spec.n_layer + 2,
        prefetch_next=K,
    )
    session = Session(settings)
    try:
        prompt = [int(t) for t in np.random.default_rng(1).integers(10, 5000, 40)]
        g = session.generate(prompt)
        s = session.experts.stats
    finally:
        session.close()
    check_additive(g.profile)
    f = g.figures
    nbytes = model.experts.nbytes.sum(axis=2)[:, 0]  # [L] one expert's bytes per layer
    rows = {int(layer): r for r, layer in enumerate(model.experts.layers)}
    all_miss = sum(v[0] * int(nbytes[rows[int(layer)]]) for layer, v in s["layers"].items())
    assert s["lookup_expert_bytes"] == all_miss
    assert s["reads_avoided"] == pytest.approx(1 - s["expert_bytes_read"] / all_miss)
    assert s["prefetches"] > 0 and s["prefetch_hits"] <= s["misses"]
    assert s["hits"] + s["misses"] == s["lookups"]
    assert 0.0 <= f["hit_rate"] <= 1.0 - f["prefetch_hit_rate"]
    assert f["reads_avoided"] <= 1.0 and f["ssd_mb_per_token"] >= f["prefetch_mb_per_token"] > 0


def test_additive_breakdown_scales_medians_to_the_median_total():
    runs = [(1.0, 1.0, 0.0), (4.0, 1.0, 0.0), (2.0, 6.0, 1.0)]  # attention, io_wait, other
    rows = []
    for i, (a, w, o) in enumerate(runs):
        prof = {"decode": {"attention": a, "io_wait": w, "other": o, "total": a + w + o}}
        rows.append({"label": "x", "repeat": i, "result": {"profile_ms_per_token": prof}})
    table = additive_breakdown(profile_frame(rows))
    got = table.set_index("category")
    # medians: attention 2, io_wait 1, other 0 (sum 3); totals 2, 5, 9: median 5
    assert got.loc["total", "ms_per_token"] == 5.0
    assert got["scale"].iloc[0] == pytest.approx(5 / 3)
    assert got.loc["attention", "median_ms"] == 2.0
    assert got.loc["attention", "ms_per_token"] == pytest.approx(10 / 3)
    parts = got.drop(index="total")
    assert parts["ms_per_token"].sum() == pytest.approx(5.0)
    assert parts["share"].sum() == pytest.approx(1.0)
    assert list(got.index) == ["attention", "io_wait", "other", "total"]
    assert (got["runs"] == 3).all()
    assert additive_breakdown(profile_frame([])).empty
