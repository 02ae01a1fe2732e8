"""`sdq bench NAME ...`: one subcommand per benchmark module in sdq.commands.bench.

layer-miss  one layer, 1-8 experts missing: serial vs parallel vs split reads (table T3)
resident    sdq vs llama.cpp with everything in RAM
peers       sdq vs llama.cpp under the same memory cap
A benchmark whose module is not in this build is left out.
"""

from __future__ import annotations

import argparse

BENCHMARKS = {
    "layer-miss": "one layer, 1-8 experts missing: read time and GB/s per I/O mode (T3)",
    "resident": "sdq vs llama.cpp, everything resident in RAM",
    "peers": "sdq vs llama.cpp under the same memory cap (T12)",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sdq.commands import add_module_subcommands

    sub = p.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    add_module_subcommands(sub, "sdq.commands.bench", BENCHMARKS, "_bench")
    p.set_defaults(_bench_parser=p)


def run(args) -> int:
    if not getattr(args, "_bench", None):
        args._bench_parser.print_help()
        return 2
    return int(args._bench(args) or 0)
