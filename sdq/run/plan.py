"""The memory plan: how many expert slots fit in a RAM budget, counted before allocating.

    slots = floor((budget - process - dense - kv - compute - transient - pager - reserve)
                  / (slot_bytes + per-slot metadata))
    slots = min(slots, routed experts in the file + the largest policy's streaming slots)

Every term is known before anything big is allocated (seed 000 §5: the compute buffer that
grew after sizing the arena is what crashed the 8 GB machine):
  process       the process as it is when planning, once its runtime is started (below), and
                the larger of two figures, one per way a small machine is modelled:
                  resident  VmRSS now: anonymous and mapped file pages (what a machine's RAM
                            holds; a cgroup charges the anonymous part of it)
                  data      VmData now, the data segment: every private writable mapping,
                            touched or not (what RLIMIT_DATA counts), plus the stacks of the
                            threads the engine will start (virtual memory, counted there only)
  dense         every tensor that is not a routed expert (model.dense_bytes), which the engine
                copies into anonymous memory and keeps resident; each array rounded to pages
  kv, compute   sdq.run.workspace.workspace_bytes(spec, n_ctx, n_ubatch, compute_threads): buffers
                named *cache are the KV cache, the rest the ubatch compute buffers (one set of
                expert buffers per compute thread); each rounded to pages
  transient     arrays an op makes and drops (activations converted to 8-bit blocks, embedding
                rows, RoPE tables; `transient_bytes`), and the Python objects a run creates
  pager fixed   I/O worker stacks (the pager reads in place, so no bounce buffers)
  reserve       head room for what is not modelled; seed default 900. The terms above are meant
                to make any reserve, 0 included, safe: a run either fits or is refused.

Sizing "seed" (`sdq chat --sizing seed`, for notebook 04) is seed 000's arithmetic instead, for
reproducing what it did: slots = floor((budget - resident set now - dense - reserve) / per slot).
It counts the process's resident set as it is when sizing and the dense weights (loaded before
sizing in the seed) and nothing that grows after: not the KV cache, the compute buffers, the
transient arrays, the pager's stacks or the data segment's excess over the resident set, which
are allocated after the arena is sized in the seed (000 §5.1: "the compute buffer ... is
allocated after the pager sizes the arena, so it is not counted"). Its reserve is the seed's:
the only insurance for all of that. A run sized so may pass its budget: that is what it shows.

The runtime is started before the process is measured (`start_runtime`), so what it would
otherwise add after the arena is sized is already in "process": the kernels are loaded from
Numba's on-disk cache (LLVM's code and data: ~20-35 MB), Numba's thread pool is started at the
compute threads, the BLAS has allocated its buffer, and glibc's malloc is held to one arena
(otherwise each thread that allocates gets a heap of its own, 64 MiB of reserved address space
whose used part joins the data segment and is not reused by the other threads).
`sdq` itself sets OPENBLAS_NUM_THREADS=1 before NumPy loads (sdq.cli): OpenBLAS otherwise starts
a thread per core, each with a stack and a buffer of its own, for a library sdq calls at most
once per decode layer (an F32 router's matrix-vector product). Kernels that are not in Numba's
cache yet (the first run after installing or changing them) are compiled while the run computes,
which takes more memory than any plan counts: run once without a limit first (the experiment
suites' calibration run and tests/test_oom_promise.py do).

What the plan guarantees, with the process measured as above: the data segment stays below the
budget (so an RLIMIT_DATA of the budget never fails an allocation) and so does the resident set
(so a memory cgroup of the budget, which charges resident anonymous memory and reclaims page
cache before it kills, has nothing to kill for; its charge can still reach the limit through
page cache, which it then reclaims). A budget that cannot hold `min_slots` slots raises PlanError
stating the smallest budget that would, before anything big is allocated.

The expert cache's policy decides how the slots are used (sdq.paging.policies): K cache slots
at least (K = experts used per token, so one layer's experts fit at once), plus lrfu_bypass's
streaming slots (K for the misses it reads past the cache, and one per prefetched expert). The
cache takes its split of the slots from the plan (MemoryPlan.slot_split), so a plan that passes
never fails in the cache for want of slots.
"""

