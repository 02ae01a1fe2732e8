"""`sdq device`: storage device models (sdq.paging.device_model).

    sdq device from-table TABLE.csv -o MODEL.json [--name NAME] [--json]
        fit a model to a published latency / bandwidth table; prints each cell's residual
    sdq device show MODEL.json [--threads 1,2,4,8,16] [--size BYTES] [--json]
        what a model predicts: per-read ms and aggregate MB/s by reads in flight

`sdq probe --fit-out MODEL.json` fits one to a probe of a real device; `--device-model` (probe,
chat, benches) replays reads against one.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from sdq.errors import ParamsError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="device_command", metavar="SUBCOMMAND", required=True)
    fit = sub.add_parser(
        "from-table",
        help="fit a device model to a latency / bandwidth table (CSV)",
        description="Fit a device model to a CSV table with columns size_bytes, threads and any "
        "of median_ms, mb_s, iops ('#' lines: the table's source); print each cell's residual.",
    )
    fit.add_argument("table", type=Path, help="CSV table")
    fit.add_argument("-o", "--out", type=Path, required=True, help="model JSON to write")
    fit.add_argument("--name", help="the model's name (default: the output file's stem)")
    fit.add_argument("--json", action="store_true", help="print the model as JSON")
    show = sub.add_parser("show", help="what a device model predicts")
    show.add_argument("model", type=Path, help="model JSON")
    show.add_argument("--threads", default="1,2,4,6,8,12,16", help="reads in flight (1,2,...)")
    show.add_argument("--size", type=int, default=1_900_544, help="bytes per read (1900544)")
    show.add_argument("--json", action="store_true", help="print the predictions as JSON")


def table_source(path: Path) -> str:
    """The table's '#' comment lines, joined: where its numbers come from."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return str(path)
    notes = [ln.lstrip()[1:].strip() for ln in lines if ln.lstrip().startswith("#")]
    return f"{path.name}: " + " ".join(notes) if notes else str(path.name)


def format_fit(model) -> str:
    """The model's four numbers and every fitted cell: table, model, residual."""
    bound = " (at least: still gaining at the highest concurrency)" * (
        model.queue_depth_bound == "at least"
    )
    lines = [
        f"device model {model.name}: latency {model.latency_ms:g} ms, one stream "
        f"{model.stream_mb_s:g} MB/s, aggregate {model.aggregate_mb_s:g} MB/s, queue depth "
        f"{model.queue_depth}{bound}; MB = 10^6 B",
    ]
    if not model.fit:
        return lines[0]
    lines += [
        f"{'size B':>9} {'threads':>7} {'ms':>8} {'model ms':>9} {'resid':>7} "
        f"{'MB/s':>8} {'model MB/s':>10} {'resid':>7}",
    ]
    for c in model.fit.get("cells", []):
        ms = (
            f"{c['median_ms']:>8.3f} {c['model_ms']:>9.3f} {c['ms_residual']:>+7.1%}"
            if "median_ms" in c
            else f"{'':>8} {'':>9} {'':>7}"
        )
        mb = (
            f"{c['mb_s']:>8.1f} {c['model_mb_s']:>10.1f} {c['mb_s_residual']:>+7.1%}"
            if "mb_s" in c
            else ""
        )
        lines.append(f"{c['size_bytes']:>9} {c['threads']:>7} {ms} {mb}")
    lines.append(
        f"largest residual {model.fit['max_abs_residual']:.1%} "
        f"(residual = model / table - 1; {model.fit['method']})"
    )
    return "\n".join(lines)


def run(args) -> int:
    from sdq.paging import device_model

    if args.device_command == "from-table":
        out = device_model.check_destination(args.out, "-o")
        cells = device_model.read_table(args.table)
        name = args.name or out.stem
        model = device_model.fit(cells, name=name, source=table_source(args.table))
        device_model.save(model, out)
        if args.json:
            print(json.dumps(asdict(model), indent=2))
        else:
            print(format_fit(model))
            print(f"device model written to {out}")
        return 0
    from sdq.measure.probe import parse_int_list

    model = device_model.load(args.model)
    if args.size < 1:
        raise ParamsError(f"--size must be >= 1, got {args.size}")
    rows = []
    for t in parse_int_list(args.threads, "--threads"):
        ms, mb_s = model.level(args.size, t)
        rows.append({"threads": t, "size_bytes": args.size, "model_ms": float(ms[0]),
                     "model_mb_s": float(mb_s[0])})  # fmt: skip
    if args.json:
        print(json.dumps({"model": asdict(model), "levels": rows}, indent=2))
    else:
        print(format_fit(type(model)(**{**asdict(model), "fit": {}})))
        print(f"{'threads':>7} {'ms':>9} {'MB/s':>9}   ({args.size} B reads, back to back)")
        for r in rows:
            print(f"{r['threads']:>7} {r['model_ms']:>9.3f} {r['model_mb_s']:>9.1f}")
    return 0
