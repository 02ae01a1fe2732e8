"""The reader's cached per-layer read templates give exactly the plain loop's read table, in
every mode, after split changes, and the template is never written to."""

from __future__ import annotations

import numpy as np
import pytest
from pager_support import make_model, plans_match_the_loop

from sdq.paging.reads import (
    ExpertReader,
    IOSettings,
    SlotLayout,
    apply_template,
    read_template,
)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # 12-36 KB segments: split cuts them into page-aligned chunks, unevenly per part
    return make_model(
        tmp_path_factory.mktemp("plan") / "experts.bin",
        n_layers=3,
        n_expert=8,
        row_bytes=(4321, 6007, 2999),
    )


@pytest.mark.parametrize("cache_mode", ["pagecache", "dontneed", "direct"])
def test_reader_template_matches_the_loop_in_every_mode(model, cache_mode):
    t = model.experts
    layout = SlotLayout.for_table(t, cache_mode)
    reader = ExpertReader(model.path, t, layout, IOSettings(threads=2, cache_mode=cache_mode))
    try:
        modes = ["serial", "parallel", "split"]
        for _, _, _, reads in plans_match_the_loop(reader, layout, modes, 120, seed=3):
            assert reads.flags.c_contiguous and reads.dtype == np.int64
    finally:
        reader.close()


def test_template_requests_do_not_change_the_template(model):
    t = model.experts
    layout = SlotLayout.for_table(t, "direct")
    tmpl = read_template(t.offsets[1], t.nbytes[1], 7, layout, 3)
    before = tmpl.rows.copy()
    apply_template(tmpl, [3, 1], [1 << 20, 2 << 20], "split")
    apply_template(tmpl, [0], [5 << 20], "serial")
    assert np.array_equal(tmpl.rows, before)
    assert (tmpl.rows[..., 4] < layout.slot_bytes).all()  # destinations relative to the slot


def test_batch_timing_summarises_the_report(model):
    t = model.experts
    layout = SlotLayout.for_table(t, "pagecache")
    reader = ExpertReader(model.path, t, layout, IOSettings(threads=2, mode="split", split=3))
    arena = np.zeros(3 * layout.slot_bytes + 64, dtype=np.uint8)
    base = arena.ctypes.data + (-arena.ctypes.data) % 64
    try:
        batch, _ = reader.submit(1, [4, 0, 6], [base + s * layout.slot_bytes for s in range(3)])
        batch.wait_all()
        rep = batch.report()  # [R, 6]
        reads, span_ns, busy_ns = batch.timing()
        assert reads == len(rep) > 3
        assert span_ns == int(rep[:, 2].max() - rep[:, 0].min()) > 0
        assert busy_ns == int((rep[:, 2] - rep[:, 1]).sum()) > 0
    finally:
        reader.close()
