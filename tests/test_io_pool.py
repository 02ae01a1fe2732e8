"""sdq._io (the C pread pool) and sdq.paging.reads (expert reads into slots)."""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pytest
from pager_support import last_expert, make_model

from sdq import _io
from sdq.errors import ParamsError, ReadError
from sdq.paging.arena import Arena
from sdq.paging.reads import ExpertReader, IOSettings, SlotLayout, _chunks

MODES = [("serial", 1), ("parallel", 1), ("split", 2), ("split", 3), ("split", 8)]
CACHE_MODES = ["pagecache", "dontneed", "direct"]


def direct_supported(path) -> bool:
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # segments of 12-36 KB: split modes really cut them into page-aligned chunks
    return make_model(
        tmp_path_factory.mktemp("io") / "experts.bin",
        n_layers=3,
        n_expert=8,
        row_bytes=(4321, 6007, 2999),
    )


def reads_table(rows):
    return np.array(rows, dtype=np.int64).reshape(-1, 7)


def test_pool_threads_resize_and_bounds():
    with _io.Pool(3) as pool:
        assert pool.threads == 3
        pool.threads = 7
        assert pool.threads == 7
        pool.threads = 1
        assert pool.threads == 1
        with pytest.raises(ValueError, match="threads must be"):
            pool.threads = 0
    with pytest.raises(ValueError, match="closed"):
        _ = pool.threads
    with pytest.raises(ValueError, match="threads must be"):
        _io.Pool(_io.MAX_THREADS + 1)


def test_pool_reads_groups_and_timings(tmp_path):
    data = np.random.default_rng(1).integers(0, 256, 100_000, dtype=np.uint8)
    f = tmp_path / "d.bin"
    f.write_bytes(data.tobytes())
    fd = os.open(f, os.O_RDONLY)
    dest = np.zeros(30_000, dtype=np.uint8)
    base = dest.ctypes.data
    # group 0: two tasks (one with two reads); group 1: one task
    rows = [
        (fd, 5, 1000, 1000, base, 0, 0),
        (fd, 20_001, 999, 999, base + 1000, 0, 0),
        (fd, 50_003, 7000, 7000, base + 2000, 1, 0),
        (fd, 99_000, 1000, 1000, base + 9000, 2, 1),
    ]
    with _io.Pool(4) as pool:
        batch = pool.submit(reads_table(rows), 0, dest)
        batch.wait(1)
        assert batch.done(1)
        batch.wait_all()
        assert batch.all_done() and batch.n_reads == 4 and batch.n_groups == 2
        rep = np.frombuffer(batch.report(), dtype=np.int64).reshape(-1, 6)
    os.close(fd)
    for _, off, n, _, d, _, _ in rows:
        assert np.array_equal(dest[d - base : d - base + n], data[off : off + n])
    assert (rep[:, 1] >= rep[:, 0]).all() and (rep[:, 2] >= rep[:, 1]).all()
    assert list(rep[:, 3]) == [1000, 999, 7000, 1000] and not rep[:, 4:].any()
    # the serial task ran its reads in order
    assert rep[1, 1] >= rep[0, 2]


@pytest.mark.parametrize(
    "rows, match",
    [
        ([(0, 0, 0, 0, 1, 0, 0)], "invalid"),
        ([(0, 0, 8, 9, 1, 0, 0)], "invalid"),
        ([(0, 0, 8, 8, 1, 1, 0)], "task id must be 0"),
        ([(0, 0, 8, 8, 1, 0, 0), (0, 0, 8, 8, 1, 2, 0)], "in order"),
        ([(0, 0, 8, 8, 1, 0, 0), (0, 0, 8, 8, 1, 0, 1)], "share one group"),
    ],
)
def test_submit_rejects_malformed_tables(rows, match):
    with _io.Pool(1) as pool, pytest.raises(ValueError, match=match):
        pool.submit(reads_table(rows))


