"""The arena: one anonymous RAM mapping cut into fixed-size expert slots.

Only the arena holds expert bytes; the reader fills slots in place (no bounce buffers). The
mapping asks for transparent huge pages, so an O_DIRECT read into a slot is a few physically
contiguous segments rather than one per 4 KiB page (`sdq probe --engine` measures the effect).
Its first slot starts on a huge-page boundary, so no slot straddles a partial huge page at the
arena's start.

With `prefault` (the pager's arena) every page is touched when the arena is made: the kernel
finds, zeroes and, where memory is fragmented, compacts its pages then, at load, instead of
inside the first expert read into each slot during generation. The process holds the whole
arena from that moment, which is what the memory plan counted for it.
"""

from __future__ import annotations

import mmap

import numpy as np

HUGE_PAGE = 2 << 20  # bytes: the x86-64 transparent huge page
PAGE = 4096
# mapped beside the slots: room to start them on a huge-page boundary, and to end the last
# slot inside a whole huge page (which the kernel backs entirely once that slot is touched)
PADDING_BYTES = 2 * HUGE_PAGE


class Arena:
    """One anonymous mapping of `n_slots` slots of `slot_bytes` each (huge-page-aligned base)."""

    def __init__(self, n_slots: int, slot_bytes: int, prefault: bool = False):
        if n_slots < 1 or slot_bytes < 1:
            raise ValueError(f"arena needs slots and bytes, got {n_slots} x {slot_bytes}")
        self.n_slots = n_slots
        self.slot_bytes = slot_bytes
        # the pages before the first slot's boundary are never touched and take no memory
        self._map = mmap.mmap(
            -1, self.nbytes + PADDING_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        )
        try:
            self._map.madvise(mmap.MADV_HUGEPAGE)
        except (AttributeError, OSError):  # no THP in this kernel or build: 4 KiB pages
            pass
        whole = np.frombuffer(self._map, dtype=np.uint8)  # [nbytes + PADDING_BYTES]
        skip = -whole.ctypes.data % HUGE_PAGE
        self.buf = whole[skip : skip + self.nbytes]  # [n_slots * slot_bytes]
        self.base = self.buf.ctypes.data
        if prefault:
            self.buf[::PAGE] = 0

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
