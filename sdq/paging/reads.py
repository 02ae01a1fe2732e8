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
  merged     as parallel, but experts of one request whose reads continue each other in the
             file (a pack's neighbouring records) share their tasks, each task one preadv
             (the pool's FLAG_MERGE) into their separate slots
Each expert is one group, so a caller can wait for one expert while the others load; merged
experts share a group (ReadBatch maps the k-th requested expert to its group).

A pack (sdq.paging.pack) stores each expert as one record: then an expert is one read whatever
the mode (split N cuts that read into N chunks), and the slot layout is the record's
(`SlotLayout.for_pack`).

Failing safely. A failed read (I/O error, short read, end of file, canceled) is a ReadError
naming the file, layer, expert, part, offset and length; a wait that outlasts
`IOSettings.timeout_s` is one too (the read may hang in the kernel: its batch and the arena
stay allocated, the process can still exit). The file's identity (device, inode, size,
modification time) is recorded at open; a reader whose file was truncated, rewritten or replaced
raises ModelChangedError from then on (FileIdentity), so no byte read from a changed file is
served.

The reads of every expert of a layer are computed once per split (ReadTemplate, offsets
relative to the slot); a request gathers its experts' rows and adds their slot addresses, so
the time between routing and the reads starting is a few NumPy calls whatever the mode.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import numpy as np

from sdq import _io
from sdq.errors import ModelChangedError, ParamsError, ReadError

PARTS = ("gate", "up", "down")
WHOLE = 3  # the part of a read that covers a pack's whole record
READ_PARTS = (*PARTS, "record")
MODES = ("serial", "parallel", "split", "merged")
CACHE_MODES = ("pagecache", "dontneed", "direct")
# the modes whose reads reach the device (a probe or profile measures one of these)
COLD_CACHE_MODES = ("direct", "dontneed")
DIRECT_ALIGN = _io.DIRECT_ALIGN  # 4096
BUFFERED_ALIGN = 64
SPLIT_PAGE = 4096
MAX_SPLIT = 8
_KINDS = {
    "error": "I/O error",
    "short": "short read",
    "eof": "read past end of file",
    "canceled": "read canceled",
    "timeout": "read timed out",
}
DEFAULT_TIMEOUT_S = 60.0


def expert_table(model):
    """The ExpertTable the pager reads from: the model's pack's when it has one (offsets into
    the pack), else the model's (GGUFError when it has no routed experts)."""
    pack = getattr(model, "pack", None)
    if pack is not None:
        return pack.table
    return model.require_experts() if hasattr(model, "require_experts") else model.experts


def expert_file(model):
    """The file the pager reads experts from: the model's pack, or the model itself."""
    pack = getattr(model, "pack", None)
    return pack.path if pack is not None else model.path


def slot_layout(model, cache_mode: str) -> SlotLayout:
    """The slot layout of the pager's reads of `model` (its pack's records when it has one)."""
    pack = getattr(model, "pack", None)
    if pack is not None:
        return SlotLayout.for_pack(pack, cache_mode)
    return SlotLayout.for_table(expert_table(model), cache_mode)


def align_up(n, a: int):
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class IOSettings:
    """How experts are read. threads: pool workers; split: chunks per segment in mode split;
    timeout_s: the longest a wait for one expert's reads may block before it fails; verify:
    check every expert read against a checksum of the file's bytes (sdq.paging.checksums);
    device: a DeviceModel (sdq.paging.device_model) to replay every read against, the bytes
    coming from the warmed page cache (cache mode pagecache), or None: this machine's device."""

    threads: int = 8
    mode: str = "parallel"
    split: int = 1
    cache_mode: str = "pagecache"
    timeout_s: float = DEFAULT_TIMEOUT_S
    verify: bool = False
    device: object | None = None  # sdq.paging.device_model.DeviceModel

    def __post_init__(self):
        if self.mode not in MODES:
            raise ParamsError(f"I/O mode {self.mode!r}: expected one of {', '.join(MODES)}")
        if self.cache_mode not in CACHE_MODES:
            raise ParamsError(
                f"cache mode {self.cache_mode!r}: expected one of {', '.join(CACHE_MODES)}"
            )
        if not 1 <= self.threads <= _io.MAX_THREADS:
            raise ParamsError(f"I/O threads {self.threads}: expected 1..{_io.MAX_THREADS}")
        if not 0 < self.timeout_s < 1e9:
            raise ParamsError(f"read timeout {self.timeout_s} s: expected > 0")
        if self.device is not None and self.cache_mode != "pagecache":
            raise ParamsError(
                f"an emulated device ({self.device.label}) reads from the page cache: cache "
                f"mode {self.cache_mode} does not apply"
            )
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
    slot_bytes: int
    # a pack's records: per table row, each part's offset in a slot (None: a GGUF's regions)
    row_starts: tuple[tuple[int, int, int], ...] | None = None

    @property
    def packed(self) -> bool:
        """The experts come from a pack: one read per expert (module docstring)."""
        return self.row_starts is not None

    @classmethod
    def for_pack(cls, pack, cache_mode: str) -> SlotLayout:
        """A slot holds one record of `pack` (sdq.paging.pack) as it lies in the file."""
        direct = cache_mode == "direct"
        align = DIRECT_ALIGN if direct else BUFFERED_ALIGN
        widest = max(range(len(pack.record_bytes)), key=lambda r: pack.record_bytes[r])
        # the widest row's part offsets; views use each row's own (row_starts)
        return cls(align, direct, pack.starts[widest], pack.slot_bytes, tuple(pack.starts))

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
        return cls(align, direct, starts, int(sum(regions)))

    def view_offset(self, file_offset: int, part: int, row: int | None = None) -> int:
        """Offset inside a slot of the first byte of a segment that starts at file_offset (of
        table row `row`: needed for a pack, whose records differ by row)."""
        if self.row_starts is not None:
            if row is None:
                raise ValueError("a pack's slot layout needs the table row")
            return self.row_starts[row][part]
        head = file_offset % DIRECT_ALIGN if self.direct else 0
        return self.region_offsets[part] + head


@dataclass(frozen=True)
class FileIdentity:
    """What names the bytes of an open file: device, inode, size, modification time (ns)."""

    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def change(self, now: FileIdentity) -> str:
        """What differs in `now`, in words ("" when nothing does)."""
        if (now.dev, now.ino) != (self.dev, self.ino):
            return "replaced by another file"
        if now.size != self.size:
            return f"size changed from {self.size} to {now.size} bytes"
        if now.mtime_ns != self.mtime_ns:
            return "rewritten (modification time changed)"
        return ""


class ReadBatch:
    """A submitted batch: wait for one expert (group) or all, with errors as ReadError."""

    def __init__(self, batch, path: str, meta, reader: ExpertReader | None = None, groups=None):
        self.batch = batch
        self.path = path
        # int64 [R, 3], or (ReadTemplate, experts, layer, read order or None) to build it from
        self._meta = meta
        self.reader = reader  # checks the file's identity once bytes have arrived
        # the pool group of the k-th requested expert (mode merged); None: group k
        self.groups = groups

    @property
    def meta(self) -> np.ndarray:
        """int64 [R, 3]: layer, expert, part (3: a pack's whole record) of each read."""
        if isinstance(self._meta, tuple):
            self._meta = template_meta(*self._meta)
        return self._meta

    def wait(self, group: int) -> None:
        """Blocks until the reads of the group-th requested expert are done; ReadError if one
        failed or timed out, ModelChangedError if the file changed since it was opened."""
        if self.groups is not None:
            group = self.groups[group]
        try:
            self.batch.wait(group)
        except _io.IOFailure as exc:
            raise self._error(exc) from None
        if self.reader is not None:
            self.reader.check_open_file()

    def wait_all(self) -> None:
        try:
            self.batch.wait_all()
        except _io.IOFailure as exc:
            raise self._error(exc) from None
        if self.reader is not None:
            self.reader.check_open_file()

    def done(self, group: int) -> bool:
        return self.batch.done(group if self.groups is None else self.groups[group])

    def all_done(self) -> bool:
        return self.batch.all_done()

    def report(self) -> np.ndarray:
        """int64 [R, 6]: submit_ns, start_ns, end_ns, done bytes, errno, kind (0 = ok)."""
        return np.frombuffer(self.batch.report(), dtype=np.int64).reshape(-1, 6)

    def timing(self) -> tuple[int, int, int]:
        """(reads, first submit to last end ns, sum of the reads' own ns) of a finished batch:
        report()'s summary in plain Python (a batch has tens of reads; NumPy's per-call cost
        would dominate)."""
        rep = memoryview(self.batch.report()).cast("q")  # [R * 6]
        start, end = rep[1::6], rep[2::6]
        return len(end), max(end) - min(rep[0::6]), sum(end) - sum(start)

    def failed(self, group: int) -> bool:
        """Whether a read of a finished group failed, or the file changed (without raising)."""
        if self.groups is not None:
            group = self.groups[group]
        try:
            self.batch.wait(group)
        except _io.IOFailure:
            return True
        return self.reader is not None and self.reader.changed is not None

    def _error(self, exc) -> ReadError:
        layer, expert, part = (int(v) for v in self.meta[exc.index])
        what = _KINDS.get(exc.kind, "read failed")
        part = READ_PARTS[part]
        detail = f": {os.strerror(exc.errno)}" if exc.kind == "error" else ""
        got = f", got {exc.done} bytes" if exc.kind == "short" else ""
        after = f" after {self.batch_timeout():g} s" if exc.kind == "timeout" else ""
        message = (
            f"{self.path}: {what}{after} reading layer {layer} expert {expert} {part} "
            f"at offset {exc.offset} length {exc.length}{got}{detail}"
        )
        if exc.kind == "timeout" and self.reader is not None:
            self.reader.hung = message  # the reader is done for: it refuses further work
        return ReadError(message)

    def batch_timeout(self) -> float:
        return self.reader.io.timeout_s if self.reader is not None else 0.0


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
        self.identity = FileIdentity.of(os.fstat(self.fd))
        self.changed: str | None = None  # the error's message once the file is seen changed
        self.hung: str | None = None  # the error's message once a read outlasted the timeout
        self.flags = (_io.FLAG_DIRECT if layout.direct else 0) | (
            _io.FLAG_DONTNEED if io.cache_mode == "dontneed" else 0
        )
        if io.cache_mode == "dontneed":
            # no readahead: it would leave neighbouring experts cached behind DONTNEED's back
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)
        self._templates: dict[int, ReadTemplate] = {}  # table row -> its reads, built once
        self.source_mb_s = None  # under emulation: the page cache's speed, one stream
        if io.device is not None:
            from sdq.paging.device_model import prepare_source

            try:
                size = int(np.max(table.nbytes))
                self.source_mb_s = prepare_source(self.fd, self.identity.size, io.device, size)
            except BaseException:
                os.close(self.fd)
                raise
        self.pool = _io.Pool(io.threads, timeout=io.timeout_s)
        if io.device is not None:
            self.pool.emulate(*io.device.c_params())

    def check_open_file(self) -> None:
        """ModelChangedError if the open file was truncated or rewritten since it was opened
        (one fstat); once seen, every later check raises it too. ReadError once a read has
        hung past the timeout: it may still write into its slot, so nothing more is read."""
        if self.hung is not None:
            raise ReadError(self.hung)
        if self.changed is None:
            how = self.identity.change(FileIdentity.of(os.fstat(self.fd)))
            if how:
                self._changed(how)
        if self.changed is not None:
            raise ModelChangedError(self.changed)

    def check_path(self) -> None:
        """check_open_file, and also ModelChangedError if the path now names another file."""
        self.check_open_file()
        try:
            how = self.identity.change(FileIdentity.of(os.stat(self.path)))
        except OSError as exc:
            how = f"gone ({exc.strerror})"
        if how:
            self._changed(how)
            raise ModelChangedError(self.changed)

    def _changed(self, how: str) -> None:
        self.changed = (
            f"{self.path}: the model file changed while in use: {how}; "
            f"no expert read after the change is used"
        )

    def set_io(self, io: IOSettings) -> None:
        """Change mode / split / threads (not the cache mode: that needs another fd)."""
        if io.cache_mode != self.io.cache_mode:
            raise ParamsError("the cache mode of an open reader cannot change")
        if io.timeout_s != self.io.timeout_s:
            raise ParamsError("the read timeout of an open reader cannot change")
        if io.device != self.io.device:
            raise ParamsError("the emulated device of an open reader cannot change")
        self.pool.threads = io.threads
        if io.chunks != self.io.chunks:
            self._templates = {}
        self.io = io

    def template(self, row: int) -> ReadTemplate:
        """Table row `row`'s ReadTemplate for the current split (built on first use)."""
        tmpl = self._templates.get(row)
        if tmpl is None:
            t = self.table
            tmpl = read_template(
                t.offsets[row], t.nbytes[row], self.fd, self.layout, self.io.chunks
            )
            self._templates[row] = tmpl
        return tmpl

    def plan(self, row: int, experts, addrs) -> tuple[np.ndarray, np.ndarray]:
        """Reads for experts[k] of table row `row` into slot addresses addrs[k].

        Returns (reads int64 [R, 7], meta int64 [R, 3]: layer, expert, part of each read).
        """
        tmpl = self.template(row)
        reads, _, order = apply_template(tmpl, experts, addrs, self.io.mode)
        return reads, template_meta(tmpl, experts, self.table.layers[row], order)

    def submit(self, row: int, experts, addrs, keepalive=None) -> tuple[ReadBatch, int]:
        """Submits the reads; returns (batch, device bytes requested)."""
        tmpl = self.template(row)
        reads, groups, order = apply_template(tmpl, experts, addrs, self.io.mode)
        flags = self.flags | (_io.FLAG_MERGE if groups is not None else 0)
        batch = self.pool.submit(reads, flags, keepalive)
        layer = self.table.layers[row]
        meta = (tmpl, experts, layer, order)  # the meta table is only built for a failure
        device = tmpl.device_bytes
        batch = ReadBatch(batch, self.path, meta, self, groups)
        return batch, sum(device[e] for e in experts)

    def drop_cache(self) -> None:
        """Drops the file's pages from the page cache (written back first: DONTNEED keeps dirty
        pages). Not under an emulated device, whose source the page cache is."""
        if self.io.device is not None:
            return
        os.fdatasync(self.fd)
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def emulated(self) -> tuple[int, int, int]:
        """(reads run under the emulated device, reads whose bytes came after their emulated
        end, the others' summed ns past it: workers woken late): zeros without one."""
        return self.pool.emulated() if self.pool is not None else (0, 0, 0)

    def resident_fraction(self, offset: int, length: int) -> float:
        return _io.resident_fraction(self.fd, offset, length)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
            with contextlib.suppress(OSError):  # closed underneath already: nothing to free
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


