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
    "synth": "build a synthetic GGUF: qwen3moe (tiny, mini, custom) or qwen35moe (tiny35, seed)",
    "plan": "print the memory plan for a RAM budget: dense, KV, compute, reserve, arena slots",
    "pack": "write a model's pack: each routed expert stored in one piece, one read per expert",
    "chat": "generate text with experts paged from disk under a RAM budget",
    "serve": "serve the model over an OpenAI-compatible HTTP API (one request at a time)",
    "bench": "benchmarks: layer-miss, resident, peers",
    "probe": "measure the storage device: latency and bandwidth vs concurrency (table T1)",
    "device": "storage device models: fit one to a published table, show its predictions",
    "routes": "routing traces: cache simulations and statistics",
    "experiments": "experiment suites (subprocess per configuration, repeats, medians)",
}


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line on stderr and exit code 2, like every
    other user mistake (argparse prints the whole usage first). Subcommand parsers are made of
    the same class."""

    def _get_values(self, action, arg_strings):
        if action.nargs is None and action.option_strings and arg_strings == ["--"]:
            # `--flag=--`: argparse drops the "--" and would store an empty list
            self.error(f"argument {'/'.join(action.option_strings)}: expected a value, got '--'")
        return super()._get_values(action, arg_strings)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")


def _one_line(text: str) -> str:
    """`text` with newlines and other unprintable characters shown escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
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
    _escape_unencodable_output()
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    bad = next((a for a in argv if not _from_a_command_line(a)), None)
    if bad is not None:
        print(
            f"sdq: error: argument {_one_line(repr(bad))} cannot come from a command line "
            "(a NUL, or a surrogate that stands for no byte)",
            file=sys.stderr,
        )
        return 2
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
    except MemoryError as exc:  # a size no plan bounds (--resident), or a limit set outside
        print(f"sdq {args.command}: out of memory: {_where(exc)}", file=sys.stderr)
        return 1
    except BaseException as exc:  # a bug, not a user mistake: still one line, exit code 1
        # (pyo3's PanicException, raised by `tokenizers`, derives from BaseException)
        if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
            raise  # SystemExit, GeneratorExit
        print(f"sdq {args.command}: internal error: {_where(exc)}", file=sys.stderr)
        return 1


def _from_a_command_line(arg: str) -> bool:
    """Whether `arg` is what Python makes of some argument bytes: no NUL, and no surrogate but
    the ones standing for bytes that are not UTF-8 (PEP 383). Only a caller's list breaks this."""
    try:
        return b"\0" not in os.fsencode(arg)
    except UnicodeEncodeError:
        return False


def _where(exc: BaseException) -> str:
    """'TypeError: message (at sdq/run/plan.py:120)': the exception and the innermost frame."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    at = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return _one_line(f"{type(exc).__name__}: {exc}{at}")


def _escape_unencodable_output() -> None:
    """Arguments that are not UTF-8 reach Python as lone surrogates (PEP 383); printed back
    (a file name in a report, say) they are written escaped instead of failing to encode."""
    try:
        sys.stdout.reconfigure(errors="backslashreplace")
    except (AttributeError, ValueError):  # a replaced stream (a test's capture, a pipe object)
        pass
