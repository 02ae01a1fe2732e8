"""The CLI's subcommands, one module each (`sdq.commands.<name>`); `bench/` holds one
module per benchmark. Each module defines `add_arguments(parser)` and `run(args) -> int` and
keeps its top-level imports light so that `sdq --help` stays fast. `run_flags.py` is no command:
it declares the flags that set a generation run, once, for chat and the benches.

May import every other folder of sdq; nothing in sdq imports it but `sdq.cli`.
"""

from __future__ import annotations

import argparse
import importlib
import math


def finite_float(text: str) -> float:
    """argparse type: a float that is a number (not nan, inf or -inf)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def add_module_subcommands(sub, package: str, table: dict[str, str], run_key: str) -> None:
    """One subparser per entry of `table` (name -> help), from the module `package`.<name with
    - replaced by _>: its `add_arguments` fills the parser, its `run` is stored as `run_key`.
    A module not built into this version is left out."""
    for name, help_text in table.items():
        module_name = f"{package}.{name.replace('-', '_')}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        parser = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(parser)
        parser.set_defaults(**{run_key: module.run})
