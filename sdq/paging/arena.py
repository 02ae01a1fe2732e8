"""The arena: one anonymous RAM mapping cut into fixed-size expert slots.

Only the arena holds expert bytes; the reader fills slots in place (no bounce buffers). The
mapping asks for transparent huge pages, so an O_DIRECT read into a slot is a few physically
contiguous segments rather than one per 4 KiB page (`sdq probe --engine` measures the effect).
"""

from __future__ import annotations

import mmap

import numpy as np


class Arena:
    """One anonymous mapping of `n_slots` slots of `slot_bytes` each (page-aligned base)."""

    def __init__(self, n_slots: int, slot_bytes: int):
        if n_slots < 1 or slot_bytes < 1:
            raise ValueError(f"arena needs slots and bytes, got {n_slots} x {slot_bytes}")
        self.n_slots = n_slots
        self.slot_bytes = slot_bytes
        self._map = mmap.mmap(-1, n_slots * slot_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            self._map.madvise(mmap.MADV_HUGEPAGE)
        except (AttributeError, OSError):  # no THP in this kernel or build: 4 KiB pages
            pass
        self.buf = np.frombuffer(self._map, dtype=np.uint8)  # [n_slots * slot_bytes]
        self.base = self.buf.ctypes.data

    @property
    def nbytes(self) -> int:
        return self.n_slots * self.slot_bytes

    def address(self, slot: int) -> int:
        return self.base + slot * self.slot_bytes

    def slot(self, slot: int) -> np.ndarray:
        start = slot * self.slot_bytes
        return self.buf[start : start + self.slot_bytes]  # [slot_bytes]

    def close(self) -> None:
        self.buf = None
        try:
            self._map.close()
        except BufferError:
            pass  # views still alive: the mapping goes when they do
