"""Storage device models: how long a read of a given size takes with a given number in flight,
fitted from a probe or a published table, saved as JSON, and replayed by the read pool.

The model (four numbers):

    latency      seconds before the first byte of any read
    stream       bytes / s one read can move at most (one stream)
    aggregate    bytes / s all reads in flight share
    queue_depth  reads the device serves at once; more wait for a free place

A read of s bytes that begins while n reads are in the device (itself included, n <= depth)
takes

    service(s, n) = latency + s / min(stream, aggregate / n)

its rate fixed when it begins (a read that arrives later does not slow those already in the
device). With `threads` workers reading back to back (threads <= depth), every read sees
n = threads, so a probe level of `threads` workers predicts per-read time service(s, threads)
and aggregate bandwidth threads * s / service(s, threads); past the queue depth the extra
workers only wait: time (threads / depth) * service(s, depth), aggregate as at the depth.

Emulation (kernels_c/io_pool.c, `Pool.emulate`): the pool keeps a virtual device, `depth`
places each with the time it frees. A read takes the place that frees first, begins at
max(now, that time), counts the places still busy then (n, itself included), and its
completion is held until begin + service(length, n), after the real bytes have arrived from a
faster source (the page cache, warmed first). Emulation can only slow reads down: a read whose
real copy ends after its emulated finish is counted late (`Pool.emulated()`), and a model
faster than the source is refused (`check_slower_than`).

Fitting (`fit`): least squares on the log of every given cell (per-read median time and
aggregate MB/s of each (size, threads) row of a table), by a coarse-to-fine grid over
latency, stream and aggregate, for each concurrency of the table as the queue depth (between
two measured concurrencies a table cannot place the knee). A table that still gains at its
highest concurrency does not say where the depth ends: the smallest depth with the best fit is
kept, and when that is the highest concurrency `queue_depth_bound` says "at least".

Units: MB = 10**6 bytes; times in the JSON in ms, bandwidths in MB/s.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from sdq import files
from sdq.errors import ParamsError
from sdq.units import MB

MODEL_VERSION = 1
MAX_MODEL_BYTES = 2**20
MAX_TABLE_BYTES = 2**20
MAX_DEPTH = 256  # the C pool's places (SDQ_MAX_THREADS)
TABLE_COLUMNS = ("size_bytes", "threads", "median_ms", "mb_s", "iops")


@dataclass(frozen=True)
class DeviceModel:
    """A fitted storage device (module docstring). `fit` holds how it was obtained: the
    cells it was fitted to, with the model's value and the relative residual of each."""

    name: str
    latency_ms: float
    stream_mb_s: float
    aggregate_mb_s: float
    queue_depth: int
    source: str = ""
    queue_depth_bound: str = "exact"  # "at least": the data never stopped gaining
    fit: dict = field(default_factory=dict)
    version: int = MODEL_VERSION

    def __post_init__(self):
        for name in ("latency_ms", "stream_mb_s", "aggregate_mb_s"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
                raise ParamsError(f"device model {self.name!r}: {name} {v!r} is not a number")
        if self.latency_ms < 0:
            raise ParamsError(f"device model {self.name!r}: latency_ms {self.latency_ms} < 0")
        if self.stream_mb_s <= 0 or self.aggregate_mb_s <= 0:
            raise ParamsError(f"device model {self.name!r}: bandwidths must be > 0 MB/s")
        q = self.queue_depth
        if not isinstance(q, int) or isinstance(q, bool) or not 1 <= q <= MAX_DEPTH:
            raise ParamsError(f"device model {self.name!r}: queue_depth {q!r}: expected 1..256")

    @property
    def label(self) -> str:
        """What every figure measured under this model is labelled with."""
        return f"emulated: {self.name}"

    def level(self, size: int, threads: int) -> tuple[float, float]:
        """(per-read ms, aggregate MB/s) the model predicts for a probe level of `threads`
        workers reading `size`-byte reads back to back."""
        return _predict(
            np.array([size], float),
            np.array([threads], float),
            self.latency_ms / 1e3,
            self.stream_mb_s * MB,
            self.aggregate_mb_s * MB,
            self.queue_depth,
        )

    def c_params(self) -> tuple[int, float, float, int]:
        """(latency ns, stream bytes/s, aggregate bytes/s, depth) for `Pool.emulate`."""
        return (
            round(self.latency_ms * 1e6),
            self.stream_mb_s * MB,
            self.aggregate_mb_s * MB,
            self.queue_depth,
        )


def _predict(size, threads, lat, stream, agg, depth):
    """(per-read ms [N], aggregate MB/s [N]) for sizes [N] bytes and threads [N]; lat in s,
    bandwidths in bytes/s; the last three may be arrays broadcasting against [N]."""
    n = np.minimum(threads, depth)
    rate = np.minimum(stream, agg / n)
    service = lat + size / rate  # s, a read in the device
    per_read = service * np.maximum(threads / depth, 1.0)  # waiting for a place included
    mb_s = n * size / service / MB
    return per_read * 1e3, mb_s


# ---------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class TableCell:
    """One row of a latency / bandwidth table: reads of `size` bytes, `threads` in flight."""

    size: int
    threads: int
    median_ms: float | None
    mb_s: float | None  # from the mb_s column, or iops x size


def read_table(path: str | Path) -> list[TableCell]:
    """A CSV table: columns size_bytes, threads, and any of median_ms, mb_s, iops (empty
    cells allowed); lines starting with '#' are comments (the table's source)."""
    path = Path(path)
    text = _read_text(path, MAX_TABLE_BYTES, "device table")
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    if not rows:
        raise ParamsError(f"device table {path}: no rows")
    missing = {"size_bytes", "threads"} - set(rows[0])
    if missing:
        raise ParamsError(f"device table {path}: missing column {sorted(missing)[0]!r}")
    unknown = set(rows[0]) - set(TABLE_COLUMNS)
    if unknown:
        raise ParamsError(
            f"device table {path}: unknown column {sorted(unknown)[0]!r} "
            f"(expected {', '.join(TABLE_COLUMNS)})"
        )
    cells = []
    for i, row in enumerate(rows, start=2):
        size = _number(row.get("size_bytes"), path, i, "size_bytes", integer=True)
        threads = _number(row.get("threads"), path, i, "threads", integer=True)
        median = _number(row.get("median_ms"), path, i, "median_ms", optional=True)
        mb_s = _number(row.get("mb_s"), path, i, "mb_s", optional=True)
        iops = _number(row.get("iops"), path, i, "iops", optional=True)
        if mb_s is None and iops is not None:
            mb_s = iops * size / MB
        if median is None and mb_s is None:
            raise ParamsError(f"device table {path}: row {i} has no median_ms, mb_s or iops")
        if threads > MAX_DEPTH:
            raise ParamsError(f"device table {path}: row {i}: threads {threads} > {MAX_DEPTH}")
        cells.append(TableCell(int(size), int(threads), median, mb_s))
    return cells


def _number(text, path, row, column, *, integer=False, optional=False):
    text = (text or "").strip()
    if not text:
        if optional:
            return None
        raise ParamsError(f"device table {path}: row {row}: {column} is empty")
    try:
        value = float(text)
    except ValueError:
        raise ParamsError(
            f"device table {path}: row {row}: {column} {text!r} is not a number"
        ) from None
    if not math.isfinite(value) or value <= 0 or (integer and value != int(value)):
        kind = "a positive integer" if integer else "a positive number"
        raise ParamsError(f"device table {path}: row {row}: {column} {text!r} is not {kind}")
    return int(value) if integer else value


# ---------------------------------------------------------------------------- fitting


def _loss(cells, lat, stream, agg, depth):
    """Sum of squared log residuals over every given cell; parameters may be grids."""
    total = 0.0
    for c in cells:
        ms, mb_s = _predict(float(c.size), float(c.threads), lat, stream, agg, depth)
        if c.median_ms is not None:
            total = total + np.log(ms / c.median_ms) ** 2
        if c.mb_s is not None:
            total = total + np.log(mb_s / c.mb_s) ** 2
    return total


def _grid_fit(cells, depth, start, span, steps=25, rounds=5):
    """Coarse-to-fine search of log (lat s, stream B/s, agg B/s) around `start`."""
    centre = np.log(np.asarray(start, float))  # [3]
    span = np.asarray(span, float)
    best = None
    for _ in range(rounds):
        axes = [np.linspace(c - s, c + s, steps) for c, s in zip(centre, span, strict=True)]
        lat, stream, agg = np.meshgrid(*[np.exp(a) for a in axes], indexing="ij")  # [G, G, G]
        agg = np.maximum(agg, stream)  # the aggregate is never below one stream
        loss = _loss(cells, lat, stream, agg, depth)
        i = np.unravel_index(int(np.argmin(loss)), loss.shape)
        best = (float(loss[i]), float(lat[i]), float(stream[i]), float(agg[i]))
        centre = np.log(np.array(best[1:]))
        span = span * 3 / steps
    return best


def fit(cells: list[TableCell], *, name: str, source: str = "") -> DeviceModel:
    """The DeviceModel that fits the cells best (module docstring); its `fit` lists every
    cell with the model's value and the relative residual (model / table - 1)."""
    if not cells:
        raise ParamsError("fitting a device model needs at least one table cell")
    sizes = {c.size for c in cells}
    if len(sizes) < 2 and not any(c.mb_s for c in cells if c.threads > 1):
        raise ParamsError(
            "fitting a device model needs two read sizes or bandwidth at two concurrencies"
        )
    top = max(c.threads for c in cells)
    # a starting point read off the cells: the smallest read's time as the latency, the
    # largest single-stream read's rate as the stream, the best aggregate
    small = min(cells, key=lambda c: (c.size, c.threads))
    lat0 = (small.median_ms or small.threads * small.size / MB / small.mb_s * 1e3) / 2e3
    stream0 = (
        max(c.size / (c.median_ms / 1e3) for c in cells if c.median_ms)
        if any(c.median_ms for c in cells)
        else max(c.mb_s for c in cells if c.mb_s) * MB
    )
    agg0 = max([c.mb_s * MB for c in cells if c.mb_s] + [stream0]) * 2
    results = []
    for depth in sorted({c.threads for c in cells}):
        loss, lat, stream, agg = _grid_fit(cells, depth, (lat0, stream0, agg0), (3.0, 3.0, 3.0))
        results.append((loss, depth, lat, stream, agg))
    best_loss = min(r[0] for r in results)
    # the smallest depth within a hair of the best (deeper ones fit no better)
    loss, depth, lat, stream, agg = next(r for r in results if r[0] <= best_loss * 1.001 + 1e-12)
    bound = "at least" if depth >= top else "exact"
    model = DeviceModel(
        name=name,
        latency_ms=round(lat * 1e3, 4),
        stream_mb_s=round(stream / MB, 2),
        aggregate_mb_s=round(agg / MB, 2),
        queue_depth=int(max(depth, top) if bound == "at least" else depth),
        source=source,
        queue_depth_bound=bound,
    )
    return DeviceModel(**{**asdict(model), "fit": fit_report(model, cells)})


def fit_report(model: DeviceModel, cells: list[TableCell]) -> dict:
    """Each cell with the table's and the model's value and the relative residual."""
    rows = []
    for c in cells:
        ms, mb_s = model.level(c.size, c.threads)
        row = {"size_bytes": c.size, "threads": c.threads}
        if c.median_ms is not None:
            row |= {"median_ms": c.median_ms, "model_ms": round(float(ms[0]), 4)}
            row["ms_residual"] = round(float(ms[0]) / c.median_ms - 1, 4)
        if c.mb_s is not None:
            row |= {"mb_s": round(c.mb_s, 3), "model_mb_s": round(float(mb_s[0]), 3)}
            row["mb_s_residual"] = round(float(mb_s[0]) / c.mb_s - 1, 4)
        rows.append(row)
    res = [abs(r[k]) for r in rows for k in ("ms_residual", "mb_s_residual") if k in r]
    return {"cells": rows, "max_abs_residual": round(max(res), 4), "method": "log least squares"}


def cells_from_probe(levels, small=()) -> list[TableCell]:
    """Table cells from a probe's ReadStats (the level and 4 KiB sweeps)."""
    return [TableCell(s.size, s.threads, s.median_ms, s.mb_s) for s in (*levels, *small)]


# ---------------------------------------------------------------------------- JSON


def check_destination(path: str | Path, flag: str) -> Path:
    """`path` if a model can be written there (ParamsError naming `flag` if not)."""
    path = Path(path)
    if not path.name or path.is_dir() or (path.exists() and not path.is_file()):
        raise ParamsError(f"{flag} {path}: not a file to write")
    parent = path.resolve().parent
    if not parent.is_dir():
        raise ParamsError(f"{flag} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ParamsError(f"{flag} {path}: directory {parent} is not writable")
    return path


def save(model: DeviceModel, path: str | Path) -> Path:
    try:
        return files.write_json(Path(path), asdict(model))
    except OSError as exc:
        raise ParamsError(f"cannot write {path}: {exc.strerror}") from None


def load(path: str | Path) -> DeviceModel:
    """A device model written by `save` (`sdq probe --fit-out`, `sdq device from-table`)."""
    path = Path(path)
    text = _read_text(path, MAX_MODEL_BYTES, "device model")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParamsError(
            f"device model {path}: not JSON ({exc.msg} at line {exc.lineno})"
        ) from None
    if not isinstance(data, dict):
        raise ParamsError(f"device model {path}: expected a JSON object")
    if data.get("version") != MODEL_VERSION:
        raise ParamsError(f"device model {path}: version {data.get('version')!r}, expected 1")
    known = set(DeviceModel.__dataclass_fields__)
    needed = {"name", "latency_ms", "stream_mb_s", "aggregate_mb_s", "queue_depth"}
    if needed - set(data):
        raise ParamsError(f"device model {path}: missing {sorted(needed - set(data))[0]!r}")
    if not isinstance(data["name"], str) or not data["name"]:
        raise ParamsError(f"device model {path}: name must be a non-empty string")
    if not isinstance(data.get("fit", {}), dict):
        raise ParamsError(f"device model {path}: fit must be an object")
    return DeviceModel(**{k: v for k, v in data.items() if k in known})


def resolve(spec: str | None) -> DeviceModel | None:
    """A device parameter: None, "" or "native" -> None (this machine's device); else a
    model file's path."""
    if spec is None or str(spec).strip() in ("", "native"):
        return None
    return load(spec)


def _read_text(path: Path, limit: int, what: str) -> str:
    data = files.read_small(path, limit, f"{what} {path}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ParamsError(f"{what} {path}: not UTF-8 text") from None


# ---------------------------------------------------------------------------- the source


def prepare_source(fd: int, file_bytes: int, model: DeviceModel, size: int) -> float:
    """Warm a file into the page cache (the emulated device's source), time `size`-byte
    reads of it in one stream, and refuse a model whose one stream is not slower: emulation
    can only slow reads down. Returns the source's MB/s (median of 8 reads)."""
    chunk = 8 << 20
    for off in range(0, file_bytes, chunk):
        os.pread(fd, chunk, off)
    size = max(1, min(size, file_bytes))
    buf = bytearray(size)
    rates = []
    for i in range(8):
        off = (i * 7919 * 4096) % max(file_bytes - size, 1)
        t0 = time.perf_counter_ns()
        os.preadv(fd, [buf], off)
        rates.append(size / MB / max((time.perf_counter_ns() - t0) / 1e9, 1e-9))
    source = float(np.median(rates))
    if model.stream_mb_s >= source:
        raise ParamsError(
            f"device model {model.name}: one stream at {model.stream_mb_s:g} MB/s is not slower "
            f"than the source here ({source:.0f} MB/s from the page cache): emulation can only "
            "slow reads down"
        )
    return source