def test_direct_flag_checks_alignment():
    buf = np.zeros(8192, np.uint8)
    with _io.Pool(1) as pool, pytest.raises(ValueError, match="4096-aligned"):
        pool.submit(reads_table([(0, 32, 4096, 4096, buf.ctypes.data, 0, 0)]), _io.FLAG_DIRECT)


def test_failures_name_fd_offset_length(tmp_path):
    f = tmp_path / "small.bin"
    f.write_bytes(b"x" * 1000)
    fd = os.open(f, os.O_RDONLY)
    buf = np.zeros(4096, np.uint8)
    a = buf.ctypes.data
    closed = os.open(f, os.O_RDONLY)
    os.close(closed)
    cases = [
        ((closed, 0, 16, 16), "error", "Bad file descriptor"),
        ((fd, 5000, 16, 16), "eof", "past end of file"),
        ((fd, 990, 100, 100), "short", "short read"),
    ]
    with _io.Pool(2) as pool:
        for (rfd, off, n, need), kind, text in cases:
            batch = pool.submit(reads_table([(rfd, off, n, need, a, 0, 0)]), 0, buf)
            with pytest.raises(_io.IOFailure, match=text) as info:
                batch.wait(0)
            exc = info.value
            assert (exc.fd, exc.offset, exc.length, exc.kind, exc.index) == (rfd, off, n, kind, 0)
            assert f"offset {off}" in str(exc) and f"length {n}" in str(exc)
        # need < length: the part past the end of file is not needed
        pool.submit(reads_table([(fd, 990, 100, 10, a, 0, 0)]), 0, buf).wait(0)
    with pytest.raises(_io.IOFailure, match="past end of file"):
        _io.pread_into(fd, 2000, bytearray(10))
    os.close(fd)


def test_closing_a_busy_pool_cancels_queued_reads(tmp_path):
    f = tmp_path / "d.bin"
    f.write_bytes(np.arange(1 << 20, dtype=np.uint32).astype(np.uint8).tobytes())
    fd = os.open(f, os.O_RDONLY)
    buf = np.zeros(1 << 20, np.uint8)
    rows = [(fd, i * 4096, 4096, 4096, buf.ctypes.data + i * 4096, i, i) for i in range(256)]
    pool = _io.Pool(1)
    batch = pool.submit(reads_table(rows), 0, buf)
    pool.close()
    rep = np.frombuffer(batch.report(), np.int64).reshape(-1, 6)
    # every read is complete with the file's bytes, or canceled: none is left half done or
    # reported ok without having run
    data = np.fromfile(f, np.uint8)
    canceled = rep[:, 5] == 4
    for i, (_, off, n, _, _, _, _) in enumerate(rows):
        if not canceled[i]:
            assert rep[i, 5] == 0 and rep[i, 3] == n
            assert np.array_equal(buf[i * 4096 : i * 4096 + n], data[off : off + n])
        else:
            assert rep[i, 3] == 0 and rep[i, 4] == 125  # ECANCELED
    if canceled.any():
        with pytest.raises(_io.IOFailure, match="canceled"):
            batch.wait_all()
    os.close(fd)


def test_chunks_are_page_aligned_and_cover_the_range():
    rng = np.random.default_rng(3)
    for _ in range(500):
        start = int(rng.integers(0, 1 << 20))
        stop = start + int(rng.integers(1, 1 << 20))
        n = int(rng.integers(1, 9))
        pieces = _chunks(start, stop, n)
        assert 1 <= len(pieces) <= n
        assert pieces[0][0] == start and pieces[-1][1] == stop
        for (a, b), (c, _) in zip(pieces, pieces[1:], strict=False):
            assert b == c and b % 4096 == 0 and a < b