from __future__ import annotations

import ctypes
import mmap
import resource
import sys
import threading
from dataclasses import asdict, dataclass, replace

from sdq.errors import PlanError
from sdq.paging.arena import PADDING_BYTES as ARENA_PADDING_BYTES
from sdq.paging.cache import CacheSettings
from sdq.paging.policies import BY_NAME, SlotSplit, min_slots, split_slots
from sdq.paging.reads import expert_table, slot_layout
from sdq.units import MIB

PAGE = mmap.PAGESIZE
IO_THREAD_STACK_BYTES = 256 * 1024  # kernels_c/io_pool.c WORKER_STACK_BYTES
SLOT_META_BYTES = 512  # Python bookkeeping per slot (dict entry, LRU node, key tuple)
# Python objects a run creates besides its arrays (token lists and timings, the route of each
# layer, the JSON it prints) and malloc's slack around them: about 2 MB of data segment measured
# beside the counted arrays on the tiny model with 8 generated tokens; tests/test_oom_promise.py
# runs at the plan's minimum, and notebook 04's plan-sized mini runs stay inside with it
RUN_OBJECTS_BYTES = 6 * MIB
THREAD_EXTRA_BYTES = 64 * 1024  # a new thread's own allocations beside its stack (16 KiB seen)
DEFAULT_RESERVE_MB = 900
SIZINGS = ("plan", "seed")  # sdq's plan; seed 000's "budget - RSS now - reserve" (see above)
M_ARENA_MAX = -8  # mallopt parameter (glibc malloc.h)


# -- the process ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessSize:
    """What this process holds now, in bytes: `resident` (VmRSS) and `data` (VmData)."""

    resident: int
    data: int


def process_now() -> ProcessSize:
    """This process's resident set and data segment, from /proc/self/status (psutil's RSS for
    both where there is no /proc)."""
    from sdq.proc import proc_status_kib

    kib = proc_status_kib("/proc/self/status", ("VmRSS", "VmData"))
    if len(kib) == 2:
        return ProcessSize(kib["VmRSS"] * 1024, kib["VmData"] * 1024)
    import psutil

    rss = psutil.Process().memory_info().rss
    return ProcessSize(rss, rss)


def thread_stack_bytes() -> int:
    """The stack a new thread gets: Python's threading.stack_size() when set, else the C
    library's default (glibc: RLIMIT_STACK's soft limit, 2 MiB when unlimited)."""
    size = threading.stack_size()
    if size:
        return size
    try:
        libc = ctypes.CDLL(None)
        attr = ctypes.create_string_buffer(128)  # pthread_attr_t: 56 bytes on x86-64 Linux
        out = ctypes.c_size_t(0)
        if libc.pthread_getattr_default_np(attr) == 0:
            ok = libc.pthread_attr_getstacksize(attr, ctypes.byref(out)) == 0
            libc.pthread_attr_destroy(attr)
            if ok and out.value:
                return int(out.value)
    except (OSError, AttributeError):  # not glibc
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    return 8 * MIB if soft == resource.RLIM_INFINITY else int(soft)


def prefill_workers(compute_threads: int) -> int:
    """Threads the engine starts for a prefill ubatch (sdq.run.engine: whole experts go to one
    worker per compute thread when there are two or more)."""
    return compute_threads if compute_threads > 1 else 0


def start_runtime() -> None:
    """Makes this process what it will be once it computes, so that measuring it now counts
    that (see the module docstring): one malloc arena, the engine's kernels loaded from Numba's
    cache, Numba's thread pool started at its current thread count, the BLAS buffer allocated.
    Idempotent and cheap the second time."""
    _one_malloc_arena()
    import numpy as np

    import sdq.run.engine  # noqa: F401  (imports every kernel module the engine calls)

    _load_cached_kernels()
    _start_thread_pool()
    a = np.ones((4, 4096), np.float32)
    np.dot(a, a[0])  # OpenBLAS allocates its buffer (32 MiB) on the first product this long


