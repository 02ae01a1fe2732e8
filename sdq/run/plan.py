"""The memory plan: how many expert slots fit in a RAM budget, counted before allocating.

    slots = floor((budget - rss_now - dense - kv - compute - pager_fixed - reserve)
                  / (slot_bytes + per-slot metadata))

Every term is known before anything big is allocated (seed 000 §5: the compute buffer that
grew after sizing the arena is what crashed the 8 GB machine):
  rss_now       the process as it is when planning (interpreter, numpy, numba, the GGUF header)
  dense         every tensor that is not a routed expert (model.dense_bytes), which the engine
                copies into anonymous memory and keeps resident
  kv, compute   sdq.run.workspace.workspace_bytes(spec, n_ctx, n_ubatch, compute_threads): buffers
                named *cache are the KV cache, the rest the ubatch compute buffers (one set of
                expert buffers per compute thread)
  pager fixed   I/O worker stacks (the pager reads in place, so no bounce buffers)
  reserve       head room for what is not modelled (allocator slack, JIT code); seed default 900
Plan first, then load the dense weights and allocate: the plan measures RSS as it is now.

The expert cache's policy decides how the slots are used (sdq.paging.policies): K cache slots
at least (K = experts used per token, so one layer's experts fit at once), plus lrfu_bypass's
streaming slots (K for the misses it reads past the cache, and one per prefetched expert). A
budget that cannot hold `min_slots` slots raises PlanError stating the smallest budget that
would; the cache takes its split of the slots from the plan (MemoryPlan.slot_split), so a plan
that passes never fails in the cache for want of slots.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from sdq.errors import PlanError
from sdq.paging.cache import CacheSettings
from sdq.paging.policies import SlotSplit, min_slots, split_slots
from sdq.paging.reads import SlotLayout, expert_table
from sdq.units import MIB

IO_THREAD_STACK_BYTES = 256 * 1024  # kernels_c/io_pool.c WORKER_STACK_BYTES
SLOT_META_BYTES = 512  # Python bookkeeping per slot (dict entry, LRU node, key tuple)
DEFAULT_RESERVE_MB = 900


def current_rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


@dataclass(frozen=True)
class MemoryPlan:
    ram_budget_bytes: int
    rss_bytes: int
    dense_bytes: int
    kv_bytes: int
    compute_bytes: int
    pager_bytes: int  # fixed pager buffers (I/O thread stacks)
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
    def fixed_bytes(self) -> int:
        """Everything but the arena."""
        return (
            self.rss_bytes
            + self.dense_bytes
            + self.kv_bytes
            + self.compute_bytes
            + self.pager_bytes
            + self.reserve_bytes
        )

    @property
    def arena_bytes(self) -> int:
        return self.slots * self.slot_bytes

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
        return [
            ("RSS now", self.rss_bytes / MIB, "measured before loading anything big"),
            ("dense weights", self.dense_bytes / MIB, "resident, anonymous memory"),
            ("KV cache", self.kv_bytes / MIB, f"ctx {self.n_ctx}"),
            ("compute buffers", self.compute_bytes / MIB, f"ubatch {self.n_ubatch}"),
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
        )
        return d


def plan_memory(
    model,
    ram_budget_mb: float,
    n_ctx: int,
    n_ubatch: int,
    reserve_mb: float = DEFAULT_RESERVE_MB,
    rss_now: int | None = None,
    *,
    cache_mode: str = "pagecache",
    io_threads: int = 8,
    compute_threads: int = 1,
    cache: CacheSettings | None = None,
) -> MemoryPlan:
    """Plans the arena for `model` under `ram_budget_mb`, for the expert cache's settings
    `cache` (default CacheSettings()).

    Raises PlanError when the budget holds fewer slots than the cache's policy needs.
    """
    from sdq.run.workspace import workspace_bytes

    cache = cache or CacheSettings()
    table = expert_table(model)
    spec = model.spec
    K = int(spec.n_expert_used)
    layout = SlotLayout.for_table(table, cache_mode)
    ws = workspace_bytes(spec, n_ctx, n_ubatch, compute_threads)
    kv = sum(b for name, b in ws.items() if name.endswith("cache"))
    compute = sum(ws.values()) - kv
    rss = current_rss() if rss_now is None else int(rss_now)
    budget = int(ram_budget_mb * MIB)
    base = MemoryPlan(
        ram_budget_bytes=budget,
        rss_bytes=rss,
        dense_bytes=int(model.dense_bytes),
        kv_bytes=int(kv),
        compute_bytes=int(compute),
        pager_bytes=io_threads * IO_THREAD_STACK_BYTES,
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
    )
    left = budget - base.fixed_bytes
    slots = max(left // base.per_slot_bytes, 0)
    if slots < base.min_slots:
        streaming = base.min_slots - K
        needs = f"experts used per token {K}"
        if streaming:
            needs += f" + {streaming} streaming slots of cache policy {cache.policy}"
        raise PlanError(
            f"RAM budget {ram_budget_mb:g} MB holds {slots} expert slots of "
            f"{layout.slot_bytes / MIB:.3f} MB; at least {base.min_slots} are needed "
            f"({needs}): "
            f"minimum budget {base.min_budget_bytes / MIB:.1f} MB (RSS {rss / MIB:.1f}, dense "
            f"{base.dense_bytes / MIB:.1f}, KV {kv / MIB:.1f}, compute {compute / MIB:.1f}, "
            f"reserve {reserve_mb:g} MB)"
        )
    return replace(base, slots=int(slots))


def plan_for_slots(
    model, slots: int, cache_mode: str = "pagecache", cache: CacheSettings | None = None
) -> MemoryPlan:
    """A plan with a given slot count and nothing else counted: for tests and benchmarks.
    The cache's policy may need more slots than `slots`: ExpertCache then says so."""
    cache = cache or CacheSettings()
    K = int(model.spec.n_expert_used)
    table = expert_table(model)
    layout = SlotLayout.for_table(table, cache_mode)
    return MemoryPlan(
        ram_budget_bytes=slots * (layout.slot_bytes + SLOT_META_BYTES),
        rss_bytes=0,
        dense_bytes=0,
        kv_bytes=0,
        compute_bytes=0,
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
