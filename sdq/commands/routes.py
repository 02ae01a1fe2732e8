"""`sdq routes`: expert-cache simulations and routing statistics of a trace.

    sdq routes simulate TRACE --policy lru,belady,fifo,lfu,pin --slots 8,16,24 \\
        --scope layer|global --phase decode|prefill|all [--json]
    sdq routes stats TRACE [--window 48] [--k 1,2,4,8] [--json]

TRACE is an sdq route log (`sdq chat --route-log`) or one of the real traces in data/traces/
(format detected; --format overrides).
"""

from __future__ import annotations

import argparse
import json
import sys

from sdq.commands import finite_float
from sdq.errors import ParamsError

MAX_INT = 2**31 - 1  # counts the simulations' compiled kernels take
DEFAULT_POLICIES = "lru,fifo,lfu,lrfu,pin,admit,belady,belady_bypass"


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or min(values) < 1 or max(values) > MAX_INT:
        raise argparse.ArgumentTypeError(f"expected integers in 1..{MAX_INT}, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="routes_command", metavar="SUBCOMMAND", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("trace", help="route log or trace file")
        p.add_argument(
            "--format",
            choices=["auto", "engine", "granite", "mixtral", "deepseek"],
            default="auto",
            help="trace format (default: detected from the file)",
        )
        p.add_argument(
            "--phase",
            choices=["auto", "decode", "prefill", "all"],
            default="auto",
            help="tokens to replay (auto: decode if the trace has any, else prefill)",
        )
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")

    sim = sub.add_parser("simulate", help="misses and hit rate per cache policy and slot count")
    common(sim)
    sim.add_argument(
        "--policy",
        default=DEFAULT_POLICIES,
        help=f"comma-separated policies (default {DEFAULT_POLICIES}; also layer_lrfu and "
        "lrfu_bypass (K of the slots stream) for --scope global, pin_other: a pin ranked "
        "on the trace's other sequences)",
    )
    sim.add_argument(
        "--slots",
        type=_int_list,
        default=None,
        help="comma-separated slot counts: per layer for --scope layer, in all for global "
        "(default: top_k, E/4, E/2, E per layer)",
    )
    sim.add_argument("--scope", choices=["layer", "global"], default="layer")
    sim.add_argument("--min-hits", type=int, default=2, help="admit: requests before admission")
    sim.add_argument(
        "--half-life", type=finite_float, default=16.0, help="lrfu: tokens per halving of a request"
    )
    sim.set_defaults(_routes=_simulate)

    st = sub.add_parser("stats", help="reuse in a window, U(k) savings, per-layer popularity")
    common(st)
    st.add_argument("--window", type=int, default=48, help="reuse window in tokens (default 48)")
    st.add_argument("--k", type=_int_list, default=[1, 2, 4, 8], help="U(k) batch sizes")
    st.set_defaults(_routes=_stats)


def run(args: argparse.Namespace) -> int:
    return args._routes(args)


def _load(args):
    from sdq.analysis.readers import read_trace

    trace = read_trace(args.trace, None if args.format == "auto" else args.format)
    phase = args.phase
    if phase == "auto":
        phase = "decode" if "decode" in trace.phases_present() else "prefill"
    if trace.lookups(phase) == 0:
        raise ParamsError(
            f"{args.trace}: no {phase} tokens (present: {', '.join(trace.phases_present())})"
        )
    return trace, phase


def _simulate(args) -> int:
    from sdq.analysis.replay import TRACE_POLICIES, sweep
    from sdq.analysis.simulate import PolicyParams

    trace, phase = _load(args)
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    for p in policies:
        if p not in TRACE_POLICIES:
            raise ParamsError(f"unknown policy {p!r} (known: {', '.join(TRACE_POLICIES)})")
    if not 1 <= args.min_hits <= MAX_INT or args.half_life <= 0:
        raise ParamsError(
            f"--min-hits must be in 1..{MAX_INT} and --half-life > 0, got {args.min_hits}, "
            f"{args.half_life}"
        )
    E, K = trace.n_expert, trace.top_k
    slots = args.slots or sorted({K, max(K, E // 4), max(K, E // 2), E})
    if args.slots is None and args.scope == "global":
        slots = [s * trace.n_layer for s in slots]
    params = PolicyParams(min_hits=args.min_hits, half_life=args.half_life)
    results = sweep(trace, policies, slots, args.scope, phase, params)
    belady = {r.slots: r.misses for r in results if r.policy == "belady"}
    rows = []
    for r in results:
        row = r.row()
        if r.slots in belady:
            row["misses_vs_belady"] = r.misses / belady[r.slots] if belady[r.slots] else None
        rows.append(row)
    header = _header(trace, phase)
    if args.json:
        print(json.dumps({**header, "scope": args.scope, "results": rows}, indent=1))
        return 0
    _print_header(header)
    unit = "slots per layer" if args.scope == "layer" else "slots in all"
    print(f"scope {args.scope} ({unit}); a miss is any lookup not served from the cache")
    cols = ["slots", "policy", "lookups", "misses", "hit_rate", "misses_vs_belady"]
    _print_table(rows, cols)
    return 0


def _stats(args) -> int:
    from sdq.analysis.ngram import mean_accepted, prompt_lookup
    from sdq.analysis.reuse import (
        layer_popularity,
        only_once_fraction,
        reuse_histogram,
        union_saving,
    )
    from sdq.analysis.trace import phase_blocks

    trace, phase = _load(args)
    if not 1 <= args.window <= MAX_INT:
        raise ParamsError(f"--window must be in 1..{MAX_INT}, got {args.window}")
    blocks = phase_blocks(trace, phase)
    top = max(1, trace.n_expert // 4)
    pop = layer_popularity(blocks, trace.n_expert, top, trace.layer_ids)
    out = {
        **_header(trace, phase),
        "window": args.window,
        "only_once_fraction": only_once_fraction(blocks, args.window),
        "reuse_histogram": reuse_histogram(blocks, args.window),
        "union_saving": {str(k): union_saving(blocks, k) for k in args.k},
        "layer_popularity": pop,
    }
    streams = [
        (s.name, list(s.prefill.tokens or ()) + list(s.decode.tokens or ()), s.prefill.n_tokens)
        for s in trace.sequences
        if s.decode.tokens is not None or s.prefill.tokens is not None
    ]
    if streams:
        out["ngram_mean_accepted_k8"] = {
            str(n): sum(
                mean_accepted(prompt_lookup(toks, start if start < len(toks) else 1, n, 8))
                for _, toks, start in streams
            )
            / len(streams)
            for n in (2, 3, 4, 6, 8)
        }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    _print_header(out)
    print(
        f"requests whose (layer, expert) occurs once in a {args.window}-token window: "
        f"{out['only_once_fraction']:.1%}"
    )
    hist = ", ".join(f"{k}: {v:.1%}" for k, v in out["reuse_histogram"].items())
    print(f"occurrences in the window, share of requests: {hist}")
    print(
        "U(k) reads saved by k-token batches: "
        + ", ".join(f"k={k}: {v:.1%}" for k, v in out["union_saving"].items())
    )
    if "ngram_mean_accepted_k8" in out:
        acc = ", ".join(f"n={n}: {v:.2f}" for n, v in out["ngram_mean_accepted_k8"].items())
        print(f"prompt-lookup mean accepted draft length (k=8) on the trace's tokens: {acc}")
    print("per-layer popularity:")
    _print_table(pop, list(pop[0].keys()) if pop else [])
    return 0


def _header(trace, phase: str) -> dict:
    return {
        "trace": trace.source,
        "format": trace.format,
        "model": trace.model,
        "layers": trace.n_layer,
        "experts": trace.n_expert,
        "top_k": trace.top_k,
        "sequences": len(trace.sequences),
        "phase": phase,
        "lookups": trace.lookups(phase),
        "notes": list(trace.notes),
    }


def _print_header(h: dict) -> None:
    print(
        f"{h['trace']} ({h['format']}: {h['model']}; {h['layers']} layers x {h['experts']} "
        f"experts, top-{h['top_k']}; {h['sequences']} sequence(s), {h['phase']}, "
        f"{h['lookups']} lookups)"
    )
    for note in h["notes"]:
        print(f"note: {note}")


def _print_table(rows: list[dict], cols: list[str]) -> None:
    def fmt(v) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.4f}"
        return str(v)

    cells = [[fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))
    sys.stdout.flush()
