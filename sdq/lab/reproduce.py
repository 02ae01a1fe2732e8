"""Run every lab notebook with a parameter set: `python -m sdq.lab.reproduce --params smoke`.

1. Build (or reuse from the cache) the synthetic model named by the set's `model:` section.
2. For each notebooks/NN_*.ipynb that the set has a section for, in order: execute it with
   papermill, parameters = {params_name, model_path} + its section, into a staging folder;
   write provenance.json there; then rename the folder to outputs/<stem>/<params>/. A partial
   run never looks finished.
   Every finished run's tables, values, verdicts and provenance are also kept under
   outputs/<stem>/<params>/runs/<date>/, with the earlier runs' (sdq.lab.provenance.archive_run):
   rerunning a notebook adds a run, it never hides one.
3. A failing notebook is reported (which cell, one-line error), its staging folder is kept as
   outputs/<stem>/<params>.failed/ for inspection, the previous outputs stay untouched, and the
   other notebooks still run. The exit status is 1 if any failed.
4. No silent gaps: after the notebooks ran, every verdict they recorded must rest on data. A
   claim with no measurement (n = 0: nothing was measured, or every run of it failed) is an
   error naming the claim and the notebook, and the exit status is 1 — unless its verdict is
   "not testable here" with the regime that rules it out (`judge_not_testable`). `make
   reproduce` then stops before it renders docs/.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from sdq import files as atomic
from sdq.errors import LabError, SdqError
from sdq.lab import provenance, runner
from sdq.lab.notebooks import notebook_paths
from sdq.lab.outputs import VERDICTS_FILE, read_verdicts
from sdq.lab.params import ModelParams, Params, load_params
from sdq.lab.paths import repo_root, shown
from sdq.lab.verdict import NOT_TESTABLE

MAX_EXECUTED_BYTES = 2 * 2**20  # executed notebooks above this are not kept


@dataclass(frozen=True)
class NotebookResult:
    stem: str
    ok: bool
    seconds: float
    output_dir: Path  # outputs/<stem>/<params>/ on success, .../<params>.failed/ on failure
    error: str = ""


def build_model(model: ModelParams) -> Path:
    """The run's synthetic model (built once; sdq.synth.build caches it by content hash)."""
    from sdq.synth.build import build_model as synth_build

    return Path(synth_build(model.preset, qtype=model.qtype, seed=model.seed, progress=True))


def select(params: Params, root: Path, only: list[str] | None) -> list[Path]:
    """The notebooks to run: those named by `only`, each checked to have a section in the
    parameter set, else every notebook the set has a section for (a set runs what it
    configures: `seed-scale` only notebook 06, `default` every other one)."""
    paths = notebook_paths(root / "notebooks")
    if only:
        by_stem = {p.stem: p for p in paths}
        unknown = [s for s in only if s not in by_stem]
        if unknown:
            known = ", ".join(by_stem) or "none"
            raise LabError(f"--only {unknown[0]}: no such notebook (notebooks/: {known})")
        paths = [by_stem[s] for s in only]
        for p in paths:
            params.section(p.stem)  # raises ParamsError naming the missing section
        return paths
    chosen = [p for p in paths if p.stem in params.notebooks]
    if not chosen:
        params.section(paths[0].stem if paths else "any notebook")  # ParamsError: no section
    return chosen


def run(
    params: Params,
    only: list[str] | None = None,
    root: Path | None = None,
    outputs_root: Path | None = None,
    model_path: Path | None = None,
    log: Callable[[str], None] = print,
    max_executed_bytes: int | None = MAX_EXECUTED_BYTES,
) -> list[NotebookResult]:
    """Run the selected notebooks; return one result per notebook (failures included)."""
    root = root or repo_root()
    outputs_root = Path(outputs_root or root / "outputs")
    notebooks = select(params, root, only)
    if not only:
        chosen = {nb.stem for nb in notebooks}
        skipped = [p.stem for p in notebook_paths(root / "notebooks") if p.stem not in chosen]
        if skipped:
            log(f"not run (no section in params/{params.path.name}): {', '.join(skipped)}")
    if model_path is None:
        m = params.model
        log(f"model: building/reusing {m.preset} {m.qtype} seed {m.seed} ...")
        t0 = time.perf_counter()
        model_path = build_model(m)
        log(
            f"model: {model_path} ({model_path.stat().st_size / 2**20:,.1f} MiB, "
            f"{time.perf_counter() - t0:.1f} s)"
        )
    results = []
    for i, nb in enumerate(notebooks, 1):
        log(f"[{i}/{len(notebooks)}] {nb.stem} ({params.name}) ...")
        result = run_one(nb, params, outputs_root, Path(model_path), max_executed_bytes, root)
        status = "ok" if result.ok else "FAILED"
        log(
            f"[{i}/{len(notebooks)}] {nb.stem}: {status} in {result.seconds:.1f} s "
            f"-> {shown(result.output_dir, root)}/"
        )
        if not result.ok:
            log(f"    {result.error}")
        results.append(result)
    return results


