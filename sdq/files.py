"""Write a file so that readers see the old version or the whole new one, never a part."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any


def read_small(path: str | os.PathLike, limit: int, shown: str) -> bytes:
    """The bytes of a small regular file (a profile, a table, a parameter set), or a one-line
    ParamsError beginning with `shown`: missing, a directory, not a regular file (a FIFO is
    refused, not waited on: the file is opened O_NONBLOCK), unreadable, larger than `limit`."""
    from sdq.errors import ParamsError

    try:
        with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NONBLOCK)) as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ParamsError(f"{shown}: not a regular file")
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise ParamsError(f"{shown}: no such file") from None
    except IsADirectoryError:
        raise ParamsError(f"{shown}: is a directory") from None
    except OSError as exc:
        raise ParamsError(f"{shown}: cannot read ({exc.strerror})") from None
    except ValueError:  # a NUL in the name
        raise ParamsError(f"{shown}: not a file name") from None
    if len(data) > limit:
        raise ParamsError(f"{shown}: larger than {limit} bytes")
    return data


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
    folder or the new one whole, never a mix and never missing. Where the kernel can swap two
    names in one step (Linux renameat2 RENAME_EXCHANGE) the folders are swapped and the old one,
    now at `src`, is removed; elsewhere the old one is renamed aside first, which leaves a
    moment in which `dst` does not exist."""
    src, dst = Path(src), Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists() and _exchange(src, dst):
        shutil.rmtree(src, ignore_errors=True)
        return dst
    old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
    if dst.exists():
        os.replace(dst, old)
    os.replace(src, dst)
    shutil.rmtree(old, ignore_errors=True)
    return dst


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names a and b atomically; False where the C library or file system cannot."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    renameat2.argtypes += [ctypes.c_uint]
    rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return rc == 0
