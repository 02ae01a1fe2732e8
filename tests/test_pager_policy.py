"""The pager's lrfu_bypass policy against the cache simulation of the same name: on one route
trace, the arena hits and misses exactly where sdq.analysis.simulate says it does.

Dimension key: T tokens, L MoE layers, E experts per layer, K experts per token.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pager_support import make_model

from sdq.analysis.replay import global_stream
from sdq.analysis.simulate import PolicyParams, simulate_groups
from sdq.errors import ParamsError, PlanError
from sdq.paging.cache import CacheSettings, ExpertCache
from sdq.run.plan import plan_for_slots

L, E, K = 3, 8, 2


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model(
        tmp_path_factory.mktemp("policy") / "experts.bin", n_layers=L, n_expert=E, k=K
    )


def skewed_trace(seed: int, tokens: int) -> np.ndarray:
    """int [T, L, K]: per layer a Zipf-like popularity, K distinct experts per token."""
    rng = np.random.default_rng(seed)
    out = np.empty((tokens, L, K), dtype=np.int64)
    for layer in range(L):
        p = 1.0 / np.arange(1, E + 1) ** 1.2
        p = p[rng.permutation(E)]
        p /= p.sum()
        for t in range(tokens):
            out[t, layer] = rng.choice(E, K, replace=False, p=p)
    return out


def open_cache(model, settings, slots):
    return ExpertCache(model, plan_for_slots(model, slots, cache=settings), settings=settings)


def replay(model, trace, settings, slots):
    """Acquires the trace token by token, layer by layer; -> (misses per token, stats)."""
    misses = []
    with open_cache(model, settings, slots) as cache:
        for token in trace:
            n = 0
            for row, ids in enumerate(token):
                h = cache.acquire(model.experts.layers[row], ids)
                for i in range(len(ids)):
                    h.wait(i)
                want = model.expert_bytes(h.layer, int(ids[-1]))
                assert [v.tobytes() for v in h.views(len(ids) - 1)] == want
                n += h.hits.count(False)
                cache.release(h)
            misses.append(n)
        return np.array(misses), cache.stats


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 10_000),
    slots=st.integers(2 * K, L * K - 1),
    half_life=st.sampled_from([1.0, 4.0, 32.0]),
)
def test_global_arena_equals_simulation(model, seed, slots, half_life):
    trace = skewed_trace(seed, tokens=40)  # [T, L, K]
    cs = CacheSettings(policy="lrfu_bypass", half_life=half_life)
    misses, stats = replay(model, trace, cs, slots)
    groups = global_stream(trace, E)  # [T*L, K]
    params = PolicyParams(half_life=half_life, n_layer=L, n_expert=E)
    # cumulative misses after every token, not just the total
    expect = [
        simulate_groups(groups[: (t + 1) * L], L * E, slots, "lrfu_bypass", params)
        for t in range(len(trace))
    ]
    assert np.cumsum(misses).tolist() == expect
    assert stats["policy"] == "lrfu_bypass"
    assert stats["misses"] == expect[-1] and stats["lookups"] == trace.size
    assert stats["bypassed"] > 0  # the policy did read past the cache
    assert stats["cached"] <= slots - K  # K slots stream


def test_beats_lru_where_a_token_does_not_fit(model):
    trace = skewed_trace(3, tokens=80)
    slots = L * K - 1
    lru, _ = replay(model, trace, CacheSettings(policy="lru"), slots)
    bypass, _ = replay(model, trace, CacheSettings(policy="lrfu_bypass"), slots)
    assert bypass.sum() < lru.sum()


def test_auto_picks_by_arena_size(model):
    cases = [  # (slots, prefetch slots, policy)
        (2 * K, 0, "lrfu_bypass"),
        (L * K - 1, 0, "lrfu_bypass"),
        (L * K, 0, "layer_lrfu"),
        (2 * K - 1, 0, "layer_lrfu"),  # no room for K streaming slots beside K cached
        (2 * K, 1, "layer_lrfu"),  # nor for a prefetch slot besides
        (2 * K + 1, 1, "lrfu_bypass"),
    ]
    for slots, prefetch, want in cases:
        with open_cache(model, CacheSettings(prefetch_slots=prefetch), slots) as cache:
            assert cache.policy == want, slots
            streaming = K + prefetch if want == "lrfu_bypass" else 0
            assert cache.max_acquire == slots - streaming


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 10_000),
    slots=st.integers(K, L * E),
    half_life=st.sampled_from([1.0, 4.0, 32.0]),
)
def test_layer_lrfu_arena_equals_simulation(model, seed, slots, half_life):
    trace = skewed_trace(seed, tokens=30)  # [T, L, K]
    cs = CacheSettings(policy="layer_lrfu", half_life=half_life)
    misses, stats = replay(model, trace, cs, slots)
    groups = global_stream(trace, E)  # [T*L, K]
    params = PolicyParams(half_life=half_life, n_layer=L, n_expert=E)
    expect = [
        simulate_groups(groups[: (t + 1) * L], L * E, slots, "layer_lrfu", params)
        for t in range(len(trace))
    ]
    assert np.cumsum(misses).tolist() == expect
    assert stats["policy"] == "layer_lrfu" and stats["bypassed"] == 0


def test_bad_settings_are_one_line_errors(model):
    with pytest.raises(ParamsError, match="cache policy 'mru'"):
        CacheSettings(policy="mru")
    with pytest.raises(ParamsError, match="half_life 0"):
        CacheSettings(half_life=0)
    with pytest.raises(ParamsError, match="prefetch_slots -1"):
        CacheSettings(prefetch_slots=-1)
    with pytest.raises(PlanError, match="slots cannot hold"):
        open_cache(model, CacheSettings(policy="lrfu_bypass"), K + 1)


def replay_prefetching(model, trace, settings, slots, guess):
    """Like replay, but after each acquire prefetches guess(t, row) for the next layer, as the
    engine does (the last layer's guess is the next token's layer 0)."""
    misses = []
    flat = [(t, row) for t in range(len(trace)) for row in range(L)]
    with open_cache(model, settings, slots) as cache:
        n = 0
        for i, (t, row) in enumerate(flat):
            ids = trace[t, row]
            h = cache.acquire(model.experts.layers[row], ids)
            if i + 1 < len(flat):
                t1, row1 = flat[i + 1]
                cache.prefetch(model.experts.layers[row1], guess(t1, row1))
            for j, e in enumerate(ids):
                h.wait(j)
                want = model.expert_bytes(h.layer, int(e))
                assert [v.tobytes() for v in h.views(j)] == want
            n += h.hits.count(False)
            cache.release(h)
            if row == L - 1:
                misses.append(n)
                n = 0
        return np.array(misses), cache.stats


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 10_000), slots=st.integers(2 * K, L * K - 1), right=st.floats(0, 1))
def test_streamed_prefetch_changes_no_cache_decision(model, seed, slots, right):
    """Prefetches (right with probability `right`, else random experts) read into their own
    streaming slots: the misses stay the simulation's, used prefetches read nothing again,
    wrong ones are counted, and every view holds its expert's bytes."""
    trace = skewed_trace(seed, tokens=30)
    rng = np.random.default_rng(seed + 1)

    def guess(t, row):
        if rng.random() < right:
            return trace[t, row]
        return rng.choice(E, K, replace=False)

    cs = CacheSettings(policy="lrfu_bypass", half_life=8.0, prefetch_slots=K)
    misses, stats = replay_prefetching(model, trace, cs, slots + K, guess)
    plain, plain_stats = replay(
        model, trace, CacheSettings(policy="lrfu_bypass", half_life=8.0), slots
    )
    assert misses.tolist() == plain.tolist()
    s = stats
    assert s["prefetches"] == s["prefetch_hits"] + s["prefetch_unused"] + s["streamed"]
    # a used prefetch replaces a read; a wrong one is an extra read
    assert s["expert_bytes_read"] >= plain_stats["expert_bytes_read"]
    if right == 1.0:
        assert s["prefetch_unused"] == 0 and s["prefetch_hits"] > 0
        assert s["expert_bytes_read"] == plain_stats["expert_bytes_read"]


def test_perfect_prefetch_serves_every_miss(model):
    trace = skewed_trace(11, tokens=40)
    cs = CacheSettings(policy="lrfu_bypass", half_life=8.0, prefetch_slots=K)
    misses, s = replay_prefetching(model, trace, cs, L * K - 1 + K, lambda t, row: trace[t, row])
    # all misses but the very first acquire's were prefetched
    assert s["prefetch_hits"] == s["misses"] - K == int(misses.sum()) - K
