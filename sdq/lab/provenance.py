"""provenance.json: what produced a set of outputs — code, packages, parameters, machine, date."""

from __future__ import annotations

import os
import platform
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


def git_state(root: Path | None = None) -> dict[str, Any]:
    """Commit SHA, and whether tracked files other than the generated outputs/ and docs/
    differ from it (dirty) and how many: a reproduce run rewrites outputs/ as it goes, which
    says nothing about the code that produced them."""
    root = root or repo_root()

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()

    try:
        sha = git("rev-parse", "HEAD")
        status = git(
            "status", "--porcelain", "--untracked-files=no", "--",
            ".", ":(exclude)outputs", ":(exclude)docs",
        )  # fmt: skip
        changed = status.splitlines()
    except (OSError, subprocess.SubprocessError):
        return {"sha": None, "dirty": None, "changed_files": None}
    return {"sha": sha, "dirty": bool(changed), "changed_files": len(changed)}


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def cpu_info() -> dict[str, Any]:
    import psutil

    model = platform.processor() or None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
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
    }
    return info


def _rotational(device: str) -> bool | None:
    """From /sys/block/<disk>/queue/rotational; None when the device is not a block disk."""
    name = Path(device).name
    for candidate in (name, name.rstrip("0123456789"), name.split("p")[0]):
        flag = Path("/sys/block") / candidate / "queue" / "rotational"
        if candidate and flag.exists():
            return flag.read_text().strip() == "1"
    return None


def collect(
    params: dict[str, Any],
    notebook: str,
    outputs_dir: Path,
    model_path: Path | None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The provenance record of one notebook run."""
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
        "git": git_state(),
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
