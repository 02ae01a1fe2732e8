"""Experiment suites: every configuration a fresh `sdq` subprocess, repeated, alternated,
journaled, summarized as medians with their spread (tables T3-T5, T9-T11).

    sdq experiments --suite threads --model MODEL --repeat 3 --out DIR [--params params/X.yaml]

    from sdq.measure.experiments import Settings, run_suite
    rows = run_suite("threads", model_path, Settings(repeat=3), out_dir)   # journal rows

Modules: config (RunConfig: one configuration and its resume key), suites (Settings, which
configurations each suite runs, budget sizing), execute (one run in a subprocess under a RAM
limit, crash classification), journal (append-only JSONL, fsync per row), runner (alternating
schedule, resume, progress bar), summary (medians, spread, flat tables). RAM limits and page-cache
dropping are in sdq.measure.limits.
"""

from sdq.measure.experiments.api import run_suite
from sdq.measure.experiments.suites import SUITES, Settings

__all__ = ["SUITES", "Settings", "run_suite"]
