"""The `sdq` command line: one subcommand per module in `sdq.commands`.

Each command module defines `add_arguments(parser)` and `run(args) -> int`, and keeps its
top-level imports light (numba, pandas and friends are imported inside `run`), so that
`sdq --help` stays fast. User mistakes raise `SdqError`: printed as one line, exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys

from sdq import __version__
from sdq.commands import add_module_subcommands
from sdq.errors import SdqError

# name -> one-line help. The module is sdq.commands.<name with - replaced by _>.
COMMANDS = {
    "info": "print a GGUF model's anatomy: spec, tensors, experts (table T2)",
    "synth": "build a synthetic qwen3moe GGUF model (tiny, mini or custom)",
    "plan": "print the memory plan for a RAM budget: dense, KV, compute, reserve, arena slots",
    "chat": "generate text with experts paged from disk under a RAM budget",
    "bench": "benchmarks: layer-miss, resident, peers",
    "probe": "measure the storage device: latency and bandwidth vs concurrency (table T1)",
    "routes": "routing traces: cache simulations and statistics",
    "experiments": "experiment suites (subprocess per configuration, repeats, medians)",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sdq",
        description="Run MoE GGUF models larger than RAM by paging routed experts from disk, "
        "and measure what decides their speed.",
    )
    parser.add_argument("--version", action="version", version=f"sdq {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_module_subcommands(sub, "sdq.commands", COMMANDS, "_run")
    return parser


def cap_native_threads() -> None:
    """One OpenBLAS thread unless the environment says otherwise; must run before NumPy loads.
    sdq calls the BLAS for at most one matrix-vector product per decode layer (an F32 router);
    OpenBLAS would start a thread per core at load, each with its own stack and buffer: address
    space the memory plan would have to hold (sdq.run.plan)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main(argv: list[str] | None = None) -> int:
    cap_native_threads()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except SdqError as exc:
        print(f"sdq {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"sdq {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
