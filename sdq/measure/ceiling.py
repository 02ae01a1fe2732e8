"""How far a paged run's decode is from the device's limit and from the best possible cache.

Dimension key: N lookup groups (one per decode token and MoE layer), K experts per group,
S cache slots, Q lookups (N x K), M keys (table row x E + expert: one global key space).

Two answers per run, both from what the run itself recorded:

1. The best cache on the same problem (`optimum`, sdq.measure.optimum). `DecodeRoutes` keeps
   the decode's routing (the engine's route-log hook) and the expert cache's contents when
   decode starts. The fewest misses any cache could have had on those lookups is then a
   min-cost flow
   (sdq.analysis.optimal: Belady with bypass, a token's K experts resident together) with
   - S = the live policy's cache slots: the arena's slots less its streaming slots (under
     lrfu_bypass: K for bypassed misses plus the prefetch width x depth; under lru and
     layer_lrfu none),
   - one global scope (the pager's Residents hold every layer's experts in one pool),
   - the cache starting from the pager's own contents at the first decode lookup (prefill
     filled it; the optimum may keep any of those experts for free and none other),
   - a miss allowed to bypass the cache (lrfu_bypass streams such misses past it; under lru
     and layer_lrfu, which admit every miss, the optimum is then a lower bound).
   Prefetch does not change the problem: a lookup a prefetch served read its expert all the
   same (the pager counts it a miss), and a wrong guess is bytes read for no lookup. So
   pager misses / optimum misses >= 1 always, and pager expert bytes read / optimum expert
   bytes also counts the wrong guesses.

2. Where the token time went (`token_time`, sdq.measure.optimum), per decode pass, from the
   engine's timers (sdq.run.engine.Timers and its marks) and the run's figures; the parts add
   up to the token time by construction (`compute` is the remainder; there is no other part):
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

from dataclasses import asdict, dataclass

from sdq.measure.optimum import DecodeRoutes, optimum_report, token_time
from sdq.measure.peers import decode_bound_tok_s, io_ceiling_tok_s, probe_bandwidth

__all__ = ["CeilingReport", "ceiling_report", "run_report", "saved_bandwidth"]


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


def saved_bandwidth(settings) -> tuple[float | None, str] | None:
    """(MB/s, note) from the I/O profile the run applied, else the saved profile of the model
    file's device (sdq.paging.io_profile); None when there is none, (None, why) when the
    profile holds no measured bandwidth (the run itself stands: only its ceiling is unknown)."""
    from sdq.errors import ParamsError
    from sdq.paging.io_profile import find_profile

    path = settings.io_profile or find_profile(settings.model)
    if path is None:
        return None
    try:
        return probe_bandwidth(path)
    except ParamsError as exc:
        return None, f"no bandwidth: {exc}"


def run_report(figures: dict, decode_profile: dict, routes: DecodeRoutes, bandwidth) -> dict:
    """Both answers for `sdq chat --json` and the peers rows: {"optimum": ..., "ceiling": ...}
    (empty when the run decoded no token)."""
    if not figures.get("n_decode") or not decode_profile:
        return {}
    return {
        "optimum": asdict(optimum_report(routes)),
        "ceiling": asdict(ceiling_report(figures, decode_profile, bandwidth)),
    }
