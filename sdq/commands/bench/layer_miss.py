"""`sdq bench layer-miss`: one layer, every expert a miss — how fast do its experts arrive?

Seed 000 §2 (table T3): 8 experts of one layer, all missing, read as
  serial    8 threads, each reads one expert's three segments one after another
  parallel  every segment its own request (16 or 24 threads)
  split N   every segment cut into N page-aligned chunks (seed 003)
Each repetition picks a layer and `--experts` distinct experts at random (seeded), drops the
file's pages from the page cache (dontneed), bypasses it (direct) or warms it with one untimed
read (pagecache, reported as such: not device speed), and times every
configuration on the same experts, in a rotating order so drift does not favour one. Reported:
median wall time from submit to the last byte, GB/s of expert bytes at that median, and the
ratio to the best configuration of another mode measured in the same run (> 1: slower).
The slot bytes of each configuration are checked against the file once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from sdq.errors import ParamsError, ReadError

CACHE_NOTES = {
    "direct": "O_DIRECT, page cache bypassed",
    "dontneed": "page cache dropped before each read set, DONTNEED after each read",
    "pagecache": "warm page cache (read once untimed first): NOT device speed",
}


@dataclass
class Row:
    mode: str
    split: int
    io_threads: int
    cache_mode: str
    experts: int
    repeat: int
    median_ms: float
    min_ms: float
    max_ms: float
    expert_bytes: int  # per repetition (median over repetitions)
    device_bytes: int
    gb_s: float
    # share of the experts' pages in the page cache before a timed read: the largest over
    # repetitions for direct / dontneed (should be 0), the smallest for pagecache (should be 1)
    resident_before: float
    best_other: str = ""
    ratio_to_best_other: float = float("nan")

    @property
    def label(self) -> str:
        name = f"split{self.split}" if self.mode == "split" else self.mode
        return f"{name} x{self.io_threads}"


def _int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="GGUF file")
    p.add_argument("--experts", type=int, default=8, help="experts per layer read (default 8)")
    p.add_argument(
        "--mode",
        default="serial,parallel",
        help="comma list of serial, parallel, split (default serial,parallel)",
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
    p.add_argument("--cache-mode", choices=tuple(CACHE_NOTES), default="dontneed")
    p.add_argument("--repeat", type=int, default=9, help="repetitions (default 9)")
    p.add_argument("--layer", type=int, default=None, help="fixed MoE layer (default: random)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def configurations(modes, splits, threads) -> list[tuple[str, int, int]]:
    out = []
    for mode in modes:
        for n in threads:
            for s in splits if mode == "split" else [1]:
                out.append((mode, s, n))
    return out


def run(args) -> int:
    from sdq.paging.reads import MODES, ExpertReader, IOSettings, SlotLayout
    from sdq.format.model import open_model
    from sdq.paging.cache import Arena

    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            raise ParamsError(f"--mode {m!r}: expected serial, parallel or split")
    if args.repeat < 1:
        raise ParamsError(f"--repeat {args.repeat}: expected >= 1")
    model = open_model(args.model)
    table = model.require_experts()
    if not 1 <= args.experts <= table.n_expert:
        raise ParamsError(f"--experts {args.experts}: the model has {table.n_expert} per layer")
    if args.layer is not None:
        table.row(args.layer)
    configs = configurations(modes, args.split, args.io_threads)
    for mode, s, n in configs:
        IOSettings(threads=n, mode=mode, split=s, cache_mode=args.cache_mode)  # validates
    layout = SlotLayout.for_table(table, args.cache_mode)
    arena = Arena(args.experts, layout.slot_bytes)
    first = IOSettings(threads=configs[0][2], cache_mode=args.cache_mode)
    reader = ExpertReader(model.path, table, layout, first)
    check_fd = os.open(model.path, os.O_RDONLY)
    rng = np.random.default_rng(args.seed)
    times = {c: [] for c in configs}
    resident = dict.fromkeys(configs, 0.0)
    nbytes = {c: [] for c in configs}
    try:
        for r in range(args.repeat):
            row = (
                table.row(args.layer)
                if args.layer is not None
                else int(rng.integers(len(table.layers)))
            )
            experts = [int(e) for e in rng.choice(table.n_expert, args.experts, replace=False)]
            addrs = [arena.address(k) for k in range(args.experts)]
            order = configs[r % len(configs) :] + configs[: r % len(configs)]
            for c in order:
                mode, s, n = c
                reader.set_io(IOSettings(threads=n, mode=mode, split=s, cache_mode=args.cache_mode))
                if args.cache_mode == "pagecache":  # warm: read once untimed
                    reader.submit(row, experts, addrs, arena)[0].wait_all()
                else:
                    reader.drop_cache()
                cached = _resident(reader, table, row, experts)
                worse = min if args.cache_mode == "pagecache" else max
                resident[c] = worse(resident[c], cached) if r else cached
                t0 = time.perf_counter_ns()
                batch, device = reader.submit(row, experts, addrs, arena)
                batch.wait_all()
                times[c].append((time.perf_counter_ns() - t0) / 1e6)
                nbytes[c].append((int(table.nbytes[row, experts].sum()), device))
                if r == 0:
                    _check(check_fd, arena, layout, table, row, experts, model.path)
        if args.cache_mode != "pagecache":
            reader.drop_cache()
    finally:
        os.close(check_fd)
        reader.close()
        arena.close()

    rows = []
    for c in configs:
        mode, s, n = c
        med = statistics.median(times[c])
        eb = int(statistics.median(b for b, _ in nbytes[c]))
        db = int(statistics.median(d for _, d in nbytes[c]))
        rows.append(
            Row(
                mode,
                s,
                n,
                args.cache_mode,
                args.experts,
                args.repeat,
                med,
                min(times[c]),
                max(times[c]),
                eb,
                db,
                eb / med / 1e6,
                resident[c],
            )
        )
    for row_ in rows:
        others = [o for o in rows if o.mode != row_.mode]
        if others:
            best = min(others, key=lambda o: o.median_ms)
            row_.best_other = best.label
            row_.ratio_to_best_other = row_.median_ms / best.median_ms

    if args.json:
        out = {
            "benchmark": "layer-miss",
            "model": str(model.path),
            "cache_mode": args.cache_mode,
            "cache_note": CACHE_NOTES[args.cache_mode],
            "rows": [asdict(r_) | {"label": r_.label} for r_ in rows],
        }
        print(json.dumps(out, indent=1))
        return 0
    print(
        f"layer-miss: {model.path.name}, {args.experts} experts of one layer, all miss; "
        f"{args.repeat} repetitions, medians"
    )
    print(f"cache mode: {args.cache_mode} ({CACHE_NOTES[args.cache_mode]})")
    print(
        f"{'config':<14} {'median ms':>10} {'min':>8} {'max':>8} {'GB/s':>7} {'MB':>7} "
        f"{'cached':>7}  vs best other mode"
    )
    for r_ in rows:
        vs = f"{r_.ratio_to_best_other:.2f}x ({r_.best_other})" if r_.best_other else "-"
        print(
            f"{r_.label:<14} {r_.median_ms:>10.2f} {r_.min_ms:>8.2f} {r_.max_ms:>8.2f} "
            f"{r_.gb_s:>7.2f} {r_.expert_bytes / 1e6:>7.1f} {r_.resident_before:>6.0%}  {vs}"
        )
    return 0


def _resident(reader, table, row, experts) -> float:
    fractions = [
        reader.resident_fraction(int(table.offsets[row, e, p]), int(table.nbytes[row, e, p]))
        for e in experts
        for p in range(3)
    ]
    return max(fractions)


def _check(fd, arena, layout, table, row, experts, path) -> None:
    """The slots hold the file's bytes (read back through a plain buffered fd)."""
    for k, e in enumerate(experts):
        slot = arena.slot(k)
        for p in range(3):
            off, n = int(table.offsets[row, e, p]), int(table.nbytes[row, e, p])
            v = layout.view_offset(off, p)
            if slot[v : v + n].tobytes() != os.pread(fd, n, off):
                raise ReadError(
                    f"{path}: slot bytes differ from the file for layer "
                    f"{table.layers[row]} expert {e} part {p}"
                )
