"""provenance.json: what produced a set of outputs — code, packages, parameters, machine, date.

Code: the commit (`git rev-parse HEAD` of the repository), whether tracked files other than
the generated outputs/ and docs/ differed from it (dirty), and the git tree ids of the paths
that decide a notebook's results (`CODE_PATHS`: sdq/ and the notebook itself), so that docs can
tell whether outputs come from the code at HEAD (`code_changed_since`).

Machine: the CPU (its model name and the vector extensions it reports: avx2, avx512f, ...,
which decide the kernels llama.cpp and numba compile), the cores, the RAM and the disks that
hold the model and the outputs; `machine` names it in one line, the key by which docs group
runs from different machines.

Runs: outputs/<stem>/<params>/ holds the latest run's files at its top level and every run's
tables, values, verdicts and provenance under runs/<run id>/ (`archive_run`), so that a rerun
never hides an earlier run's figures; `list_runs` reads them back for the docs.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from sdq import files as atomic
from sdq.lab.paths import repo_root

# distribution names (as pip knows them) whose versions decide the results
PACKAGES = (
    "sdq",
    "numpy",
    "numba",
    "llvmlite",
    "gguf",
    "llama_cpp_python",
    "tokenizers",
    "psutil",
    "pandas",
    "altair",
    "vl-convert-python",
    "papermill",
    "ipykernel",
)


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()


def code_paths(notebook: str | None) -> tuple[str, ...]:
    """The tracked paths whose content decides a notebook's results: the package and the
    notebook itself (other notebooks and the generated outputs/ and docs/ do not)."""
    return ("sdq",) + ((f"notebooks/{notebook}.ipynb",) if notebook else ())


def git_state(root: Path | None = None, notebook: str | None = None) -> dict[str, Any]:
    """Commit SHA (`git rev-parse HEAD`); whether tracked files other than the generated
    outputs/ and docs/ differ from it (dirty) and how many: a reproduce run rewrites outputs/
    as it goes, which says nothing about the code that produced them; and `trees`, the git
    object id at HEAD of each of `code_paths(notebook)`."""
    root = root or repo_root()
    try:
        sha = _git(root, "rev-parse", "HEAD")
        status = _git(
            root, "status", "--porcelain", "--untracked-files=no", "--",
            ".", ":(exclude)outputs", ":(exclude)docs",
        )  # fmt: skip
        changed = status.splitlines()
    except (OSError, subprocess.SubprocessError):
        return {"sha": None, "dirty": None, "changed_files": None, "trees": None}
    return {
        "sha": sha,
        "dirty": bool(changed),
        "changed_files": len(changed),
        "trees": code_trees(root, "HEAD", code_paths(notebook)),
    }


def code_trees(root: Path, commit: str, paths: tuple[str, ...]) -> dict[str, str | None]:
    """{path: git object id of `path` at `commit`} (None where the commit lacks it)."""
    trees: dict[str, str | None] = {}
    for path in paths:
        try:
            trees[path] = _git(root, "rev-parse", "--verify", "-q", f"{commit}:{path}") or None
        except (OSError, subprocess.SubprocessError):
            trees[path] = None
    return trees


def code_changed_since(record: dict[str, Any], root: Path | None = None) -> list[str] | None:
    """The code paths of a provenance record's notebook whose content at HEAD differs from
    what the record's run used ([] when none); None when that cannot be told (no git here, no
    commit in the record, or a record without trees whose commit this repository lacks)."""
    root = root or repo_root()
    git = record.get("git") or {}
    sha = git.get("sha")
    if not sha:
        return None
    paths = code_paths(record.get("notebook"))
    now = code_trees(root, "HEAD", paths)
    if all(v is None for v in now.values()):
        return None  # not a git repository
    then = git.get("trees")
    if not then:  # recorded before trees were: look the commit up
        try:
            _git(root, "cat-file", "-e", f"{sha}^{{commit}}")
        except (OSError, subprocess.SubprocessError):
            return None
        then = code_trees(root, sha, paths)
    return [p for p in paths if then.get(p) != now.get(p)]


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


# /proc/cpuinfo flags that name a vector instruction set (x86: sse*, avx*, fma, f16c, amx*;
# Arm: asimd*, sve*, neon) — what a kernel built for this CPU may use
VECTOR_FLAG_PREFIXES = ("sse", "ssse3", "avx", "fma", "f16c", "amx", "asimd", "sve", "neon")


def vector_extensions(cpuinfo: str) -> list[str]:
    """The vector extensions named in the first `flags` (x86) or `Features` (Arm) line of a
    /proc/cpuinfo text, in the order listed there."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            return [f for f in value.split() if f.lower().startswith(VECTOR_FLAG_PREFIXES)]
    return []