def _one_malloc_arena() -> None:
    try:
        ctypes.CDLL(None).mallopt(M_ARENA_MAX, 1)
    except (OSError, AttributeError):  # not glibc: its allocator, its own rules
        pass


def _load_cached_kernels() -> int:
    """Loads every overload Numba's on-disk cache holds for the kernels of sdq.kernels (what
    their first call would load while the run computes); returns how many it loaded."""
    from numba.core.dispatcher import Dispatcher

    n = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("sdq.kernels.") or module is None:
            continue
        for fn in list(vars(module).values()):
            if not isinstance(fn, Dispatcher) or len(fn.overloads):
                continue
            try:  # Numba's cache index: {(signature, target, ...): file}
                index = fn._cache._cache_file._load_index()
            except (AttributeError, OSError, EOFError):
                continue
            for key in index:
                fn.compile(key[0])
                n += 1
    return n


def _start_thread_pool() -> None:
    import numba

    _pool_kernel()(numba.get_num_threads() * 4)


_POOL_KERNEL = []


def _pool_kernel():
    """A parallel loop that makes Numba's threading layer start its workers (compiled once,
    then cached like the kernels)."""
    if not _POOL_KERNEL:
        from numba import prange

        from sdq.kernels.jit import kernel

        @kernel(parallel=True)
        def start_pool(n):
            total = 0
            for i in prange(n):
                total += i
            return total

        _POOL_KERNEL.append(start_pool)
    return _POOL_KERNEL[0]


# -- terms ----------------------------------------------------------------------------------


