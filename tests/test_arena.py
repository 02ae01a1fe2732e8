"""The expert arena: slots start on a huge-page boundary; the pager's arena is faulted in when it
is made (not inside an expert read during generation), and the plan counts its padding."""

from pager_support import resident_pages

from sdq.paging.arena import HUGE_PAGE, PADDING_BYTES, Arena

SLOT = 1_912_832  # one seed-shaped expert in its slot: not a multiple of the huge page


def test_slots_start_on_a_huge_page_boundary_and_do_not_overlap():
    arena = Arena(5, SLOT)
    try:
        assert arena.base % HUGE_PAGE == 0
        assert arena.buf.nbytes == 5 * SLOT == arena.nbytes
        assert [arena.address(k) - arena.base for k in range(5)] == [k * SLOT for k in range(5)]
        arena.slot(4)[:] = 7  # the last slot is inside the mapping
        assert arena.slot(3).max() == 0
    finally:
        arena.close()


def test_prefault_makes_every_page_resident_and_the_default_leaves_them_untouched():
    lazy, eager = Arena(3, SLOT), Arena(3, SLOT, prefault=True)
    try:
        assert resident_pages(lazy.base, lazy.nbytes).sum() == 0
        assert resident_pages(eager.base, eager.nbytes).all()
        assert not eager.buf.any()  # touched, still zero
    finally:
        lazy.close()
        eager.close()


def test_the_plan_counts_the_arena_padding(tiny_model):
    from sdq.format.model import open_model
    from sdq.run.plan import plan_memory

    plan = plan_memory(open_model(tiny_model), ram_budget_mb=4000, n_ctx=256, n_ubatch=16)
    assert plan.pager_bytes >= PADDING_BYTES
