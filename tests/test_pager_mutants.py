"""sdq.paging.cache and sdq.paging.policies: pins, close, the counters and each policy's victim,
checked one decision at a time (tests/mutation/REPORT.md lists what the suite must catch)."""

from __future__ import annotations

import time

import pytest
from pager_support import make_model

from sdq.errors import ParamsError, PlanError
from sdq.paging.cache import COUNTERS, CacheSettings, ExpertCache
from sdq.paging.policies import POLICIES, min_slots, split_slots
from sdq.paging.reads import IOSettings
from sdq.run.plan import plan_for_slots


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("mut") / "experts.bin", n_layers=3, n_expert=8, k=2)


def _cache(model, slots, policy="lru", prefetch=0, **io):
    cs = CacheSettings(policy=policy, prefetch_slots=prefetch)
    return ExpertCache(model, plan_for_slots(model, slots, cache=cs), IOSettings(**io), cs)


def _bytes(model, layer, e):
    return b"".join(model.expert_bytes(layer, e))


def _check(model, h):
    for i, e in enumerate(h.experts):
        h.wait(i)
        assert b"".join(v.tobytes() for v in h.views(i)) == _bytes(model, h.layer, e)


def test_a_second_release_does_not_unpin_again(model):
    """Two handles pin the same experts; releasing the first twice leaves the second's pins:
    every slot stays pinned and a third acquire of other experts has nothing to evict."""
    layer = model.experts.layers[0]
    cache = _cache(model, 2)
    h1 = cache.acquire(layer, [0, 1])
    h2 = cache.acquire(layer, [0, 1])
    assert h2.hits == (True, True)
    cache.release(h1)
    cache.release(h1)
    assert h1.released
    with pytest.raises(PlanError):
        cache.acquire(layer, [2, 3])
    _check(model, h2)  # the second handle's bytes are still there
    cache.release(h2)
    h3 = cache.acquire(layer, [2, 3])  # now both slots can be evicted
    _check(model, h3)
    cache.release(h3)
    assert cache.stats["evictions"] == 2
    cache.close()


def test_acquire_and_prefetch_after_close_are_refused(model):
    cache = _cache(model, 4)
    layer = model.experts.layers[0]
    cache.release(cache.acquire(layer, [0]))
    cache.close()
    cache.close()  # a second close is a no-op
    with pytest.raises(ValueError, match="the expert cache is closed"):
        cache.acquire(layer, [1])
    with pytest.raises(ValueError, match="the expert cache is closed"):
        cache.prefetch(layer, [1])


def test_a_lookup_of_a_read_in_flight_is_an_inflight_hit(model):
    """The second lookup of an expert whose read nobody has waited for yet is a hit on a read
    in flight; once waited for, the next lookup is a plain hit."""
    layer = model.experts.layers[2]
    with _cache(model, 4) as cache:
        h1 = cache.acquire(layer, [5])
        assert h1.hits == (False,) and h1.pending[0] is not None
        batch = h1.pending[0][0]
        batch.done = lambda group: False  # a slow device: the read is still running
        h2 = cache.acquire(layer, [5])
        del batch.done
        assert h2.hits == (True,) and h2.pending[0] == h1.pending[0]
        s = cache.stats
        assert (s["lookups"], s["hits"], s["misses"], s["inflight_hits"]) == (2, 1, 1, 1)
        _check(model, h2)
        _check(model, h1)
        cache.release(h1)
        cache.release(h2)
        h3 = cache.acquire(layer, [5])
        assert h3.hits == (True,) and h3.pending == [None] and h3.ready_order() == [0]
        cache.release(h3)
        s = cache.stats
        assert (s["lookups"], s["hits"], s["misses"], s["inflight_hits"]) == (3, 2, 1, 1)


