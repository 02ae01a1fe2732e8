"""sdq.run.plan: every buffer counted before allocating; a budget too small states the minimum."""

from __future__ import annotations

import json

import pytest
from pager_support import make_model

from sdq.cli import main
from sdq.errors import PlanError
from sdq.paging.arena import PADDING_BYTES as ARENA_PADDING_BYTES
from sdq.paging.cache import POLICIES, CacheSettings, ExpertCache
from sdq.paging.policies import BY_NAME
from sdq.paging.reads import SlotLayout
from sdq.run.plan import (
    IO_THREAD_STACK_BYTES,
    RUN_OBJECTS_BYTES,
    SLOT_META_BYTES,
    THREAD_EXTRA_BYTES,
    ProcessSize,
    pages,
    plan_memory,
    process_now,
    thread_stack_bytes,
    transient_bytes,
)
from sdq.run.workspace import workspace_bytes
from sdq.units import MIB


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("mem") / "experts.bin", n_layers=2, n_expert=8, k=2)


def test_slots_fill_what_is_left(model):
    plan = plan_memory(model, 64, n_ctx=256, n_ubatch=16, reserve_mb=8, rss_now=20 * MIB)
    ws = workspace_bytes(model.spec, 256, 16)
    assert plan.kv_bytes == pages(ws["k_cache"]) + pages(ws["v_cache"])
    assert plan.kv_bytes + plan.compute_bytes == sum(pages(b) for b in ws.values())
    assert plan.pager_bytes == 8 * IO_THREAD_STACK_BYTES + ARENA_PADDING_BYTES
    assert plan.dense_bytes == pages(model.dense_bytes) and plan.rss_bytes == 20 * MIB
    assert plan.transient_bytes == transient_bytes(model.spec, 16, 1) > RUN_OBJECTS_BYTES
    assert plan.thread_bytes == 0  # one compute thread: no prefill workers to start
    fixed = (
        20 * MIB
        + plan.dense_bytes
        + plan.kv_bytes
        + plan.compute_bytes
        + plan.transient_bytes
        + plan.pager_bytes
        + 8 * MIB
    )
    assert plan.fixed_bytes == fixed
    per_slot = plan.slot_bytes + SLOT_META_BYTES
    assert plan.slot_bytes == SlotLayout.for_table(model.experts, "pagecache").slot_bytes
    # 64 MB holds more slots than the model has experts; 10.5 slots' worth past the fixed part:
    budget_mb = (fixed + 10.5 * per_slot) / MIB
    plan = plan_memory(model, budget_mb, n_ctx=256, n_ubatch=16, reserve_mb=8, rss_now=20 * MIB)
    assert plan.slots == 10 < (64 * MIB - fixed) // per_slot
    assert 0 <= plan.left_bytes < per_slot
    assert plan.growth_bytes == fixed - 20 * MIB + plan.slots * per_slot


def test_seed_sizing_counts_only_the_resident_set_dense_and_reserve(model):
    """Sizing "seed" (000 §5): arena = budget - RSS now - dense - reserve; the KV cache, the
    compute buffers, the transient arrays, the pager's stacks and the data segment are not
    counted, so the seed's arena is larger than the plan's by exactly what they take."""
    now = ProcessSize(20 * MIB, 30 * MIB)  # a data segment larger than the resident set
    kw = dict(n_ctx=256, n_ubatch=16, reserve_mb=1, rss_now=now, compute_threads=2)
    plan = plan_memory(model, 1e4, **kw)
    seed = plan_memory(model, 1e4, sizing="seed", **kw)
    assert seed.sizing == "seed" and plan.sizing == "plan"
    assert seed.fixed_bytes == 20 * MIB + seed.dense_bytes + 1 * MIB
    left_out = plan.fixed_bytes - seed.fixed_bytes
    assert left_out == (
        plan.process_bytes
        - 20 * MIB
        + plan.kv_bytes
        + plan.compute_bytes
        + plan.transient_bytes
        + plan.pager_bytes
    )
    per_slot = plan.per_slot_bytes
    budget_mb = (seed.fixed_bytes + 10.5 * per_slot) / MIB
    seed = plan_memory(model, budget_mb, sizing="seed", **kw)
    assert seed.slots == 10 and 0 <= seed.left_bytes < per_slot
    assert seed.to_dict()["sizing"] == "seed"
    with pytest.raises(PlanError):  # the plan's count leaves fewer than K slots at that budget
        plan_memory(model, budget_mb, **kw)
    with pytest.raises(PlanError, match="sizing"):
        plan_memory(model, budget_mb, sizing="guess", **kw)


def test_the_process_is_the_larger_of_resident_and_data_with_thread_stacks(model, monkeypatch):
    """The process counted is its resident set, or its data segment plus the stacks of the
    prefill workers still to start, whichever is larger (RSS and RLIMIT_DATA both held).
    (The cap at the file's 16 experts is lifted, so that the slots show the difference.)"""
    import sdq.run.plan

    monkeypatch.setattr(sdq.run.plan, "useful_slots", lambda *args: 1 << 40)
    kw = dict(n_ctx=256, n_ubatch=16, reserve_mb=8, compute_threads=3)
    stacks = 3 * (thread_stack_bytes() + THREAD_EXTRA_BYTES)
    resident = plan_memory(model, 512, rss_now=ProcessSize(200 * MIB, 100 * MIB), **kw)
    assert resident.thread_bytes == stacks and resident.process_bytes == 200 * MIB
    assert resident.process_basis == "resident"
    data = plan_memory(model, 512, rss_now=ProcessSize(100 * MIB, 200 * MIB), **kw)
    assert data.process_bytes == 200 * MIB + stacks and data.process_basis == "data"
    assert data.slots < resident.slots
    assert data.fixed_bytes - resident.fixed_bytes == stacks


NEW_THREAD_PROBE = """
import threading
from sdq.run.plan import process_now, start_runtime, thread_stack_bytes, THREAD_EXTRA_BYTES
start_runtime()  # one malloc arena: the thread allocates from the main one
release = threading.Event()
before = process_now().data
t = threading.Thread(target=release.wait)
t.start()
grown = process_now().data - before
release.set()
t.join()
print(grown, thread_stack_bytes(), THREAD_EXTRA_BYTES)
"""


def test_a_new_threads_stack_is_what_the_plan_counts_for_it():
    """thread_stack_bytes() is the data segment a new thread adds (its stack), to within the
    extra the plan counts per thread. In a fresh process: glibc reuses the stacks of threads
    that ended, so in a process that already ran and joined threads a new one may add nothing."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", NEW_THREAD_PROBE], capture_output=True, text=True, check=True
    ).stdout
    grown, stack, extra = map(int, out.split())
    assert stack <= grown <= stack + extra, f"a new thread added {grown} B, stack {stack} B"


def test_transient_arrays_grow_with_the_ubatch(model):
    small, large = (transient_bytes(model.spec, t, 2) for t in (16, 512))
    assert RUN_OBJECTS_BYTES < small < large


def test_direct_slots_are_page_aligned_and_larger(model):
    buffered = plan_memory(model, 64, 256, 16, reserve_mb=8, rss_now=0)
    direct = plan_memory(model, 64, 256, 16, reserve_mb=8, rss_now=0, cache_mode="direct")
    assert direct.slot_bytes % 4096 == 0 and direct.align == 4096
    assert direct.slot_bytes > buffered.slot_bytes >= model.experts.max_expert_bytes


def test_too_small_budget_states_the_minimum(model):
    plan = plan_memory(model, 64, 256, 16, reserve_mb=8, rss_now=10 * MIB)
    minimum_mb = plan.min_budget_bytes / MIB
    ok = plan_memory(model, minimum_mb, 256, 16, reserve_mb=8, rss_now=10 * MIB)
    assert ok.slots == model.spec.n_expert_used
    with pytest.raises(PlanError, match=rf"minimum budget {minimum_mb:.1f} MB") as info:
        plan_memory(model, minimum_mb - 0.01, 256, 16, reserve_mb=8, rss_now=10 * MIB)
    assert "at least 2 are needed" in str(info.value)
    bypass = CacheSettings(policy="lrfu_bypass", prefetch_slots=1)  # K cache + K + 1 streaming
    with pytest.raises(PlanError, match="at least 5 are needed .* 3 streaming slots"):
        plan_memory(model, minimum_mb, 256, 16, reserve_mb=8, rss_now=10 * MIB, cache=bypass)


@pytest.mark.parametrize("prefetch", [0, 1, 2])
@pytest.mark.parametrize("policy", POLICIES)
def test_the_cache_opens_at_the_plans_minimum(model, policy, prefetch):
    """At the smallest budget the plan accepts for a policy, the cache opens and serves a
    layer's experts; 1 MB less and the plan refuses, naming that minimum."""
    cache = CacheSettings(policy=policy, prefetch_slots=prefetch)
    kw = dict(n_ctx=256, n_ubatch=16, reserve_mb=8, rss_now=10 * MIB, cache=cache)
    minimum_mb = plan_memory(model, 64, **kw).min_budget_bytes / MIB
    plan = plan_memory(model, minimum_mb, **kw)
    assert plan.slots == plan.min_slots
    with ExpertCache(model, plan, settings=cache) as experts:
        K = model.spec.n_expert_used
        assert experts.max_acquire >= K
        layer = model.experts.layers[0]
        handle = experts.acquire(layer, range(K))
        for i in range(K):
            handle.wait(i)
        experts.release(handle)
        experts.prefetch(model.experts.layers[1], range(K))
    with pytest.raises(PlanError, match=rf"minimum budget {minimum_mb:.1f} MB"):
        plan_memory(model, minimum_mb - 1, **kw)


