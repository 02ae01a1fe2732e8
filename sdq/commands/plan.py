"""`sdq plan MODEL --ram-budget-mb B -c CTX -b UBATCH`: the memory plan as a table (or JSON).

Every term is counted before anything is allocated: the process as it stands (runtime
started), dense weights, KV cache, compute buffers, pager buffers, reserve; what is left becomes
expert slots (sdq.run.plan). The plan is made by the same code, from the same flags and
defaults, as `sdq chat`'s (sdq.run.session.plan_paged, after the model, threads and tokenizer
are set up as chat sets them up), so a budget this command accepts is one `sdq chat` runs with.
"""

from __future__ import annotations

import argparse
import json

from sdq.commands.run_flags import add_run_arguments, checked_settings

PLAN_FLAGS = (
    "ram_budget_mb",
    "n_ctx",
    "n_ubatch",
    "threads",
    "reserve_mb",
    "max_slots",
    "io_threads",
    "io_profile",
    "cache_mode",
    "cache_policy",
    "prefetch_next",
    "prefetch_depth",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="GGUF file")
    add_run_arguments(p, PLAN_FLAGS, flags={"n_ctx": ("-c", "--ctx", "--ctx-size")})
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    from sdq.run.session import open_for_run, plan_paged
    from sdq.run.settings import RunSettings
    from sdq.units import MIB

    settings = checked_settings(RunSettings.from_args(args))
    model, _tokenizer = open_for_run(settings)  # held while planning, as chat holds them
    plan = plan_paged(model, settings).plan
    if args.json:
        print(json.dumps({"model": str(model.path), **plan.to_dict()}, indent=1))
        return 0
    budget = plan.ram_budget_bytes / MIB
    print(f"memory plan for {model.path.name}: budget {budget:g} MB")
    rows = plan.rows()
    width = max(len(name) for name, _, _ in rows)
    print(f"{'item':<{width}}  {'MB':>10}  note")
    for name, mb, note in rows:
        print(f"{name:<{width}}  {mb:>10.1f}  {note}")
    return 0