@pytest.mark.parametrize("cache_mode", CACHE_MODES)
@pytest.mark.parametrize("mode, split", MODES)
def test_slot_bytes_equal_file_bytes(model, mode, split, cache_mode):
    if cache_mode == "direct" and not direct_supported(model.path):
        pytest.skip("this file system has no O_DIRECT")
    table = model.experts
    layout = SlotLayout.for_table(table, cache_mode)
    if cache_mode == "direct":
        assert layout.slot_bytes % 4096 == 0 and all(o % 4096 == 0 for o in layout.region_offsets)
    rng = np.random.default_rng(hash((mode, split, cache_mode)) % 2**32)
    io = IOSettings(threads=4, mode=mode, split=split, cache_mode=cache_mode)
    reader = ExpertReader(model.path, table, layout, io)
    arena = Arena(4, layout.slot_bytes)
    try:
        last = last_expert(model)
        picks = [last] + [
            (table.layers[int(rng.integers(len(table.layers)))], int(rng.integers(table.n_expert)))
            for _ in range(9)
        ]
        for i in range(0, len(picks), 4):
            group = picks[i : i + 4]
            by_row: dict[int, list] = {}
            for k, (layer, e) in enumerate(group):
                by_row.setdefault(table.row(layer), []).append((e, k))
            for row, items in by_row.items():
                arena.buf[:] = 0xAA
                batch, device_bytes = reader.submit(
                    row, [e for e, _ in items], [arena.address(k) for _, k in items], arena
                )
                batch.wait_all()
                assert device_bytes >= sum(int(table.nbytes[row, e].sum()) for e, _ in items)
                for e, k in items:
                    slot = arena.slot(k)
                    for p in range(3):
                        off, n = int(table.offsets[row, e, p]), int(table.nbytes[row, e, p])
                        v = layout.view_offset(off, p)
                        assert slot[v : v + n].tobytes() == model.data[off : off + n].tobytes()
    finally:
        reader.close()
        arena.close()


def test_dontneed_leaves_nothing_cached(model):
    table = model.experts
    layout = SlotLayout.for_table(table, "pagecache")
    arena = Arena(2, layout.slot_bytes)
    for cache_mode, expect in (("pagecache", 1.0), ("dontneed", 0.0)):
        reader = ExpertReader(model.path, table, layout, IOSettings(cache_mode=cache_mode))
        reader.drop_cache()
        batch, _ = reader.submit(0, [3], [arena.address(0)], arena)
        batch.wait_all()
        off, n = int(table.offsets[0, 3, 0]), int(table.nbytes[0, 3, 0])
        assert reader.resident_fraction(off, n) == pytest.approx(expect)
        reader.close()
    arena.close()


def test_settings_are_validated():
    with pytest.raises(ParamsError, match="I/O mode"):
        IOSettings(mode="fast")
    with pytest.raises(ParamsError, match="cache mode"):
        IOSettings(cache_mode="tmpfs")
    assert IOSettings(mode="split", split=99).split == 8
    assert IOSettings(mode="split", split=0).split == 1
    with pytest.raises(ParamsError, match="read timeout"):
        IOSettings(timeout_s=0)
    with pytest.raises(ValueError, match="timeout must be"):
        _io.Pool(1, timeout=-1.0)
    with _io.Pool(1, timeout=2.5) as pool:
        assert pool.timeout == 2.5


def test_truncated_after_open_is_a_read_error(tmp_path):
    model = make_model(tmp_path / "t.bin", n_layers=2, n_expert=4)
    layout = SlotLayout.for_table(model.experts, "pagecache")
    reader = ExpertReader(model.path, model.experts, layout, IOSettings())
    arena = Arena(1, layout.slot_bytes)
    os.truncate(model.path, int(model.experts.offsets[1, 3, 1]) + 7)
    batch, _ = reader.submit(1, [3], [arena.address(0)], arena)
    with pytest.raises(
        ReadError,
        match=r"t\.bin: (short read|read past end of file) reading "
        r"layer 2 expert 3 up at offset \d+ length \d+",
    ):
        batch.wait(0)
    reader.close()
    arena.close()