@dataclass(frozen=True)
class ReadTemplate:
    """Every expert's reads of one layer, computed once: plan_reads then only gathers the
    requested experts and adds their slot addresses.

    rows: int64 [E, M, 7] (M = P x chunks): fd, offset, length, need, destination relative to
    the slot start, row index m within the expert, 0, ordered by part then chunk; valid:
    bool [E, M] (None when every row is a read: no split, or every segment cut into
    `chunks`); parts: int64 [E, M] part of each row; shift: int64 [E, 1, 7], added to the k-th
    requested expert's rows: task k*M + m, group k; device_bytes: per expert, the bytes its
    reads request (Python ints)."""

    rows: np.ndarray
    valid: np.ndarray | None
    parts: np.ndarray
    shift: np.ndarray
    device_bytes: list[int]


def read_template(offsets, nbytes, fd, layout, chunks) -> ReadTemplate:
    """The ReadTemplate of a layer: offsets, nbytes int64 [E, P]. From a pack (layout.packed)
    an expert is one read of its whole record, which ends on a 4096-byte boundary."""
    off = np.asarray(offsets, dtype=np.int64)  # [E, P]
    end = off + np.asarray(nbytes, dtype=np.int64)  # [E, P]
    if layout.packed:  # one segment: the record, from its gate to its aligned end
        off, end = off[:, :1], align_up(end[:, 2:], DIRECT_ALIGN)  # [E, 1]
    if layout.direct:
        start, stop = off - off % DIRECT_ALIGN, align_up(end, DIRECT_ALIGN)
    else:
        start, stop = off, end
    n = max(int(chunks), 1)
    if n > 1:
        step = align_up(-(-(stop - start) // n), SPLIT_PAGE)  # [E, P]
        base = start - start % SPLIT_PAGE
        j = np.arange(1, n, dtype=np.int64)  # [n-1]
        cuts = base[..., None] + j * step[..., None]  # [E, P, n-1], increasing
        cuts = np.where((stop - start)[..., None] > SPLIT_PAGE, cuts, stop[..., None])
        bounds = np.concatenate(
            [start[..., None], np.minimum(cuts, stop[..., None]), stop[..., None]], -1
        )  # [E, P, n+1]
        lo, hi = bounds[..., :-1], bounds[..., 1:]  # [E, P, n]
    else:
        lo, hi = start[..., None], stop[..., None]  # [E, P, 1]
    E, P = off.shape
    region = np.asarray((0,) if layout.packed else layout.region_offsets, dtype=np.int64)  # [P]
    rows = np.zeros((E, P, n, 7), dtype=np.int64)
    rows[..., 0] = fd
    rows[..., 1] = lo
    rows[..., 2] = hi - lo
    rows[..., 3] = np.minimum(hi, end[..., None]) - lo
    rows[..., 4] = region[None, :, None] + (lo - start[..., None])
    M = P * n
    rows = rows.reshape(E, M, 7)
    rows[..., 5] = np.arange(M)
    valid = (lo < hi).reshape(E, M)
    part_ids = np.array([WHOLE] if layout.packed else range(P), dtype=np.int64)  # [P]
    parts = np.broadcast_to(part_ids[:, None], (P, n)).reshape(1, M)
    parts = np.broadcast_to(parts, (E, M))
    shift = np.zeros((E, 1, 7), dtype=np.int64)
    shift[:, 0, 5] = np.arange(E) * M
    shift[:, 0, 6] = np.arange(E)
    device = (rows[..., 2] * valid).sum(axis=1).tolist()
    return ReadTemplate(rows, None if valid.all() else valid, parts, shift, device)


def apply_template(tmpl: ReadTemplate, experts, addrs, mode: str):
    """Reads for experts [K] into slot addresses addrs [K] (see plan_reads).

    Returns (reads int64 [R, 7], groups, order): groups[k] is the pool group of the k-th
    expert and order int64 [R] the row of each read in expert order (both None unless mode
    merged: then group k is not always k, nor read r the r-th of expert order)."""
    reads = tmpl.rows[experts]  # [K, M, 7] (a copy)
    reads += tmpl.shift[: len(reads)]  # task k*M + m, group k
    reads[:, :, 4] += np.asarray(addrs, dtype=np.int64)[:, None]
    if mode == "merged":
        return merge_reads(reads)
    if tmpl.valid is None:
        reads = reads.reshape(-1, 7)  # [R, 7]; the task column is already 0..R-1
    else:
        reads = reads[tmpl.valid[experts]]  # [R, 7]
        reads[:, 5] = np.arange(len(reads))
    if mode == "serial":
        reads[:, 5] = reads[:, 6]  # one task per expert
    return reads, None, None


def merge_reads(reads: np.ndarray):
    """Mode merged (one segment per part, no split): experts whose every read continues the
    previous expert's read of the same part in the file (offset = its offset + length, and
    that read wants all its bytes) join it; a run of such experts is one group, and each of
    its parts one task whose reads lie in file order.

    reads: int64 [K, M, 7] as apply_template builds them. Returns (reads [R, 7], groups [K],
    order [R]: each read's row in expert order, k * M + m)."""
    K, M, _ = reads.shape
    by_offset = sorted(range(K), key=lambda k: int(reads[k, 0, 1]))
    runs: list[list[int]] = []
    for k in by_offset:
        if runs:
            prev = reads[runs[-1][-1]]  # [M, 7]
            if (
                (reads[k, :, 1] == prev[:, 1] + prev[:, 2]).all()
                and (prev[:, 3] == prev[:, 2]).all()
                and (reads[k, :, 0] == prev[:, 0]).all()
            ):
                runs[-1].append(k)
                continue
        runs.append([k])
    groups = [0] * K
    order = []
    for g, run in enumerate(runs):
        for k in run:
            groups[k] = g
        for m in range(M):
            order.extend(k * M + m for k in run)
    out = reads.reshape(K * M, 7)[order]  # [R, 7]
    out[:, 6] = [groups[i // M] for i in order]
    task, last = -1, None
    for r, i in enumerate(order):  # a new task at each run and part
        key = (groups[i // M], i % M)
        if key != last:
            task, last = task + 1, key
        out[r, 5] = task
    return out, groups, np.asarray(order, dtype=np.int64)


def template_meta(tmpl: ReadTemplate, experts, layer: int, order=None) -> np.ndarray:
    """int64 [R, 3]: layer, expert, part of each read of apply_template(tmpl, experts, ...);
    `order`: apply_template's read order (mode merged), None: expert order."""
    experts = np.asarray(experts, dtype=np.int64)  # [K]
    parts = tmpl.parts[experts]  # [K, M]
    ids = np.broadcast_to(experts[:, None], parts.shape)  # [K, M]
    if tmpl.valid is not None:
        keep = tmpl.valid[experts]
        parts, ids = parts[keep], ids[keep]
    parts, ids = parts.reshape(-1), ids.reshape(-1)
    if order is not None:
        parts, ids = parts[order], ids[order]
    return np.stack([np.full(len(parts), layer, dtype=np.int64), ids, parts], axis=1)


def plan_reads(offsets, nbytes, experts, addrs, fd, layout, mode, chunks, layer=0):
    """The read table for experts of one layer (vectorized; plan_reads_ref is the plain loop).

    offsets, nbytes: int64 [E, P] of the layer; experts [K]; addrs [K] slot addresses.
    Returns (reads int64 [R, 7]: fd, offset, length, need, dest, task, group; meta [R, 3]).
    Reads are ordered by expert, part, chunk; the group of a read is its expert's index k.
    ExpertReader keeps each layer's template and calls apply_template directly.
    """
    tmpl = read_template(offsets, nbytes, fd, layout, chunks)
    reads, _, order = apply_template(tmpl, experts, addrs, mode)
    return reads, template_meta(tmpl, experts, layer, order)


def plan_reads_ref(offsets, nbytes, experts, addrs, fd, layout, mode, chunks, layer=0):
    """Plain-loop reference of plan_reads (same result)."""
    per_expert = []  # per requested expert: its reads (fd, offset, length, need, dest, part)
    for e, addr in zip(experts, addrs, strict=True):
        if layout.packed:  # one segment: the whole record
            segments = [(int(offsets[e, 0]), int(offsets[e, 2] + nbytes[e, 2]), WHOLE)]
        else:
            segments = [
                (int(offsets[e, p]), int(offsets[e, p] + nbytes[e, p]), p) for p in range(3)
            ]
        mine = []
        for off, end, p in segments:
            if layout.packed:
                end = align_up(end, DIRECT_ALIGN)
            if layout.direct:
                start, stop = off - off % DIRECT_ALIGN, align_up(end, DIRECT_ALIGN)
            else:
                start, stop = off, end
            region = 0 if layout.packed else layout.region_offsets[p]
            pieces = _chunks(start, stop, chunks)
            mine.append(
                [(fd, s, t - s, min(t, end) - s, addr + region + (s - start), p) for s, t in pieces]
            )
        per_expert.append(mine)  # [P][chunks]
    rows, meta = [], []
    if mode == "merged":
        runs = []
        for k in sorted(range(len(experts)), key=lambda k: per_expert[k][0][0][1]):
            if runs:
                prev = per_expert[runs[-1][-1]]
                here = per_expert[k]
                if all(
                    h[0][1] == q[0][1] + q[0][2] and q[0][3] == q[0][2] and h[0][0] == q[0][0]
                    for h, q in zip(here, prev, strict=True)
                ):
                    runs[-1].append(k)
                    continue
            runs.append([k])
        task = -1
        for g, run in enumerate(runs):
            for p in range(len(per_expert[run[0]])):
                task += 1
                for k in run:
                    for r in per_expert[k][p]:
                        rows.append((*r[:5], task, g))
                        meta.append((layer, int(experts[k]), r[5]))
        return np.array(rows, dtype=np.int64), np.array(meta, dtype=np.int64)
    task = -1
    for k, mine in enumerate(per_expert):
        if mode == "serial":
            task += 1
        for pieces in mine:
            if mode != "serial" and chunks == 1:
                task += 1
            for r in pieces:
                if mode != "serial" and chunks > 1:
                    task += 1
                rows.append((*r[:5], task, k))
                meta.append((layer, int(experts[k]), r[5]))
    return np.array(rows, dtype=np.int64), np.array(meta, dtype=np.int64)