def test_counters_of_a_plain_run(model):
    """Every counter after a short run, worked out by hand (lru, 3 slots, K=2)."""
    t = model.experts
    L0, L1 = t.layers[0], t.layers[1]
    size = [int(t.nbytes[r].sum(axis=1)[0]) for r in range(3)]  # one expert's bytes per row
    with _cache(model, 3) as cache:
        for layer, ids in ((L0, [0, 1]), (L0, [1, 2]), (L1, [0]), (L0, [2, 1])):
            h = cache.acquire(layer, ids)
            _check(model, h)
            cache.release(h)
        s = cache.stats
    # L0 {0,1}: 2 misses; L0 {1,2}: 1 hit, 1 miss (free slot); L1 {0}: miss, evicts L0e0;
    # L0 {2,1}: 2 hits
    assert (s["lookups"], s["hits"], s["misses"], s["evictions"]) == (7, 3, 4, 1)
    assert s["hit_rate"] == 3 / 7
    assert s["lookup_expert_bytes"] == 6 * size[0] + size[1]
    assert s["expert_bytes_read"] == s["bytes_read"] == 3 * size[0] + size[1]
    assert s["reads_avoided"] == pytest.approx(
        1 - (3 * size[0] + size[1]) / (6 * size[0] + size[1])
    )
    assert s["reads"] > 0 and s["read_ms"] >= 0 and s["io_busy_ms"] >= 0 and s["wait_ms"] >= 0
    for name in ("bypassed", "inflight_hits", "prefetches", "prefetch_hits", "prefetch_unused"):
        assert s[name] == 0, name
    assert s["read_errors"] == s["overflow_admits"] == s["prefetch_bytes_read"] == 0
    assert s["prefetch_hit_rate"] == 0.0
    assert s["layers"] == {L0: [6, 3, 3], L1: [1, 0, 1], t.layers[2]: [0, 0, 0]}
    assert (s["policy"], s["slots"], s["cached"], s["streamed"]) == ("lru", 3, 3, 0)
    assert s["slot_bytes"] == cache.plan.slot_bytes
    assert set(COUNTERS) <= set(s)


def test_rates_are_zero_before_the_first_lookup(model):
    with _cache(model, 2) as cache:
        s = cache.stats
        assert s["hit_rate"] == s["prefetch_hit_rate"] == s["reads_avoided"] == 0.0
        assert s["lookups"] == 0 and s["cached"] == 0


def test_lru_evicts_the_least_recent_and_never_a_requested_expert(model):
    layer = model.experts.layers[0]
    with _cache(model, 3) as cache:
        for ids in ([0, 1], [2], [0]):  # recency now 1, 2, 0
            cache.release(cache.acquire(layer, ids))
        h = cache.acquire(layer, [3, 1])  # 1 is requested: 3 evicts 2, not 1
        assert h.hits == (False, True)
        cache.release(h)
        assert cache.cached(layer) == [0, 1, 3]
        h = cache.acquire(layer, [4])  # least recent now 0
        cache.release(h)
        assert cache.cached(layer) == [1, 3, 4]


def test_prefetch_counts_and_skips(model):
    layer = model.experts.layers[1]
    size = int(model.experts.nbytes[1].sum(axis=1)[0])
    with _cache(model, 3) as cache:
        h = cache.acquire(layer, [0, 1])
        assert cache.prefetch(layer, [0, 2, 3]) == 1  # 0 cached, 2 takes the free slot, 3 none
        s = cache.stats
        assert s["prefetches"] == 1 and s["prefetch_bytes_read"] == size
        assert s["lookups"] == 2  # a prefetch is not a lookup
        cache.release(h)
        h = cache.acquire(layer, [2])
        assert h.hits == (False,)
        _check(model, h)
        cache.release(h)
        s = cache.stats
        assert (s["hits"], s["misses"], s["prefetch_hits"]) == (0, 3, 1)
        assert s["prefetch_hit_rate"] == 1 / 3


