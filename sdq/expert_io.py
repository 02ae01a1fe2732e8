"""Reading routed experts from the model file into arena slots through the C pread pool.

Dimension key: L MoE layers (ExpertTable rows), E experts, K experts in one request, P = 3
parts of an expert (gate, up, down), R reads in a batch.

Slot layout. A slot holds one expert: three regions, one per part, each as large as that part
is anywhere in the model, each starting on the layout's alignment (64 bytes for buffered
reads, 4096 for O_DIRECT).

O_DIRECT needs file offset, length and destination 4096-aligned, but GGUF tensors are only
32-byte aligned. We read the aligned superset of a segment straight into its region and hand
out a view starting `offset % 4096` bytes in. The alternative, reading into a per-thread
aligned bounce buffer and copying into the slot, costs one extra memcpy of every expert
(~2 MB per expert for the seed's model: 0.1-0.3 ms of one core per expert at 8-20 GB/s,
competing with the compute for memory bandwidth) and a bounce buffer per thread; reading in
place costs at most one extra 4 KiB page at each end of a segment (< 1.5 % more device bytes
for 590 KB segments) and at most 4 KiB of slack per region. In-place is faster, so that is
what `direct` does. The last expert of a file may end mid-page: its aligned read runs past
the end of file, and the read only has to deliver the bytes up to the segment's end (`need`).

Read layouts (seed 000 §2, §4.1; seed 003):
  serial     one task per expert: its three segments read one after another
  parallel   one task per segment
  split N    each segment cut at page-aligned file offsets into at most N chunks (N in 1..8),
             one task per chunk
Each expert is one group, so a caller can wait for one expert while the others load.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from sdq import _io
from sdq.errors import ParamsError, ReadError

PARTS = ("gate", "up", "down")
MODES = ("serial", "parallel", "split")
CACHE_MODES = ("pagecache", "dontneed", "direct")
DIRECT_ALIGN = _io.DIRECT_ALIGN  # 4096
BUFFERED_ALIGN = 64
SPLIT_PAGE = 4096
MAX_SPLIT = 8
_KINDS = {1: "I/O error", 2: "short read", 3: "read past end of file", 4: "read canceled"}


def expert_table(model):
    """The model's ExpertTable (GGUFError when it has no routed experts)."""
    return model.require_experts() if hasattr(model, "require_experts") else model.experts


def align_up(n, a: int):
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class IOSettings:
    """How experts are read. threads: pool workers; split: chunks per segment in mode split."""

    threads: int = 8
    mode: str = "parallel"
    split: int = 1
    cache_mode: str = "pagecache"

    def __post_init__(self):
        if self.mode not in MODES:
            raise ParamsError(f"I/O mode {self.mode!r}: expected one of {', '.join(MODES)}")
        if self.cache_mode not in CACHE_MODES:
            raise ParamsError(
                f"cache mode {self.cache_mode!r}: expected one of {', '.join(CACHE_MODES)}"
            )
        if not 1 <= self.threads <= _io.MAX_THREADS:
            raise ParamsError(f"I/O threads {self.threads}: expected 1..{_io.MAX_THREADS}")
        object.__setattr__(self, "split", min(max(int(self.split), 1), MAX_SPLIT))

    @property
    def chunks(self) -> int:
        return self.split if self.mode == "split" else 1


@dataclass(frozen=True)
class SlotLayout:
    """Where each part of an expert lies inside a slot."""

    align: int
    direct: bool
    region_offsets: tuple[int, int, int]  # byte offset of each part's region in the slot
    region_bytes: tuple[int, int, int]
    slot_bytes: int

    @classmethod
    def for_table(cls, table, cache_mode: str) -> SlotLayout:
        direct = cache_mode == "direct"
        align = DIRECT_ALIGN if direct else BUFFERED_ALIGN
        offsets = np.asarray(table.offsets, dtype=np.int64)  # [L, E, P]
        nbytes = np.asarray(table.nbytes, dtype=np.int64)  # [L, E, P]
        if direct:
            span = align_up(offsets % DIRECT_ALIGN + nbytes, DIRECT_ALIGN)  # [L, E, P]
        else:
            span = align_up(nbytes, BUFFERED_ALIGN)
        regions = tuple(int(span[..., p].max()) for p in range(3))
        starts = (0, regions[0], regions[0] + regions[1])
        return cls(align, direct, starts, regions, int(sum(regions)))

    def view_offset(self, file_offset: int, part: int) -> int:
        """Offset inside a slot of the first byte of a segment that starts at file_offset."""
        head = file_offset % DIRECT_ALIGN if self.direct else 0
        return self.region_offsets[part] + head


