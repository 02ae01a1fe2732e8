"""sdq.run.plan: each term of the memory plan checked on its own, with numbers written out here
(tests/mutation/REPORT.md lists what the suite must catch)."""

from __future__ import annotations

import pytest
from pager_support import make_model

from sdq.errors import PlanError
from sdq.paging.arena import PADDING_BYTES as ARENA_PADDING_BYTES
from sdq.paging.cache import CacheSettings
from sdq.run.plan import (
    IO_THREAD_STACK_BYTES,
    PAGE,
    RUN_OBJECTS_BYTES,
    SLOT_META_BYTES,
    THREAD_EXTRA_BYTES,
    ProcessSize,
    pages,
    plan_for_slots,
    plan_memory,
    prefill_workers,
    process_now,
    thread_stack_bytes,
    transient_bytes,
)
from sdq.units import MIB

KW = dict(n_ctx=256, n_ubatch=16, reserve_mb=8, rss_now=20 * MIB)


@pytest.fixture(autouse=True)
def uncapped(monkeypatch):
    """These tests check the terms of the budget one by one, with budgets that hold more slots
    than this 16-expert model has experts: the cap at the file's experts (tested in
    test_memory_plan.py) is lifted here so that the slots still show every term."""
    import sdq.run.plan

    monkeypatch.setattr(sdq.run.plan, "useful_slots", lambda *args: 1 << 40)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("plan") / "experts.bin", n_layers=2, n_expert=8, k=2)


def _expert_buffer_bytes(spec, n_ubatch: int, threads: int) -> int:
    """The compute threads' expert buffers as the workspace lists them: ffn_in, ffn_down
    [W, T, D] and ffn_gate, ffn_up [W, T, F], float32, each rounded to pages."""
    W, T, D, F = threads, n_ubatch, spec.n_embd, spec.expert_ffn
    return 2 * pages(4 * W * T * D) + 2 * pages(4 * W * T * F)