def test_bypass_counts_streamed_misses(model):
    """lrfu_bypass with K cache slots: once they hold an expert that was requested twice, a
    new expert requested once streams past the cache (bypassed) and is not cached."""
    layer = model.experts.layers[0]
    with _cache(model, 4, policy="lrfu_bypass") as cache:  # 2 streaming + 2 cache
        for _ in range(2):
            cache.release(cache.acquire(layer, [0, 1]))
        h = cache.acquire(layer, [2])
        assert h.hits == (False,) and h.entries == [None]
        _check(model, h)
        cache.release(h)
        s = cache.stats
        assert s["bypassed"] == 1 and s["evictions"] == 0 and s["policy"] == "lrfu_bypass"
        assert cache.cached(layer) == [0, 1]


def test_bad_ids_and_settings(model):
    with _cache(model, 2) as cache:
        layer = model.experts.layers[0]
        with pytest.raises(ValueError, match="distinct"):
            cache.acquire(layer, [1, 1])
        with pytest.raises(ValueError, match=r"expert 8 out of range 0\.\.7"):
            cache.acquire(layer, [8])
        with pytest.raises(ValueError, match=r"expert -1 out of range"):
            cache.acquire(layer, [-1])
        h = cache.acquire(layer, [0, 7])
        cache.release(h)
    with pytest.raises(ParamsError, match="cache policy 'nope'"):
        CacheSettings(policy="nope")
    with pytest.raises(ParamsError, match="half_life 0"):
        CacheSettings(half_life=0)
    with pytest.raises(ParamsError, match="prefetch_slots -1"):
        CacheSettings(prefetch_slots=-1)
    assert CacheSettings(prefetch_slots=0).prefetch_slots == 0
    assert CacheSettings().policy == "auto" and CacheSettings().half_life == 32.0


def test_slot_needs_per_policy():
    assert POLICIES == ("auto", "lru", "lrfu_bypass", "layer_lrfu")
    assert min_slots("lru", 2, 3) == 2
    assert min_slots("layer_lrfu", 2, 3) == 2
    assert min_slots("lrfu_bypass", 2, 3) == 2 + 2 + 3
    split = split_slots("lrfu_bypass", 10, 4, 2, 1)
    assert (split.policy, split.cache, split.streaming) == ("lrfu_bypass", 7, 3)
    lru = split_slots("lru", 10, 4, 2, 1)
    assert (lru.policy, lru.cache, lru.streaming) == ("lru", 10, 0)


@pytest.mark.parametrize("policy", ["lru", "layer_lrfu"])
def test_an_expert_requested_later_in_the_same_acquire_is_not_evicted(model, policy):
    """Two slots: one pinned by an open handle, the other holds an expert this acquire requests
    after a miss. The miss may evict neither, so the acquire fails as 'all pinned', and rolls
    back: the open handle's expert and the requested one stay cached."""
    layer = model.experts.layers[1]
    with _cache(model, 2, policy=policy) as cache:
        cache.release(cache.acquire(layer, [4]))
        held = cache.acquire(layer, [3])
        with pytest.raises(PlanError, match="pinned or loading"):
            cache.acquire(layer, [6, 4])
        assert cache.cached(layer) == [3, 4]
        cache.release(held)
        h = cache.acquire(layer, [6, 4])  # now 3 can go
        assert h.hits == (False, True)
        _check(model, h)
        cache.release(h)
        assert cache.cached(layer) == [4, 6]


def test_ready_order_puts_the_experts_without_a_read_first(model):
    layer = model.experts.layers[0]
    with _cache(model, 4) as cache:
        h = cache.acquire(layer, [2])
        _check(model, h)
        cache.release(h)
        h = cache.acquire(layer, [5, 2, 6])  # miss, hit, miss
        assert h.hits == (False, True, False)
        assert [p is None for p in h.pending] == [False, True, False]
        assert h.ready_order() == [1, 0, 2]
        _check(model, h)
        cache.release(h)


def test_a_failed_acquire_unpins_its_hits(model):
    """An acquire whose hit was pinned before a later miss found no slot gives the pin back:
    once the other handle is released, both slots can be evicted."""
    layer = model.experts.layers[0]
    with _cache(model, 2) as cache:
        cache.release(cache.acquire(layer, [0]))
        held = cache.acquire(layer, [1])
        with pytest.raises(PlanError):
            cache.acquire(layer, [0, 5])  # 0 hits (pinned), 5 has no slot
        cache.release(held)
        h = cache.acquire(layer, [7, 6])  # evicts 0 and 1
        _check(model, h)
        cache.release(h)
        assert cache.cached(layer) == [6, 7]