def test_unreadable_and_missing_files_are_read_errors(tmp_path):
    model = make_model(tmp_path / "u.bin", n_layers=1, n_expert=2)
    layout = SlotLayout.for_table(model.experts, "pagecache")
    with pytest.raises(ReadError, match="nope.bin: cannot open"):
        ExpertReader(tmp_path / "nope.bin", model.experts, layout, IOSettings())
    # a directory opens but cannot be read (EISDIR): works even as root, unlike chmod 000
    reader = ExpertReader(tmp_path, model.experts, layout, IOSettings())
    arena = Arena(1, layout.slot_bytes)
    batch, _ = reader.submit(0, [1], [arena.address(0)], arena)
    with pytest.raises(ReadError, match="I/O error reading layer 1 expert 1 .*Is a directory"):
        batch.wait_all()
    reader.close()
    arena.close()


def test_pool_waits_release_the_gil(tmp_path):
    """Another Python thread runs while the main thread waits for a batch.

    With a 10 s switch interval the spinner can only run when the main thread gives the GIL
    up itself, so ticks that happen between `before` and `after` prove wait_all released it.
    """
    f = tmp_path / "big.bin"
    f.write_bytes(os.urandom(4 << 20))
    fd = os.open(f, os.O_RDONLY)
    buf = np.zeros(4 << 20, np.uint8)
    rows = [(fd, i << 16, 1 << 16, 1 << 16, buf.ctypes.data + (i << 16), 0, 0) for i in range(64)]
    ticks = 0
    stop = threading.Event()

    def spin():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0)  # gives the GIL back at once

    during = 0
    old = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    t = threading.Thread(target=spin)
    try:
        with _io.Pool(1) as pool:
            t.start()
            for _ in range(10):
                batch = pool.submit(reads_table(rows), _io.FLAG_DONTNEED, buf)
                before = ticks
                batch.wait_all()
                during += ticks - before
            stop.set()
            t.join()
    finally:
        sys.setswitchinterval(old)
    os.close(fd)
    assert during > 0


def test_binding_does_not_leak(tmp_path):
    """Thousands of batches (successes and failures) leave RSS flat: the Python binding frees
    every batch and exception it makes (the C core is checked under valgrind)."""
    import psutil

    f = tmp_path / "d.bin"
    f.write_bytes(os.urandom(1 << 16))
    fd = os.open(f, os.O_RDONLY)
    buf = np.zeros(1 << 16, np.uint8)
    good = reads_table(
        [(fd, i * 4096, 4096, 4096, buf.ctypes.data + i * 4096, i, i % 4) for i in range(16)]
    )
    bad = reads_table([(fd, 1 << 20, 4096, 4096, buf.ctypes.data, 0, 0)])

    def cycle(n):
        for _ in range(n):
            b = pool.submit(good, 0, buf)
            b.wait(3)
            b.wait_all()
            b.report()
            with pytest.raises(_io.IOFailure):
                pool.submit(bad, 0, buf).wait(0)

    with _io.Pool(2) as pool:
        cycle(2000)  # warm up allocator pools
        before = psutil.Process().memory_info().rss
        cycle(5000)
        grown = psutil.Process().memory_info().rss - before
    os.close(fd)
    assert grown < 2 << 20, f"RSS grew {grown} bytes over 5000 batches"


@pytest.mark.parametrize("cache_mode", ["pagecache", "direct"])
def test_vectorized_plan_matches_the_loop(model, cache_mode):
    from sdq.paging.reads import plan_reads, plan_reads_ref

    t = model.experts
    layout = SlotLayout.for_table(t, cache_mode)
    rng = np.random.default_rng(7)
    for _ in range(200):
        row = int(rng.integers(len(t.layers)))
        k = int(rng.integers(1, t.n_expert + 1))
        experts = rng.choice(t.n_expert, k, replace=False)
        addrs = 4096 * (1 + np.arange(k)) * layout.slot_bytes
        mode = ["serial", "parallel", "split"][int(rng.integers(3))]
        chunks = int(rng.integers(1, 9)) if mode == "split" else 1
        args = (t.offsets[row], t.nbytes[row], experts, addrs, 9, layout, mode, chunks, 3)
        got, want = plan_reads(*args), plan_reads_ref(*args)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
