"""`run_suite`: build a suite's configurations for a model and run them into DIR/<suite>.jsonl."""

from __future__ import annotations

from pathlib import Path

from sdq.measure.experiments.journal import Journal
from sdq.measure.experiments.runner import run_sweep
from sdq.measure.experiments.suites import ROTATED_SUITES, Settings, SuiteBuilder


def journal_path(out_dir: str | Path, suite: str) -> Path:
    return Path(out_dir) / f"{suite}.jsonl"


def run_suite(
    suite: str,
    model: str | Path,
    settings: Settings,
    out_dir: str | Path,
    *,
    repeat: int | None = None,
    progress: bool = True,
    system_drop: bool = False,
    builder: SuiteBuilder | None = None,
) -> list[dict]:
    """Runs (or resumes) one suite; returns its journal rows in schedule order."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    builder = builder or SuiteBuilder(str(model), settings, out_dir, progress=progress)
    configs = builder.build(suite)
    n = settings.repeat if repeat is None else repeat
    if suite == "layer-miss":
        n = min(n, 1) if repeat is None else n  # the benchmark repeats inside one run
    return run_sweep(
        configs,
        n,
        Journal(journal_path(out_dir, suite)),
        progress=progress,
        timeout_s=settings.timeout_s,
        system_drop=system_drop,
        cold_wait_s=settings.cold_wait_s,
        desc=suite,
        rotate=suite in ROTATED_SUITES,
    )
