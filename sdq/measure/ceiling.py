"""How far a paged run's decode is from the device's limit and from the best possible cache.

Dimension key: N lookup groups (one per decode token and MoE layer), K experts per group,
S cache slots, Q lookups (N x K), M keys (table row x E + expert: one global key space).

Two answers per run, both from what the run itself recorded:

1. The best cache on the same problem (`optimum`). `DecodeRoutes` keeps the decode's routing
   (the engine's route-log hook) and the expert cache's contents when decode starts. The
   fewest misses any cache could have had on those lookups is then a min-cost flow
   (sdq.analysis.optimal: Belady with bypass, a token's K experts resident together) with
   - S = the live policy's cache slots: the arena's slots less its streaming slots (under
     lrfu_bypass: K for bypassed misses plus the prefetch width; under lru and layer_lrfu none),
   - one global scope (the pager's Residents hold every layer's experts in one pool),
   - the cache starting from the pager's own contents at the first decode lookup (prefill
     filled it; the optimum may keep any of those experts for free and none other),
   - a miss allowed to bypass the cache (lrfu_bypass streams such misses past it; under lru
     and layer_lrfu, which admit every miss, the optimum is then a lower bound).
   Prefetch does not change the problem: a lookup a prefetch served read its expert all the
   same (the pager counts it a miss), and a wrong guess is bytes read for no lookup. So
   pager misses / optimum misses >= 1 always, and pager expert bytes read / optimum expert
   bytes also counts the wrong guesses.

2. Where the token time went (`accounting`), per decode pass, from the engine's timers
   (sdq.run.engine.Timers and its marks) and the run's figures; the parts add up to the token
   time by construction (`compute` is the remainder; there is no other part):
     no_read   compute while nothing is left to read or asked yet: before the pass's first
               expert request (embedding, layer 0's attention and router), after its last
               expert release (the output head) and between passes (sampling). The disk is idle
               then (a wrong guess still being read is the exception).
     io_wait   blocked on expert reads after routing: misses nothing had guessed, and guesses
               not yet read when needed
     pager     inside the pager's acquire / release / prefetch calls (its Python and lock)
     compute   the rest: attention, router and expert products from the first request to the
               last release, which reads in flight may overlap
   The I/O ceiling is bandwidth / MB read per token (DESIGN `io_ceiling_tok_s`); the
   bandwidth comes from a device probe's profile (sdq.paging.io_profile: its best aggregate
   O_DIRECT or dontneed bandwidth, never page-cache speed), and `bandwidth_note` says which.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from sdq.analysis.optimal import _build, _flow_kernel
from sdq.measure.peers import decode_bound_tok_s, io_ceiling_tok_s, probe_bandwidth

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
    misses, that never pays (tests/test_ceiling.py checks the result against a brute force).

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


@dataclass(frozen=True)
class CeilingReport:
    """A decode against the I/O ceiling and the bound, with its token time split."""

    bandwidth_mb_s: float | None  # MB = 10**6 B per second
    bandwidth_note: str  # where the bandwidth comes from, its cache mode
    ssd_mb_per_token: float
    io_ceiling_tok_s: float | None  # bandwidth / MB read per token; None: nothing read
    io_ceiling_fraction: float | None  # decode_tok_s / io_ceiling_tok_s
    read_ms_at_bandwidth: float | None  # one token's reads at that bandwidth
    no_wait_tok_s: float  # this run's token time without its read waits, as tok/s
    bound_tok_s: float | None  # min(ceiling, compute_tok_s)
    bound_by: str | None  # "io" or "compute"
    compute_source: str  # what compute_tok_s was: a resident run, or no_wait_tok_s
    bound_fraction: float | None  # decode_tok_s / bound_tok_s
    token_time: dict


def ceiling_report(
    figures: dict,
    decode_profile: dict,
    bandwidth: tuple[float, str] | None,
    resident_tok_s: float | None = None,
) -> CeilingReport:
    """The I/O ceiling, the bound and the token time of one decode. The bound's compute side
    is `resident_tok_s` (a resident run of the same model) when given, else this run's own
    token time less its read waits."""
    tt = token_time(figures, decode_profile)
    bw, note = bandwidth if bandwidth is not None else (None, "no device probe profile")
    mb = float(figures["ssd_mb_per_token"])
    ceiling = io_ceiling_tok_s(mb, bw)
    decode = 1e3 / tt.total_ms
    no_wait = 1e3 / (tt.total_ms - tt.io_wait_ms)
    compute = resident_tok_s if resident_tok_s else no_wait
    bound, by = decode_bound_tok_s(ceiling, compute)
    return CeilingReport(
        bandwidth_mb_s=bw,
        bandwidth_note=note,
        ssd_mb_per_token=mb,
        io_ceiling_tok_s=ceiling,
        io_ceiling_fraction=decode / ceiling if ceiling else None,
        read_ms_at_bandwidth=1e3 / ceiling if ceiling else None,
        no_wait_tok_s=no_wait,
        bound_tok_s=bound,
        bound_by=by,
        compute_source="resident run" if resident_tok_s else "this run less its read waits",
        bound_fraction=decode / bound if bound else None,
        token_time={"total_ms": tt.total_ms, **tt.parts},
    )


def saved_bandwidth(settings) -> tuple[float, str] | None:
    """(MB/s, note) from the I/O profile the run applied, else the saved profile of the model
    file's device (sdq.paging.io_profile); None when there is none."""
    from sdq.paging.io_profile import find_profile

    path = settings.io_profile or find_profile(settings.model)
    return None if path is None else probe_bandwidth(path)


def run_report(figures: dict, decode_profile: dict, routes: DecodeRoutes, bandwidth) -> dict:
    """Both answers for `sdq chat --json` and the peers rows: {"optimum": ..., "ceiling": ...}
    (empty when the run decoded no token)."""
    if not figures.get("n_decode") or not decode_profile:
        return {}
    return {
        "optimum": asdict(optimum_report(routes)),
        "ceiling": asdict(ceiling_report(figures, decode_profile, bandwidth)),
    }


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan
