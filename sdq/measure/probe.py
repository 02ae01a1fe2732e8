"""Device probe: read latency and bandwidth vs concurrency and chunking (table T1, seed 000 §1).

Measure the device before tuning the pager. Three sweeps on random page-aligned offsets of one
file, all read the way the pager reads experts: by its C pread pool (`sdq._io.Pool`) into a
preallocated arena (`sdq.paging.arena.Arena`), faulted in once and reused — one slot per read in
flight — so the figures are the engine's own read path, not first-touch page faults:

- levels:  `reads` random reads of `size` bytes (an expert segment) at each thread count,
           rounded up to a multiple of it (the same count fio reads):
           median / mean / p90 latency of one read and aggregate MB/s over the level;
- small:   the same for 4 KiB reads at 1 and 16 threads: latency and IOPS;
- split:   batches of `batch` segments, each cut into S page-aligned chunks (S = 1, 2, 4, 8),
           at the engine's I/O thread count: segment latency (batch submit to its last
           chunk) and MB/s — seed 003's question, asked of the device alone.

Every read is `direct` (O_DIRECT) or `dontneed` (posix_fadvise DONTNEED after each read);
before each run the file is flushed and dropped from the page cache, and mincore reports the
share of the pages about to be read that are cached anyway (`cached`, expected 0): warm
page-cache reads are never reported as device speed. Without a file, a scratch file of stated
size is written, flushed, dropped from the cache and removed afterwards — also on Ctrl-C,
SIGTERM or an exception.

The recommendation (`recommend`) is the smallest thread count within 5% of the best
bandwidth and the split that beats split 1 by more than 5% at the engine's batch (else 1),
saved as a JSON I/O profile that `load_io_profile` reads back (`sdq chat --io-profile`).

Units: MB = 10**6 bytes, MB/s = bytes / 10**6 / second, latency in ms.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from sdq.errors import ParamsError, ReadError
from sdq.measure.fio import DEFAULT_RUNTIME_S
from sdq.paging.io_profile import IOProfile
from sdq.paging.reads import COLD_CACHE_MODES
from sdq.units import GIB, KIB, MB, MIB

PAGE = 4096
# seed 000's "1.9 MB": one expert, gate 589,824 + up 589,824 + down 720,896 bytes
DEFAULT_SIZE = 1_900_544
SMALL_SIZE = 4096
DEFAULT_THREADS = (1, 2, 4, 6, 8, 12, 16)
DEFAULT_SMALL_THREADS = (1, 16)
DEFAULT_SPLITS = (1, 2, 4, 8)
DEFAULT_SPLIT_BATCH = 24  # seed 000 decode: 8 experts x 3 segments submitted at once
DEFAULT_SCRATCH_BYTES = GIB
MEMORY_FILESYSTEMS = ("tmpfs", "ramfs", "devtmpfs")
WITHIN = 0.05  # "within 5% of the best" and "helps by more than 5%"


# ---------------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """q-th percentile (0..100) with linear interpolation between order statistics.

    The same definition as numpy.percentile's default ("linear"): rank = q/100 * (n - 1).
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    ordered = sorted(float(v) for v in values)
    if not ordered:
        raise ValueError("percentile of no values")
    rank = q / 100 * (len(ordered) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def mean(values: Sequence[float]) -> float:
    values = [float(v) for v in values]
    if not values:
        raise ValueError("mean of no values")
    return math.fsum(values) / len(values)


@dataclass(frozen=True)
class ReadStats:
    """One cell of T1: `reads` reads of `size` bytes with `threads` in flight."""

    threads: int
    size: int  # bytes per read (per segment for split cells)
    reads: int  # reads (segments) measured, all repeats together
    median_ms: float
    mean_ms: float
    p90_ms: float
    mb_s: float  # aggregate bandwidth: bytes / level wall time; median over repeats
    iops: float  # reads / level wall time; median over repeats
    mb_s_min: float  # spread of the per-repeat bandwidth
    mb_s_max: float
    split: int = 1
    batch: int = 0  # segments submitted together (split cells); 0 = all reads at once
    cached: float = 0.0  # share of pages already in the page cache before reading (should be 0)
    # per repeat, in run order: what paired comparisons (sdq.lab.verdict) are made from
    mb_s_runs: tuple[float, ...] = ()
    median_ms_runs: tuple[float, ...] = ()
    iops_runs: tuple[float, ...] = ()


@dataclass(frozen=True)
class Timing:
    """Raw timing of one level run: per-read latency (ns) and the level's wall time (ns)."""

    latency_ns: np.ndarray  # [N] int64
    wall_ns: int
    nbytes: int  # bytes read in the level
    cached: float = 0.0  # share of the ranges' pages in the page cache just before the reads


def summarize(runs: Sequence[Timing], *, threads: int, size: int, split: int = 1, batch: int = 0):
    """Pool latencies over repeats; bandwidth and IOPS are per repeat, then their median."""
    if not runs:
        raise ValueError("summarize needs at least one run")
    lat_ms = np.concatenate([r.latency_ns for r in runs]).astype(np.float64) / 1e6  # [N]
    mb_s = [r.nbytes / MB / (r.wall_ns / 1e9) for r in runs]
    iops = [len(r.latency_ns) / (r.wall_ns / 1e9) for r in runs]
    return ReadStats(
        threads=threads,
        size=size,
        reads=int(lat_ms.size),
        median_ms=percentile(lat_ms, 50),
        mean_ms=mean(lat_ms),
        p90_ms=percentile(lat_ms, 90),
        mb_s=percentile(mb_s, 50),
        iops=percentile(iops, 50),
        mb_s_min=min(mb_s),
        mb_s_max=max(mb_s),
        split=split,
        batch=batch,
        cached=mean([r.cached for r in runs]),
        mb_s_runs=tuple(mb_s),
        median_ms_runs=tuple(percentile(r.latency_ns / 1e6, 50) for r in runs),
        iops_runs=tuple(iops),
    )


# ---------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class ProbeSettings:
    path: Path | None = None  # file to read; None: a scratch file in scratch_dir
    size: int = DEFAULT_SIZE  # bytes per read
    size_source: str = "default: seed 000's expert, 1.9 MB"
    threads: tuple[int, ...] = DEFAULT_THREADS
    reads: int = 64
    cache_mode: str = "direct"
    splits: tuple[int, ...] = DEFAULT_SPLITS
    split_threads: int | None = None  # None: the recommended thread count of the level sweep
    split_batch: int = DEFAULT_SPLIT_BATCH
    small_threads: tuple[int, ...] = DEFAULT_SMALL_THREADS
    small_reads: int | None = None  # None: 4 x reads
    repeat: int = 1
    scratch_dir: Path = Path(".")
    scratch_bytes: int = DEFAULT_SCRATCH_BYTES
    seed: int = 0
    fio: bool = False  # also run each level cell with fio (when installed), interleaved
    fio_seconds: float = DEFAULT_RUNTIME_S  # each fio run reads this long; 0: `reads` reads
    # replay the reads against this device model (sdq.paging.device_model); the bytes come
    # from the page cache (cache_mode "pagecache"), warmed first
    device_model: Path | None = None

    def validate(self) -> None:
        def positive(name, value):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ParamsError(f"{name} must be a positive integer, got {value!r}")

        if not self.threads:
            raise ParamsError("--threads: give at least one thread count")
        for t in (*self.threads, *self.small_threads):
            positive("--threads: thread count", t)
        for s in self.splits:
            positive("--split: chunk count", s)
            if s > 8:
                raise ParamsError(f"--split: chunk count {s} is above 8 (the pager's limit)")
        positive("--size", self.size)
        positive("--reads", self.reads)
        positive("--repeat", self.repeat)
        positive("--split-batch", self.split_batch)
        if not isinstance(self.fio_seconds, int | float) or not 0 <= self.fio_seconds <= 600:
            raise ParamsError(f"--fio-seconds must be in 0..600, got {self.fio_seconds!r}")
        if self.split_threads is not None:
            positive("--split-threads", self.split_threads)
        if self.small_reads is not None:
            positive("small reads", self.small_reads)
        if self.device_model is not None:
            if self.cache_mode != "pagecache":
                raise ParamsError(
                    "--device-model reads from the page cache (the emulated device's source): "
                    f"--cache-mode {self.cache_mode} does not apply"
                )
        elif self.cache_mode not in COLD_CACHE_MODES:
            raise ParamsError(
                f"--cache-mode must be one of {', '.join(COLD_CACHE_MODES)}, "
                f"got {self.cache_mode!r}"
            )
        top = max((*self.threads, *self.small_threads, self.split_threads or 1))
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        arena = top * _round_up(self.size, PAGE)
        if arena > ram // 4:
            raise ParamsError(
                f"{top} reads in flight x {self.size} B need a {arena} B arena, more than a "
                f"quarter of RAM ({ram} B); lower --threads or --size"
            )
        if self.path is None:
            positive("--scratch-size", self.scratch_bytes)
            if self.scratch_bytes < _round_up(self.size, PAGE):
                raise ParamsError(
                    f"--size {self.size} B is larger than the scratch file "
                    f"({self.scratch_bytes} B); raise --scratch-size"
                )


def parse_int_list(text: str, name: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4); a clear ParamsError for anything else."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ParamsError(f"{name}: expected comma-separated integers, got {text!r}") from None
    if not values:
        raise ParamsError(f"{name}: expected comma-separated integers, got {text!r}")
    bad = [v for v in values if v < 1]
    if bad:
        raise ParamsError(f"{name}: values must be >= 1, got {bad[0]}")
    return values


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


# ---------------------------------------------------------------------------- scratch file


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM / SIGHUP raise KeyboardInterrupt in the main thread, so `finally` blocks run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    saved = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def _check_writable_dir(directory: Path) -> None:
    if not directory.exists():
        raise ParamsError(f"scratch directory {directory} does not exist")
    if not directory.is_dir():
        raise ParamsError(f"scratch directory {directory} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ParamsError(f"scratch directory {directory} is not writable")


@contextlib.contextmanager
def scratch_file(directory: Path, nbytes: int, seed: int = 0) -> Iterator[Path]:
    """A file of `nbytes` random bytes in `directory`, on disk and out of the page cache.

    Removed when the block exits, however it exits (exception, Ctrl-C, SIGTERM, SIGHUP).
    """
    directory = Path(directory)
    _check_writable_dir(directory)
    free = shutil.disk_usage(directory).free
    if nbytes > free:
        raise ParamsError(
            f"scratch file of {nbytes} B does not fit in {directory} ({free} B free); "
            "lower --scratch-size or choose another --scratch-dir"
        )
    path = directory / f".sdq-probe-{os.getpid()}-{time.monotonic_ns()}.scratch"
    rng = np.random.default_rng(seed)
    chunk = 8 * MIB
    with _signals_raise():
        try:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except OSError as exc:
                raise ParamsError(
                    f"cannot create scratch file in {directory}: {exc.strerror}"
                ) from None
            try:
                left = nbytes
                while left:
                    n = min(chunk, left)
                    # random bytes: nothing a compressing or deduplicating layer could shortcut
                    os.write(fd, rng.integers(0, 256, n, dtype=np.uint8).tobytes())
                    left -= n
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError as exc:
                raise ParamsError(
                    f"cannot write {nbytes} B scratch file {path}: {exc.strerror}"
                ) from None
            finally:
                os.close(fd)
            yield path
        finally:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


# ---------------------------------------------------------------------------- reading


def _open_for(path: Path, cache_mode: str) -> int:
    flags = os.O_RDONLY | (os.O_DIRECT if cache_mode == "direct" else 0)
    try:
        return os.open(path, flags)
    except OSError as exc:
        if cache_mode == "direct" and exc.errno == errno.EINVAL:  # a fs without O_DIRECT
            raise ReadError(
                f"{path}: the filesystem does not support O_DIRECT; use --cache-mode dontneed"
            ) from None
        raise ReadError(f"cannot open {path}: {exc.strerror}") from None


def _drop_cache(fd: int) -> None:
    """Write back and evict the file's cached pages, so a level starts cold.

    DONTNEED only evicts clean pages: a file written moments ago (a model just built) would
    otherwise stay in the page cache and be "read" at memory speed.
    """
    with contextlib.suppress(OSError):  # fsync of a read-only fd works on Linux; if not, try
        os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def _cached_share(fd: int, offsets: np.ndarray, length: int) -> float:
    """Mean share of the ranges' pages already in the page cache (mincore), before reading."""
    from sdq import _io

    return mean([_io.resident_fraction(fd, int(o), int(length)) for o in offsets])


HUGE_PAGE = 2 * MIB


def huge_share(arena) -> float:
    """Share of the mapping that holds `arena` backed by transparent huge pages (smaps)."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        head = line.split(" ", 1)[0].split("-")
        if len(head) != 2 or not all(c in "0123456789abcdef" for c in "".join(head)):
            continue
        lo, hi = int(head[0], 16), int(head[1], 16)
        if lo <= arena.base < hi:
            for entry in lines[i + 1 :]:
                if entry.startswith("AnonHugePages:"):
                    return int(entry.split()[1]) * KIB / (hi - lo)
            break
    return 0.0


def inner_arena(n_slots: int, slot_bytes: int):
    """(arena, first): an `sdq.paging.arena.Arena` with `n_slots` usable slots from index
    `first` on.

    The arena asks for transparent huge pages, and the kernel can only back whole, aligned
    2 MiB ranges of a mapping with them: a slot within 2 MiB of either end of a small arena may
    get 4 KiB pages, while almost all of the engine's large arena is huge-page backed. So the
    probes keep spare slots at both ends and read only into the ones between.
    """
    from sdq.paging.arena import Arena

    lead = -(-HUGE_PAGE // slot_bytes)
    return Arena(n_slots + 2 * lead, slot_bytes), lead


class PoolReader:
    """Reads the way the pager reads: the pager's C pool (`sdq._io.Pool`) into an arena.

    One persistent pool (its thread count set per cell) and one `sdq.paging.arena.Arena` (huge pages
    where the kernel gives them, see `inner_arena`) with a slot per read in flight, allocated
    and faulted in once when the reader is made, then reused by every read of the probe, as the
    engine reads experts into preallocated slots it reuses token after token. Read i of a batch
    lands in slot first + i % threads (the bytes are discarded,
    only the timing is kept). A fresh buffer per read would time first-touch page faults and
    cold memory the engine never sees. Every read is its own task; `groups` (one per read by
    default) only label what a caller waits for. Slots are page-aligned and a whole number of
    pages, as O_DIRECT needs.
    Timestamps are the pool's (CLOCK_MONOTONIC, as `time.perf_counter_ns` on Linux); in
    `dontneed` mode the pool's end time includes the posix_fadvise after the read.
    """

    def __init__(self, fd: int, max_threads: int, max_len: int, cache_mode: str):
        from sdq import _io

        self.fd = fd
        self._flags = {"direct": _io.FLAG_DIRECT, "dontneed": _io.FLAG_DONTNEED, "pagecache": 0}[
            cache_mode
        ]
        self.keep_warm = False  # under emulation the page cache is the source
        self.stride = _round_up(max_len, PAGE)
        self.arena, self.first = inner_arena(max_threads, self.stride)
        self.arena.buf[::PAGE] = 1  # fault every page in now, not during a timed read
        self._pool = _io.Pool(1)
        self.max_threads = max_threads

    @property
    def threads(self) -> int:
        return self._pool.threads

    @threads.setter
    def threads(self, n: int) -> None:
        if not 1 <= n <= self.max_threads:
            raise ValueError(f"{n} threads: this reader has slots for 1..{self.max_threads}")
        self._pool.threads = n

    def emulate(self, model) -> None:
        """Hold every read until `model` (a DeviceModel) would have finished it."""
        self._pool.emulate(*model.c_params())
        self.keep_warm = True

    def emulated(self) -> tuple[int, int, int]:
        """(reads run under emulation, reads whose bytes arrived after their emulated end, the
        others' summed ns past it)."""
        return self._pool.emulated()

    def drop_cache(self) -> None:
        """Start a run cold: the file out of the page cache (kept warm under emulation, where
        the page cache is the source)."""
        if not self.keep_warm:
            _drop_cache(self.fd)

    def read_batch(self, offsets: np.ndarray, lengths: np.ndarray, groups=None):
        """(submit_ns, start_ns [R], end_ns [R]) of reads of `lengths` at `offsets`, all at once."""
        n = len(offsets)
        if n and int(np.max(lengths)) > self.stride:
            raise ValueError(f"read of {int(np.max(lengths))} B exceeds the slot ({self.stride} B)")
        table = np.empty((n, 7), np.int64)  # [R, 7]: fd, offset, length, need, dest, task, group
        table[:, 0] = self.fd
        table[:, 1] = offsets
        table[:, 2] = lengths
        table[:, 3] = lengths
        slot = self.first + np.arange(n, dtype=np.int64) % self.threads  # [R]
        table[:, 4] = self.arena.base + slot * self.stride
        table[:, 5] = np.arange(n)
        table[:, 6] = np.arange(n) if groups is None else groups
        try:
            batch = self._pool.submit(table, self._flags, self.arena.buf)
            batch.wait_all()
        except OSError as exc:
            raise ReadError(f"probe read failed: {exc}") from None
        report = np.frombuffer(batch.report(), np.int64).reshape(n, 6)  # [R, 6]
        del batch  # frees the C batch before the slots are reused
        return int(report[0, 0]), report[:, 1].copy(), report[:, 2].copy()

    def close(self) -> None:
        self._pool.close()
        self.arena.close()


READER = (
    "sdq._io.Pool (the pager's C pthread pool) into a reused, pre-faulted arena "
    "(one slot per read in flight)"
)


def _random_offsets(rng, file_bytes: int, length: int, n: int) -> np.ndarray:
    """n page-aligned offsets of non-overlapping `length`-byte ranges where the file allows."""
    stride = _round_up(length, PAGE)
    slots = (file_bytes - length) // stride + 1
    if slots < 1:
        raise ParamsError(f"read size {length} B is larger than the file ({file_bytes} B)")
    idx = rng.choice(slots, size=n, replace=n > slots)  # [N]
    return idx.astype(np.int64) * stride


def _read_len(size: int, cache_mode: str) -> int:
    """O_DIRECT reads whole 4 KiB pages: the request is rounded up (and counted as read)."""
    return _round_up(size, PAGE) if cache_mode == "direct" else size


def level_reads(reads: int, threads: int) -> int:
    """Reads of a level: `reads` rounded up to a multiple of `threads`, so every reader has the
    same share (fio's number_ios per job) and no level ends on a part-empty last round."""
    return -(-reads // threads) * threads


def _level(reader, file_bytes, *, size, threads, reads, cache_mode, rng, repeat) -> list[Timing]:
    """`reads` random reads of `size` bytes with `threads` workers, `repeat` times."""
    length = _read_len(size, cache_mode)
    reader.threads = threads
    runs = []
    for _ in range(repeat):
        offsets = _random_offsets(rng, file_bytes, length, reads)  # [R]
        lengths = np.full(reads, length, np.int64)  # [R]
        reader.drop_cache()
        cached = _cached_share(reader.fd, offsets, length)
        _, start, end = reader.read_batch(offsets, lengths)
        wall = int(end.max() - start.min())
        runs.append(Timing(end - start, wall, int(lengths.sum()), cached))
    return runs


def chunk_bounds(size: int, split: int) -> list[tuple[int, int]]:
    """(offset within segment, length) of `split` chunks cut on page boundaries.

    Fewer chunks come back when the segment has fewer pages than `split`.
    """
    step = _round_up(-(-size // split), PAGE)
    return [(o, min(step, size - o)) for o in range(0, size, step)]


def _split_cell(
    reader, file_bytes, *, size, split, threads, batch, reads, cache_mode, rng, repeat
) -> list[Timing]:
    """Segments in batches of `batch`, each cut in `split` chunks, all of a batch at once.

    A segment's latency runs from its batch's submission to its last chunk's end; the wall
    time is the sum of the batches' (submission to last end), so the cache drop and checks
    between batches are not counted. The file is dropped before every batch: buffered chunk
    reads trigger readahead past a segment, which a later batch could otherwise hit.
    """
    length = _read_len(size, cache_mode)
    chunks = chunk_bounds(length, split)
    n_batches = max(1, round(reads / batch))
    fd = reader.fd
    reader.threads = threads
    runs = []
    for _ in range(repeat):
        seg_lat, wall, nbytes, cached = [], 0, 0, []
        for _b in range(n_batches):
            seg = _random_offsets(rng, file_bytes, length, batch)  # [B]
            offsets = np.array([s + o for s in seg for o, _ in chunks], np.int64)  # [B*S]
            lengths = np.array([n for _ in seg for _, n in chunks], np.int64)  # [B*S]
            groups = np.repeat(np.arange(batch), len(chunks))  # [B*S]: segment of each chunk
            reader.drop_cache()
            cached.append(_cached_share(fd, seg, length))
            submit, start, end = reader.read_batch(offsets, lengths, groups)
            per_seg = end.reshape(batch, len(chunks)).max(axis=1)  # [B]
            seg_lat.append(per_seg - submit)
            wall += int(end.max()) - submit
            nbytes += int(lengths.sum())
        runs.append(Timing(np.concatenate(seg_lat), wall, nbytes, mean(cached)))
    return runs


# ---------------------------------------------------------------------------- re-reads


@dataclass(frozen=True)
class Reread:
    """The same 4 KiB blocks read twice with O_DIRECT, one read in flight (`reread_latency`)."""

    path: str
    reads: int
    file_age_s: float  # seconds since the file was last written (mtime)
    first_median_ms: float
    first_p90_ms: float
    first_mean_ms: float
    second_median_ms: float
    second_p90_ms: float
    second_mean_ms: float
    first_ms: tuple[float, ...] = ()  # [N] each block's first read, in read order
    second_ms: tuple[float, ...] = ()  # [N] the same block's second read

    @property
    def mean_ratio(self) -> float:
        """Mean latency of the first reads / of the second reads of the same blocks."""
        return self.first_mean_ms / self.second_mean_ms

    @property
    def slower_share(self) -> float:
        """Share of the blocks whose first read took longer than their second. Without a cache
        below the machine the two reads of a block are alike and the share is 1/2 (the reads
        alternate in time, so a busier or quieter machine does not favour either)."""
        a, b = np.asarray(self.first_ms), np.asarray(self.second_ms)  # [N], [N]
        return float(np.mean(a > b))

    def slower_share_interval(self, resamples: int = 10_000, seed: int = 0):
        """95 % percentile bootstrap interval of `slower_share`, resampling blocks: a low end
        above 1/2 means first reads are slower more often than chance: a cache below."""
        return self._interval(lambda a, b: (a > b).mean(axis=1), resamples, seed)

    def _interval(self, stat, resamples: int, seed: int) -> tuple[float, float]:
        a, b = np.asarray(self.first_ms), np.asarray(self.second_ms)  # [N], [N]
        idx = np.random.default_rng(seed).integers(0, len(a), size=(resamples, len(a)))
        values = np.sort(stat(a[idx], b[idx]))  # [resamples]
        tail = round(resamples * 0.025)
        return float(values[tail - 1]), float(values[resamples - tail])


def reread_order(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, first, second) for re-reading blocks 0..n-1 interleaved with first reads.

    order [2n]: the blocks in read order b0, b1, b0, b2, b1, ..., b(n-1), b(n-2), b(n-1): each
    block is read again right after the next block's first read, so first and second reads
    alternate in time and a machine that slows down or speeds up touches both alike.
    first [n], second [n]: the positions in `order` of each block's first and second read.
    """
    if n < 1:
        raise ValueError("reread_order needs at least one block")
    order = [0]
    for i in range(1, n):
        order += [i, i - 1]
    order.append(n - 1)
    order = np.asarray(order, dtype=np.int64)  # [2n]
    first = np.full(n, -1, np.int64)
    second = np.full(n, -1, np.int64)
    for pos, b in enumerate(order):
        if first[b] < 0:
            first[b] = pos
        else:
            second[b] = pos
    return order, first, second


def reread_latency(path: str | os.PathLike, reads: int = 256, seed: int = 0) -> Reread:
    """`reads` 4 KiB O_DIRECT reads at distinct random offsets of `path`, one in flight,
    through the pager's pool, each block read a second time right after the next block's first
    read (`reread_order`).

    O_DIRECT bypasses this machine's page cache, so second reads faster than the first mean a
    cache below it: the host's, when the disk is virtual, or the drive's own. Blocks read or
    written shortly before are fast both times if such a cache holds them already.
    """
    path = Path(path)
    st = path.stat()
    fd = _open_for(path, "direct")
    try:
        reader = PoolReader(fd, 1, PAGE, "direct")
        try:
            rng = np.random.default_rng(seed)
            blocks = _random_offsets(rng, st.st_size, PAGE, reads)  # [N]
            order, first, second = reread_order(len(blocks))  # [2N], [N], [N]
            lengths = np.full(len(order), PAGE, np.int64)  # [2N]
            _, start, end = reader.read_batch(blocks[order], lengths)  # one worker: in order
            lat = (end - start).astype(np.float64) / 1e6  # [2N] ms
        finally:
            reader.close()
    finally:
        os.close(fd)
    a, b = lat[first], lat[second]  # [N], [N]
    return Reread(
        path=str(path),
        reads=reads,
        file_age_s=time.time() - st.st_mtime,
        first_median_ms=percentile(a, 50),
        first_p90_ms=percentile(a, 90),
        first_mean_ms=mean(a),
        second_median_ms=percentile(b, 50),
        second_p90_ms=percentile(b, 90),
        second_mean_ms=mean(b),
        first_ms=tuple(float(x) for x in a),
        second_ms=tuple(float(x) for x in b),
    )


# ---------------------------------------------------------------------------- the probe


@dataclass
class ProbeResult:
    settings: dict
    storage: dict
    storage_label: str
    scratch: bool  # True when the file was a scratch file (removed afterwards)
    cache_mode: str
    reader: str  # what issued the reads
    levels: list[ReadStats] = field(default_factory=list)
    small: list[ReadStats] = field(default_factory=list)
    split: list[ReadStats] = field(default_factory=list)
    split_threads: int = 0
    fio: list[dict] = field(default_factory=list)  # fio on the same level cells (fio_summary)
    fio_note: str = ""  # fio's version, or why there is no fio column
    fio_memory: str = ""  # fio's buffers: huge pages reserved, or why 4 KiB pages
    arena_huge_share: float = 0.0  # share of the reader's arena on transparent huge pages
    seconds: float = 0.0
    # 1-minute load average before and after, and the CPUs: how busy the machine was
    load: tuple[float, float] = (0.0, 0.0)
    cpus: int = 0
    # under --device-model: "emulated: <name>", and the model, its source's speed, late reads
    emulated: str = ""
    emulation: dict = field(default_factory=dict)

    def conditions(self) -> str:
        return (
            f"1-min load average {self.load[0]:.1f} -> {self.load[1]:.1f} on {self.cpus} CPUs "
            f"over {self.seconds:.0f} s"
        )

    def to_dict(self, engine=None) -> dict:
        d = asdict(self)
        d["recommendation"] = asdict(recommend(self, engine))
        return d


@dataclass(frozen=True)
class Recommendation:
    io_threads: int
    io_split: int
    best_mb_s: float
    chosen_mb_s: float
    split_gain: float  # bandwidth of the chosen split / split 1
    why: str
    basis: str = "levels"  # what the threads come from: "engine" (T1_engine) or "levels" (T1)


BASIS = {
    "engine": "the pager's own expert reads (K experts x 3 segments of a layer in flight)",
    "levels": "equal-sized reads, all in flight at once",
}


def pick_threads(cells, within: float = WITHIN):
    """(chosen, best) of (threads, median MB/s) pairs: the fewest threads whose median is
    within `within` of the best median, and the best."""
    cells = list(cells)
    if not cells:
        raise ValueError("no thread counts measured")
    top = max(cells, key=lambda c: c[1])
    chosen = min((c for c in cells if c[1] >= (1 - within) * top[1]), key=lambda c: c[0])
    return chosen, top


def pick_split(cells, within: float = WITHIN):
    """(split, gain) from (split, median MB/s, slowest run's MB/s) triples measured alike: the
    fastest split > 1 whose median beats split 1's by more than `within` and whose slowest run
    beats split 1's median (one lucky run is not enough); else (1, 1.0). Also (1, 1.0) when
    split 1 was not measured."""
    cells = list(cells)
    base = next((c for c in cells if c[0] == 1), None)
    if base is None:
        return 1, 1.0
    helps = [c for c in cells if c[0] > 1 and c[1] > (1 + within) * base[1] and c[2] > base[1]]
    if not helps:
        return 1, 1.0
    win = max(helps, key=lambda c: c[1])
    return win[0], win[1] / base[1]


def recommend(result: ProbeResult | None = None, engine=None, within: float = WITHIN):
    """The I/O threads and split to run the pager with, from the probe's measurements.

    Threads: the fewest whose median bandwidth is within `within` of the best median — on the
    pager's own expert reads (`engine`, an sdq.measure.probe_engine.EngineResult) when they
    were measured, else on the level sweep of `result`. Split: by `pick_split`, from the
    engine's split sweep when measured, else from `result`'s chunking cells at the engine's
    batch (the largest measured).
    """
    eng_cells = list(getattr(engine, "cells", None) or [])
    if eng_cells:
        basis, cells = "engine", [(c.threads, c.arena_mb_s) for c in eng_cells]
    elif result is not None and result.levels:
        basis, cells = "levels", [(c.threads, c.mb_s) for c in result.levels]
    else:
        raise ValueError("no levels measured")
    (n, mb_s), (top_n, top_mb_s) = pick_threads(cells, within)
    why = f"{n} thread{'s' if n != 1 else ''}: {mb_s:.0f} MB/s on {BASIS[basis]}"
    if n == top_n:
        why += ", the best median"
    else:
        why += f", within {within:.0%} of the best median ({top_mb_s:.0f} MB/s at {top_n})"
    eng_split = list(getattr(engine, "splits", None) or [])
    if eng_split:
        io_split, gain = pick_split([(c.split, c.mb_s, c.mb_s_min) for c in eng_split], within)
        where = f"the pager's split reads at {eng_split[0].threads} threads"
    else:
        split = list(result.split) if result is not None else []
        batch = max((c.batch for c in split), default=0)
        engine_batch = [c for c in split if c.batch == batch]
        io_split, gain = pick_split([(c.split, c.mb_s, c.mb_s_min) for c in engine_batch], within)
        where = f"chunked reads, batch {batch}"
    if io_split > 1:
        why += f"; split {io_split} gives {gain:.2f}x split 1 ({where})"
    elif eng_split or (result is not None and result.split):
        why += f"; no split beats split 1 by more than {within:.0%} ({where})"
    return Recommendation(n, io_split, top_mb_s, mb_s, gain, why, basis)


def _engine_shape(model_path: Path) -> tuple[int, int]:
    """(largest expert segment bytes, segments a decode layer submits: K experts x 3)."""
    from sdq.format.model import open_model

    model = open_model(model_path)
    table = model.require_experts() if hasattr(model, "require_experts") else model.experts
    return int(np.max(table.nbytes)), int(model.spec.n_expert_used) * 3


def settings_for_model(model_path: Path, **overrides) -> ProbeSettings:
    """Probe settings whose read size and split batch come from a GGUF model's experts."""
    seg, batch = _engine_shape(Path(model_path))
    base = dict(path=Path(model_path), size=seg, split_batch=batch)
    base["size_source"] = f"the model's largest expert segment, {seg} B"
    base.update(overrides)
    return ProbeSettings(**base)


def storage_of(path: Path):
    """Storage labels of `path`; a memory filesystem is refused (no device behind it)."""
    from sdq.measure.device import describe_storage

    storage = describe_storage(path)
    if storage.fstype in MEMORY_FILESYSTEMS:
        raise ParamsError(
            f"{path} is on {storage.fstype}, which lives in RAM: there is no device to probe "
            "(give --file or --scratch-dir on a disk)"
        )
    return storage


def _sweep(result: ProbeResult, settings: ProbeSettings, path, fd, file_bytes, rng, say) -> None:
    """All cells through one PoolReader, repeats outermost."""
    top = max((*settings.threads, *settings.small_threads, settings.split_threads or 1))
    reader = PoolReader(fd, top, _read_len(settings.size, settings.cache_mode), settings.cache_mode)
    result.arena_huge_share = huge_share(reader.arena)
    try:
        if settings.device_model is not None:
            _start_emulation(result, settings, reader, file_bytes, rng, say)
        _sweep_cells(result, settings, path, reader, file_bytes, rng, say)
        if settings.device_model is not None:
            reads, late, over_ns = reader.emulated()
            held = max(reads - late, 1)
            result.emulation |= {"reads": reads, "late_reads": late,
                                 "mean_lag_us": over_ns / held / 1e3}  # fmt: skip
    finally:
        reader.close()


SOURCE_READS = 16


def _start_emulation(result, settings, reader, file_bytes, rng, say) -> None:
    """Warm the file into the page cache, time it as the source (one stream, `size`-byte
    reads), refuse a model faster than that, and start the emulation."""
    from sdq.paging import device_model

    model = device_model.load(settings.device_model)
    say(f"warming {file_bytes / MIB:.0f} MiB into the page cache (the emulated device's source)")
    warm_file(reader.fd, file_bytes)
    reader.keep_warm = True
    reader.threads = 1
    runs = _level(reader, file_bytes, size=settings.size, threads=1, reads=SOURCE_READS,
                  cache_mode="pagecache", rng=rng, repeat=1)  # fmt: skip
    source = summarize(runs, threads=1, size=settings.size)
    check_source(model, source.mb_s, source.cached)
    reader.emulate(model)
    result.emulated = model.label
    result.emulation = {
        "model": {k: v for k, v in asdict(model).items() if k != "fit"},
        "source": "page cache (warmed)",
        "source_mb_s": source.mb_s,
        "source_cached": source.cached,
    }


def warm_file(fd: int, file_bytes: int, chunk: int = 8 * MIB) -> None:
    """Read the whole file once so that its pages are in the page cache."""
    for off in range(0, file_bytes, chunk):
        os.pread(fd, chunk, off)


def check_source(model, source_mb_s: float, cached: float) -> None:
    """ParamsError unless the source (the warm page cache) is faster than the model's single
    stream: emulation can only slow reads down."""
    if cached < 0.99:
        raise ParamsError(
            f"device model {model.name}: only {cached:.0%} of the file stayed in the page cache; "
            "emulation needs a source that fits in RAM (a smaller --scratch-size or --file)"
        )
    if model.stream_mb_s >= source_mb_s:
        raise ParamsError(
            f"device model {model.name}: one stream at {model.stream_mb_s:g} MB/s is not slower "
            f"than the source here ({source_mb_s:.0f} MB/s from the page cache): emulation "
            "can only slow reads down"
        )


def _sweep_cells(result, settings, path, reader, file_bytes, rng, say) -> None:
    """All cells, repeats outermost: run r of every cell before run r + 1 of any, so slow
    phases of a shared machine spread over all cells instead of biasing one; the cells run in
    one order on even runs and in the reverse order on odd ones, so any two cells alternate
    (what the paired comparisons of sdq.lab.verdict need). fio (when asked) runs next to sdq's
    run of the same cell: after it on even runs, before it on odd ones, for `fio_seconds` each,
    into huge-page buffers where they can be reserved (sdq.measure.fio)."""
    mode, size, reads, repeat = settings.cache_mode, settings.size, settings.reads, settings.repeat
    small_reads = settings.small_reads or 4 * reads
    fio, buffers = None, contextlib.nullcontext(None)
    if settings.fio:
        from sdq.measure import fio as fio_mod

        if fio_mod.fio_binary() is None:
            result.fio_note = "fio is not installed"
        else:
            fio, result.fio_note = fio_mod.run_fio, fio_mod.fio_version() or "fio"
            pages = fio_mod.huge_pages_for(_read_len(size, mode), max(settings.threads))
            buffers = fio_mod.huge_page_buffers(pages)
    levels = {t: [] for t in settings.threads}
    small = {t: [] for t in settings.small_threads}
    fio_runs = {t: [] for t in settings.threads}
    with buffers as memory:
        result.fio_memory = memory.note if memory is not None else ""

        def fio_cell(t, n):
            fio_runs[t].append(fio(path, size=_read_len(size, mode), threads=t, reads=n,
                                   cache_mode=mode, runtime_s=settings.fio_seconds or None,
                                   memory=memory))  # fmt: skip

        for r in range(repeat):
            for t in _in_turn(settings.threads, r):
                n = level_reads(reads, t)
                say(f"run {r + 1}/{repeat}: {size} B x {n} reads at {t} threads")
                if fio is not None and r % 2:  # every other run fio goes first: no order bias
                    fio_cell(t, n)
                levels[t] += _level(reader, file_bytes, size=size, threads=t, reads=n,
                                    cache_mode=mode, rng=rng, repeat=1)  # fmt: skip
                if fio is not None and not r % 2:
                    fio_cell(t, n)
            for t in _in_turn(settings.small_threads, r):
                say(f"run {r + 1}/{repeat}: 4 KiB x {small_reads} reads at {t} threads")
                small[t] += _level(reader, file_bytes, size=SMALL_SIZE, threads=t,
                                   reads=small_reads, cache_mode=mode, rng=rng,
                                   repeat=1)  # fmt: skip
    result.levels = [summarize(runs, threads=t, size=size) for t, runs in levels.items()]
    result.small = [summarize(runs, threads=t, size=SMALL_SIZE) for t, runs in small.items()]
    if fio is not None:
        result.fio = [
            fio_summary(runs, sdq=level)
            for runs, level in zip(fio_runs.values(), result.levels, strict=True)
        ]

    threads = settings.split_threads or recommend(result).io_threads
    result.split_threads = threads
    cells = [(b, s) for b in sorted({1, settings.split_batch}) for s in settings.splits]
    split_runs = {c: [] for c in cells}
    for r in range(repeat):
        for batch, s in _in_turn(cells, r):
            say(f"run {r + 1}/{repeat}: split {s}, batch {batch} segments, {threads} threads")
            split_runs[batch, s] += _split_cell(reader, file_bytes, size=size, split=s,
                                                threads=threads, batch=batch, reads=reads,
                                                cache_mode=mode, rng=rng, repeat=1)  # fmt: skip
    result.split = [
        summarize(runs, threads=threads, size=size, split=s, batch=b)
        for (b, s), runs in split_runs.items()
    ]


def _in_turn(cells, run: int) -> list:
    """The cells in their order on even runs, reversed on odd ones."""
    cells = list(cells)
    return cells if run % 2 == 0 else cells[::-1]


def fio_summary(runs, sdq: ReadStats | None = None) -> dict:
    """Medians over fio runs of one cell (FioStats), in ReadStats' field names; with `sdq` (the
    probe's own cell) also `sdq_over_fio`: the ratio of the two median bandwidths."""
    med = {k: percentile([getattr(r, k) for r in runs], 50) for k in
           ("median_ms", "mean_ms", "p90_ms", "mb_s", "iops")}  # fmt: skip
    ratio = sdq.mb_s / med["mb_s"] if sdq is not None and med["mb_s"] > 0 else float("nan")
    return dict(
        threads=runs[0].threads, size=runs[0].size, reads=sum(r.reads for r in runs), **med,
        mb_s_min=min(r.mb_s for r in runs), mb_s_max=max(r.mb_s for r in runs),
        cache_mode=runs[0].cache_mode, command=runs[-1].command, sdq_over_fio=ratio,
        page_bytes=sorted({r.page_bytes for r in runs}),  # fio's buffer pages, all runs
        runtime_ms=percentile([r.runtime_ms for r in runs], 50),
    )  # fmt: skip


def run_probe(settings: ProbeSettings, progress=None) -> ProbeResult:
    """Run the three sweeps; `progress(str)` is called before each cell when given."""
    settings.validate()
    say = progress or (lambda msg: None)
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if settings.path is None:
            say(f"writing a {settings.scratch_bytes / MIB:.0f} MiB scratch file")
            path = stack.enter_context(
                scratch_file(settings.scratch_dir, settings.scratch_bytes, settings.seed)
            )
        else:
            path = Path(settings.path)
            if not path.is_file():
                raise ParamsError(f"--file {path}: no such file")
        file_bytes = path.stat().st_size
        if settings.size > file_bytes:
            raise ParamsError(f"--size {settings.size} B is larger than {path} ({file_bytes} B)")
        if _read_len(settings.size, settings.cache_mode) > file_bytes:
            raise ParamsError(
                f"--size {settings.size} B, rounded up to {_read_len(settings.size, 'direct')} B "
                f"for O_DIRECT, is larger than {path} ({file_bytes} B)"
            )
        if settings.device_model is not None:
            from sdq.measure.device import describe_storage

            storage = describe_storage(path)  # only the source: the device is the model
        else:
            storage = storage_of(path)
        fd = _open_for(path, settings.cache_mode)
        stack.callback(os.close, fd)
        rng = np.random.default_rng(settings.seed)
        result = ProbeResult(
            settings=_settings_dict(settings),
            storage=storage.to_dict(),
            storage_label=storage.label(),
            scratch=settings.path is None,
            cache_mode=settings.cache_mode,
            reader=READER,
        )
        load_before = os.getloadavg()[0]
        with _signals_raise():
            _sweep(result, settings, path, fd, file_bytes, rng, say)
        if result.emulated:
            result.storage_label = f"{result.emulated} (source: {result.storage_label})"
        result.load, result.cpus = (load_before, os.getloadavg()[0]), os.cpu_count() or 0
    result.seconds = time.perf_counter() - t0
    return result


@contextlib.contextmanager
def target_file(
    file: str | os.PathLike | None, scratch_dir: Path, scratch_bytes: int, seed: int = 0
) -> Iterator[Path]:
    """The file to probe: `file` itself, or a scratch file removed when the block exits."""
    if file:
        path = Path(file)
        if not path.is_file():
            raise ParamsError(f"--file {path}: no such file")
        yield path
    else:
        with scratch_file(Path(scratch_dir), scratch_bytes, seed) as path:
            yield path


def _settings_dict(settings: ProbeSettings) -> dict:
    d = asdict(settings)
    for k in ("path", "scratch_dir", "device_model"):
        d[k] = None if d[k] is None else str(d[k])
    return d


# ---------------------------------------------------------------------------- I/O profile


def profile_from(result: ProbeResult, engine=None) -> IOProfile:
    """The I/O profile of a probe (`recommend(result, engine)` and the evidence behind it)."""
    rec = recommend(result, engine)
    measured = {
        "size": result.settings["size"],
        "basis": rec.basis,
        "best_mb_s": rec.best_mb_s,
        "chosen_mb_s": rec.chosen_mb_s,
        "split_gain": rec.split_gain,
        "split_threads": result.split_threads,
        "why": rec.why,
        "levels": [asdict(s) for s in result.levels],
        "split": [asdict(s) for s in result.split],
    }
    if engine is not None:
        measured["engine"] = [asdict(c) for c in engine.cells]
        measured["engine_split"] = [asdict(c) for c in getattr(engine, "splits", [])]
    return IOProfile(
        io_threads=rec.io_threads,
        io_split=rec.io_split,
        cache_mode=result.cache_mode,
        device=dict(result.storage, label=result.storage_label),
        measured=json.loads(json.dumps(finite(measured))),  # as saved: lists, None for NaN
    )


def finite(obj):
    """`obj` (dicts, lists, tuples, numbers) with every non-finite float — NaN: not measured —
    as None, which JSON can hold; tuples become lists."""
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
