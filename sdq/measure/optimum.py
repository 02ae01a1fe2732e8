"""The fewest expert reads any cache could have made on a run's own decode, and the split of
its token time (the two per-run answers of sdq.measure.ceiling that need no device figure).

Dimension key: N lookup groups (one per decode token and MoE layer), K experts per group,
S cache slots, Q lookups (N x K), M keys (table row x E + expert: one global key space).

`DecodeRoutes` keeps the decode's routing (the engine's route-log hook) and the expert cache's
contents when decode starts; `optimum_report` then sets the pager's decode misses against the
fewest any cache could have had on the same problem (sdq.measure.ceiling says which problem)
and `token_time` splits a decode pass's wall time into parts that add up to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sdq.analysis.optimal import _build, _flow_kernel

STATS = ("lookups", "misses", "expert_bytes_read", "bytes_read")  # decode deltas kept


class DecodeRoutes:
    """The decode's routing kept in memory, through the engine's `route_log` hook; every record
    is passed on to `inner` (a sdq.paging.route_log.RouteLog, or None).

    At the first decode record (layer 0's router of the first decode pass, before its acquire)
    it notes the expert cache's contents and counters; a prefill record after decode records
    (a new generation) starts over."""

    def __init__(self, experts, inner=None):
        self.experts, self.inner = experts, inner
        self.table = experts.table
        self.n_expert = int(self.table.n_expert)
        self._reset()

    def _reset(self) -> None:
        self.rows: list[list[int]] = []  # [N][K] keys of each decode group
        self.initial: set[int] | None = None  # keys cached when decode started
        self.stats0: dict | None = None

    def write_batch(self, phase: str, pos0: int, layer: int, ids, weights=None) -> None:
        if self.inner is not None:
            self.inner.write_batch(phase, pos0, layer, ids, weights)
        if phase != "decode":
            if self.initial is not None:
                self._reset()
            return
        base = self.table.row(layer) * self.n_expert
        if self.initial is None:
            self.stats0 = {k: self.experts.stats[k] for k in STATS}
            self.initial = {
                self.table.row(int(lay)) * self.n_expert + e
                for lay in self.table.layers
                for e in self.experts.cached(int(lay))
            }
        for row in np.asarray(ids).reshape(-1, np.asarray(ids).shape[-1]):  # [T, K]
            self.rows.append([base + int(e) for e in row])

    def groups(self) -> np.ndarray:
        """int64 [N, K]: the decode's lookup groups as global keys."""
        if not self.rows:
            return np.zeros((0, 1), np.int64)
        return np.asarray(self.rows, dtype=np.int64)

    def decode_stats(self) -> dict:
        """The pager's counters over the decode (call after the generation ended)."""
        if self.stats0 is None:
            return dict.fromkeys(STATS, 0)
        now = self.experts.stats
        return {k: now[k] - self.stats0[k] for k in STATS}

    def key_bytes(self) -> np.ndarray:
        """int64 [M]: each key's expert bytes (gate + up + down)."""
        return np.asarray(self.table.nbytes, dtype=np.int64).sum(axis=2).reshape(-1)


def optimal_cost(
    groups: np.ndarray, slots: int, initial=(), key_bytes: np.ndarray | None = None
) -> int:
    """The fewest misses a cache of `slots` slots could have over lookup groups [N, K]
    (-1 padding), bypass allowed, starting with the keys `initial` (at most `slots`) cached.

    A min-cost flow (sdq.analysis.optimal) with one more edge per key of `initial`: from the
    start to the key's first lookup, a slot it held from the start (one hit). The flow may
    also let a held key go before a lookup that would have been a hit and give its slot to
    another key of that lookup's group, which a real cache cannot (the hit pins it). Counting
    misses, that trades one hit for another; tests/test_ceiling.py finds the result equal to a
    brute force over every cache content on random small cases.

    With `key_bytes` (int64 [M]) a miss costs its key's bytes and the result is the flow's
    fewest bytes: a lower bound on what any cache reads, exact when every key has the same
    size. Unequal sizes can make letting a hit go pay, and the bound then lies below the
    true optimum."""
    groups = np.asarray(groups, dtype=np.int64)
    initial = sorted(set(int(k) for k in initial))
    if len(initial) > slots:
        raise ValueError(f"{len(initial)} keys cannot start in {slots} slots")
    if groups.shape[0] == 0:
        return 0
    tail, head, cap, cost, n_nodes, q = _build(groups, slots)
    n = groups.shape[0]
    keys = groups[groups >= 0]  # [Q] lookup i's key, row-major
    first: dict[int, int] = {}
    for i in range(q - 1, -1, -1):
        first[int(keys[i])] = i
    pre = np.array([first[k] for k in initial if k in first], dtype=np.int64)  # lookups
    weight = np.ones(q, np.int64) if key_bytes is None else np.asarray(key_bytes)[keys]  # [Q]
    n_keep = int((cost < 0).sum())  # the keep edges come last, one per lookup with a next one
    if key_bytes is not None and n_keep:
        cost = cost.copy()
        cost[-n_keep:] = -weight[head[-n_keep:] - (n + 1)]  # the hit each keep edge makes
    tail = np.concatenate([tail, np.zeros(len(pre), np.int64)])
    head = np.concatenate([head, n + 1 + pre])
    cap = np.concatenate([cap, np.ones(len(pre), np.int64)])
    cost = np.concatenate([cost, -weight[pre]]).astype(np.int64)
    saved = int(_flow_kernel(tail, head, cap, cost, n_nodes, 0, n, slots))
    return int(weight.sum()) - saved


@dataclass(frozen=True)
class OptimumReport:
    """The pager's decode against the best cache on the same problem (module docstring)."""

    policy: str  # the live replacement policy
    cache_slots: int  # S: the arena's slots less the policy's streaming slots
    streaming_slots: int
    scope: str  # "global": one pool for every layer's experts, as the pager keeps them
    initial_cached: int  # experts cached when decode started (the optimum's start too)
    lookups: int
    pager_misses: int
    optimum_misses: int
    misses_vs_optimum: float  # pager / optimum (NaN when the optimum misses nothing)
    pager_expert_bytes: int  # expert bytes the pager read in decode, prefetches included
    optimum_expert_bytes: int  # with experts of unequal sizes a lower bound (optimal_cost)
    bytes_optimum_exact: bool  # every expert the same size: the bytes optimum is exact
    bytes_vs_optimum: float  # pager / optimum bytes (at least the true ratio when not exact)


def optimum_report(routes: DecodeRoutes) -> OptimumReport:
    """The pager's decode misses and expert bytes against the optimum (after the generation)."""
    cache = routes.experts
    split = cache.plan.slot_split
    groups = routes.groups()  # [N, K]
    initial = routes.initial or set()
    stats = routes.decode_stats()
    best = optimal_cost(groups, split.cache, initial)
    sizes = routes.key_bytes()  # [M]
    uniform = bool((sizes == sizes[0]).all())
    best_bytes = (
        best * int(sizes[0]) if uniform else optimal_cost(groups, split.cache, initial, sizes)
    )
    return OptimumReport(
        policy=split.policy,
        cache_slots=split.cache,
        streaming_slots=split.streaming,
        scope="global",
        initial_cached=len(initial),
        lookups=int((groups >= 0).sum()),
        pager_misses=int(stats["misses"]),
        optimum_misses=best,
        misses_vs_optimum=_ratio(stats["misses"], best),
        pager_expert_bytes=int(stats["expert_bytes_read"]),
        optimum_expert_bytes=int(best_bytes),
        bytes_optimum_exact=uniform,
        bytes_vs_optimum=_ratio(stats["expert_bytes_read"], best_bytes),
    )


@dataclass(frozen=True)
class TokenTime:
    """One decode pass's wall time in ms, split into parts that add up to `total_ms`."""

    total_ms: float
    no_read_ms: float
    io_wait_ms: float
    pager_ms: float
    compute_ms: float

    @property
    def parts(self) -> dict[str, float]:
        return {
            "no_read_ms": self.no_read_ms,
            "io_wait_ms": self.io_wait_ms,
            "pager_ms": self.pager_ms,
            "compute_ms": self.compute_ms,
        }


def token_time(figures: dict, decode_profile: dict) -> TokenTime:
    """Split the decode token time (module docstring) from sdq.run.generate's figures
    (forward_ms_per_token, no_read_ms_per_token, pager_ms_per_token) and its decode profile
    (total, io_wait: ms per token)."""
    total = float(decode_profile["total"])
    between = total - float(figures["forward_ms_per_token"])  # sampling, Python between passes
    no_read = float(figures["no_read_ms_per_token"]) + between
    io_wait = float(decode_profile["io_wait"])
    pager = float(figures["pager_ms_per_token"])
    return TokenTime(total, no_read, io_wait, pager, total - no_read - io_wait - pager)


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan
