"""sdq.paging.cache: the expert cache against a pure-Python model of its policy, threads, faults."""

from __future__ import annotations

import json
import os
import random
import threading
from collections import Counter, OrderedDict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pager_support import make_model

from sdq.errors import PlanError, ReadError
from sdq.paging.cache import CacheSettings, ExpertCache
from sdq.paging.reads import IOSettings
from sdq.paging.route_log import RouteLog
from sdq.run.plan import plan_for_slots


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("pager") / "experts.bin", n_layers=3, n_expert=8, k=2)


def check_views(model, h):
    for i, e in enumerate(h.experts):
        h.wait(i)
        expect = model.expert_bytes(h.layer, e)
        for view, want in zip(h.views(i), expect, strict=True):
            assert view.tobytes() == want


class LRUModel:
    """What the cache must do under policy lru, written as plainly as possible."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.lru = OrderedDict()  # key -> None, oldest first
        self.pins: Counter = Counter()

    def acquire(self, row, ids):
        """-> (hits, pinned keys) or raises PlanError after rolling back like the cache."""
        lru = self.lru
        group = {(row, e) for e in ids}  # an acquire never evicts what it requests
        hits, pinned, new = [], [], []
        try:
            for e in ids:
                key = (row, e)
                if key in lru:
                    hits.append(True)
                    lru.move_to_end(key)
                    self.pins[key] += 1
                    pinned.append(key)
                    continue
                hits.append(False)
                if len(lru) >= self.capacity:
                    victim = next((k for k in lru if not self.pins[k] and k not in group), None)
                    if victim is None:
                        raise PlanError("all pinned")
                    del lru[victim]
                lru[key] = None
                self.pins[key] += 1
                pinned.append(key)
                new.append(key)
        except PlanError:
            for key in pinned:
                self.pins[key] -= 1
            for key in new:
                del lru[key]
            raise
        return hits, pinned

    def release(self, pinned):
        for key in pinned:
            self.pins[key] -= 1

    def cached(self, row):
        return sorted(e for (r, e) in self.lru if r == row)


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("acq"), st.integers(0, 2), st.sets(st.integers(0, 7), min_size=1, max_size=2)
        ),
        st.tuples(st.just("rel"), st.integers(0, 5), st.just(frozenset())),
    ),
    min_size=1,
    max_size=40,
)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=ops, slots=st.integers(2, 12))
def test_lru_matches_the_model(model, ops, slots):
    table = model.experts
    cs = CacheSettings(policy="lru")
    cache = ExpertCache(model, plan_for_slots(model, slots, cache=cs), IOSettings(threads=2), cs)
    ref = LRUModel(slots)
    handles = []  # (cache handle, model pinned keys)
    try:
        for op, a, ids in ops:
            if op == "rel":
                if handles:
                    h, pinned = handles.pop(a % len(handles))
                    cache.release(h)
                    ref.release(pinned)
                continue
            layer, ids = table.layers[a], sorted(ids)
            if len(handles) >= 3:
                continue
            try:
                hits, pinned = ref.acquire(a, ids)
            except PlanError:
                with pytest.raises(PlanError, match="pinned"):
                    cache.acquire(layer, ids)
                continue
            h = cache.acquire(layer, ids)
            assert list(h.hits) == hits
            check_views(model, h)
            handles.append((h, pinned))
            for r, lay in enumerate(table.layers):
                assert cache.cached(lay) == ref.cached(r)
        s = cache.stats
        assert s["lookups"] == s["hits"] + s["misses"]
        assert s["lookups"] == sum(lookups for lookups, _, _ in s["layers"].values())
        assert s["bypassed"] == s["overflow_admits"] == 0
    finally:
        for h, _ in handles:
            cache.release(h)
        cache.close()


def test_all_slots_pinned_is_a_clear_error(model):
    cache = ExpertCache(model, plan_for_slots(model, 2))
    layer = model.experts.layers[0]
    h = cache.acquire(layer, [0, 1])
    with pytest.raises(PlanError, match=r"all 2 slots of the arena are pinned .*max_acquire = 2"):
        cache.acquire(layer, [2])
    cache.release(h)
    cache.release(cache.acquire(layer, [2]))
    cache.close()


def test_too_few_slots_for_the_policy_state_the_minimum(model):
    cs = CacheSettings(policy="lrfu_bypass", prefetch_slots=1)  # K cache + K + 1 streaming
    with pytest.raises(PlanError, match=r"5 slots needed, minimum budget [\d.]+ MB"):
        ExpertCache(model, plan_for_slots(model, 4, cache=cs), settings=cs)


def test_the_plan_must_be_made_for_the_cache_settings(model):
    plan = plan_for_slots(model, 8, cache=CacheSettings(policy="lru"))
    with pytest.raises(PlanError, match="counted slots for cache policy lru with 0 prefetch"):
        ExpertCache(model, plan, settings=CacheSettings(policy="lrfu_bypass"))


def test_prefetched_experts_are_read_misses_not_hits(model):
    """A lookup a prefetch's read serves is a miss (and a prefetch hit) that reads nothing
    itself; the next lookup of the same expert is a hit."""
    cache = ExpertCache(model, plan_for_slots(model, 6))
    layer = model.experts.layers[1]
    assert cache.prefetch(layer, [3, 4, 3]) == 2
    assert cache.prefetch(layer, [3]) == 0
    h = cache.acquire(layer, [3, 4, 5])
    assert h.hits == (False, False, False)
    check_views(model, h)
    cache.release(h)
    s = cache.stats
    assert s["prefetches"] == 2 and s["prefetch_hits"] == 2 and s["misses"] == 3
    assert s["hits"] == 0 and s["hit_rate"] == 0.0
    assert (
        s["bytes_read"]
        == s["expert_bytes_read"]
        == sum(int(model.experts.nbytes[1, e].sum()) for e in (3, 4, 5))
    )
    h = cache.acquire(layer, [4, 3])
    assert h.hits == (True, True)
    cache.release(h)
    assert cache.stats["hits"] == 2 and cache.stats["prefetch_hits"] == 2
    cache.close()


@pytest.mark.parametrize(
    "cache_mode, policy", [("pagecache", "lru"), ("dontneed", "lrfu_bypass"), ("direct", "auto")]
)
def test_threads_stress(model, cache_mode, policy):
    """Several threads acquire and release random experts: right bytes, no deadlock, sums add up."""
    t = model.experts
    n_threads, iters, k = 4, 60, 2
    cs = CacheSettings(policy=policy)
    plan = plan_for_slots(
        model, n_threads * k + 4 + (k if policy == "lrfu_bypass" else 0), cache_mode, cs
    )
    io = IOSettings(threads=3, mode="split", split=2, cache_mode=cache_mode)
    cache = ExpertCache(model, plan, io, cs)
    lookups = Counter()
    errors = []

    def work(seed):
        rng = random.Random(seed)
        try:
            for _ in range(iters):
                layer = rng.choice(t.layers)
                ids = rng.sample(range(t.n_expert), rng.randint(1, k))
                h = cache.acquire(layer, ids)
                for i in h.ready_order():
                    h.wait(i)
                check_views(model, h)
                cache.release(h)
                lookups[seed] += len(ids)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads), "deadlock"
    assert not errors, errors[0]
    s = cache.stats
    assert s["lookups"] == sum(lookups.values()) == s["hits"] + s["misses"]
    assert sum(v[0] for v in s["layers"].values()) == s["lookups"]
    assert s["read_ms"] > 0 and s["wait_ms"] >= 0 and s["read_errors"] == 0
    cache.close()


def test_truncated_file_stops_the_cache(tmp_path):
    """A file truncated after open is a changed file: the next acquire fails, one line.
    (A read that fails in an unchanged file fails its waiting expert only: test_io_faults.)"""
    model = make_model(tmp_path / "t.bin", n_layers=2, n_expert=4, k=2)
    cache = ExpertCache(model, plan_for_slots(model, 4))
    layer = model.experts.layers[1]
    os.truncate(model.path, int(model.experts.offsets[1, 3, 1]) + 5)  # cuts expert 3's up
    with pytest.raises(ReadError, match=r"t\.bin: the model file changed .* size changed"):
        cache.acquire(layer, [0, 3])
    cache.close()


def test_route_log_round_trip(tmp_path):
    path = tmp_path / "routes.jsonl"
    log = RouteLog(path)
    log.write("decode", 7, 2, [5, 1], [0.75, 0.25])
    log.write_batch("prefill", 0, 1, np.array([[1, 2], [3, 4]]), np.array([[0.5, 0.5], [0.9, 0.1]]))
    assert not path.exists()  # written under a temporary name until closed
    log.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records[0] == {
        "phase": "decode",
        "pos": 7,
        "layer": 2,
        "experts": [5, 1],
        "weights": [0.75, 0.25],
    }
    assert [r["pos"] for r in records[1:]] == [0, 1] and records[2]["experts"] == [3, 4]
    assert records[2]["weights"] == [0.9, 0.1]


def test_bad_ids_are_rejected(model):
    cache = ExpertCache(model, plan_for_slots(model, 4))
    with pytest.raises(ValueError, match="distinct"):
        cache.acquire(1, [1, 1])
    with pytest.raises(ValueError, match="out of range"):
        cache.acquire(1, [8])
    cache.close()


def test_streaming_overflow_admits_instead_of_failing(model):
    cs = CacheSettings(policy="lrfu_bypass")
    cache = ExpertCache(model, plan_for_slots(model, 4, cache=cs), settings=cs)  # 2 cache + K
    layer = model.experts.layers[2]
    for _ in range(3):  # experts 0 and 1 score ~3: a first-seen expert is weaker
        cache.release(cache.acquire(layer, [0, 1]))
    h = cache.acquire(layer, [2, 3, 4])  # K = 2 streaming slots for 3 weaker misses
    check_views(model, h)
    cache.release(h)
    s = cache.stats
    assert (s["bypassed"], s["overflow_admits"], s["evictions"]) == (2, 1, 1)
    assert cache.cached(layer) == [1, 4]  # 4 took the least recent slot (0's)
    assert s["layers"][layer] == [9, 4, 5]
    assert s["reads"] >= 15 and s["io_busy_ms"] > 0
    cache.close()
