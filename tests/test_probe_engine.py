"""The engine-path probe (sdq.measure.probe_engine) and fio's mixed-size command (measure.fio)."""

from __future__ import annotations

import math
import shutil

import pytest

from sdq.errors import ParamsError
from sdq.measure.fio import bssplit, fio_command
from sdq.measure.probe import HUGE_PAGE
from sdq.measure.probe_engine import PAGE, _direct_spans, engine_vs_fio


def test_bssplit_shares_are_whole_percents_summing_to_100():
    assert bssplit([593920] * 5 + [864256]) == "593920/83:864256/17"
    assert bssplit([4096] * 3) == "4096/100"
    # a size whose share rounds to 0 is left out; the most common size takes the rounding
    text = bssplit([8192] * 999 + [4096])
    assert text == "8192/100"
    shares = [int(p.split("/")[1]) for p in bssplit([1, 2, 2, 3, 3, 3]).split(":")]
    assert sum(shares) == 100 and shares == [17, 33, 50]
    with pytest.raises(ValueError):
        bssplit([])


def test_fio_command_with_a_split_reads_mixed_aligned_sizes(tmp_path):
    cmd = fio_command(
        tmp_path / "f", size=0, threads=4, reads=72, cache_mode="direct", split="4096/50:8192/50"
    )
    assert "--bssplit=4096/50:8192/50" in cmd and "--blockalign=4096" in cmd
    assert not any(c.startswith("--bs=") for c in cmd)
    assert "--numjobs=4" in cmd and "--number_ios=18" in cmd and "--direct=1" in cmd


def test_direct_spans_are_the_aligned_supersets(tiny_model):
    from sdq.format.model import open_model

    table = open_model(tiny_model).require_experts()
    spans = _direct_spans(table)  # [L, E, P]
    for li, e, p in [(0, 0, 0), (0, 1, 2), (len(table.layers) - 1, table.n_expert - 1, 1)]:
        off, n = int(table.offsets[li, e, p]), int(table.nbytes[li, e, p])
        lo, hi = off // PAGE * PAGE, math.ceil((off + n) / PAGE) * PAGE
        assert spans[li, e, p] == hi - lo
    assert (spans % PAGE == 0).all() and (spans >= table.nbytes).all()


def test_engine_vs_fio_without_fio(tiny_model):
    res = engine_vs_fio(tiny_model, (1, 2), layers=2, repeat=2, fio=False)
    assert [c.threads for c in res.cells] == [1, 2]
    assert res.reads_per_layer == 3 * res.k and res.layers == 2 and res.repeat == 2
    for c in res.cells:
        assert c.runs == 2
        assert c.arena_mb_s > 0 and c.one_slot_mb_s > 0 and c.arena_read_ms > 0
        assert c.small_pages_mb_s > 0 and c.small_pages_read_ms > 0
        assert c.arena_mb_s_min <= c.arena_mb_s <= c.arena_mb_s_max
        assert math.isnan(c.fio_mb_s) and math.isnan(c.arena_over_fio)
    assert sum(int(p.split("/")[1]) for p in res.bssplit.split(":")) == 100
    assert res.fio_note == "" and res.cpus >= 1 and res.seconds > 0
    assert 0 <= res.huge_share <= 1 and res.small_pages_huge_share == 0


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
def test_engine_vs_fio_with_fio(tiny_model):
    res = engine_vs_fio(tiny_model, (2,), layers=2, repeat=1)
    (c,) = res.cells
    assert c.fio_mb_s > 0 and c.fio_read_ms > 0
    assert c.arena_over_fio == pytest.approx(c.arena_mb_s / c.fio_mb_s)
    assert "--bssplit=" in res.fio_note and "--direct=1" in res.fio_note
    assert "FILE" in res.fio_note and str(tiny_model) not in res.fio_note


def test_engine_vs_fio_rejects_bad_settings(tiny_model):
    with pytest.raises(ParamsError, match="layers=0"):
        engine_vs_fio(tiny_model, (1,), layers=0)
    with pytest.raises(ParamsError, match="threads"):
        engine_vs_fio(tiny_model, (0,))


def test_engine_vs_fio_reads_the_right_bytes(tiny_model, monkeypatch):
    """The slots hold the file's bytes after a run (the timed reads are real reads)."""
    import os

    import sdq.paging.arena
    from sdq.format.model import open_model

    arenas = []

    class Keep(sdq.paging.arena.Arena):
        def close(self):
            arenas.append(self.buf.copy())
            super().close()

    monkeypatch.setattr(sdq.paging.arena, "Arena", Keep)
    engine_vs_fio(tiny_model, (1,), layers=1, repeat=1, fio=False)
    buf = arenas[0]  # [slots * slot_bytes]: the huge-page arena, closed first
    from sdq.paging.reads import SlotLayout

    table = open_model(tiny_model).require_experts()
    layout = SlotLayout.for_table(table, "direct")
    first = -(-HUGE_PAGE // layout.slot_bytes)  # the spare slots before the ones read into
    buf = buf[first * layout.slot_bytes :]  # [from the first slot read into]
    # that slot was last written by some expert's read (which one depends on the run order):
    # its gate region must hold that expert's gate bytes, byte for byte
    fd = os.open(tiny_model, os.O_RDONLY)
    try:
        matches = 0
        for off, n in zip(table.offsets[..., 0].ravel(), table.nbytes[..., 0].ravel(), strict=True):
            v = layout.view_offset(int(off), 0)
            if buf[v : v + int(n)].tobytes() == os.pread(fd, int(n), int(off)):
                matches += 1
    finally:
        os.close(fd)
    assert matches >= 1, "the first slot does not hold any expert's gate bytes"


def test_the_arena_asks_for_huge_pages():
    """The pager's arena (which the probes read into) is advised MADV_HUGEPAGE: with THP in
    `madvise` or `always` mode its anonymous pages may be 2 MiB (smaps: THPeligible 1)."""
    from pathlib import Path

    from sdq.paging.arena import Arena

    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not mode.exists() or "[never]" in mode.read_text():
        pytest.skip("transparent huge pages are off on this machine")
    arena = Arena(2, 4 << 20)
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()

        def holds_arena(line: str) -> bool:  # a mapping's header line whose range holds it
            span = line.split(" ", 1)[0].split("-")
            if len(span) != 2 or not all(c in "0123456789abcdef" for c in "".join(span)):
                return False
            return int(span[0], 16) <= arena.base < int(span[1], 16)

        head = next(i for i, line in enumerate(lines) if holds_arena(line))
        fields = dict(line.split(":", 1) for line in lines[head + 1 : head + 30] if ":" in line)
        assert fields["THPeligible"].strip() == "1"
    finally:
        arena.close()


def test_huge_share_of_an_arena():
    import mmap
    from pathlib import Path

    from sdq.measure.probe_engine import huge_share
    from sdq.paging.arena import Arena

    small = Arena(4, 4 << 20)
    try:
        small._map.madvise(mmap.MADV_NOHUGEPAGE)
        small.buf[::PAGE] = 1
        assert huge_share(small) == 0
    finally:
        small.close()
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not mode.exists() or "[never]" in mode.read_text():
        return  # nothing more to see without THP
    big = Arena(4, 4 << 20)  # 16 MiB asking for huge pages: at least some 2 MiB ranges
    try:
        big.buf[::PAGE] = 1
        assert 0 <= huge_share(big) <= 1
    finally:
        big.close()
