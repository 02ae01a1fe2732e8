"""The best cache on a run's own decode, and the token time against the I/O ceiling
(sdq.measure.ceiling).

Dimension key: N lookup groups, K experts per group, S cache slots, M keys.
"""

import json
import math
from itertools import combinations
from types import SimpleNamespace

import numpy as np
import pytest

from sdq.cli import main
from sdq.measure.ceiling import run_report
from sdq.measure.optimum import DecodeRoutes, optimal_cost, optimum_report, token_time
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


# --- DecodeRoutes and optimum_report on a pager small enough to count by hand ----------------


class _Table:
    """Two MoE layers (3 and 5: table rows 0 and 1) of 4 experts; nbytes [rows, E, 3]."""

    n_expert = 4
    layers = (3, 5)

    def __init__(self, nbytes):
        self.nbytes = nbytes

    def row(self, layer):
        return self.layers.index(layer)


class _Pager:
    """What DecodeRoutes and optimum_report read of an ExpertCache."""

    def __init__(self, nbytes, cached):
        self.table = _Table(nbytes)
        self.stats = {"lookups": 5, "misses": 2, "expert_bytes_read": 200, "bytes_read": 300}
        self._cached = cached
        split = SimpleNamespace(cache=8, streaming=1, policy="lru")
        self.plan = SimpleNamespace(slot_split=split)

    def cached(self, layer):
        return self._cached[layer]


class _Log:
    def __init__(self):
        self.calls = []

    def write_batch(self, *args):
        self.calls.append(args)


def _decode(routes, pager, tokens):
    """tokens: per token, the experts of layer 3 and of layer 5; each pass adds 1 miss."""
    for l3, l5 in tokens:
        routes.write_batch("decode", 0, 3, np.array([l3]))
        routes.write_batch("decode", 0, 5, np.array([l5]))
        pager.stats = {k: v + 100 if "bytes" in k else v + 1 for k, v in pager.stats.items()}


def test_decode_routes_keep_the_decode_as_global_keys_and_pass_every_record_on():
    nbytes = np.full((2, 4, 3), 10, np.int64)  # [rows, E, 3] every expert 30 bytes
    pager, log = _Pager(nbytes, {3: [0], 5: [2]}), _Log()
    routes = DecodeRoutes(pager, log)
    assert routes.groups().shape == (0, 1) and routes.groups().dtype == np.int64
    assert routes.decode_stats() == dict.fromkeys(("lookups", "misses", "expert_bytes_read",
                                                   "bytes_read"), 0)  # fmt: skip
    routes.write_batch("prefill", 0, 3, np.array([[1, 2], [0, 3]]), np.ones((2, 2)))
    assert routes.initial is None and routes.rows == []
    _decode(routes, pager, [([0, 1], [2, 3]), ([1, 0], [3, 1])])
    assert routes.initial == {0, 6}  # layer 3's expert 0, layer 5's expert 2 (row 1: 4 + 2)
    assert routes.groups().tolist() == [[0, 1], [6, 7], [1, 0], [7, 5]]
    assert routes.decode_stats() == {"lookups": 2, "misses": 2, "expert_bytes_read": 200,
                                     "bytes_read": 200}  # fmt: skip
    assert len(log.calls) == 5 and log.calls[0][0] == "prefill" and log.calls[-1][2] == 5
    assert routes.key_bytes().tolist() == [30] * 8
    routes.write_batch("prefill", 0, 3, np.array([[1, 2]]))  # a new generation starts over
    assert routes.initial is None and routes.rows == [] and routes.stats0 is None


def test_the_report_against_a_cache_of_every_key_by_hand():
    """8 slots hold every key: the optimum misses each decode key not cached at the start once
    (keys 1, 7, 5 with 0 and 6 cached); equal sizes make the bytes exact (3 x 30)."""
    nbytes = np.full((2, 4, 3), 10, np.int64)
    pager = _Pager(nbytes, {3: [0], 5: [2]})
    routes = DecodeRoutes(pager)
    _decode(routes, pager, [([0, 1], [2, 3]), ([1, 0], [3, 1])])
    report = optimum_report(routes)
    assert (report.policy, report.cache_slots, report.streaming_slots) == ("lru", 8, 1)
    assert (report.scope, report.initial_cached, report.lookups) == ("global", 2, 8)
    assert (report.pager_misses, report.optimum_misses, report.misses_vs_optimum) == (2, 3, 2 / 3)
    assert (report.pager_expert_bytes, report.optimum_expert_bytes) == (200, 90)
    assert report.bytes_optimum_exact and report.bytes_vs_optimum == 200 / 90
    nbytes[1, 1] = 100  # layer 5's expert 1 (key 5) is larger: the bytes come from the flow
    uneven = optimum_report(routes)
    assert not uneven.bytes_optimum_exact
    assert (uneven.optimum_misses, uneven.optimum_expert_bytes) == (3, 30 + 30 + 300)


def test_a_decode_with_nothing_to_read_has_no_ratio():
    pager = _Pager(np.full((2, 4, 3), 10, np.int64), {3: [0, 1], 5: [2, 3]})
    routes = DecodeRoutes(pager)
    _decode(routes, pager, [([0, 1], [2, 3])])
    report = optimum_report(routes)
    assert report.optimum_misses == 0 and math.isnan(report.misses_vs_optimum)


def test_optimal_cost_edges():
    assert optimal_cost(np.zeros((0, 2), np.int64), 2) == 0
    assert optimal_cost([[0, 1]], 2) == 2 and optimal_cost([[0, 1]], 2, initial=[1]) == 1
    assert optimal_cost([[0, 1]], 2, key_bytes=np.array([5, 7])) == 12
    with pytest.raises(ValueError, match=r"^3 keys cannot start in 2 slots$"):
        optimal_cost([[0, 1]], 2, initial=[0, 1, 2])


def test_token_time_by_hand():
    t = token_time(
        {"forward_ms_per_token": 8.0, "no_read_ms_per_token": 1.0, "pager_ms_per_token": 0.5},
        {"total": 10.0, "io_wait": 2.0},
    )
    assert (t.total_ms, t.no_read_ms, t.io_wait_ms, t.pager_ms, t.compute_ms) == (
        10.0, 3.0, 2.0, 0.5, 4.5)  # fmt: skip
    assert t.parts == {"no_read_ms": 3.0, "io_wait_ms": 2.0, "pager_ms": 0.5, "compute_ms": 4.5}
