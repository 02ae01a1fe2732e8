"""The best cache on a run's own decode, and the token time against the I/O ceiling
(sdq.measure.ceiling).

Dimension key: N lookup groups, K experts per group, S cache slots, M keys.
"""

import json
import math
from itertools import combinations

import numpy as np
import pytest

from sdq.cli import main
from sdq.measure.ceiling import run_report
from sdq.measure.optimum import DecodeRoutes, optimal_cost, token_time
from sdq.run.session import Session
from sdq.run.settings import RunSettings

PROMPT = "Hello there, how are you doing today my friend? Tell me about the sea."


def brute_force(groups, slots, initial=(), weight=None) -> int:
    """The least cost over every sequence of cache contents: after each group the cache holds
    the group's hits and any of the other keys it held or the group requested, at most `slots`;
    a missed key costs weight[key] (1 without weights)."""
    states = {frozenset(initial): 0}
    for row in np.asarray(groups).tolist():
        group = frozenset(k for k in row if k >= 0)
        nxt: dict[frozenset, int] = {}
        for state, cost in states.items():
            cost += sum(1 if weight is None else int(weight[k]) for k in group - state)
            must = group & state
            optional = sorted((state | group) - must)
            for r in range(0, min(slots - len(must), len(optional)) + 1):
                for extra in combinations(optional, r):
                    s = must | frozenset(extra)
                    if cost < nxt.get(s, 1 << 60):
                        nxt[s] = cost
        states = nxt
    return min(states.values())


def random_case(rng, n_keys=6, k=2, n=7):
    groups = np.full((n, k), -1, dtype=np.int64)  # [N, K]
    for g in range(n):
        width = int(rng.integers(1, k + 1))
        groups[g, :width] = rng.choice(n_keys, size=width, replace=False)
    return groups


@pytest.mark.parametrize("seed", range(60))
def test_optimum_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    groups = random_case(rng)
    slots = int(rng.integers(2, 5))
    initial = set(rng.choice(6, size=int(rng.integers(0, slots + 1)), replace=False).tolist())
    assert optimal_cost(groups, slots) == brute_force(groups, slots)
    assert optimal_cost(groups, slots, initial) == brute_force(groups, slots, initial)
    # bytes: a lower bound with unequal sizes, exact with equal ones
    weight = rng.integers(1, 9, size=6)  # [M] bytes per key
    exact = brute_force(groups, slots, initial, weight)
    assert optimal_cost(groups, slots, initial, weight) <= exact
    same = np.full(6, 7)
    assert optimal_cost(groups, slots, initial, same) == 7 * brute_force(groups, slots, initial)


def test_bytes_bound_is_below_the_optimum_somewhere():
    """The case where letting a hit go pays (optimal_cost's docstring): key 3 is cached at the
    start and requested with key 2; the flow frees 3's slot for 2, which a cache cannot."""
    groups = np.array([[3, 2], [0, -1], [4, -1], [4, 2], [4, 3], [0, 2], [4, 2]])  # [N, K]
    weight = np.array([2, 6, 3, 2, 5, 8])
    assert brute_force(groups, 2, {3, 4}, weight) == 12
    assert optimal_cost(groups, 2, {3, 4}, weight) == 11


def test_a_free_start_saves_exactly_the_first_lookups_it_holds():
    groups = np.array([[0, 1], [2, 3], [0, 1], [2, 3]])  # [N, K]
    assert optimal_cost(groups, 2) == 6  # 0,1 kept for group 2; 2,3 read twice
    assert optimal_cost(groups, 2, {0, 1}) == 4
    assert optimal_cost(groups, 4, {0, 1, 2, 3}) == 0
    with pytest.raises(ValueError):
        optimal_cost(groups, 2, {0, 1, 2})


def paged_run(model, slots, policy, prefetch=None, n=20):
    """A paged decode on the tiny model with the routes kept; -> (session, generation, routes)."""
    settings = RunSettings(
        model=str(model),
        n_ctx=256,
        n_ubatch=32,
        n_predict=n,
        stop_at_eos=False,
        max_slots=slots,
        cache_policy=policy,
        prefetch_next=prefetch,
        cache_mode="pagecache",
        ram_budget_mb=4096,
    )
    session = Session(settings)
    routes = DecodeRoutes(session.experts, session.engine.route_log)
    session.engine.route_log = routes
    g = session.generate(session.tokenizer.encode(PROMPT))
    return session, g, routes


CAPPED = [(6, "lrfu_bypass", None), (4, "layer_lrfu", None), (5, "lru", 0), (7, "lru", None)]


