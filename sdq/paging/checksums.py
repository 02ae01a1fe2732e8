"""Checksums of the experts' bytes, for `--verify`: every expert read is checked against them.

An expert's checksum (xxh3-64 of each of its three segments) is computed once, at its first
use, from the file by a path independent of the read pool: plain `os.pread` calls on a
descriptor of its own, 64 KiB at a time into a buffer that is reused. The pool's bytes are then
hashed in the slot, where the engine reads them, so an offset, a destination, a slot mix-up or a
torn read all show as a mismatch. With a cold page-cache mode the pages of that extra read are
dropped again (`posix_fadvise(DONTNEED)`), so the device reads measured stay honest.
"""

from __future__ import annotations

import os
import threading

import xxhash

from sdq.errors import ReadError

PARTS = ("gate", "up", "down")
CHUNK = 1 << 16  # bytes per plain read when a checksum is computed


class ExpertChecksums:
    """Per (table row, expert): the xxh3-64 of its gate, up and down segments."""

    def __init__(self, path, table, drop_pages: bool):
        self.path = str(path)
        self.table = table
        self.drop_pages = drop_pages
        self.fd = os.open(self.path, os.O_RDONLY)
        self._known: dict[tuple[int, int], tuple[int, int, int]] = {}
        self._buf = bytearray(CHUNK)  # uint8 [CHUNK], reused by every plain read
        self._lock = threading.Lock()  # one computation at a time: they share the buffer

    def expected(self, row: int, expert: int) -> tuple[int, int, int]:
        """The checksums of expert `expert` of table row `row` (read from the file once)."""
        sums = self._known.get((row, expert))
        if sums is None:
            with self._lock:
                sums = tuple(self._segment(row, expert, p) for p in range(3))
            self._known[(row, expert)] = sums
        return sums

    def _segment(self, row: int, expert: int, part: int) -> int:
        offset = int(self.table.offsets[row, expert, part])
        length = int(self.table.nbytes[row, expert, part])
        h = xxhash.xxh3_64()
        view = memoryview(self._buf)
        pos = 0
        while pos < length:
            n = os.preadv(self.fd, [view[: min(CHUNK, length - pos)]], offset + pos)
            if n <= 0:
                raise ReadError(
                    f"{self.path}: end of file computing the checksum of layer "
                    f"{self.table.layers[row]} expert {expert} {PARTS[part]} at offset {offset} "
                    f"length {length}, got {pos} bytes"
                )
            h.update(view[:n])
            pos += n
        if self.drop_pages:
            os.posix_fadvise(self.fd, offset, length, os.POSIX_FADV_DONTNEED)
        return h.intdigest()

    def check(self, row: int, expert: int, views) -> None:
        """ReadError naming the segment if a view's bytes differ from the file's."""
        for part, (view, want) in enumerate(zip(views, self.expected(row, expert), strict=True)):
            got = xxhash.xxh3_64_intdigest(view)
            if got != want:
                offset = int(self.table.offsets[row, expert, part])
                length = int(self.table.nbytes[row, expert, part])
                raise ReadError(
                    f"{self.path}: checksum mismatch for layer {self.table.layers[row]} expert "
                    f"{expert} {PARTS[part]} at offset {offset} length {length}: the bytes read "
                    f"hash to {got:016x}, the file's to {want:016x}"
                )

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
