"""One layer, some of its experts a miss: how fast do they arrive? (table T3)

Seed 000 §2: 8 experts of one layer, all missing, read as
  serial    one task per expert: its three segments one after another (8 threads)
  parallel  every segment its own request (16 or 24 threads)
  split N   every segment cut into N page-aligned chunks (seed 003)
The seed's point (an expert is a chain of three reads) matters most when only a few experts of a
layer miss, as in decode, so the number of misses per layer is a parameter (`misses`, e.g.
1, 2, 4, 8): with 8 misses the serial reads already keep 8 requests in flight.

Each repetition picks a layer and max(misses) distinct experts at random (seeded); a
configuration with m misses reads the first m of them. Before every timed read the file's pages
are dropped from the page cache (dontneed), bypassed (direct) or warmed with one untimed read
(pagecache, reported as such: not device speed). Every configuration is timed once per
repetition on the same experts, in an order rotated by one each repetition so drift does not
favour one; the per-repetition times are kept (`Row.times_ms`), so two configurations give one
pair per repetition. With a pack (`pack`, sdq.paging.pack), every misses x thread count also
reads the same experts from the pack: "pack" (one read per expert), "pack splitN" (with mode
split: each record cut into N chunks) and "pack merged" (experts whose records lie side by
side read with one preadv). With `fio`, fio reads the same file
next to it (sdq.measure.fio): per configuration the same read lengths (a bssplit of the reads
sdq issued) with as many jobs as sdq had reads in flight (the I/O threads, or fewer when the
layer has fewer reads), O_DIRECT as sdq (cache mode direct only: fio cannot drop pages after
each read, so in a longer run it would re-read pages it cached), into buffers on huge pages
like the arena's where they can be reserved, for `fio_seconds`, at three points of the run (first,
middle and last repetition, after sdq's reads): `device_gb_s` / fio's median is the ratio to
fio. fio streams reads back to back while a layer waits for its slowest read, so the ratio also
holds what that wait costs. Reported per configuration: median wall time from submit to the
last byte,
GB/s of expert bytes at that median, and the ratio to the best configuration of another mode
with the same misses (> 1: slower). The slot bytes of each configuration are checked against the
file once. `sdq bench layer-miss` prints the rows.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from sdq.errors import ParamsError, ReadError
from sdq.paging.reads import CACHE_MODES, MODES

# what each page-cache mode (sdq.paging.reads.CACHE_MODES) means for this benchmark's timings
CACHE_NOTES = {
    "direct": "O_DIRECT, page cache bypassed",
    "dontneed": "page cache dropped before each read set, DONTNEED after each read",
    "pagecache": "warm page cache (read once untimed first): NOT device speed",
}


@dataclass(frozen=True)
class LayerMissSettings:
    """What one layer-miss run reads: `misses` experts of one layer (each count a set of
    configurations), each configuration (misses x mode x I/O threads, x split for mode split)
    `repeat` times, in one page-cache mode."""

    misses: tuple[int, ...] = (8,)
    modes: tuple[str, ...] = ("serial", "parallel")
    splits: tuple[int, ...] = (4,)
    io_threads: tuple[int, ...] = (8, 16, 24)
    cache_mode: str = "dontneed"
    repeat: int = 9
    layer: int | None = None  # a fixed MoE layer; None: a random one per repetition
    seed: int = 0
    # a device model file (sdq.paging.device_model): reads replayed against it, the bytes from
    # the warmed page cache (cache_mode pagecache); None: this machine's device
    device_model: str | None = None
    pack: str | None = None  # a pack of the model: its rows too (module docstring)
    fio: bool = False  # fio on the same reads beside every configuration (module docstring)
    fio_seconds: float = 0.5

    def configurations(self) -> list[tuple[int, str, int, int, str]]:
        """(misses, mode, split, io_threads, source) of every configuration, in the order
        reported; source: "gguf" or "pack"."""
        return configurations(
            self.misses, self.modes, self.splits, self.io_threads, self.pack is not None
        )


@dataclass
class Row:
    misses: int  # experts of the layer read (all missing)
    mode: str
    split: int
    io_threads: int
    cache_mode: str
    repeat: int
    median_ms: float
    min_ms: float
    max_ms: float
    expert_bytes: int  # per repetition (median over repetitions)
    device_bytes: int
    gb_s: float
    # share of the experts' pages in the page cache before a timed read: the largest over
    # repetitions for direct / dontneed (should be 0), the smallest for pagecache (should be 1)
    resident_before: float
    best_other: str = ""
    ratio_to_best_other: float = float("nan")
    times_ms: list[float] = field(default_factory=list)  # (repeat,) one per repetition, in order
    device: str = "native"  # this machine's device, or "emulated: <model name>"
    late_reads: int = 0  # under emulation: reads whose bytes came after their emulated end
    mean_lag_us: float = 0.0  # under emulation: how long after its emulated end a read ended
    source: str = "gguf"  # the file read: the GGUF (three reads per expert) or its pack
    device_gb_s: float = float("nan")  # device bytes requested / median time
    fio_gb_s: float = float("nan")  # fio's median over its runs (nan: not run)
    fio_jobs: int = 0  # fio's jobs: the reads sdq had in flight
    fio_page_bytes: int = 0  # page size of fio's buffers
    ratio_to_fio: float = float("nan")  # device_gb_s / fio_gb_s
    fio_bssplit: str = ""

    @property
    def kind(self) -> str:
        """The read layout without the thread count: serial, split4, pack, pack merged..."""
        if self.source == "pack":
            if self.mode in ("merged", "split"):
                return f"pack {'merged' if self.mode == 'merged' else f'split{self.split}'}"
            return "pack"
        return f"split{self.split}" if self.mode == "split" else self.mode

    @property
    def label(self) -> str:
        return f"{self.kind} x{self.io_threads}"


def configurations(misses, modes, splits, threads, pack=False) -> list[tuple]:
    out = []
    for m in misses:
        for mode in modes:
            for n in threads:
                for s in splits if mode == "split" else [1]:
                    out.append((m, mode, s, n, "gguf"))
        if pack:  # serial reads a record as parallel does: one read
            for mode in [*(v for v in modes if v not in ("serial", "merged")), "merged"]:
                for n in threads:
                    for s in splits if mode == "split" else [1]:
                        out.append((m, mode, s, n, "pack"))
    return out


@dataclass
class _Tally:
    """What the repetitions measured of one configuration."""

    times_ms: list[float] = field(default_factory=list)  # per repetition: submit to last byte
    nbytes: list[tuple[int, int]] = field(default_factory=list)  # (expert, device) bytes
    resident: float = 0.0  # the worst share of the experts' pages found cached before a read
    lengths: list[int] = field(default_factory=list)  # every read's length, for fio's bssplit
    in_flight: list[int] = field(default_factory=list)  # per repetition: reads in flight
    fio: list[tuple[float, int]] = field(default_factory=list)  # (MB/s, buffer page bytes)


def measure_layer_miss(path: str | os.PathLike, settings: LayerMissSettings) -> list[Row]:
    """Time every configuration of `settings` on the experts of the GGUF file `path`; one Row
    per configuration, with its ratio to the best configuration of another mode."""
    from sdq.format.model import open_model
    from sdq.paging.arena import Arena
    from sdq.paging.pack import open_pack
    from sdq.paging.reads import ExpertReader, IOSettings, SlotLayout

    st = settings
    for m in st.modes:
        if m not in MODES:
            raise ParamsError(f"--mode {m!r}: expected one of {', '.join(MODES)}")
    if st.cache_mode not in CACHE_MODES:
        raise ParamsError(
            f"--cache-mode {st.cache_mode!r}: expected one of {', '.join(CACHE_MODES)}"
        )
    if st.repeat < 1:
        raise ParamsError(f"--repeat {st.repeat}: expected >= 1")
    if st.fio:
        from sdq.measure.fio import fio_binary

        if st.cache_mode != "direct" or st.device_model is not None:
            raise ParamsError(
                "--fio compares O_DIRECT reads of this machine's device: use --cache-mode "
                "direct without --device-model (fio cannot drop pages after each read, and a "
                "longer fio run would re-read pages it cached)"
            )
        if fio_binary() is None:
            raise ParamsError("--fio: fio is not installed (apt-get install fio)")
    model = open_model(path)
    table = model.require_experts()
    if not st.misses:
        raise ParamsError("--misses: expected at least one count")
    for m in st.misses:
        if not 1 <= m <= table.n_expert:
            raise ParamsError(f"--misses {m}: expected 1..{table.n_expert} (experts per layer)")
    if st.layer is not None:
        table.row(st.layer)
    configs = st.configurations()
    emu = None
    if st.device_model is not None:
        from sdq.paging.device_model import load

        emu = load(st.device_model)
    for _, mode, s, n, _src in configs:
        IOSettings(threads=n, mode=mode, split=s, cache_mode=st.cache_mode, device=emu)
    most = max(st.misses)
    pack = open_pack(model, st.pack) if st.pack is not None else None
    first = IOSettings(threads=configs[0][3], cache_mode=st.cache_mode, device=emu)
    layouts = {"gguf": SlotLayout.for_table(table, st.cache_mode)}
    tables = {"gguf": table}
    if pack is not None:
        layouts["pack"] = SlotLayout.for_pack(pack, st.cache_mode)
        tables["pack"] = pack.table
    slot_bytes = max(lay.slot_bytes for lay in layouts.values())
    arena = Arena(most, slot_bytes, prefault=True)  # no first-touch faults in a timed read
    readers = {"gguf": ExpertReader(model.path, table, layouts["gguf"], first)}
    if pack is not None:
        try:
            readers["pack"] = ExpertReader(pack.path, pack.table, layouts["pack"], first)
        except BaseException:
            readers["gguf"].close()
            raise
    check_fd = os.open(model.path, os.O_RDONLY)
    rng = np.random.default_rng(st.seed)
    tally = {c: _Tally() for c in configs}
    warm = st.cache_mode == "pagecache" and emu is None  # emulated: warmed at open
    fio_at = _fio_points(st) if st.fio else ()
    fio_memory = None
    try:
        for r in range(st.repeat):
            row = (
                table.row(st.layer)
                if st.layer is not None
                else int(rng.integers(len(table.layers)))
            )
            chosen = [int(e) for e in rng.choice(table.n_expert, most, replace=False)]
            order = configs[r % len(configs) :] + configs[: r % len(configs)]
            for c in order:
                m, mode, s, n, src = c
                reader, source, t = readers[src], tables[src], tally[c]
                experts = chosen[:m]
                addrs = [arena.address(k) for k in range(m)]
                reader.set_io(
                    IOSettings(threads=n, mode=mode, split=s, cache_mode=st.cache_mode, device=emu)
                )
                if warm:  # read once untimed
                    reader.submit(row, experts, addrs, arena)[0].wait_all()
                else:
                    reader.drop_cache()  # emulated: the source stays warm
                cached = _resident(reader, source, row, experts)
                worse = min if st.cache_mode == "pagecache" else max
                t.resident = worse(t.resident, cached) if r else cached
                t0 = time.perf_counter_ns()
                batch, device = reader.submit(row, experts, addrs, arena)
                batch.wait_all()
                t.times_ms.append((time.perf_counter_ns() - t0) / 1e6)  # ns -> ms
                if fio_at:
                    reads, _ = reader.plan(row, experts, addrs)  # [R, 7]
                    t.lengths.extend(int(v) for v in reads[:, 2])
                    t.in_flight.append(min(n, len(set(reads[:, 5].tolist()))))
                t.nbytes.append((int(table.nbytes[row, experts].sum()), device))
                if r == 0:
                    _check(check_fd, arena, layouts[src], table, source, row, experts, model.path)
            if r in fio_at:
                if fio_memory is None:
                    fio_memory = _fio_memory(tally.values())
                for c in order:
                    t = tally[c]
                    t.fio.append(
                        _fio_run(readers[c[4]].path, st, t.lengths, t.in_flight, fio_memory)
                    )
        if not warm:
            for reader in readers.values():
                reader.drop_cache()
        emulated = [sum(v) for v in zip(*(rd.emulated() for rd in readers.values()), strict=True)]
    finally:
        if fio_memory is not None:
            fio_memory.close()
        os.close(check_fd)
        for reader in readers.values():
            reader.close()
        arena.close()

    rows = []
    for c in configs:
        m, mode, s, n, src = c
        t = tally[c]
        med = statistics.median(t.times_ms)
        eb = int(statistics.median(b for b, _ in t.nbytes))
        db = int(statistics.median(d for _, d in t.nbytes))
        rows.append(
            Row(
                m,
                mode,
                s,
                n,
                st.cache_mode,
                st.repeat,
                med,
                min(t.times_ms),
                max(t.times_ms),
                eb,
                db,
                eb / med / 1e6,  # bytes per ms / 10**6 = GB/s
                t.resident,
                times_ms=list(t.times_ms),
                device="native" if emu is None else emu.label,
                late_reads=emulated[1],
                mean_lag_us=emulated[2] / max(emulated[0] - emulated[1], 1) / 1e3,
                source=src,
                device_gb_s=db / med / 1e6,
            )
        )
        if t.fio:
            row = rows[-1]
            row.fio_gb_s = statistics.median(v for v, _ in t.fio) / 1e3
            row.fio_page_bytes = min(p for _, p in t.fio)
            row.fio_jobs = _jobs(t.in_flight)
            row.fio_bssplit = _bssplit(t.lengths)
            row.ratio_to_fio = row.device_gb_s / row.fio_gb_s
    for row_ in rows:
        others = [o for o in rows if o.kind != row_.kind and o.misses == row_.misses]
        if others:
            best = min(others, key=lambda o: o.median_ms)
            row_.best_other = best.label
            row_.ratio_to_best_other = row_.median_ms / best.median_ms
    return rows


def _fio_points(st: LayerMissSettings) -> tuple[int, ...]:
    """The repetitions after which fio runs: the first, the middle and the last."""
    return tuple(sorted({0, st.repeat // 2, st.repeat - 1}))


def _jobs(in_flight: list[int]) -> int:
    return max(1, int(statistics.median(in_flight)))


def _bssplit(lengths: list[int]) -> str:
    from sdq.measure.fio import bssplit

    return bssplit(lengths)


class _FioBuffers:
    """fio's buffer memory for the whole run: huge pages reserved once (sdq.measure.fio)."""

    def __init__(self, pages: int):
        from sdq.measure.fio import huge_page_buffers

        self._ctx = huge_page_buffers(pages)
        self.memory = self._ctx.__enter__()

    def close(self) -> None:
        self._ctx.__exit__(None, None, None)