def run_one(
    nb: Path,
    params: Params,
    outputs_root: Path,
    model_path: Path,
    max_executed_bytes: int | None = MAX_EXECUTED_BYTES,
    root: Path | None = None,
) -> NotebookResult:
    """Run one notebook into staging; on success rename it to outputs/<stem>/<params>/, the
    runs kept there before carried over into its runs/ folder with this one added."""
    stem = nb.stem
    staging_root = outputs_root / f".staging-{stem}-{params.name}-{os.getpid()}"
    staged = staging_root / stem / params.name
    final = outputs_root / stem / params.name
    failed = outputs_root / stem / f"{params.name}.failed"
    _remove_dead_staging(outputs_root, f".staging-{stem}-{params.name}-")
    shutil.rmtree(staging_root, ignore_errors=True)
    section = params.section(stem)
    parameters = {"params_name": params.name, "model_path": str(model_path), **section}
    git_before = provenance.git_state(root, stem)
    started = time.perf_counter()
    try:
        try:
            execution = runner.execute(nb, staged / f"{stem}.ipynb", parameters, staging_root)
            _check_no_stray_outputs(nb, staging_root, staged)
        except LabError as exc:
            seconds = time.perf_counter() - started
            atomic.write_text(staged / "error.txt", str(exc) + "\n")
            atomic.replace_dir(staged, failed)
            return NotebookResult(stem, False, seconds, failed, str(exc))
        executed = _keep_or_drop_executed(execution.executed_path, max_executed_bytes)
        record = provenance.collect(
            params={"name": params.name, "model": asdict(params.model), stem: section},
            notebook=stem,
            outputs_dir=outputs_root,
            model_path=model_path,
            extra={
                "duration_s": round(execution.seconds, 2),
                "code_cells": execution.cells,
                "executed_notebook": executed,
            },
            root=root,
            git_before=git_before,
        )
        provenance.write(staged / "provenance.json", record)
        provenance.archive_run(staged, final if final.is_dir() else None)
        atomic.replace_dir(staged, final)
        shutil.rmtree(failed, ignore_errors=True)
        return NotebookResult(stem, True, time.perf_counter() - started, final)
    finally:
        shutil.rmtree(staging_root, ignore_errors=True)


def _remove_dead_staging(outputs_root: Path, prefix: str) -> None:
    """Remove the staging folders `prefix`<pid> left by runs that were killed (their process
    is gone); a run still going keeps its own."""
    for folder in outputs_root.glob(f"{prefix}*"):
        pid = folder.name.removeprefix(prefix)
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _check_no_stray_outputs(nb: Path, staging_root: Path, staged: Path) -> None:
    """Outputs written under another notebook or parameter set would be lost: refuse them."""
    stray = sorted(p for p in staging_root.glob("*/*") if p != staged)
    if stray:
        where = stray[0].relative_to(staging_root).as_posix()
        raise LabError(
            f"{nb.name}: wrote outputs to {where}/ instead of {nb.stem}/<params_name>/ "
            f"(use Outputs({nb.stem!r}, params_name))"
        )


def _keep_or_drop_executed(path: Path, limit: int | None) -> dict:
    size = path.stat().st_size
    if limit is None or size < limit:
        return {"file": path.name, "bytes": size, "kept": True}
    path.unlink()
    return {
        "file": path.name,
        "bytes": size,
        "kept": False,
        "note": f"executed notebook was {size / 2**20:.1f} MiB, over the "
        f"{limit / 2**20:.0f} MiB limit: not kept",
    }


def is_silent_gap(record: dict) -> bool:
    """A verdict record with no data behind it: n = 0, and not a "not testable here" that
    states the regime ruling the claim out."""
    if record.get("n") != 0:
        return False
    return not (record.get("verdict") == NOT_TESTABLE and str(record.get("regime", "")).strip())


def silent_gaps(output_dir: Path, root: Path | None = None) -> list[str]:
    """One line per claim recorded in `output_dir`/verdicts.json with no data (`is_silent_gap`),
    naming the claim, the notebook and the file; [] when there is none (or no verdicts)."""
    path = Path(output_dir) / VERDICTS_FILE
    if not path.is_file():
        return []
    where = shown(path, root or repo_root())
    notebook = Path(output_dir).parent.name
    return [
        f"claim {r['claim']} of notebook {notebook} has no data (n = 0, verdict "
        f"{r.get('verdict')!r}: {r.get('reason', '')}); every run of it failed or none was "
        f"measured ({where})"
        for r in read_verdicts(path)
        if is_silent_gap(r)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sdq.lab.reproduce", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--params", default="default", help="parameter set: params/NAME.yaml")
    parser.add_argument(
        "--only",
        action="append",
        metavar="STEM",
        help="run only this notebook (repeatable), e.g. 00_model_anatomy",
    )
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    try:
        params = load_params(args.params)
        results = run(params, only=args.only)
        gaps = [line for r in results if r.ok for line in silent_gaps(r.output_dir)]
    except SdqError as exc:
        print(f"reproduce: error: {exc}", file=sys.stderr)
        return exc.exit_code
    failed = [r for r in results if not r.ok]
    total = time.perf_counter() - t0
    print(
        f"reproduce: {len(results) - len(failed)}/{len(results)} notebooks ok "
        f"in {total:.1f} s (params {params.name})"
    )
    for r in failed:
        print(f"reproduce: error: {r.error}", file=sys.stderr)
    for line in gaps:
        print(f"reproduce: error: {line}", file=sys.stderr)
    return 1 if failed or gaps else 0


if __name__ == "__main__":
    raise SystemExit(main())