def cpu_info() -> dict[str, Any]:
    import psutil

    model = platform.processor() or None
    extensions: list[str] | None = None
    try:
        text = Path("/proc/cpuinfo").read_text()
        for line in text.splitlines():
            if line.lower().startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        extensions = vector_extensions(text)
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "model": model,
        "machine": platform.machine(),
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "usable_cores": usable,
        "vector_extensions": extensions,
    }


def ram_info() -> dict[str, Any]:
    import psutil

    vm, sw = psutil.virtual_memory(), psutil.swap_memory()
    return {
        "total_mb": vm.total // 2**20,
        "available_mb": vm.available // 2**20,
        "swap_total_mb": sw.total // 2**20,
    }


def disk_info(path: Path) -> dict[str, Any]:
    """The filesystem holding `path`: device, type, mount point, size, free, rotational."""
    import psutil

    path = Path(path).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    best = None
    for part in psutil.disk_partitions(all=True):
        mp = Path(part.mountpoint)
        if (path == mp or mp in path.parents) and (
            best is None or len(part.mountpoint) > len(best.mountpoint)
        ):
            best = part
    usage = psutil.disk_usage(str(path))
    info: dict[str, Any] = {
        "path": str(path),
        "device": best.device if best else None,
        "fstype": best.fstype if best else None,
        "mountpoint": best.mountpoint if best else None,
        "total_gb": round(usage.total / 1e9, 1),
        "free_gb": round(usage.free / 1e9, 1),
        "rotational": _rotational(best.device) if best else None,
        "disk_model": _disk_model(best.device) if best else None,
    }
    return info


def _block_dir(device: str) -> Path | None:
    """/sys/block/<disk> of a device or of the disk holding a partition; None if none."""
    name = Path(device).name
    for candidate in (name, name.rstrip("0123456789"), name.split("p")[0]):
        folder = Path("/sys/block") / candidate
        if candidate and (folder / "queue" / "rotational").exists():
            return folder
    return None


def _rotational(device: str) -> bool | None:
    """From /sys/block/<disk>/queue/rotational; None when the device is not a block disk."""
    folder = _block_dir(device)
    return None if folder is None else (folder / "queue" / "rotational").read_text().strip() == "1"


def _disk_model(device: str) -> str | None:
    """The disk's vendor and model as /sys/block/<disk>/device/ states them (a virtual disk
    may state none)."""
    folder = _block_dir(device)
    if folder is None:
        return None
    words = []
    for name in ("vendor", "model"):
        try:
            words.append((folder / "device" / name).read_text().strip())
        except OSError:
            continue
    return " ".join(w for w in words if w) or None


def machine(record: dict[str, Any]) -> str:
    """One line naming the machine of a provenance record: the CPU's model name, its vector
    extensions and the disk that held the model (else the outputs). Runs with the same line
    ran on the same kind of machine; a record from before vector extensions were kept says
    so, and is grouped by its CPU's model name."""
    cpu = record.get("cpu") or {}
    extensions = cpu.get("vector_extensions")
    wide = [e for e in extensions or [] if e.startswith(("avx", "amx", "sve", "asimd", "neon"))]
    shown = ", ".join(wide or extensions or []) or "none"
    ext = "vector extensions not recorded" if extensions is None else shown
    disk = (record.get("model") or {}).get("disk") or record.get("outputs_disk") or {}
    if disk:
        rot = {True: "rotational", False: "non-rotational"}.get(disk.get("rotational"), "")
        kind = ", ".join(x for x in (disk.get("fstype"), rot, disk.get("disk_model")) if x)
        where = f"disk {disk.get('device') or '?'}" + (f" ({kind})" if kind else "")
    else:
        where = "disk not recorded"
    return f"{cpu.get('model') or 'unknown CPU'} ({ext}); {where}"


