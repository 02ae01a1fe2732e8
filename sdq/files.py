"""Write a file so that readers see the old version or the whole new one, never a part."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any


def write_bytes(path: Path, data: bytes) -> Path:
    """Write `data` to a temporary name beside `path`, flush it, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def write_text(path: Path, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, obj: Any) -> Path:
    """Stable JSON: 1-space indent, keys in insertion order, UTF-8, trailing newline."""
    return write_text(path, json.dumps(obj, indent=1, ensure_ascii=False, allow_nan=False) + "\n")


def replace_dir(src: Path, dst: Path) -> Path:
    """Move the finished folder `src` to `dst`, replacing what was there: `dst` is the old
    folder or the new one whole, never a mix (the old one is renamed aside, then removed)."""
    src, dst = Path(src), Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
    if dst.exists():
        os.replace(dst, old)
    os.replace(src, dst)
    shutil.rmtree(old, ignore_errors=True)
    return dst