def test_prefetch_into_cache_slots_pins_until_submitted(model):
    """A prefetch whose second expert finds no slot does not evict its first (not yet read):
    one started; the prefetched expert is evictable afterwards."""
    layer = model.experts.layers[1]
    with _cache(model, 3) as cache:
        held = cache.acquire(layer, [0, 1])
        assert cache.prefetch(layer, [2, 3]) == 1
        assert cache.cached(layer) == [0, 1, 2]
        cache.release(held)
        h = cache.acquire(layer, [2])  # served by the prefetch's read
        _check(model, h)
        cache.release(h)
        for ids in ([4, 5], [6, 7]):  # the prefetched expert is not pinned for ever
            h = cache.acquire(layer, ids)
            _check(model, h)
            cache.release(h)
        assert cache.cached(layer) == [5, 6, 7]


def test_a_prefetch_still_reading_is_waited_for(model, monkeypatch):
    """An acquire of an expert whose prefetch read is still running waits for that read."""
    from sdq.paging.reads import ReadBatch

    layer = model.experts.layers[2]
    with _cache(model, 3) as cache:
        monkeypatch.setattr(ReadBatch, "done", lambda self, group: False)  # a slow device
        assert cache.prefetch(layer, [4]) == 1
        h = cache.acquire(layer, [4])
        monkeypatch.undo()
        assert h.hits == (False,) and h.pending[0] is not None and h.ready_order() == [0]
        _check(model, h)
        cache.release(h)
        assert cache.stats["prefetch_hits"] == 1


def test_layer_lrfu_prefetch_ranks_victims_from_the_layer_being_computed(model):
    """Under layer_lrfu a prefetch for the next layer evicts from the layer computed last
    (visited again only next token), not from the layer it prefetches for; before any acquire
    the layer prefetched for counts as the current one."""
    t = model.experts
    with _cache(model, 3, policy="layer_lrfu") as cache:
        cache.release(cache.acquire(t.layers[1], [5]))
        cache.release(cache.acquire(t.layers[0], [0, 1]))  # arena full; table row 0 is now
        assert cache.prefetch(t.layers[1], [6]) == 1
        assert cache.cached(t.layers[1]) == [5, 6]
        assert len(cache.cached(t.layers[0])) == 1
    with _cache(model, 3, policy="layer_lrfu") as cache:
        assert cache.prefetch(t.layers[0], [0, 1]) == 2
        assert cache.prefetch(t.layers[2], [3]) == 1  # arena full, no acquire yet
        time.sleep(0.2)  # the prefetch reads (a few hundred bytes) finish: evictable
        # as if row 1 were current: row 2 is visited next, row 0 last: a row-0 expert goes
        assert cache.prefetch(t.layers[1], [7]) == 1
        assert cache.cached(t.layers[2]) == [3]
        assert len(cache.cached(t.layers[0])) == 1


def test_streamed_prefetches_used_and_unused(model):
    """lrfu_bypass with one prefetch slot: a prefetch the next acquire requests is a prefetch
    hit read once; one it does not request is dropped as unused and its slot comes back."""
    t = model.experts
    L0, L1 = t.layers[0], t.layers[1]
    with _cache(model, 6, policy="lrfu_bypass", prefetch=1) as cache:  # 3 streaming, 3 cache
        assert cache.prefetch(L1, [4]) == 1
        assert cache.stats["streamed"] == 1
        h = cache.acquire(L1, [4, 5])
        assert h.hits == (False, False)
        _check(model, h)
        cache.release(h)
        s = cache.stats
        assert (s["prefetches"], s["prefetch_hits"], s["prefetch_unused"]) == (1, 1, 0)
        assert s["misses"] == 2 and s["streamed"] == 0
        size = int(t.nbytes[1].sum(axis=1)[0])
        assert s["expert_bytes_read"] == 2 * size and s["prefetch_bytes_read"] == size
        assert cache.prefetch(L0, [6]) == 1
        h = cache.acquire(L0, [7])  # 6 not requested: a wrong guess
        _check(model, h)
        cache.release(h)
        s = cache.stats
        assert (s["prefetches"], s["prefetch_hits"], s["prefetch_unused"]) == (2, 1, 1)
        assert s["streamed"] == 0