def pages(nbytes: int) -> int:
    """`nbytes` rounded up to whole pages (what a mapping of that size holds)."""
    return -(-int(nbytes) // PAGE) * PAGE


def dense_allocation(model) -> int:
    """The dense tensors as the engine allocates them: one array each, rounded to pages (a
    model without a tensor index, such as the tests' stand-ins: its dense bytes, rounded)."""
    from sdq.format.model import is_routed

    tensors = getattr(model, "tensors", None)
    if tensors is None:
        return pages(model.dense_bytes)
    return sum(pages(t.nbytes) for name, t in tensors.items() if not is_routed(name))


def transient_bytes(spec, n_ubatch: int, compute_threads: int = 1) -> int:
    """Arrays one op makes and drops while a ubatch of T tokens runs (sdq.run.engine), at most
    these alive at once, plus RUN_OBJECTS_BYTES:
      embedding rows           [T, D] float32 (copied into the workspace, then dropped)
      RoPE tables              2 x [T, Dh/2] float32
      converted activations    the layer input xn [T, D] and the attention output [T, H*Dh]
                               as 8-bit blocks for each weight type (Q8_K and Q8_0: ~1.2 B
                               per value each), and the expert hidden rows [T, F] per worker
      route indices            [T, K] int64 twice (np.nonzero of a ubatch's routes)
      qwen35moe                the delta-net output [T, Hv*S] and the shared expert's hidden
                               rows [T, Fs] as 8-bit blocks
      shared expert            (qwen2moe) its hidden rows [T, Fs] as 8-bit blocks
      dense FFN layers         (glm4moe) the hidden rows [T, Fd] as 8-bit blocks
      MLA                      (deepseek2) one head's query and latent rows, copied and
                               converted, and the heads' values [T, H*Dv] converted
    """
    T, D, F = n_ubatch, spec.n_embd, spec.expert_ffn
    HD, Dh, K = spec.n_head * spec.head_dim, spec.head_dim, spec.n_expert_used
    W = max(int(compute_threads), 1)
    arrays = (
        4 * T * D  # embedding rows
        + 4 * T * Dh  # RoPE cos and sin
        + 5 * T * (D + HD) // 2  # converted layer input and attention output (2.5 B/value)
        + 5 * T * F * W // 2  # converted expert hidden rows
        + 16 * T * K  # route indices
    )
    hybrid = getattr(spec, "hybrid", None)
    if hybrid is not None:  # qwen35moe: delta-net output and shared-expert hidden rows converted
        arrays += 5 * T * (hybrid.inner_size + spec.shared_ffn) // 2
    elif getattr(spec, "shared_ffn", 0):  # qwen2moe: the shared expert's hidden rows converted
        arrays += 5 * T * spec.shared_ffn // 2
    from sdq.run.workspace import has_dense_layers

    if has_dense_layers(spec):  # a dense layer's FFN hidden rows converted
        arrays += 5 * T * spec.dense_ffn // 2
    mla = getattr(spec, "mla", None)
    if mla is not None:  # deepseek2 (sdq.run.mla): a head's query and latent rows, copied
        per_head = mla.key_length - mla.rope_dim + mla.kv_lora_rank
        arrays += 4 * T * per_head + 5 * T * per_head // 2  # and converted; values converted
        arrays += 5 * T * mla.value_length * spec.n_head // 2
    return pages(arrays) + RUN_OBJECTS_BYTES


@dataclass(frozen=True)
class MemoryPlan:
    ram_budget_bytes: int
    rss_bytes: int  # resident set when planning (VmRSS)
    data_bytes: int  # data segment when planning (VmData)
    thread_bytes: int  # stacks of the threads the engine will start (counted with data_bytes)
    dense_bytes: int  # dense tensors as allocated (each rounded to pages)
    kv_bytes: int
    compute_bytes: int
    transient_bytes: int  # arrays ops make and drop, and a run's Python objects
    pager_bytes: int  # I/O thread stacks, and the arena mapping's huge-page padding
    reserve_bytes: int
    slot_bytes: int
    slot_meta_bytes: int
    slots: int
    min_slots: int
    cache_mode: str
    align: int
    n_ctx: int
    n_ubatch: int
    io_threads: int
    cache_policy: str  # CacheSettings.policy the slots are counted for ("auto" unresolved)
    prefetch_slots: int  # CacheSettings.prefetch_slots
    n_expert_used: int  # K
    n_moe_layers: int
    compute_threads: int = 1
    thread_stack_bytes: int = 0  # one new thread's stack
    sizing: str = "plan"  # SIZINGS: "seed" counts only the resident set, dense and reserve

    @property
    def slot_split(self) -> SlotSplit:
        """How the expert cache uses the slots: its policy, cache and streaming slots."""
        return split_slots(
            self.cache_policy,
            self.slots,
            self.n_moe_layers,
            self.n_expert_used,
            self.prefetch_slots,
        )

    @property
    def process_bytes(self) -> int:
        """The process as counted: the larger of its resident set and its data segment plus
        the stacks of the threads still to start."""
        return max(self.rss_bytes, self.data_bytes + self.thread_bytes)

    @property
    def process_basis(self) -> str:
        """Which figure `process_bytes` is: "resident" or "data"."""
        return "resident" if self.rss_bytes >= self.data_bytes + self.thread_bytes else "data"

    @property
    def fixed_bytes(self) -> int:
        """Everything but the arena (sizing "seed": what the seed's arithmetic counts)."""
        if self.sizing == "seed":
            return self.rss_bytes + self.dense_bytes + self.reserve_bytes
        return (
            self.process_bytes
            + self.dense_bytes
            + self.kv_bytes
            + self.compute_bytes
            + self.transient_bytes
            + self.pager_bytes
            + self.reserve_bytes
        )

    @property
    def arena_bytes(self) -> int:
        return self.slots * self.slot_bytes

    @property
    def growth_bytes(self) -> int:
        """What the process is planned to add after it was measured: every term but the
        process, the arena and its slot metadata included."""
        return self.fixed_bytes - self.process_bytes + self.slots * self.per_slot_bytes

    @property
    def left_bytes(self) -> int:
        return self.ram_budget_bytes - self.fixed_bytes - self.slots * self.per_slot_bytes

    @property
    def per_slot_bytes(self) -> int:
        return self.slot_bytes + self.slot_meta_bytes

    def budget_for_slots(self, slots: int) -> int:
        """The smallest budget (bytes) that holds `slots` slots with everything else as planned."""
        return self.fixed_bytes + slots * self.per_slot_bytes

    @property
    def min_budget_bytes(self) -> int:
        return self.budget_for_slots(self.min_slots)

    def rows(self) -> list[tuple[str, float, str]]:
        """(item, MB, note) for the table `sdq plan` prints."""
        stacks = prefill_workers(self.compute_threads)
        return [
            (
                "process now",
                self.process_bytes / MIB,
                f"the larger of resident {self.rss_bytes / MIB:.1f} and data segment "
                f"{self.data_bytes / MIB:.1f} + {stacks} thread stacks to start "
                f"{self.thread_bytes / MIB:.1f}; runtime started",
            ),
            ("dense weights", self.dense_bytes / MIB, "resident, anonymous memory"),
            ("KV cache", self.kv_bytes / MIB, f"ctx {self.n_ctx}"),
            ("compute buffers", self.compute_bytes / MIB, f"ubatch {self.n_ubatch}"),
            ("transient arrays", self.transient_bytes / MIB, "per op, and the run's objects"),
            ("pager buffers", self.pager_bytes / MIB, f"{self.io_threads} I/O thread stacks"),
            (
                "slot metadata",
                self.slots * self.slot_meta_bytes / MIB,
                f"{self.slot_meta_bytes} B/slot",
            ),
            ("reserve", self.reserve_bytes / MIB, "head room"),
            (
                "expert arena",
                self.arena_bytes / MIB,
                f"{self.slots} slots x {self.slot_bytes / MIB:.3f} MB ({self.cache_mode}); "
                f"{self._split_note()}",
            ),
            ("left over", self.left_bytes / MIB, "less than one slot"),
            (
                "budget",
                self.ram_budget_bytes / MIB,
                f"minimum {self.min_budget_bytes / MIB:.1f} MB",
            ),
        ]

    def _split_note(self) -> str:
        split = self.slot_split
        note = f"policy {split.policy}: {split.cache} cache"
        if split.streaming:
            note += f" + {split.streaming} streaming"
        return note

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            arena_bytes=self.arena_bytes,
            fixed_bytes=self.fixed_bytes,
            left_bytes=self.left_bytes,
            min_budget_bytes=self.min_budget_bytes,
            process_bytes=self.process_bytes,
            process_basis=self.process_basis,
            growth_bytes=self.growth_bytes,
        )
        return d


