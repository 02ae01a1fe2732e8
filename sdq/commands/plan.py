"""`sdq plan MODEL --ram-budget-mb B -c CTX -b UBATCH`: the memory plan as a table (or JSON).

Every term is counted before anything is allocated: RSS now, dense weights, KV cache, compute
buffers, pager buffers, reserve; what is left becomes expert slots (sdq.run.plan). The cache
policy and the prefetch width decide how many slots the expert cache needs at least; they take
`sdq chat`'s defaults, so a budget this command accepts is one `sdq chat` runs with.
"""

from __future__ import annotations

import argparse
import json

from sdq.paging.policies import POLICIES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="GGUF file")
    p.add_argument("--ram-budget-mb", type=float, required=True, help="RAM budget in MB")
    p.add_argument("-c", "--ctx", type=int, default=4096, help="context length (default 4096)")
    p.add_argument("-b", "--ubatch", type=int, default=128, help="ubatch tokens (default 128)")
    p.add_argument("--reserve-mb", type=float, default=None, help="head room (default 900)")
    p.add_argument(
        "--cache-mode",
        choices=("pagecache", "dontneed", "direct"),
        default="pagecache",
        help="slot alignment follows the cache mode (direct: 4096)",
    )
    p.add_argument("--io-threads", type=int, default=8, help="I/O pool threads (default 8)")
    p.add_argument(
        "--cache-policy",
        choices=POLICIES,
        default="auto",
        help="expert replacement, as sdq chat (lrfu_bypass needs K streaming slots and one per "
        "prefetched expert beside its cache slots)",
    )
    p.add_argument(
        "--prefetch-next",
        type=int,
        metavar="N",
        help="experts prefetched per layer, as sdq chat (default 3/4 of K; 0: off)",
    )
    p.add_argument(
        "-t", "--threads", type=int, default=2, help="compute threads, as sdq chat (default 2)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    import sdq.run.engine  # noqa: F401  (load what `sdq chat` has loaded when it plans: Numba, LLVM)
    from sdq.errors import ParamsError
    from sdq.format.model import open_model
    from sdq.paging.cache import CacheSettings
    from sdq.paging.prefetch import prefetch_width
    from sdq.run.plan import DEFAULT_RESERVE_MB, plan_memory

    if args.prefetch_next is not None and args.prefetch_next < 0:
        raise ParamsError(f"--prefetch-next {args.prefetch_next}: expected >= 0 experts")
    model = open_model(args.model)
    prefetch = prefetch_width(model.spec.n_expert_used, args.prefetch_next)
    reserve = DEFAULT_RESERVE_MB if args.reserve_mb is None else args.reserve_mb
    plan = plan_memory(
        model,
        args.ram_budget_mb,
        args.ctx,
        args.ubatch,
        reserve_mb=reserve,
        cache_mode=args.cache_mode,
        io_threads=args.io_threads,
        compute_threads=args.threads,
        cache=CacheSettings(policy=args.cache_policy, prefetch_slots=prefetch),
    )
    if args.json:
        print(json.dumps({"model": str(model.path), **plan.to_dict()}, indent=1))
        return 0
    print(f"memory plan for {model.path.name}: budget {args.ram_budget_mb:g} MB")
    rows = plan.rows()
    width = max(len(name) for name, _, _ in rows)
    print(f"{'item':<{width}}  {'MB':>10}  note")
    for name, mb, note in rows:
        print(f"{name:<{width}}  {mb:>10.1f}  {note}")
    return 0