class ReadBatch:
    """A submitted batch: wait for one expert (group) or all, with errors as ReadError."""

    def __init__(self, batch, path: str, meta: np.ndarray):
        self.batch = batch
        self.path = path
        self.meta = meta  # int64 [R, 3]: layer, expert, part of each read

    def wait(self, group: int) -> None:
        try:
            self.batch.wait(group)
        except _io.IOFailure as exc:
            raise self._error(exc) from None

    def wait_all(self) -> None:
        try:
            self.batch.wait_all()
        except _io.IOFailure as exc:
            raise self._error(exc) from None

    def done(self, group: int) -> bool:
        return self.batch.done(group)

    def all_done(self) -> bool:
        return self.batch.all_done()

    def report(self) -> np.ndarray:
        """int64 [R, 6]: submit_ns, start_ns, end_ns, done bytes, errno, kind (0 = ok)."""
        return np.frombuffer(self.batch.report(), dtype=np.int64).reshape(-1, 6)

    def failed(self, group: int) -> bool:
        """Whether a read of a finished group failed (without raising)."""
        try:
            self.batch.wait(group)
        except _io.IOFailure:
            return True
        return False

    def _error(self, exc) -> ReadError:
        layer, expert, part = (int(v) for v in self.meta[exc.index])
        what = _KINDS.get({"error": 1, "short": 2, "eof": 3}.get(exc.kind, 4))
        detail = f": {os.strerror(exc.errno)}" if exc.kind == "error" else ""
        got = f", got {exc.done} bytes" if exc.kind == "short" else ""
        return ReadError(
            f"{self.path}: {what} reading layer {layer} expert {expert} {PARTS[part]} "
            f"at offset {exc.offset} length {exc.length}{got}{detail}"
        )


class ExpertReader:
    """Opens the model file for one cache mode and reads experts into slots."""

    def __init__(self, path, table, layout: SlotLayout, io: IOSettings):
        self.path = str(path)
        self.table = table
        self.layout = layout
        self.io = io
        if (io.cache_mode == "direct") != layout.direct:
            raise ParamsError(
                f"slot layout is for {'direct' if layout.direct else 'buffered'} reads but the "
                f"cache mode is {io.cache_mode}"
            )
        flags = os.O_RDONLY | (os.O_DIRECT if layout.direct else 0)
        try:
            self.fd = os.open(self.path, flags)
        except OSError as exc:
            extra = " (O_DIRECT not supported here?)" if exc.errno == 22 else ""
            raise ReadError(f"{self.path}: cannot open: {exc.strerror}{extra}") from None
        self.flags = (_io.FLAG_DIRECT if layout.direct else 0) | (
            _io.FLAG_DONTNEED if io.cache_mode == "dontneed" else 0
        )
        if io.cache_mode == "dontneed":
            # no readahead: it would leave neighbouring experts cached behind DONTNEED's back
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)
        self.pool = _io.Pool(io.threads)

    def set_io(self, io: IOSettings) -> None:
        """Change mode / split / threads (not the cache mode: that needs another fd)."""
        if io.cache_mode != self.io.cache_mode:
            raise ParamsError("the cache mode of an open reader cannot change")
        self.pool.threads = io.threads
        self.io = io

    def plan(self, row: int, experts, addrs) -> tuple[np.ndarray, np.ndarray]:
        """Reads for experts[k] of table row `row` into slot addresses addrs[k].

        Returns (reads int64 [R, 7], meta int64 [R, 3]: layer, expert, part of each read).
        """
        return plan_reads(
            self.table.offsets[row],
            self.table.nbytes[row],
            experts,
            addrs,
            self.fd,
            self.layout,
            self.io.mode,
            self.io.chunks,
            self.table.layers[row],
        )

    def submit(self, row: int, experts, addrs, keepalive=None) -> tuple[ReadBatch, int]:
        """Submits the reads; returns (batch, device bytes requested)."""
        reads, meta = self.plan(row, experts, addrs)
        batch = self.pool.submit(reads, self.flags, keepalive)
        return ReadBatch(batch, self.path, meta), int(reads[:, 2].sum())

    def drop_cache(self) -> None:
        """Drops the file's pages from the page cache (written back first: DONTNEED keeps dirty
        pages)."""
        os.fdatasync(self.fd)
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def resident_fraction(self, offset: int, length: int) -> float:
        return _io.resident_fraction(self.fd, offset, length)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
            os.close(self.fd)