def test_slots_stop_at_the_experts_the_file_holds(model):
    """A budget far above the model maps no more slots than every expert plus the streaming
    share: the rest of the budget stays unallocated."""
    huge = plan_memory(model, 20_000, n_ctx=256, n_ubatch=16, reserve_mb=8, rss_now=20 * MIB)
    n_experts = len(model.experts.layers) * model.experts.n_expert
    K = model.spec.n_expert_used
    streaming = BY_NAME["lrfu_bypass"].streaming_slots(K, huge.prefetch_slots)  # the largest
    assert huge.slots == n_experts + streaming
    assert huge.arena_bytes < 20_000 * MIB // 100
    assert huge.left_bytes > 19_000 * MIB


def test_the_process_is_measured_when_not_given(model):
    """A real plan starts the runtime first and then measures both figures of this process."""
    plan = plan_memory(model, 4096, 256, 16, reserve_mb=8)
    assert 1 * MIB < plan.rss_bytes < 4096 * MIB and 1 * MIB < plan.data_bytes < 4096 * MIB
    now = process_now()
    assert abs(now.data - plan.data_bytes) < 16 * MIB  # measured after the runtime started


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory):
    from gguf_builders import Layout, write_model

    path, _ = write_model(tmp_path_factory.mktemp("gguf") / "m.gguf", Layout(n_layer=2, n_expert=8))
    return path


def test_plan_command_table_json_and_error(tiny_model, capsys):
    args = ["plan", str(tiny_model), "--ram-budget-mb", "2000", "-c", "256", "-b", "16"]
    assert main([*args, "--reserve-mb", "10"]) == 0
    out = capsys.readouterr().out
    items = (
        "process now",
        "dense weights",
        "KV cache",
        "compute buffers",
        "transient arrays",
        "reserve",
        "expert arena",
    )
    for item in (*items, "minimum"):
        assert item in out
    assert main([*args, "--reserve-mb", "10", "--cache-mode", "direct", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["slots"] > 0 and d["slot_bytes"] % 4096 == 0 and d["cache_mode"] == "direct"
    assert main([*args, "--reserve-mb", "10", "--cache-policy", "lrfu_bypass", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    K = d["n_expert_used"]
    assert d["cache_policy"] == "lrfu_bypass" and d["prefetch_slots"] == 3 * K // 4  # chat's
    assert d["min_slots"] == 2 * K + d["prefetch_slots"]
    args[3] = "5"
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("sdq plan: error: RAM budget 5 MB") and "minimum budget" in err