def plan_memory(
    model,
    ram_budget_mb: float,
    n_ctx: int,
    n_ubatch: int,
    reserve_mb: float = DEFAULT_RESERVE_MB,
    rss_now: int | ProcessSize | None = None,
    *,
    cache_mode: str = "pagecache",
    io_threads: int = 8,
    compute_threads: int = 1,
    cache: CacheSettings | None = None,
    sizing: str = "plan",
) -> MemoryPlan:
    """Plans the arena for `model` under `ram_budget_mb`, for the expert cache's settings
    `cache` (default CacheSettings()); `sizing` "seed": seed 000's arithmetic (module doc).

    rss_now: the process as measured elsewhere (a ProcessSize, or bytes taken as both its
    resident set and its data segment); None (a real run): start the runtime (`start_runtime`)
    and measure this process.

    Raises PlanError when the budget holds fewer slots than the cache's policy needs.
    """
    from sdq.run.workspace import workspace_bytes

    if sizing not in SIZINGS:
        raise PlanError(f"sizing {sizing!r} is not one of {SIZINGS}")
    cache = cache or CacheSettings()
    table = expert_table(model)
    spec = model.spec
    K = int(spec.n_expert_used)
    layout = slot_layout(model, cache_mode)
    ws = workspace_bytes(spec, n_ctx, n_ubatch, compute_threads)
    kv = sum(pages(b) for name, b in ws.items() if name.endswith("cache"))
    compute = sum(pages(b) for b in ws.values()) - kv
    if rss_now is None:
        start_runtime()
        now = process_now()
    elif isinstance(rss_now, ProcessSize):
        now = rss_now
    else:
        now = ProcessSize(int(rss_now), int(rss_now))
    stack = thread_stack_bytes()
    budget = int(ram_budget_mb * MIB)
    base = MemoryPlan(
        ram_budget_bytes=budget,
        rss_bytes=now.resident,
        data_bytes=now.data,
        thread_bytes=prefill_workers(compute_threads) * (stack + THREAD_EXTRA_BYTES),
        dense_bytes=dense_allocation(model),
        kv_bytes=int(kv),
        compute_bytes=int(compute),
        transient_bytes=transient_bytes(spec, n_ubatch, compute_threads),
        pager_bytes=io_threads * IO_THREAD_STACK_BYTES + ARENA_PADDING_BYTES,
        reserve_bytes=int(reserve_mb * MIB),
        slot_bytes=layout.slot_bytes,
        slot_meta_bytes=SLOT_META_BYTES,
        slots=0,
        min_slots=min_slots(cache.policy, K, cache.prefetch_slots),
        cache_mode=cache_mode,
        align=layout.align,
        n_ctx=n_ctx,
        n_ubatch=n_ubatch,
        io_threads=io_threads,
        cache_policy=cache.policy,
        prefetch_slots=cache.prefetch_slots,
        n_expert_used=K,
        n_moe_layers=len(table.layers),
        compute_threads=int(compute_threads),
        thread_stack_bytes=stack,
        sizing=sizing,
    )
    left = budget - base.fixed_bytes
    slots = min(max(left // base.per_slot_bytes, 0), useful_slots(table, K, cache.prefetch_slots))
    if slots < base.min_slots:
        streaming = base.min_slots - K
        needs = f"experts used per token {K}"
        if streaming:
            needs += f" + {streaming} streaming slots of cache policy {cache.policy}"
        raise PlanError(
            f"RAM budget {ram_budget_mb:g} MB holds {slots} expert slots of "
            f"{layout.slot_bytes / MIB:.3f} MB; at least {base.min_slots} are needed "
            f"({needs}): "
            f"minimum budget {base.min_budget_bytes / MIB:.1f} MB (process "
            f"{base.process_bytes / MIB:.1f} {base.process_basis}, dense "
            f"{base.dense_bytes / MIB:.1f}, KV {kv / MIB:.1f}, compute {compute / MIB:.1f}, "
            f"transient {base.transient_bytes / MIB:.1f}, reserve {reserve_mb:g} MB)"
        )
    return replace(base, slots=int(slots))


def useful_slots(table, n_expert_used: int, prefetch_slots: int) -> int:
    """The most slots a cache can use: one per routed expert in the file, plus the largest
    streaming share of any policy. A budget beyond that leaves the rest unallocated, so a
    20 GB budget on a 60 MB model maps an arena the size of the model's experts, not 20 GB."""
    n_experts = len(table.layers) * int(table.n_expert)
    streaming = max(p.streaming_slots(n_expert_used, prefetch_slots) for p in BY_NAME.values())
    return n_experts + streaming


def plan_for_slots(
    model, slots: int, cache_mode: str = "pagecache", cache: CacheSettings | None = None
) -> MemoryPlan:
    """A plan with a given slot count and nothing else counted: for tests and benchmarks.
    The cache's policy may need more slots than `slots`: ExpertCache then says so."""
    cache = cache or CacheSettings()
    K = int(model.spec.n_expert_used)
    table = expert_table(model)
    layout = slot_layout(model, cache_mode)
    return MemoryPlan(
        ram_budget_bytes=slots * (layout.slot_bytes + SLOT_META_BYTES),
        rss_bytes=0,
        data_bytes=0,
        thread_bytes=0,
        dense_bytes=0,
        kv_bytes=0,
        compute_bytes=0,
        transient_bytes=0,
        pager_bytes=0,
        reserve_bytes=0,
        slot_bytes=layout.slot_bytes,
        slot_meta_bytes=SLOT_META_BYTES,
        slots=slots,
        min_slots=min_slots(cache.policy, K, cache.prefetch_slots),
        cache_mode=cache_mode,
        align=layout.align,
        n_ctx=0,
        n_ubatch=0,
        io_threads=0,
        cache_policy=cache.policy,
        prefetch_slots=cache.prefetch_slots,
        n_expert_used=K,
        n_moe_layers=len(table.layers),
    )