def _chunks(start: int, stop: int, n: int):
    """[start, stop) cut into at most n pieces at page-aligned file offsets."""
    if n <= 1 or stop - start <= SPLIT_PAGE:
        return [(start, stop)]
    step = align_up(-(-(stop - start) // n), SPLIT_PAGE)
    base = start - start % SPLIT_PAGE
    cuts = [start]
    c = base + step
    while c < stop and len(cuts) < n:
        if c > start:
            cuts.append(c)
        c += step
    cuts.append(stop)
    return list(zip(cuts[:-1], cuts[1:], strict=False))


def plan_reads(offsets, nbytes, experts, addrs, fd, layout, mode, chunks, layer=0):
    """The read table for experts of one layer (vectorized; plan_reads_ref is the plain loop).

    offsets, nbytes: int64 [E, P] of the layer; experts [K]; addrs [K] slot addresses.
    Returns (reads int64 [R, 7]: fd, offset, length, need, dest, task, group; meta [R, 3]).
    Reads are ordered by expert, part, chunk; the group of a read is its expert's index k.
    """
    experts = np.asarray(experts, dtype=np.int64)  # [K]
    addrs = np.asarray(addrs, dtype=np.int64)  # [K]
    K = len(experts)
    off = offsets[experts].reshape(-1)  # [S] S = K * P segments, expert-major
    end = off + nbytes[experts].reshape(-1)  # [S]
    if layout.direct:
        start, stop = off - off % DIRECT_ALIGN, align_up(end, DIRECT_ALIGN)
    else:
        start, stop = off, end
    region = np.asarray(layout.region_offsets, dtype=np.int64)
    dest0 = (addrs[:, None] + region[None, :]).reshape(-1)  # [S] the region holds [start, stop)
    seg_k = np.repeat(np.arange(K, dtype=np.int64), 3)  # [S]
    seg_p = np.tile(np.arange(3, dtype=np.int64), K)  # [S]
    if chunks > 1:
        step = align_up(-(-(stop - start) // chunks), SPLIT_PAGE)  # [S]
        base = start - start % SPLIT_PAGE
        j = np.arange(1, chunks, dtype=np.int64)  # [n-1]
        cuts = base[:, None] + j[None, :] * step[:, None]  # [S, n-1], increasing
        cuts = np.where(stop[:, None] - start[:, None] > SPLIT_PAGE, cuts, stop[:, None])
        bounds = np.concatenate([start[:, None], np.minimum(cuts, stop[:, None]), stop[:, None]], 1)
        lo, hi = bounds[:, :-1], bounds[:, 1:]  # [S, n]
        keep = lo < hi
        seg = np.broadcast_to(np.arange(len(off))[:, None], lo.shape)[keep]  # [R]
        lo, hi = lo[keep], hi[keep]
    else:
        seg, lo, hi = np.arange(len(off)), start, stop
    R = len(seg)
    reads = np.empty((R, 7), dtype=np.int64)
    reads[:, 0] = fd
    reads[:, 1] = lo
    reads[:, 2] = hi - lo
    reads[:, 3] = np.minimum(hi, end[seg]) - lo
    reads[:, 4] = dest0[seg] + (lo - start[seg])
    if mode == "serial":
        reads[:, 5] = seg_k[seg]
    elif chunks > 1:
        reads[:, 5] = np.arange(R)
    else:
        reads[:, 5] = seg
    reads[:, 6] = seg_k[seg]
    meta = np.stack([np.full(R, layer), experts[seg_k[seg]], seg_p[seg]], axis=1)  # [R, 3]
    return reads, meta


def plan_reads_ref(offsets, nbytes, experts, addrs, fd, layout, mode, chunks, layer=0):
    """Plain-loop reference of plan_reads (same result)."""
    rows, meta = [], []
    task = -1
    for k, (e, addr) in enumerate(zip(experts, addrs, strict=True)):
        if mode == "serial":
            task += 1
        for p in range(3):
            off, n = int(offsets[e, p]), int(nbytes[e, p])
            end = off + n
            if layout.direct:
                start, stop = off - off % DIRECT_ALIGN, align_up(end, DIRECT_ALIGN)
            else:
                start, stop = off, end
            dest = addr + layout.region_offsets[p]
            if mode != "serial" and chunks == 1:
                task += 1
            for s, t in _chunks(start, stop, chunks):
                if mode != "serial" and chunks > 1:
                    task += 1
                rows.append((fd, s, t - s, min(t, end) - s, dest + (s - start), task, k))
                meta.append((layer, int(e), p))
    return np.array(rows, dtype=np.int64), np.array(meta, dtype=np.int64)
