"""`sdq bench layer-miss MODEL`: one layer, some experts a miss — how fast do they arrive?
(table T3); serial vs parallel vs split reads at 1, 2, 4 ... misses per layer
(`--misses 1,2,4,8`). How it is measured is in sdq.measure.layer_miss.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from sdq.paging.reads import CACHE_MODES, MODES
from sdq.units import MB


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1 or max(values) > 2**31 - 1:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers in 1..{2**31 - 1}, got {text!r}"
        )
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="GGUF file")
    p.add_argument(
        "--misses",
        "--experts",
        dest="misses",
        type=_int_list,
        default=[8],
        help="experts of the layer that miss, comma list (default 8; e.g. 1,2,4,8)",
    )
    p.add_argument(
        "--mode",
        default="serial,parallel",
        help=f"comma list of {', '.join(MODES)} (default serial,parallel)",
    )
    p.add_argument(
        "--split",
        type=_int_list,
        default=[4],
        help="chunks per segment for mode split, comma list (1..8, default 4)",
    )
    p.add_argument(
        "--io-threads",
        type=_int_list,
        default=[8, 16, 24],
        help="comma list of I/O pool sizes (default 8,16,24)",
    )
    p.add_argument("--cache-mode", choices=CACHE_MODES, default="dontneed")
    p.add_argument("--repeat", type=int, default=9, help="repetitions (default 9)")
    p.add_argument("--layer", type=int, default=None, help="fixed MoE layer (default: random)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--pack",
        metavar="PATH",
        help="also read the same experts from this pack (sdq pack): one read per expert, and "
        "merged (neighbouring records in one preadv)",
    )
    p.add_argument(
        "--fio",
        action="store_true",
        help="run fio beside every configuration: the same read lengths, as many jobs as reads "
        "in flight, huge-page buffers where they can be reserved (--cache-mode direct only)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    from sdq.errors import ParamsError
    from sdq.measure.layer_miss import CACHE_NOTES, LayerMissSettings, measure_layer_miss

    if not any(m.strip() for m in args.mode.split(",")):
        raise ParamsError(f"--mode {args.mode!r}: expected a comma list of {', '.join(MODES)}")
    settings = LayerMissSettings(
        misses=tuple(args.misses),
        modes=tuple(m.strip() for m in args.mode.split(",") if m.strip()),
        splits=tuple(args.split),
        io_threads=tuple(args.io_threads),
        cache_mode=args.cache_mode,
        repeat=args.repeat,
        layer=args.layer,
        seed=args.seed,
        pack=args.pack,
        fio=args.fio,
    )
    rows = measure_layer_miss(args.model, settings)
    path = Path(args.model)
    note = CACHE_NOTES[args.cache_mode]
    if args.json:
        out = {
            "benchmark": "layer-miss",
            "model": str(path),
            "cache_mode": args.cache_mode,
            "cache_note": note,
            "rows": [asdict(r) | {"label": r.label} for r in rows],
        }
        print(json.dumps(out, indent=1))
        return 0
    shown = ",".join(str(m) for m in args.misses)
    print(
        f"layer-miss: {path.name}, {shown} experts of one layer missing; "
        f"{args.repeat} repetitions, medians"
    )
    print(f"cache mode: {args.cache_mode} ({note})")
    print(
        f"{'misses':>6} {'config':<18} {'median ms':>10} {'min':>8} {'max':>8} {'GB/s':>7} "
        f"{'MB':>7} {'cached':>7} {'÷ fio':>6}  vs best other mode"
    )
    for r in rows:
        vs = f"{r.ratio_to_best_other:.2f}x ({r.best_other})" if r.best_other else "-"
        print(
            f"{r.misses:>6} {r.label:<18} {r.median_ms:>10.2f} {r.min_ms:>8.2f} "
            f"{r.max_ms:>8.2f} {r.gb_s:>7.2f} {r.expert_bytes / MB:>7.1f} "
            f"{r.resident_before:>6.0%} {r.ratio_to_fio:>6.2f}  {vs}"
        )
    return 0