def _fio_memory(tallies) -> _FioBuffers:
    """Huge-page buffers for the longest read at the most jobs of any configuration."""
    from sdq.measure.fio import huge_pages_for

    tallies = [t for t in tallies if t.lengths]
    longest = max(max(t.lengths) for t in tallies)
    jobs = max(_jobs(t.in_flight) for t in tallies)
    return _FioBuffers(huge_pages_for(longest, jobs))


def _fio_run(path, st: LayerMissSettings, lengths, in_flight, buffers) -> tuple[float, int]:
    """(MB/s, buffer page bytes) of one fio run on this configuration's reads."""
    from sdq.measure.fio import run_fio

    jobs = _jobs(in_flight)
    mean = int(sum(lengths) / len(lengths))
    stats = run_fio(
        path,
        size=mean,
        threads=jobs,
        reads=len(lengths),
        cache_mode=st.cache_mode,
        split=_bssplit(lengths),
        runtime_s=st.fio_seconds,
        memory=buffers.memory,
    )
    return stats.mb_s, stats.page_bytes


def _resident(reader, table, row, experts) -> float:
    fractions = [
        reader.resident_fraction(int(table.offsets[row, e, p]), int(table.nbytes[row, e, p]))
        for e in experts
        for p in range(3)
    ]
    return max(fractions)


def _check(fd, arena, layout, table, source, row, experts, path) -> None:
    """The slots hold the model file's bytes (read back through a plain buffered fd); `source`
    is the table the slots were read by (the model's, or its pack's)."""
    for k, e in enumerate(experts):
        slot = arena.slot(k)
        for p in range(3):
            off, n = int(table.offsets[row, e, p]), int(table.nbytes[row, e, p])
            v = layout.view_offset(int(source.offsets[row, e, p]), p, row)
            if slot[v : v + n].tobytes() != os.pread(fd, n, off):
                raise ReadError(
                    f"{path}: slot bytes differ from the file for layer "
                    f"{table.layers[row]} expert {e} part {p}"
                )
