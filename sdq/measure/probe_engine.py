"""The engine's own expert reads next to fio on the same model file (table T1_engine).

Dimension key: L MoE layers, E experts per layer, K experts a decode layer uses, P = 3 parts
(gate, up, down), R = K * P segment reads per layer.

The probe's level sweep (`sdq.measure.probe`) reads equal-sized ranges of a file; this asks the
same question of the pager's own read path. One "layer" is a decode miss as the pager serves it:
K distinct random experts of a random MoE layer, all R segments submitted at once through
`sdq.paging.reads.ExpertReader` (mode parallel, O_DIRECT, in-place aligned reads) into K slots
of an `sdq.paging.arena.Arena`, faulted in beforehand, away from the mapping's ends (huge pages
where the kernel gives them, as in the engine's large arena) — what `sdq bench layer-miss`
times.
`layers` layers back to back (each submitted when the previous one is in) make one run;
MB/s = device bytes requested / the run's wall time, MB = 10**6 B.

Beside it, per run:
- 4 KiB pages: the same layers into an arena advised MADV_NOHUGEPAGE (the pager's arena asks
  for transparent huge pages; this shows what they are worth on this machine);
- one slot: the same layers with every expert's destination the arena's slot 0 (the bytes are
  discarded). Same reads, same pool, same code; only the destination memory differs — a layer
  spread over K slots against one slot reused, as fio reuses one buffer per job;
- fio: the same segment sizes (a bssplit of the model's O_DIRECT read lengths in their
  proportions), the same concurrency (numjobs = I/O threads), O_DIRECT, at random 4 KiB-aligned
  offsets of the same file, for `fio_seconds` (else R * layers reads), into buffers on huge
  pages like the arena's where they can be reserved (sdq.measure.fio); with `fio_small_pages`
  also into fio's default 4 KiB-page buffers.
Runs are interleaved: run r of all of them at one thread count, in alternating order, then the
next thread count (in the reverse order on odd runs), then run r + 1. Medians over runs.

Then the split sweep (`splits`): the same engine reads in the pager's mode split (each segment
cut into S page-aligned chunks, one task per chunk; split 1 = mode parallel) at `split_threads`
(default: the thread count `sdq.measure.probe.pick_threads` takes from the cells above), S in
alternating order, run after run.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
from dataclasses import dataclass, field

import numpy as np

from sdq.errors import ParamsError
from sdq.measure.probe import huge_share, inner_arena, pick_threads
from sdq.units import MB

PAGE = 4096
DEFAULT_SPLITS = (1, 2, 4, 8)


@dataclass(frozen=True)
class EngineCell:
    """One thread count: medians over runs; read_ms = median duration of one segment read."""

    threads: int
    runs: int
    arena_mb_s: float
    small_pages_mb_s: float  # the same reads into an arena kept on 4 KiB pages
    one_slot_mb_s: float
    fio_mb_s: float  # nan without fio
    arena_mb_s_min: float
    arena_mb_s_max: float
    arena_read_ms: float
    small_pages_read_ms: float
    one_slot_read_ms: float
    fio_read_ms: float  # fio's median completion latency (from its bins); nan without fio
    fio_small_pages_mb_s: float = float("nan")  # fio into 4 KiB-page buffers; nan if not run
    fio_page_bytes: tuple[int, ...] = ()  # page sizes of fio's buffers over the runs
    arena_mb_s_runs: tuple[float, ...] = ()  # per run, in run order
    fio_mb_s_runs: tuple[float, ...] = ()

    @property
    def arena_over_fio(self) -> float:
        return self.arena_mb_s / self.fio_mb_s if self.fio_mb_s > 0 else float("nan")

    @property
    def one_slot_over_fio(self) -> float:
        return self.one_slot_mb_s / self.fio_mb_s if self.fio_mb_s > 0 else float("nan")


@dataclass(frozen=True)
class EngineSplitCell:
    """The engine's reads in mode split S at one thread count: medians over runs."""

    split: int
    threads: int
    runs: int
    mb_s: float
    mb_s_min: float
    mb_s_max: float
    read_ms: float  # median duration of one chunk read
    mb_s_runs: tuple[float, ...] = ()


