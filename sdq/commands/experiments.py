"""`sdq experiments --suite S --model MODEL --repeat N --out DIR [--params params/X.yaml]`.

Runs a suite (or all of them): each configuration a fresh `sdq` subprocess, configurations
alternating within each repeat, each finished run appended to DIR/<suite>.jsonl at once, so the
same command resumes an interrupted sweep. Prints each suite's medians and spread and writes
them to DIR/<suite>.md. Settings come from the parameter file's `03_io_ab` section (I/O suites)
and `04_memory_sweep` section (memory, reserve, budgets), then from the flags.
"""

from __future__ import annotations

import argparse

from sdq.measure.limits import METHODS
from sdq.paging.reads import CACHE_MODES

SUITE_CHOICES = (
    "io",
    "threads",
    "split",
    "pack",
    "memory",
    "reserve",
    "budgets",
    "layer-miss",
    "profile",
    "all",
)
MEMORY_SUITES = ("memory", "reserve", "budgets")
SECTIONS = {"io": "03_io_ab", "memory": "04_memory_sweep"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", required=True, choices=SUITE_CHOICES)
    p.add_argument("--model", required=True, help="GGUF file, or a synthetic preset (tiny, mini)")
    p.add_argument("--repeat", type=int, help="repeats per configuration (default: params, 3)")
    p.add_argument("--out", required=True, help="folder for the journals and summaries")
    p.add_argument("--params", help="parameter file (params/<set>.yaml) with the suite settings")
    p.add_argument("--limit", choices=METHODS, help="RAM limit method")
    p.add_argument("--cache-mode", choices=CACHE_MODES)
    p.add_argument(
        "--file-cache",
        choices=("dropped", "warm"),
        help="model file pages before each chat run: dropped (cold) or warm (file read once)",
    )
    p.add_argument(
        "--system-drop",
        action="store_true",
        help="also empty the whole page cache before each run (root; slows other processes)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    from pathlib import Path

    from sdq import files as atomic
    from sdq.errors import ParamsError
    from sdq.measure.experiments.api import journal_path, run_suite
    from sdq.measure.experiments.suites import SUITES, SuiteBuilder
    from sdq.measure.experiments.summary import suite_table

    if args.repeat is not None and args.repeat < 1:
        raise ParamsError(f"--repeat {args.repeat}: expected >= 1")
    model = _model_path(args.model)
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    out = Path(args.out)
    for suite in suites:
        settings = _settings(args, "memory" if suite in MEMORY_SUITES else "io")
        builder = SuiteBuilder(model, settings, out, progress=not args.no_progress)
        rows = run_suite(
            suite,
            model,
            settings,
            out,
            repeat=args.repeat,
            progress=not args.no_progress,
            system_drop=args.system_drop,
            builder=builder,
        )
        table = suite_table(suite, rows)
        text = table.to_string(index=False, float_format=lambda v: f"{v:.4g}")
        print(f"\n== {suite}: {len(rows)} runs, journal {journal_path(out, suite)}")
        print(text)
        atomic.write_text(out / f"{suite}.md", _markdown(table))
    return 0


def _markdown(table) -> str:
    from sdq.lab.formatting import markdown_table, to_json_value

    columns = [str(c) for c in table.columns]
    records = [
        {c: to_json_value(v) for c, v in zip(columns, row, strict=True)}
        for row in table.itertuples(index=False, name=None)
    ]
    return markdown_table(columns, records)


def _model_path(model: str) -> str:
    from pathlib import Path

    if Path(model).is_file():
        return model
    from sdq.errors import ParamsError
    from sdq.synth.build import PRESETS, build_model

    if model in PRESETS:
        return str(build_model(model))
    raise ParamsError(f"--model {model}: no such file and not a synthetic preset")


def _settings(args, kind: str):
    from sdq.errors import ParamsError
    from sdq.measure.experiments.suites import Settings

    section = {}
    if args.params:
        from sdq.lab.params import read_yaml

        doc = read_yaml(args.params, f"--params {args.params}") or {}
        if not isinstance(doc, dict):
            raise ParamsError(f"--params {args.params}: expected a mapping of sections")
        section = doc.get(SECTIONS[kind]) or {}
        if not isinstance(section, dict):
            raise ParamsError(f"{args.params}: section {SECTIONS[kind]} must be a mapping")
        if kind == "memory" and "ctx" in section:  # notebook 04 names it ctx
            section = {**section, "memory_ctx": section["ctx"]}
            del section["ctx"]
    s = Settings.from_mapping(section, strict=False)
    changes = {}
    if args.repeat is not None:
        changes["repeat"] = args.repeat
    if args.limit:
        changes["limits"] = (args.limit,)
        changes["reserve_limit"] = args.limit
    if args.cache_mode:
        changes["cache_mode"] = args.cache_mode
    if args.file_cache:
        changes["file_cache"] = args.file_cache
    return s.replace(**changes) if changes else s
