"""`sdq pack MODEL [-o PATH] [--route-log LOG]`: write the model's pack, a sidecar that stores
each routed expert in one piece so the pager reads it with one request (sdq.paging.pack).
`--route-log` orders each layer's experts so that those often used together lie side by side
(the pager's `--io-mode merged` then reads neighbours with one preadv)."""

from __future__ import annotations

import argparse
import json
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="GGUF file")
    p.add_argument("-o", "--output", help="pack path (default: MODEL.sdqpack beside the model)")
    p.add_argument(
        "--route-log",
        help="order each layer's experts by co-activation in this route log (sdq chat "
        "--route-log) or routing trace; default: expert id order",
    )
    p.add_argument("--check", action="store_true", help="only check an existing pack")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    from pathlib import Path

    from tqdm import tqdm

    from sdq.analysis.coactivation import order_from_log
    from sdq.format.model import open_model
    from sdq.paging.pack import default_path, open_pack, write_pack

    model = open_model(args.model)
    table = model.require_experts()
    order, order_from = None, "expert id"
    if args.route_log and not args.check:
        order = order_from_log(args.route_log, table)
        order_from = f"co-activation in {Path(args.route_log).name}"
    path = args.output or default_path(model.path)
    t0 = time.perf_counter()
    if not args.check:
        with tqdm(
            total=None, unit="B", unit_scale=True, desc="pack", disable=args.json, leave=False
        ) as bar:

            def progress(done: int, total: int) -> None:
                bar.total = total
                bar.update(done - bar.n)

            write_pack(model, path, order, order_from, progress=progress)
    pack = open_pack(model, path)
    seconds = time.perf_counter() - t0
    size = pack.path.stat().st_size
    info = {
        "pack": str(pack.path),
        "model": str(model.path),
        "bytes": size,
        "routed_bytes": int(model.routed_bytes),
        "padding_share": 1 - model.routed_bytes / size,
        "record_bytes": sorted(set(pack.record_bytes)),
        "order_from": pack.order_from,
        "seconds": round(seconds, 2),
    }
    if args.json:
        print(json.dumps(info))
    else:
        verb = "checked" if args.check else "wrote"
        print(
            f"{verb} {pack.path}: {size / 1e9:.3f} GB, {len(pack.record_bytes)} layers x "
            f"{pack.order.shape[1]} experts, one read of "
            f"{', '.join(f'{r / 1e6:.3f}' for r in info['record_bytes'])} MB per expert, "
            f"{info['padding_share']:.1%} padding; order: {pack.order_from} "
            f"({seconds:.1f} s)"
        )
    return 0
