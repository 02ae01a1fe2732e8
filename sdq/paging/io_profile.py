"""The I/O settings a device probe recommends, saved as JSON (`sdq probe --profile-out`)
and read back by `sdq chat --io-profile`."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from sdq import files
from sdq.errors import ParamsError
from sdq.paging.reads import COLD_CACHE_MODES

PROFILE_VERSION = 1


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


def load_io_profile(path: str | os.PathLike) -> IOProfile:
    """Read and check an I/O profile written by `sdq probe --profile-out`."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ParamsError(f"I/O profile {path}: no such file") from None
    except OSError as exc:
        raise ParamsError(f"I/O profile {path}: {exc.strerror}") from None
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
