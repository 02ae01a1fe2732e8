"""The sweep's journal: one JSON line per finished run, appended and fsynced at once.

A sweep killed at any moment (kill -9 included) loses only the run in flight: every finished
run is on disk before the next one starts, and `done()` tells the re-run which (key, repeat)
pairs to skip. A line cut short by a kill during the write is ignored when reading (and the
next append starts on a fresh line).
"""

from __future__ import annotations

import json
import os
from pathlib import Path


class Journal:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.skipped_lines = 0  # unreadable lines seen by the last read()

    def read(self) -> list[dict]:
        """Every complete row, in the order written."""
        if not self.path.exists():
            return []
        rows, self.skipped_lines = [], 0
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    self.skipped_lines += 1
                    continue
                if isinstance(row, dict) and "key" in row and "repeat" in row:
                    rows.append(row)
                else:
                    self.skipped_lines += 1
        return rows

    def done(self) -> set[tuple[str, int]]:
        return {(r["key"], int(r["repeat"])) for r in self.read()}

    def append(self, row: dict) -> None:
        """Writes one row as one line and fsyncs before returning."""
        data = (json.dumps(row, allow_nan=True, default=_plain) + "\n").encode("utf-8")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            if _ends_mid_line(fd):
                data = b"\n" + data
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)


def _ends_mid_line(fd: int) -> bool:
    size = os.fstat(fd).st_size
    return size > 0 and os.pread(fd, 1, size - 1) != b"\n"


def _plain(v):
    """numpy scalars and paths as plain JSON values."""
    if hasattr(v, "item"):
        return v.item()
    return str(v)