@dataclass
class EngineResult:
    model: str
    k: int  # experts read per layer
    reads_per_layer: int  # R = K * 3
    layers: int  # layers per run
    repeat: int
    bssplit: str  # the O_DIRECT read lengths and their shares, as fio's --bssplit
    fio_note: str  # fio's version and an example command, or why there is no fio column
    cells: list[EngineCell] = field(default_factory=list)
    splits: list[EngineSplitCell] = field(default_factory=list)
    huge_share: float = 0.0  # share of the arena's mapping backed by huge pages (smaps)
    small_pages_huge_share: float = 0.0  # the same for the 4 KiB-page arena (expected 0)
    fio_memory: str = ""  # fio's buffers: huge pages reserved, or why 4 KiB pages
    fio_seconds: float = 0.0  # each fio run's length; 0: R * layers reads
    load: tuple[float, float] = (0.0, 0.0)
    cpus: int = 0
    seconds: float = 0.0

    def conditions(self) -> str:
        return (
            f"1-min load average {self.load[0]:.1f} -> {self.load[1]:.1f} on {self.cpus} CPUs "
            f"over {self.seconds:.0f} s"
        )


def _direct_spans(table) -> np.ndarray:
    """O_DIRECT read length of every segment: the 4 KiB-aligned superset. int64 [L, E, P]."""
    offsets = np.asarray(table.offsets, dtype=np.int64)  # [L, E, P]
    ends = offsets + np.asarray(table.nbytes, dtype=np.int64)  # [L, E, P]
    return -(-ends // PAGE) * PAGE - offsets // PAGE * PAGE


def engine_vs_fio(
    model_path,
    threads=(1, 2, 4, 8),
    *,
    layers: int = 9,
    repeat: int = 3,
    seed: int = 0,
    fio: bool = True,
    fio_seconds: float = 0.0,
    fio_small_pages: bool = False,
    splits=DEFAULT_SPLITS,
    split_threads: int | None = None,
    progress=None,
) -> EngineResult:
    """Measure the reads above at each thread count, then the split sweep (module docstring)."""
    from sdq.format.model import open_model
    from sdq.measure import fio as fio_mod
    from sdq.paging.reads import ExpertReader, IOSettings, SlotLayout

    if layers < 1 or repeat < 1 or not threads or min(threads) < 1:
        raise ParamsError(
            f"engine probe needs layers, repeat and thread counts >= 1, got layers={layers}, "
            f"repeat={repeat}, threads={tuple(threads)}"
        )
    if any(not 1 <= s <= 8 for s in splits) or (split_threads is not None and split_threads < 1):
        raise ParamsError(
            f"engine split sweep: splits must be in 1..8 and split threads >= 1, got "
            f"splits={tuple(splits)}, split_threads={split_threads}"
        )
    say = progress or (lambda msg: None)
    t0 = time.perf_counter()
    model = open_model(model_path)
    table = model.require_experts()
    k = int(model.spec.n_expert_used)
    spans = _direct_spans(table)  # [L, E, P]
    split = fio_mod.bssplit(spans.ravel())
    use_fio = fio and fio_mod.fio_binary() is not None
    result = EngineResult(
        model=str(model.path),
        k=k,
        reads_per_layer=3 * k,
        layers=layers,
        repeat=repeat,
        bssplit=split,
        fio_note="fio is not installed" if fio and not use_fio else "",
        fio_seconds=float(fio_seconds or 0.0),
    )
    buffers = contextlib.nullcontext(fio_mod.SMALL_PAGES)
    if use_fio:
        cmd = fio_mod.fio_command(model.path, size=0, threads=max(threads),
                                  reads=3 * k * layers, cache_mode="direct", split=split,
                                  runtime_s=fio_seconds or None)  # fmt: skip
        shown = " ".join("fio" if c == cmd[0] else c for c in cmd).replace(str(model.path), "FILE")
        result.fio_note = f"{fio_mod.fio_version() or 'fio'}: {shown} (numjobs per row)"
        buffers = fio_mod.huge_page_buffers(fio_mod.huge_pages_for(int(spans.max()), max(threads)))
    layout = SlotLayout.for_table(table, "direct")
    arena, first = inner_arena(k, layout.slot_bytes)  # K slots away from the mapping's ends
    small, small_first = inner_arena(k, layout.slot_bytes)
    with contextlib.suppress(AttributeError, OSError):
        small._map.madvise(mmap.MADV_NOHUGEPAGE)  # 4 KiB pages, as without the arena's advice
    for a in (arena, small):
        a.buf[::PAGE] = 1  # faulted in now, as a running engine's arena is
    result.huge_share, result.small_pages_huge_share = huge_share(arena), huge_share(small)
    spread = [arena.address(first + i) for i in range(k)]
    spread_small = [small.address(small_first + i) for i in range(k)]
    one = [arena.address(first)] * k
    reader = ExpertReader(model.path, table, layout, IOSettings(threads=1, cache_mode="direct"))
    rng = np.random.default_rng(seed)

    def pick():
        return [
            (int(rng.integers(len(table.layers))), rng.choice(table.n_expert, k, replace=False))
            for _ in range(layers)
        ]

    def run(picked, addrs, into=arena):
        nbytes, durations = 0, []
        start = time.perf_counter_ns()
        for row, experts in picked:
            batch, device = reader.submit(row, experts, addrs, into)
            batch.wait_all()
            nbytes += device
            report = batch.report()  # [R, 6]
            durations.append(report[:, 2] - report[:, 1])
        wall = time.perf_counter_ns() - start
        return nbytes / MB / (wall / 1e9), float(np.median(np.concatenate(durations))) / 1e6

    def fio_run(t, memory):
        st = fio_mod.run_fio(model.path, size=0, threads=t, reads=3 * k * layers,
                             cache_mode="direct", split=split, runtime_s=fio_seconds or None,
                             memory=memory)  # fmt: skip
        return st.mb_s, st.median_ms, st.page_bytes

    names = ("arena", "small", "one", "fio", "fio_small")
    samples = {t: {n: [] for n in names} for t in threads}
    split_samples = {s: [] for s in splits}
    load_before = os.getloadavg()[0]
    try:
        with buffers as memory:
            result.fio_memory = memory.note if use_fio else ""
            for r in range(repeat):
                for t in threads if r % 2 == 0 else tuple(threads)[::-1]:
                    say(f"run {r + 1}/{repeat}: engine reads at {t} threads")
                    reader.set_io(IOSettings(threads=t, mode="parallel", cache_mode="direct"))
                    run(pick()[:1], spread)  # untimed: new pool threads start, nothing else
                    picked = pick()
                    steps = [
                        ("arena", lambda p=picked: run(p, spread)),
                        ("small", lambda p=picked: run(p, spread_small, small)),
                        ("one", lambda p=picked: run(p, one)),
                    ]
                    if use_fio:
                        steps.append(("fio", lambda t=t, m=memory: fio_run(t, m)))
                        if fio_small_pages and memory.iomem != "malloc":
                            steps.append(("fio_small", lambda t=t: fio_run(t, fio_mod.SMALL_PAGES)))
                    for name, step in steps if r % 2 == 0 else steps[::-1]:
                        samples[t][name].append(step())
        _cells(result, threads, samples)
        n = split_threads or pick_threads([(c.threads, c.arena_mb_s) for c in result.cells])[0][0]
        for r in range(repeat if splits else 0):
            for s in splits if r % 2 == 0 else tuple(splits)[::-1]:
                say(f"run {r + 1}/{repeat}: engine reads in split {s} at {n} threads")
                mode = "split" if s > 1 else "parallel"
                reader.set_io(IOSettings(threads=n, mode=mode, split=s, cache_mode="direct"))
                run(pick()[:1], spread)  # untimed: the pool's threads for this setting
                split_samples[s].append(run(pick(), spread))
        result.splits = [
            EngineSplitCell(
                split=s,
                threads=n,
                runs=len(v),
                mb_s=_median([x[0] for x in v]),
                mb_s_min=min(x[0] for x in v),
                mb_s_max=max(x[0] for x in v),
                read_ms=_median([x[1] for x in v]),
                mb_s_runs=tuple(x[0] for x in v),
            )
            for s, v in split_samples.items()
            if v
        ]
    finally:
        reader.close()
        arena.close()
        small.close()
    result.load, result.cpus = (load_before, os.getloadavg()[0]), os.cpu_count() or 0
    result.seconds = time.perf_counter() - t0
    return result


def _median(values) -> float:
    return float(np.median(values)) if len(values) else float("nan")


def _cells(result: EngineResult, threads, samples) -> None:
    """EngineCell per thread count from the runs' (MB/s, read ms[, page bytes]) samples."""
    for t in threads:
        s = samples[t]
        med = {n: _median([v[0] for v in s[n]]) for n in s}
        lat = {n: _median([v[1] for v in s[n]]) for n in s}
        arena_mb = [v[0] for v in s["arena"]]
        result.cells.append(
            EngineCell(
                threads=t,
                runs=len(arena_mb),
                arena_mb_s=med["arena"],
                small_pages_mb_s=med["small"],
                one_slot_mb_s=med["one"],
                fio_mb_s=med["fio"],
                arena_mb_s_min=min(arena_mb),
                arena_mb_s_max=max(arena_mb),
                arena_read_ms=lat["arena"],
                small_pages_read_ms=lat["small"],
                one_slot_read_ms=lat["one"],
                fio_read_ms=lat["fio"],
                fio_small_pages_mb_s=med["fio_small"],
                fio_page_bytes=tuple(sorted({v[2] for v in s["fio"]})),
                arena_mb_s_runs=tuple(arena_mb),
                fio_mb_s_runs=tuple(v[0] for v in s["fio"]),
            )
        )