def test_lookup_bytes_of_experts_of_different_sizes(tmp_path):
    """A layer whose experts differ in size: the all-miss bytes are summed expert by expert."""
    m = make_model(tmp_path / "sizes.bin", n_layers=2, n_expert=8, k=2)
    m.experts.nbytes[0, 3, :] -= 2  # expert 3 of the first layer reads 6 bytes less
    sizes = m.experts.nbytes.sum(axis=2)  # [L, E]
    layer = m.experts.layers[0]
    with _cache(m, 4) as cache:
        for ids in ([3, 1], [3], [2, 0]):
            cache.release(cache.acquire(layer, ids))
        s = cache.stats
    want = int(2 * sizes[0, 3] + sizes[0, 1] + sizes[0, 2] + sizes[0, 0])
    assert s["lookup_expert_bytes"] == want
    assert s["expert_bytes_read"] == want - int(sizes[0, 3])
    assert int(sizes[0, 3]) == int(sizes[0, 1]) - 6


def test_verify_checks_each_read_once_and_drops_a_bad_expert(model):
    """verify: a slot byte flipped after the read is a ReadError naming the expert, the expert
    is dropped (and read again, right, by the next acquire); a hit is not checked again."""
    from sdq.errors import ReadError
    from sdq.paging.reads import IOSettings

    cache = ExpertCache(model, plan_for_slots(model, 4), IOSettings(threads=2, verify=True))
    layer = model.experts.layers[0]
    h = cache.acquire(layer, [1, 3])
    for read in h.pending:
        read[0].wait_all()
    off = cache.layout.view_offset(int(model.experts.offsets[0, 3, 0]), 0)
    cache.arena.slot(h.slots[1])[off] ^= 0xFF  # the first byte of expert 3's gate
    h.wait(0)
    with pytest.raises(ReadError, match=r"layer 1 expert 3 gate"):
        h.wait(1)
    cache.release(h)
    assert cache.cached(layer) == [1]
    h = cache.acquire(layer, [1, 3])  # 1 hits (checked already), 3 is read again
    assert h.hits == (True, False)
    _check(model, h)
    cache.release(h)
    slot = h.slots[0]
    cache.arena.slot(slot)[0] ^= 0xFF  # a hit's bytes are not checked again
    h = cache.acquire(layer, [1])
    h.wait(0)
    cache.release(h)
    cache.arena.slot(slot)[0] ^= 0xFF
    assert cache.stats["read_errors"] >= 1
    cache.close()


def test_a_failed_read_drops_its_expert_only(model):
    """A read that fails (the pool reports an error: here its wait raises) fails that expert's
    wait once; the expert is dropped, release works, and the next acquire reads it again."""
    from sdq.errors import ReadError

    layer = model.experts.layers[2]
    with _cache(model, 4) as cache:
        h = cache.acquire(layer, [0, 5])
        batch, bad = h.pending[1]
        batch.wait_all()
        real_wait = batch.wait

        def failed(group):
            if group == bad:
                raise ReadError("expert 5: short read")
            real_wait(group)

        batch.wait = failed
        h.wait(0)
        with pytest.raises(ReadError, match="short read"):
            h.wait(1)
        assert h.pending[1] is None
        h.wait(1)  # nothing left to wait for
        del batch.wait
        cache.release(h)
        assert cache.cached(layer) == [0]
        h = cache.acquire(layer, [5])
        assert h.hits == (False,)
        _check(model, h)
        cache.release(h)
        assert cache.stats["wait_ms"] >= 0