@pytest.mark.parametrize("slots,policy,prefetch", CAPPED)
def test_optimum_never_above_the_pager(tiny_model, slots, policy, prefetch):
    session, g, routes = paged_run(tiny_model, slots, policy, prefetch)
    try:
        report = run_report(session.figures(g), g.profile["decode"], routes, None)
        opt = report["optimum"]
        stats = routes.decode_stats()
        K = session.model.spec.n_expert_used
        assert opt["policy"] == policy
        assert opt["lookups"] == stats["lookups"] == g.figures["n_decode"] * 2 * K  # 2 layers
        assert opt["cache_slots"] == session.plan.slot_split.cache
        if policy == "lrfu_bypass":  # K streaming slots for bypassed misses + the prefetch width
            assert opt["cache_slots"] == slots - K - session.prefetch_next
        else:
            assert opt["cache_slots"] == slots
        assert 0 < opt["optimum_misses"] <= opt["pager_misses"]
        assert opt["optimum_expert_bytes"] <= opt["pager_expert_bytes"]
        sizes = routes.key_bytes()  # [M]
        assert opt["bytes_optimum_exact"] == bool((sizes == sizes[0]).all())
        assert opt["misses_vs_optimum"] >= 1.0 and opt["bytes_vs_optimum"] >= 1.0
        # the pager's misses agree with its decode hit rate
        assert opt["pager_misses"] == round(opt["lookups"] * (1 - g.figures["hit_rate"]))
        # the optimum without the prefill's cache contents can only be worse or equal
        cold = optimal_cost(routes.groups(), opt["cache_slots"])
        assert cold >= opt["optimum_misses"]
    finally:
        session.close()


def test_token_time_parts_add_up_and_none_is_negative(tiny_model):
    session, g, routes = paged_run(tiny_model, 6, "lrfu_bypass")
    try:
        fig, prof = g.figures, g.profile["decode"]
        tt = token_time(fig, prof)
        assert sum(tt.parts.values()) == pytest.approx(tt.total_ms, rel=1e-9)
        assert tt.total_ms == pytest.approx(1e3 / fig["decode_tok_s"], rel=1e-6)
        # the marks are disjoint stretches of each pass: every part >= 0 (timer noise aside)
        for name, ms in tt.parts.items():
            assert ms > -0.01, (name, ms)
        assert fig["forward_ms_per_token"] <= tt.total_ms
        assert fig["no_read_ms_per_token"] < fig["forward_ms_per_token"]
        assert tt.io_wait_ms == prof["io_wait"]
    finally:
        session.close()


def capped_chat_json(model, profile_path, measured, capsys) -> dict:
    """sdq chat --json on the tiny model with 6 slots under lrfu_bypass and an I/O profile
    whose `measured` part is given."""
    profile_path.write_text(
        json.dumps(
            {
                "version": 1,
                "io_threads": 4,
                "io_split": 1,
                "cache_mode": "direct",
                "device": {},
                "measured": measured,
            }
        )
    )
    rc = main(
        ["chat", "-m", str(model), "-p", PROMPT, "-n", "12", "-c", "256", "--max-slots", "6",
         "--cache-policy", "lrfu_bypass", "--io-profile", str(profile_path), "--json",
         "--ignore-eos"]
    )  # fmt: skip
    assert rc == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_chat_json_reports_optimum_and_ceiling(tiny_model, tmp_path, capsys):
    # a probe profile as sdq probe writes it, with a bandwidth of 400 MB/s
    measured = {"size": 131072, "best_mb_s": 400.0}
    d = capped_chat_json(tiny_model, tmp_path / "profile.json", measured, capsys)
    opt, c = d["optimum"], d["ceiling"]
    for key in ("optimum_misses", "pager_misses", "misses_vs_optimum", "bytes_vs_optimum"):
        assert math.isfinite(opt[key]), key
    assert c["bandwidth_mb_s"] == 400.0 and "direct" in c["bandwidth_note"]
    assert c["io_ceiling_tok_s"] == pytest.approx(400.0 / d["ssd_mb_per_token"])
    assert d["io_ceiling_tok_s"] == c["io_ceiling_tok_s"]
    assert d["io_ceiling_fraction"] == pytest.approx(d["decode_tok_s"] / c["io_ceiling_tok_s"])
    for key in ("io_ceiling_fraction", "bound_tok_s", "bound_fraction", "no_wait_tok_s"):
        assert math.isfinite(c[key]), key
    parts = c["token_time"]
    assert set(parts) == {"total_ms", "no_read_ms", "io_wait_ms", "pager_ms", "compute_ms"}
    assert all(math.isfinite(v) for v in parts.values())
    total = parts.pop("total_ms")
    assert sum(parts.values()) == pytest.approx(total)


def test_chat_json_without_a_measured_bandwidth(tiny_model, tmp_path, capsys):
    d = capped_chat_json(tiny_model, tmp_path / "profile.json", {}, capsys)
    c = d["ceiling"]
    assert c["bandwidth_mb_s"] is None and c["io_ceiling_tok_s"] is None
    assert c["bandwidth_note"].startswith("no bandwidth")
    assert c["bound_by"] == "compute" and math.isfinite(d["optimum"]["misses_vs_optimum"])