def same_code(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two provenance records ran the same code: the same git trees of sdq/ and of
    the notebook (`code_paths`), both recorded. The commit may differ: committing outputs
    moves HEAD without changing the code."""
    ta, tb = (r.get("git") or {} for r in (a, b))
    trees_a, trees_b = ta.get("trees"), tb.get("trees")
    if not trees_a or not trees_b or a.get("notebook") != b.get("notebook"):
        return False
    paths = code_paths(a.get("notebook"))
    return all(trees_a.get(p) is not None and trees_a.get(p) == trees_b.get(p) for p in paths)


def same_experiment(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two provenance records are repeats of one experiment: the same code
    (`same_code`) run with the same parameters, the model's and the notebook's own (a run
    with more repeats, another prompt or another model is another experiment)."""
    if not same_code(a, b):
        return False
    pa, pb = (r.get("params") or {} for r in (a, b))
    keys = ("model", a.get("notebook"))
    return all(k in pa and pa.get(k) == pb.get(k) for k in keys)


def collect(
    params: dict[str, Any],
    notebook: str,
    outputs_dir: Path,
    model_path: Path | None,
    extra: dict[str, Any] | None = None,
    root: Path | None = None,
    git_before: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The provenance record of one notebook run in the repository at `root`.

    `git_before` is `git_state` taken when the run started: if the commit or the code changed
    while the notebook ran, the record keeps both and counts as dirty (its figures may come
    from either)."""
    git = git_state(root, notebook)
    if git_before is not None and {k: git_before.get(k) for k in ("sha", "trees")} != {
        k: git.get(k) for k in ("sha", "trees")
    }:
        git = {**git, "dirty": True, "changed_during_run": True, "at_start": git_before}
    model: dict[str, Any] | None = None
    if model_path is not None:
        model_path = Path(model_path)
        model = {
            "file": model_path.name,
            "bytes": model_path.stat().st_size if model_path.exists() else None,
            "disk": disk_info(model_path.parent),
        }
    record = {
        "notebook": notebook,
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git": git,
        "params": params,
        "model": model,
        "packages": package_versions(),
        "cpu": cpu_info(),
        "ram": ram_info(),
        "outputs_disk": disk_info(outputs_dir),
        "kernel": {
            "system": platform.system(),
            "release": platform.release(),
            "version": platform.version(),
        },
    }
    record.update(extra or {})
    return record


def write(path: Path, record: dict[str, Any]) -> Path:
    return atomic.write_json(path, record)


# -- runs: every run's figures kept -----------------------------------------------------------

RUNS_DIR = "runs"
RUN_FILES = ("tables", "values.json", "verdicts.json", "provenance.json")  # what a run keeps


def run_id(record: dict[str, Any]) -> str:
    """A run's folder name under runs/: its UTC date as 20261130T115631Z."""
    date = str(record.get("date_utc") or "unknown")
    return date.replace("-", "").replace(":", "")


def archive_run(run_dir: Path, previous: Path | None) -> Path:
    """Give the finished run in `run_dir` a runs/ folder: the runs kept in `previous` (the
    outputs this run replaces), the previous top-level run itself if it is not among them, and
    this run (its `RUN_FILES`) under runs/<run id>/. Returns this run's folder."""
    runs = Path(run_dir) / RUNS_DIR
    runs.mkdir(parents=True, exist_ok=True)
    if previous is not None and Path(previous).is_dir():
        previous = Path(previous)
        old_runs = previous / RUNS_DIR
        if old_runs.is_dir():
            for old in sorted(old_runs.iterdir()):
                if old.is_dir() and not (runs / old.name).exists():
                    shutil.copytree(old, runs / old.name)
        old_record = _read_json(previous / "provenance.json")
        if old_record is not None and not any(
            _read_json(r / "provenance.json") == old_record for r in runs.iterdir()
        ):
            _copy_run_files(previous, _free_name(runs, run_id(old_record)))
    record = _read_json(Path(run_dir) / "provenance.json") or {}
    return _copy_run_files(Path(run_dir), _free_name(runs, run_id(record)))


def list_runs(out_dir: Path) -> list[dict[str, Any]]:
    """The provenance records of the runs kept under `out_dir`/runs/, oldest first (by
    folder name, i.e. date), each with its folder name as "run"."""
    runs = Path(out_dir) / RUNS_DIR
    found = []
    for folder in sorted(runs.iterdir()) if runs.is_dir() else []:
        record = _read_json(folder / "provenance.json")
        if record is not None:
            found.append({**record, "run": folder.name})
    return found


def _copy_run_files(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for name in RUN_FILES:
        item = src / name
        if item.is_dir():
            shutil.copytree(item, dst / name)
        elif item.is_file():
            shutil.copy2(item, dst / name)
    return dst


def _free_name(runs: Path, name: str) -> Path:
    """runs/<name>, or runs/<name>-2, -3 ... when two runs share a second."""
    candidate, n = runs / name, 1
    while candidate.exists():
        n += 1
        candidate = runs / f"{name}-{n}"
    return candidate


def _read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
