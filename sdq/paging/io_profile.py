"""The I/O settings a device probe recommends, saved as JSON, and where they are kept.

`sdq probe --profile-out PATH` writes a profile to PATH; `sdq probe --profile-out` (no PATH)
writes it to the profile folder of the probed file's device:

    <sdq cache>/io-profiles/<device id>.json      (sdq.dirs: $SDQ_CACHE_DIR or ~/.cache/sdq)

The device id names the block device that holds a file: its whole-disk name under /sys/block
(a partition counts as its disk), with the disk's model or serial when the kernel gives one,
e.g. `vda` or `nvme0n1-Samsung_SSD_980_1TB`; a file on no block device (overlay, NFS, tmpfs)
gets `dev-<major>-<minor>` of its filesystem. `sdq chat` looks up the profile of the model
file's device (`find_profile`) and uses it unless `--io-profile none` or an explicit I/O flag
says otherwise (sdq.run.settings states the order).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from sdq import files
from sdq.dirs import cache_root
from sdq.errors import ParamsError
from sdq.paging.reads import COLD_CACHE_MODES

PROFILE_VERSION = 1
PROFILE_DIR = "io-profiles"  # under the sdq cache folder
SYS_DEV_BLOCK = Path("/sys/dev/block")


@dataclass(frozen=True)
class IOProfile:
    """What `sdq chat --io-profile PATH` takes from a probe: threads, split, and the evidence.

    JSON schema (version 1):
      {"version": 1, "io_threads": int >= 1, "io_split": int 1..8,
       "cache_mode": "direct" | "dontneed", "device": {...storage labels...},
       "measured": {"size": bytes per read, "best_mb_s": ..., "chosen_mb_s": ...,
                    "split_gain": ..., "why": "...", "levels": [...], "split": [...]}}
    """

    io_threads: int
    io_split: int
    cache_mode: str
    device: dict
    measured: dict
    version: int = PROFILE_VERSION


def write_io_profile(path: Path, profile: IOProfile) -> None:
    try:
        files.write_json(path, asdict(profile))
    except OSError as exc:
        raise ParamsError(f"cannot write {path}: {exc.strerror}") from None


MAX_PROFILE_BYTES = 2**20  # a profile is a few hundred bytes


def load_io_profile(path: str | os.PathLike) -> IOProfile:
    """Read and check an I/O profile written by `sdq probe --profile-out`."""
    path = Path(path)
    text = files.read_small(path, MAX_PROFILE_BYTES, f"I/O profile {path}")
    try:
        data = json.loads(text.decode("utf-8"))
    except UnicodeDecodeError:
        raise ParamsError(f"I/O profile {path}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ParamsError(
            f"I/O profile {path}: not JSON ({exc.msg} at line {exc.lineno})"
        ) from None
    if not isinstance(data, dict):
        raise ParamsError(f"I/O profile {path}: expected a JSON object")
    version = data.get("version", PROFILE_VERSION)
    if version != PROFILE_VERSION:
        raise ParamsError(f"I/O profile {path}: version {version!r}, this sdq reads version 1")
    for key, lo, hi in (("io_threads", 1, 4096), ("io_split", 1, 8)):
        v = data.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise ParamsError(
                f"I/O profile {path}: {key} must be an integer in {lo}..{hi}, got {v!r}"
            )
    if data.get("cache_mode") not in COLD_CACHE_MODES:
        raise ParamsError(
            f"I/O profile {path}: cache_mode must be one of {', '.join(COLD_CACHE_MODES)}, "
            f"got {data.get('cache_mode')!r}"
        )
    return IOProfile(
        io_threads=data["io_threads"],
        io_split=data["io_split"],
        cache_mode=data["cache_mode"],
        device=dict(data.get("device") or {}),
        measured=dict(data.get("measured") or {}),
        version=version,
    )


# ---------------------------------------------------------------------------- where profiles are


def _sys_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _safe(text: str) -> str:
    """A file-name-safe form of a sysfs string: runs of other characters become '_'."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", text).strip("_.")[:64]


def disk_of(major: int, minor: int, sys_dev_block: Path = SYS_DEV_BLOCK) -> Path | None:
    """/sys/block/<disk> of a block device or of one of its partitions; None if none."""
    node = sys_dev_block / f"{major}:{minor}"
    if not node.exists():
        return None
    real = node.resolve()
    return real.parent if (real / "partition").exists() else real


def device_id(path: str | os.PathLike, sys_dev_block: Path = SYS_DEV_BLOCK) -> str:
    """The id of the device holding `path` (see the module docstring); OSError if no file."""
    st = os.stat(path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    disk = disk_of(major, minor, sys_dev_block)
    if disk is None:
        return f"dev-{major}-{minor}"
    extra = _sys_text(disk / "device" / "model") or _sys_text(disk / "device" / "serial")
    extra = extra or _sys_text(disk / "serial")
    return "-".join(p for p in (_safe(disk.name), _safe(extra)) if p) or f"dev-{major}-{minor}"


def profile_dir() -> Path:
    """The folder of saved profiles (not created here)."""
    return cache_root() / PROFILE_DIR


def default_profile_path(path: str | os.PathLike) -> Path:
    """Where the profile of the device holding `path` is saved (OSError if no such file)."""
    return profile_dir() / f"{device_id(path)}.json"


def find_profile(path: str | os.PathLike) -> Path | None:
    """The saved profile of the device holding `path`, or None (also when `path` is missing)."""
    try:
        candidate = default_profile_path(path)
    except OSError:
        return None
    return candidate if candidate.is_file() else None