def test_compute_threads_grow_compute_transient_and_thread_terms(model):
    """Every compute thread adds its expert buffers, its converted hidden rows and (from two
    threads on) a prefill worker's stack; the slots shrink by what those add."""
    kw = {**KW, "n_ubatch": 512}
    one = plan_memory(model, 256, compute_threads=1, **kw)
    four = plan_memory(model, 256, compute_threads=4, **kw)
    spec = model.spec
    assert four.compute_threads == 4 and one.compute_threads == 1
    assert four.kv_bytes == one.kv_bytes  # the KV cache does not depend on threads
    grown = _expert_buffer_bytes(spec, 512, 4) - _expert_buffer_bytes(spec, 512, 1)
    assert grown == 2 * (131072 - 32768) + 2 * (65536 - 16384)  # D=16, F=8, T=512
    assert four.compute_bytes - one.compute_bytes == grown
    T = 512
    arrays_1 = 4 * T * 16 + 4 * T * 8 + 5 * T * (16 + 16) // 2 + 5 * T * 8 // 2 + 16 * T * 2
    arrays_4 = arrays_1 + 3 * (5 * T * 8 // 2)
    assert one.transient_bytes == pages(arrays_1) + RUN_OBJECTS_BYTES
    assert four.transient_bytes == pages(arrays_4) + RUN_OBJECTS_BYTES > one.transient_bytes
    assert one.thread_bytes == 0
    assert four.thread_bytes == 4 * (thread_stack_bytes() + THREAD_EXTRA_BYTES)
    assert four.slots < one.slots
    assert four.to_dict()["compute_threads"] == 4


def test_transient_bytes_counts_each_thread(model):
    """Large enough arrays that each compute thread's share is more than a page."""
    spec = model.spec
    T = 4096
    base = 4 * T * 16 + 4 * T * 8 + 5 * T * 32 // 2 + 16 * T * 2
    for w in (1, 2, 7):
        assert transient_bytes(spec, T, w) == pages(base + w * (5 * T * 8 // 2)) + RUN_OBJECTS_BYTES
    assert transient_bytes(spec, T, 0) == transient_bytes(spec, T, 1)  # at least one thread
    assert transient_bytes(spec, T) == transient_bytes(spec, T, 1)


def test_prefill_workers():
    assert [prefill_workers(w) for w in (0, 1, 2, 5)] == [0, 0, 2, 5]


@pytest.mark.parametrize("io_threads", [0, 1, 8, 24])
def test_io_threads_are_counted_as_stacks(model, io_threads):
    plan = plan_memory(model, 64, io_threads=io_threads, **KW)
    assert plan.pager_bytes == io_threads * 256 * 1024 + ARENA_PADDING_BYTES
    assert IO_THREAD_STACK_BYTES == 256 * 1024
    assert plan.io_threads == io_threads
    base = plan_memory(model, 64, io_threads=0, **KW)
    assert plan.fixed_bytes - base.fixed_bytes == io_threads * 256 * 1024
    assert plan.slots == (64 * MIB - plan.fixed_bytes) // (plan.slot_bytes + SLOT_META_BYTES)
    assert (
        f"{io_threads} I/O thread stacks"
        in dict((r[0], r[2]) for r in plan.rows())["pager buffers"]
    )


def test_every_term_is_in_fixed_bytes(model):
    """fixed_bytes is the sum of the terms, each of which moves it by itself."""
    plan = plan_memory(model, 512, **{**KW, "rss_now": ProcessSize(30 * MIB, 10 * MIB)})
    terms = (
        plan.process_bytes,
        plan.dense_bytes,
        plan.kv_bytes,
        plan.compute_bytes,
        plan.transient_bytes,
        plan.pager_bytes,
        plan.reserve_bytes,
    )
    assert all(t > 0 for t in terms)
    assert plan.fixed_bytes == sum(terms)
    assert plan.reserve_bytes == 8 * MIB
    assert plan.process_bytes == 30 * MIB and plan.process_basis == "resident"
    assert plan.arena_bytes == plan.slots * plan.slot_bytes
    assert plan.per_slot_bytes == plan.slot_bytes + SLOT_META_BYTES == plan.slot_bytes + 512
    assert plan.left_bytes == 512 * MIB - plan.fixed_bytes - plan.slots * plan.per_slot_bytes
    assert plan.budget_for_slots(3) == plan.fixed_bytes + 3 * plan.per_slot_bytes
    assert plan.min_budget_bytes == plan.fixed_bytes + 2 * plan.per_slot_bytes
    assert plan.growth_bytes == plan.fixed_bytes - 30 * MIB + plan.slots * plan.per_slot_bytes
    d = plan.to_dict()
    for key in (
        "arena_bytes",
        "fixed_bytes",
        "left_bytes",
        "min_budget_bytes",
        "process_bytes",
        "process_basis",
        "growth_bytes",
    ):
        assert d[key] == getattr(plan, key)
    assert d["slots"] == plan.slots and d["reserve_bytes"] == 8 * MIB


def test_the_process_basis_on_a_tie_is_resident(model):
    plan = plan_memory(model, 512, **{**KW, "rss_now": ProcessSize(30 * MIB, 30 * MIB)})
    assert plan.thread_bytes == 0 and plan.process_basis == "resident"
    assert plan.process_bytes == 30 * MIB
    data = plan_memory(model, 512, **{**KW, "rss_now": ProcessSize(30 * MIB, 30 * MIB + 1)})
    assert data.process_basis == "data" and data.process_bytes == 30 * MIB + 1


def test_a_budget_of_exactly_the_minimum_holds_the_minimum(model):
    plan = plan_memory(model, 64, **KW)
    exact_mb = plan.min_budget_bytes / MIB
    assert plan_memory(model, exact_mb, **KW).slots == 2
    one_more = plan_memory(model, (plan.min_budget_bytes + plan.per_slot_bytes) / MIB, **KW)
    assert one_more.slots == 3 and one_more.left_bytes == 0


def test_the_refusal_names_every_term(model):
    plan = plan_memory(model, 64, **KW)
    with pytest.raises(PlanError) as info:
        plan_memory(model, 20, **KW)
    msg = str(info.value)
    held = max((20 * MIB - plan.fixed_bytes) // plan.per_slot_bytes, 0)
    assert msg.startswith(f"RAM budget 20 MB holds {held} expert slots of ")
    assert (
        f"{plan.slot_bytes / MIB:.3f} MB; at least 2 are needed (experts used per token 2)" in msg
    )
    for part in (
        f"minimum budget {plan.min_budget_bytes / MIB:.1f} MB",
        "process 20.0 resident",
        f"dense {plan.dense_bytes / MIB:.1f}",
        f"KV {plan.kv_bytes / MIB:.1f}",
        f"compute {plan.compute_bytes / MIB:.1f}",
        f"transient {plan.transient_bytes / MIB:.1f}",
        "reserve 8 MB",
    ):
        assert part in msg, part
    assert "streaming" not in msg


def test_the_refusal_counts_streaming_slots(model):
    bypass = CacheSettings(policy="lrfu_bypass")
    with pytest.raises(PlanError, match=r"at least 4 are needed \(experts used per token 2 \+ 2 "):
        plan_memory(model, 20, cache=bypass, **KW)


def test_a_negative_left_over_is_zero_slots(model):
    with pytest.raises(PlanError, match="holds 0 expert slots"):
        plan_memory(model, 1, **KW)


def test_plan_records_its_settings(model):
    cs = CacheSettings(policy="lru", prefetch_slots=1)
    plan = plan_memory(model, 64, cache=cs, cache_mode="direct", io_threads=3, **KW)
    assert (plan.cache_policy, plan.prefetch_slots, plan.cache_mode) == ("lru", 1, "direct")
    assert (plan.n_ctx, plan.n_ubatch, plan.n_expert_used, plan.n_moe_layers) == (256, 16, 2, 2)
    assert plan.align == 4096 and plan.ram_budget_bytes == 64 * MIB
    assert plan.rss_bytes == plan.data_bytes == 20 * MIB
    assert plan.thread_stack_bytes == thread_stack_bytes()
    assert plan.slot_meta_bytes == SLOT_META_BYTES
    assert plan.min_slots == 2
    split = plan.slot_split
    assert (split.policy, split.cache, split.streaming) == ("lru", plan.slots, 0)


def test_rows_of_the_table(model):
    process = ProcessSize(40 * MIB, 10 * MIB)
    plan = plan_memory(model, 256, compute_threads=3, **{**KW, "rss_now": process})
    rows = {name: (mb, note) for name, mb, note in plan.rows()}
    assert list(rows) == [
        "process now",
        "dense weights",
        "KV cache",
        "compute buffers",
        "transient arrays",
        "pager buffers",
        "slot metadata",
        "reserve",
        "expert arena",
        "left over",
        "budget",
    ]
    assert rows["process now"][0] == plan.process_bytes / MIB
    assert "3 thread stacks to start" in rows["process now"][1]
    assert f"resident {40.0:.1f}" in rows["process now"][1]
    assert rows["dense weights"][0] == plan.dense_bytes / MIB
    assert rows["KV cache"] == (plan.kv_bytes / MIB, "ctx 256")
    assert rows["compute buffers"] == (plan.compute_bytes / MIB, "ubatch 16")
    assert rows["transient arrays"][0] == plan.transient_bytes / MIB
    assert rows["slot metadata"] == (plan.slots * 512 / MIB, "512 B/slot")
    assert rows["reserve"][0] == 8.0
    assert rows["expert arena"][0] == plan.arena_bytes / MIB
    assert rows["expert arena"][1].startswith(f"{plan.slots} slots x ")
    assert rows["left over"][0] == plan.left_bytes / MIB
    assert rows["budget"] == (256.0, f"minimum {plan.min_budget_bytes / MIB:.1f} MB")
    stacks = 3 * (thread_stack_bytes() + THREAD_EXTRA_BYTES)
    assert rows["process now"][1] == (
        f"the larger of resident 40.0 and data segment 10.0 + 3 thread stacks to start "
        f"{stacks / MIB:.1f}; runtime started"
    )
    assert rows["dense weights"][1] == "resident, anonymous memory"
    assert rows["transient arrays"][1] == "per op, and the run's objects"
    assert rows["pager buffers"] == (plan.pager_bytes / MIB, "8 I/O thread stacks")
    assert rows["reserve"] == (8.0, "head room")
    assert rows["left over"] == (plan.left_bytes / MIB, "less than one slot")
    assert rows["expert arena"][1] == (
        f"{plan.slots} slots x {plan.slot_bytes / MIB:.3f} MB (pagecache); "
        f"policy {plan.slot_split.policy}: {plan.slots} cache"
    )
    split_note = rows["expert arena"][1].split("; ")[1]
    assert split_note.startswith("policy ")
    bypass = plan_memory(model, 64, cache=CacheSettings(policy="lrfu_bypass"), **KW)
    note = {r[0]: r[2] for r in bypass.rows()}["expert arena"]
    assert note.endswith(f"policy lrfu_bypass: {bypass.slots - 2} cache + 2 streaming")


def test_plan_for_slots_counts_nothing_else(model):
    plan = plan_for_slots(model, 5)
    assert plan.slots == 5 and plan.fixed_bytes == 0
    assert plan.ram_budget_bytes == 5 * (plan.slot_bytes + SLOT_META_BYTES)
    assert plan.left_bytes == 0 and plan.min_slots == 2
    assert plan.cache_mode == "pagecache" and plan.align == 64
    assert (plan.n_ctx, plan.n_ubatch, plan.io_threads, plan.compute_threads) == (0, 0, 0, 1)
    assert plan.process_bytes == plan.thread_bytes == plan.pager_bytes == 0
    assert plan_for_slots(model, 5, cache_mode="dontneed").cache_mode == "dontneed"
    assert plan_for_slots(model, 5, cache_mode="direct").slot_bytes % 4096 == 0


def _status_kib() -> tuple[int, int]:
    """(VmRSS, VmData) in KiB, read here from /proc/self/status."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            fields[name] = rest.split()[0] if rest.split() else ""
    return int(fields["VmRSS"]), int(fields["VmData"])


def test_process_now_reads_resident_and_data_from_proc():
    """Within 32 KiB of the kernel's own figures read just before and after (a process bigger
    than 32 MiB, so a slip of one part in a thousand shows)."""
    before = _status_kib()
    now = process_now()
    after = _status_kib()
    for got, lo, hi in zip((now.resident, now.data), before, after, strict=True):
        assert min(lo, hi) * 1024 - 32768 <= got <= max(lo, hi) * 1024 + 32768
    assert now.data > now.resident > 32 * MIB  # VmData counts untouched mappings too


def test_process_now_without_proc_uses_psutil(monkeypatch):
    import psutil

    import sdq.proc

    monkeypatch.setattr(sdq.proc, "proc_status_kib", lambda path, keys: {})
    now = process_now()
    rss = psutil.Process().memory_info().rss
    assert now.resident == now.data
    assert abs(now.resident - rss) < 8 * MIB


def test_defaults_of_plan_memory(model):
    plan = plan_memory(model, 64, **KW)
    assert (plan.cache_mode, plan.io_threads, plan.compute_threads) == ("pagecache", 8, 1)
    assert plan.cache_policy == "auto" and plan.prefetch_slots == 0


def test_dense_allocation_of_a_gguf_counts_each_dense_tensor_in_pages(tmp_path):
    from gguf_builders import Layout, write_model

    from sdq.format.model import open_model
    from sdq.run.plan import dense_allocation

    path, experts = write_model(tmp_path / "m.gguf", Layout())
    m = open_model(path)
    dense = [t for name, t in m.tensors.items() if name not in experts]
    assert len(dense) > 0 and len(experts) == 6  # 2 layers x gate, up, down
    want = sum(-(-t.nbytes // PAGE) * PAGE for t in dense)
    assert dense_allocation(m) == want
    assert want > m.dense_bytes  # the rounding is counted


def test_thread_stack_bytes_is_the_c_librarys_default(monkeypatch):
    """glibc fixes a new thread's default stack from RLIMIT_STACK at start-up: lowering the
    limit now does not change it (the figure comes from pthread), and threading.stack_size()
    overrides it; without libc the limit itself is the figure (8 MiB when unlimited)."""
    import ctypes
    import resource
    import threading

    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    default = thread_stack_bytes()
    assert default >= 1 * MIB
    resource.setrlimit(resource.RLIMIT_STACK, (4 * MIB, hard))
    try:
        assert thread_stack_bytes() == default != 4 * MIB
        with monkeypatch.context() as m:
            m.setattr(ctypes, "CDLL", lambda name: (_ for _ in ()).throw(OSError("no libc")))
            assert thread_stack_bytes() == 4 * MIB
            if hard == resource.RLIM_INFINITY:
                resource.setrlimit(resource.RLIMIT_STACK, (hard, hard))
                assert thread_stack_bytes() == 8 * MIB
    finally:
        resource.setrlimit(resource.RLIMIT_STACK, (soft, hard))
    old = threading.stack_size(512 * 1024)
    try:
        assert thread_stack_bytes() == 512 * 1024
    finally:
        threading.stack_size(old)


def test_the_runtime_starts_once():
    from sdq.run.plan import _load_cached_kernels, _pool_kernel, start_runtime

    start_runtime()
    assert _load_cached_kernels() == 0  # every cached kernel is loaded already
    pool = _pool_kernel()
    assert pool is _pool_kernel() and pool(10) == 45
    from sdq.run import plan as plan_module

    assert len(plan_module._POOL_KERNEL) == 1


def test_transient_bytes_of_a_hybrid_model():
    """qwen35moe adds the delta-net output and the shared expert's hidden rows, converted."""
    from types import SimpleNamespace

    base = dict(n_embd=64, expert_ffn=32, n_head=4, head_dim=16, n_expert_used=2)
    plain = SimpleNamespace(**base)
    hybrid = SimpleNamespace(**base, hybrid=SimpleNamespace(inner_size=4096), shared_ffn=2048)
    T = 64
    extra = 5 * T * (4096 + 2048) // 2  # 983,040 bytes
    assert transient_bytes(hybrid, T) - transient_bytes(plain, T) == pages(
        4 * T * 64 + 4 * T * 16 + 5 * T * 128 // 2 + 5 * T * 32 // 2 + 16 * T * 2 + extra
    ) - pages(4 * T * 64 + 4 * T * 16 + 5 * T * 128 // 2 + 5 * T * 32 // 2 + 16 * T * 2)
    assert (
        transient_bytes(hybrid, T)
        == pages(4 * T * 64 + 4 * T * 16 + 5 * T * 128 // 2 + 5 * T * 32 // 2 + 16 * T * 2 + extra)
        + RUN_OBJECTS_BYTES
    )


def test_a_budget_short_of_the_minimum_by_half_a_slot(model):
    plan = plan_memory(model, 64, **KW)
    budget_mb = (plan.min_budget_bytes - plan.per_slot_bytes // 2) / MIB
    with pytest.raises(PlanError, match=r"holds 1 expert slots of "):
        plan_memory(model, budget_mb, **KW)
