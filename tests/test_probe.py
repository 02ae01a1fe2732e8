"""sdq.measure.probe: statistics against NumPy, scratch-file hygiene, a smoke probe, profiles."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pager_support import resident_pages

from sdq.errors import ParamsError, ReadError
from sdq.measure import probe
from sdq.measure.device import describe_storage
from sdq.measure.probe import (
    PAGE,
    ProbeResult,
    ProbeSettings,
    ReadStats,
    Timing,
    chunk_bounds,
    percentile,
    profile_from,
    recommend,
    run_probe,
    scratch_file,
    summarize,
)
from sdq.paging.io_profile import load_io_profile, write_io_profile

SMOKE = dict(
    size=256 * 1024,
    threads=(1, 2),
    reads=8,
    splits=(1, 2),
    split_batch=4,
    small_threads=(1, 2),
    scratch_bytes=8 << 20,
)


@pytest.fixture
def disk_dir(tmp_path: Path) -> Path:
    """A directory on a real filesystem (the probe refuses tmpfs: it is RAM, not a device)."""
    if describe_storage(tmp_path).fstype not in probe.MEMORY_FILESYSTEMS:
        yield tmp_path
        return
    d = Path(__file__).resolve().parents[1] / ".cache" / "test-probe" / tmp_path.name
    d.mkdir(parents=True, exist_ok=True)
    yield d
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


def leftovers(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.name.startswith(".sdq-probe-")]


# ---------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
@pytest.mark.parametrize(
    "values",
    [
        [5.0],
        [1.0, 2.0],
        [3.0, 1.0, 2.0],
        [7.94, 6.94, 7.27, 7.84, 7.69, 8.18, 7.77],
        list(range(64)),
    ],
)
def test_percentile_matches_numpy(values, q):
    assert percentile(values, q) == pytest.approx(np.percentile(values, q), rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=200),
    st.floats(0, 100),
)
def test_percentile_matches_numpy_on_random_inputs(values, q):
    assert percentile(values, q) == pytest.approx(np.percentile(values, q), rel=1e-9, abs=1e-9)


def test_percentile_rejects_bad_input():
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_matches_numpy():
    rng = np.random.default_rng(1)
    runs = [
        Timing(rng.integers(1_000_000, 9_000_000, 64), wall_ns=int(w), nbytes=64 * 1_900_544)
        for w in (50e6, 40e6, 45e6)
    ]
    s = summarize(runs, threads=8, size=1_900_544)
    lat_ms = np.concatenate([r.latency_ns for r in runs]) / 1e6
    assert s.reads == 192
    assert s.median_ms == pytest.approx(np.median(lat_ms))
    assert s.mean_ms == pytest.approx(np.mean(lat_ms))
    assert s.p90_ms == pytest.approx(np.percentile(lat_ms, 90))
    per_run = [64 * 1_900_544 / 1e6 / (w / 1e9) for w in (50e6, 40e6, 45e6)]
    assert s.mb_s == pytest.approx(np.median(per_run))
    assert (s.mb_s_min, s.mb_s_max) == pytest.approx((min(per_run), max(per_run)))
    assert s.iops == pytest.approx(np.median([64 / (w / 1e9) for w in (50e6, 40e6, 45e6)]))


def test_seed_table_row_bandwidth():
    # 64 reads of 1.9 MB in 0.4384 s is seed 000's 276 MB/s at one thread
    run = Timing(np.full(64, 6_940_000), wall_ns=440_700_000, nbytes=64 * 1_900_544)
    assert summarize([run], threads=1, size=1_900_544).mb_s == pytest.approx(276.0, abs=0.5)


@pytest.mark.parametrize("size", [4096, 589_824, 720_896, 1_900_544, 1_000_000, 5000])
@pytest.mark.parametrize("split", [1, 2, 3, 4, 8])
def test_chunk_bounds_cover_the_segment_on_page_boundaries(size, split):
    chunks = chunk_bounds(size, split)
    assert 1 <= len(chunks) <= split
    assert sum(n for _, n in chunks) == size
    assert all(o % PAGE == 0 for o, _ in chunks)
    assert [o for o, _ in chunks] == list(np.cumsum([0] + [n for _, n in chunks[:-1]]))


# ---------------------------------------------------------------------------- recommendation


def stats(threads, mb_s, split=1, batch=0, mb_s_min=None):
    lo = mb_s if mb_s_min is None else mb_s_min
    return ReadStats(threads, 1000, 8, 1.0, 1.0, 1.0, mb_s, 1.0, lo, mb_s, split, batch)


def result_with(levels, split=()):
    return ProbeResult(
        settings={"size": 1000},
        storage={},
        storage_label="",
        scratch=True,
        cache_mode="direct",
        reader="",
        levels=levels,
        split=list(split),
    )


def test_recommend_smallest_threads_within_five_percent():
    r = result_with([stats(1, 300), stats(2, 560), stats(4, 990), stats(8, 1000), stats(16, 980)])
    rec = recommend(r)
    assert rec.io_threads == 4 and rec.best_mb_s == 1000 and rec.io_split == 1


def test_recommend_takes_the_best_median_within_five_percent_only():
    # 6 threads are 6 % below the best median: not "as fast", whatever the best's spread
    levels = [stats(1, 1000), stats(6, 1410), stats(12, 1500, mb_s_min=1066), stats(16, 1430)]
    rec = recommend(result_with(levels))
    assert rec.io_threads == 12 and rec.best_mb_s == 1500 and rec.basis == "levels"
    assert "the best median" in rec.why
    # 16 threads 4 % below the best of 24: the fewer threads are taken
    levels = [stats(1, 1000), stats(16, 1440), stats(24, 1500)]
    rec = recommend(result_with(levels))
    assert rec.io_threads == 16 and rec.chosen_mb_s == 1440 and "within 5%" in rec.why


@dataclass
class FakeEngine:
    """The fields of sdq.measure.probe_engine.EngineResult that `recommend` reads."""

    cells: list
    splits: list


@dataclass
class Cell:
    threads: int
    arena_mb_s: float


@dataclass
class SplitCell:
    split: int
    mb_s: float
    mb_s_min: float
    threads: int = 8


def test_recommend_prefers_the_pagers_own_reads_when_measured():
    levels = [stats(1, 1630), stats(8, 1500), stats(12, 1500)]  # equal-size reads: 1 thread
    split = [stats(1, 100, 1, 24), stats(1, 150, 2, 24)]  # chunked reads: split 2 helps
    engine = FakeEngine(
        [Cell(1, 1102), Cell(2, 1187), Cell(8, 1228), Cell(12, 1475), Cell(16, 1468)],
        [SplitCell(1, 1400, 1300), SplitCell(2, 1420, 1350), SplitCell(4, 1380, 1200)],
    )
    rec = recommend(result_with(levels, split), engine)
    assert rec.basis == "engine" and rec.io_threads == 12 and rec.best_mb_s == 1475
    assert rec.io_split == 1 and "pager's own expert reads" in rec.why  # 1420 < 1.05 x 1400
    assert recommend(result_with(levels, split)).io_threads == 1  # levels alone
    assert recommend(result_with(levels, split)).io_split == 2
    engine.splits = [SplitCell(1, 1000, 900), SplitCell(4, 1200, 1050)]
    rec = recommend(result_with(levels, split), engine)
    assert rec.io_split == 4 and rec.split_gain == pytest.approx(1.2)
    # without an engine split sweep, the chunking cells decide the split
    engine.splits = []
    assert recommend(result_with(levels, split), engine).io_split == 2


def test_recommend_split_only_when_it_clearly_helps():
    levels = [stats(1, 100)]
    flat = [stats(1, 100, s, 24) for s in (1, 2, 4)] + [stats(1, 104, 8, 24)]
    assert recommend(result_with(levels, flat)).io_split == 1
    helps = [stats(1, 100, 1, 24), stats(1, 120, 2, 24), stats(1, 130, 4, 24, mb_s_min=110)]
    rec = recommend(result_with(levels, helps))
    assert rec.io_split == 4 and rec.split_gain == pytest.approx(1.3)
    lucky = [stats(1, 100, 1, 24), stats(1, 130, 4, 24, mb_s_min=90)]  # one lucky repeat
    assert recommend(result_with(levels, lucky)).io_split == 1


# ---------------------------------------------------------------------------- scratch file


def test_scratch_file_is_written_and_removed(disk_dir):
    with scratch_file(disk_dir, 3 * PAGE + 5) as path:
        assert path.stat().st_size == 3 * PAGE + 5
        assert len(set(path.read_bytes())) > 200  # random bytes, not zeros
    assert not path.exists() and leftovers(disk_dir) == []


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_scratch_file_removed_when_the_block_raises(disk_dir, exc):
    with pytest.raises(exc):
        with scratch_file(disk_dir, PAGE) as path:
            raise exc("boom")
    assert not path.exists() and leftovers(disk_dir) == []


def test_scratch_file_removed_on_sigterm(disk_dir):
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        with scratch_file(disk_dir, PAGE) as path:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # interrupted by the handler at once
    assert not path.exists() and leftovers(disk_dir) == []
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back


def test_scratch_removed_when_the_probe_raises(disk_dir, monkeypatch):
    def failing_level(*args, **kwargs):
        assert leftovers(disk_dir), "the scratch file should exist while reading"
        raise OSError("simulated device failure")

    monkeypatch.setattr(probe, "_level", failing_level)
    with pytest.raises(OSError, match="simulated"):
        run_probe(ProbeSettings(scratch_dir=disk_dir, **SMOKE))
    assert leftovers(disk_dir) == []


# ---------------------------------------------------------------------------- the probe


@pytest.mark.parametrize("cache_mode", ["direct", "dontneed"])
def test_probe_smoke_on_scratch_file(disk_dir, cache_mode):
    result = run_probe(ProbeSettings(scratch_dir=disk_dir, cache_mode=cache_mode, **SMOKE))
    assert leftovers(disk_dir) == []
    assert result.scratch and result.cache_mode == cache_mode
    assert "sdq._io" in result.reader
    assert result.storage["file_bytes"] == SMOKE["scratch_bytes"]
    assert [s.threads for s in result.levels] == [1, 2]
    assert [s.threads for s in result.small] == [1, 2]
    for s in result.levels + result.small:
        assert s.reads == SMOKE["reads"] * (4 if s.size == 4096 else 1)
        assert 0 < s.median_ms <= s.p90_ms and s.mean_ms > 0 and s.mb_s > 0 and s.iops > 0
        assert s.cached < 0.05  # flushed and dropped: the reads reach the device
        # T workers each run their reads one after another, so the reads' summed latency
        # fits in T x wall time: aggregate MB/s <= T x size / mean latency
        assert s.mb_s <= s.threads * s.size / 1e6 / (s.mean_ms / 1e3) * (1 + 1e-9)
    cells = {(s.batch, s.split) for s in result.split}
    assert cells == {(1, 1), (1, 2), (4, 1), (4, 2)}
    assert all(s.threads == result.split_threads for s in result.split)
    rec = recommend(result)
    assert rec.io_threads in (1, 2) and rec.io_split in (1, 2)
    json.dumps(result.to_dict())  # serializable


def test_probe_reads_a_given_file_and_profile_round_trips(disk_dir):
    data = disk_dir / "data.bin"
    data.write_bytes(np.random.default_rng(0).integers(0, 256, 4 << 20, np.uint8).tobytes())
    s = {k: v for k, v in SMOKE.items() if k != "scratch_bytes"}
    result = run_probe(ProbeSettings(path=data, **s))
    assert not result.scratch and data.exists()
    profile = profile_from(result)
    out = disk_dir / "profile.json"
    write_io_profile(out, profile)
    loaded = load_io_profile(out)
    assert loaded == profile
    raw = json.loads(out.read_text())
    assert {"io_threads", "io_split", "cache_mode", "device", "measured"} <= raw.keys()


@pytest.mark.parametrize(
    "content, match",
    [
        ("not json", "not JSON"),
        ("[1, 2]", "JSON object"),
        ('{"io_threads": 0, "io_split": 1, "cache_mode": "direct"}', "io_threads"),
        ('{"io_threads": 4, "io_split": 9, "cache_mode": "direct"}', "io_split"),
        ('{"io_threads": 4, "io_split": 1, "cache_mode": "warm"}', "cache_mode"),
        ('{"version": 7, "io_threads": 4, "io_split": 1, "cache_mode": "direct"}', "version"),
    ],
)
def test_load_io_profile_rejects_bad_files(tmp_path, content, match):
    p = tmp_path / "p.json"
    p.write_text(content)
    with pytest.raises(ParamsError, match=match):
        load_io_profile(p)
    with pytest.raises(ParamsError, match="no such file"):
        load_io_profile(tmp_path / "missing.json")


def test_storage_labels_name_the_device_of_the_file(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"x" * 10)
    info = describe_storage(f)
    st = os.stat(f)
    assert info.dev == f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    assert info.file_bytes == 10 and info.ram_bytes > 0
    assert info.fstype  # every file is on some mount listed in /proc/self/mountinfo
    assert info.fstype in info.label()


def test_parse_fio_json():
    from sdq.measure.fio import parse_fio_json

    # the shape of `fio --output-format=json --lat_percentiles=1 --percentile_list=50:90`
    doc = {
        "fio version": "fio-3.33",
        "jobs": [
            {
                "jobname": "sdq-probe",
                "error": 0,
                "read": {
                    "io_bytes": 64 * 1_900_544,
                    "bw_bytes": 1_351_497_955,
                    "iops": 711.1,
                    "total_ios": 64,
                    "runtime": 90,
                    "lat_ns": {
                        "mean": 5_510_152.2,
                        "percentile": {"50.000000": 5_799_936, "90.000000": 6_914_048},
                    },
                },
            }
        ],
    }
    text = "note: some warning\n" + json.dumps(doc)
    f = parse_fio_json(text, threads=4, size=1_900_544, cache_mode="direct", command="fio ...")
    assert f.reads == 64 and f.threads == 4
    assert f.median_ms == pytest.approx(5.799936) and f.p90_ms == pytest.approx(6.914048)
    assert f.mean_ms == pytest.approx(5.5101522) and f.mb_s == pytest.approx(1351.497955)
    with pytest.raises(ReadError, match="no JSON"):
        parse_fio_json("fio: command failed", threads=1, size=1, cache_mode="direct", command="")


@pytest.mark.parametrize("length", [4096, 5000, 1_900_544])
def test_random_offsets_are_aligned_distinct_and_inside_the_file(length):
    rng = np.random.default_rng(0)
    file_bytes = 64 << 20
    offsets = probe._random_offsets(rng, file_bytes, length, 30)
    assert (offsets % PAGE == 0).all() and (offsets + length <= file_bytes).all()
    ends = np.sort(offsets) + length
    assert (np.sort(offsets)[1:] >= ends[:-1]).all()  # no two ranges overlap
    with pytest.raises(ParamsError, match="larger than the file"):
        probe._random_offsets(rng, 1000, 4096, 1)


def test_parse_bytes():
    from sdq.commands.probe import parse_bytes

    assert [parse_bytes(t) for t in ("4096", "4k", "4KiB", "64M", "1G", "1.5k")] == [
        4096, 4096, 4096, 64 << 20, 1 << 30, 1536,
    ]  # fmt: skip
    for bad in ("x", "1.1"):
        with pytest.raises(Exception, match="byte"):
            parse_bytes(bad)


def test_pool_reader_reads_into_one_reused_prefaulted_arena_slot_per_thread(disk_dir):
    data = disk_dir / "data.bin"
    raw = np.random.default_rng(0).integers(0, 256, 4 << 20, np.uint8)  # [4 MiB]
    data.write_bytes(raw.tobytes())
    fd = os.open(data, os.O_RDONLY | os.O_DIRECT)
    try:
        reader = probe.PoolReader(fd, 4, 65536, "direct")
        try:
            arena, first = reader.arena, reader.first
            # 4 slots for reads, 2 MiB of spare slots at each end (see inner_arena)
            assert first == (2 << 20) // 65536 and arena.n_slots == 4 + 2 * first
            assert arena.slot_bytes == 65536 and arena.base % PAGE == 0
            mapped = reader.arena.buf
            # faulted in when the reader is made: every page resident before any read
            assert resident_pages(arena.base, arena.nbytes).all()
            reader.threads = 2
            offsets = np.arange(0, 40 * 65536, 65536, dtype=np.int64)  # [40]
            lengths = np.full(40, 65536, np.int64)
            submit, start, end = reader.read_batch(offsets, lengths)
            assert reader.arena is arena and reader.arena.buf is mapped  # reused, not remade
            # the last read of each of the 2 slots in use: 38 -> slot 0, 39 -> slot 1
            # (both may have been written by an earlier read too, but no read is still running)
            for slot, i in ((0, 38), (1, 39)):
                got = arena.slot(first + slot)
                assert got.tobytes() == raw[offsets[i] : offsets[i] + 65536].tobytes()
            for untouched in (first - 1, first + 2):  # spare slots, slots beyond 2 threads
                assert (arena.slot(untouched)[::PAGE] == 1).all()
            with pytest.raises(ValueError, match="slots for 1..4"):
                reader.threads = 5
        finally:
            reader.close()
    finally:
        os.close(fd)
    assert (start >= submit).all() and (end > start).all()


def test_level_reads_are_a_whole_number_of_rounds():
    assert [probe.level_reads(64, t) for t in (1, 2, 6, 12, 16, 24)] == [64, 64, 66, 72, 64, 72]
    assert probe.level_reads(1, 4) == 4
