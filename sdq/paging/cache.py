"""The expert cache: routed experts paged from the model file into the slots of a RAM arena.

Dimension key: L MoE layers, E experts per layer, K experts used per token, P = 3 parts
(gate, up, down).

Use (the engine):

    plan = plan_memory(model, budget_mb, n_ctx, n_ubatch, cache=settings)   # sdq.run.plan
    cache = ExpertCache(model, plan, io=IOSettings(threads=8, mode="parallel"), settings=settings)
    h = cache.acquire(layer, expert_ids)     # submits every miss at once, returns at once
    for i in h.ready_order():                # hits first, then misses in submission order
        h.wait(i)                            # no-op for a hit; blocks (GIL released) for a miss
        gate, up, down = h.views(i)          # uint8 [rows, row_bytes] raw quantized bytes
        ...
    cache.release(h)                         # unpins; views must not be used afterwards
    cache.stats                              # counters, see ExpertCache.stats
    cache.close()

`layer` is the model's layer number; expert ids must be distinct within one acquire and at
most `cache.max_acquire` of them (the cache slots, all of which one acquire may pin; prefill
with a large union of experts acquires in chunks of that size).

The arena's slots are split as the memory plan says (MemoryPlan.slot_split, from the policy and
prefetch settings the plan was made with): streaming slots first, then cache slots.
Replacement (CacheSettings.policy): sdq.paging.policies ("auto" by default). An acquire never
evicts an expert it requests itself. Every expert of an acquire is pinned until release; a
pinned slot is never evicted, and when no slot can be evicted the acquire fails with PlanError.
Under lrfu_bypass a miss the policy does not admit is read into a streaming slot (counted as
`bypassed`); when every streaming slot is taken (a prefill union of many experts) it is
admitted after all (counted as `overflow_admits`) rather than failing.

Prefetch: `prefetch(layer, ids)` reads experts that are not cached without counting lookups.
Under lru and layer_lrfu they take free or evictable slots (layer_lrfu ranks victims from the
layer now being computed) and a later acquire finds them there; under lrfu_bypass they wait in
streaming slots (sdq.paging.prefetch).

What counts as a hit (the counters in `stats`; DESIGN.md's `hit_rate`): a lookup is a hit when
its expert was in a cache slot with bytes that an earlier lookup had already been served from
(or whose read an earlier lookup's miss started), i.e. when serving it needed no read of its
own or of a prefetch. Every other lookup is a miss, and a miss whose bytes a prefetch read (or
is reading) is also a `prefetch_hit`: a read that a prefetch made is a read. So
lookups = hits + misses, and prefetch_hits <= misses, under every policy. An expert a prefetch
read and no lookup has used yet stays a prefetch hit for its first lookup even tokens later.
Bytes: every read (an acquire's or a prefetch's, used or a wrong guess) is counted in
`bytes_read` and `expert_bytes_read`; `lookup_expert_bytes` is what an all-miss run would read
(every lookup's expert bytes), so `reads_avoided` = 1 - expert_bytes_read / lookup_expert_bytes.

Several Python threads may acquire and release concurrently: the bookkeeping is under one
lock; waiting for reads happens outside it.

Failures: a read that failed is never served. A waiter gets its ReadError and the expert's
entry is dropped; a failed read nobody waited for (a prefetch) is found failed when its expert
is next looked up, dropped, and read again; either way the slot returns to the free list once
unpinned. Every acquire checks that the model file is still the one opened (ExpertReader: one
fstat; at a new token also the path) and fails with ModelChangedError otherwise. A wait is
bounded by IOSettings.timeout_s; after one timed out the cache refuses every acquire and
prefetch (the hung read may still write into its slot), release() waits no more, and close()
gives the hung read the same time once, then leaves the arena mapped for it rather than
unmapping memory a read still writes into. With
IOSettings.verify every expert is checked against its checksum (sdq.paging.checksums) before
its first use after each read into its slot.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from sdq.errors import ParamsError, PlanError, ReadError
from sdq.paging.arena import Arena
from sdq.paging.checksums import ExpertChecksums
from sdq.paging.policies import BY_NAME, POLICIES
from sdq.paging.prefetch import StreamingSlots
from sdq.paging.reads import (
    ExpertReader,
    IOSettings,
    ReadBatch,
    expert_file,
    expert_table,
    slot_layout,
)
from sdq.paging.residents import Entry, Residents
from sdq.paging.views import ExpertViews

__all__ = [
    "POLICIES",
    "CacheSettings",
    "ExpertCache",
    "ExpertHandle",
]

COUNTERS = (
    "lookups",
    "hits",
    "misses",
    "bypassed",
    "evictions",
    "inflight_hits",
    "prefetches",
    "prefetch_hits",
    "prefetch_unused",
    "read_errors",
    "overflow_admits",
    "reads",
    "bytes_read",
    "expert_bytes_read",
    "prefetch_bytes_read",
    "lookup_expert_bytes",
)


@dataclass(frozen=True)
class CacheSettings:
    policy: str = "auto"  # one of POLICIES (sdq.paging.policies)
    half_life: float = 32.0  # lrfu_bypass, layer_lrfu: tokens per halving of a lookup's weight
    prefetch_slots: int = 0  # experts prefetched per layer (lrfu_bypass: its streaming slots)

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ParamsError(
                f"cache policy {self.policy!r}: expected one of {', '.join(POLICIES)}"
            )
        if not self.half_life > 0:
            raise ParamsError(f"half_life {self.half_life}: expected > 0 tokens")
        if self.prefetch_slots < 0:
            raise ParamsError(f"prefetch_slots {self.prefetch_slots}: expected >= 0")


@dataclass(eq=False)
class ExpertHandle:
    """The experts of one acquire: their slots, hit flags and the reads still to wait for."""

    layer: int
    experts: tuple[int, ...]
    hits: tuple[bool, ...]  # True: a hit (module docstring); False: a miss, maybe prefetched
    slots: list[int]  # arena slot per expert
    pending: list[tuple[ReadBatch, int] | None]  # per expert: the read to wait for, if any
    entries: list[Entry | None]  # per expert: its cache entry; None when streamed
    cache: ExpertCache = field(repr=False)
    released: bool = False

    def ready_order(self) -> list[int]:
        """Indices with nothing to wait for first, then the rest in submission order."""
        return sorted(range(len(self.experts)), key=lambda i: self.pending[i] is not None)

    def wait(self, i: int) -> None:
        """Blocks until expert i's bytes are in its slot; raises ReadError if its read failed
        (or, with verify, if its bytes differ from the file's)."""
        if self.pending[i] is not None or self.cache.checksums is not None:
            self.cache.wait(self, i)

    def views(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(gate, up, down) raw bytes of expert i: uint8 [rows, row_bytes] views of the arena."""
        return self.cache.views.of(self.layer, self.experts[i], self.slots[i])


class ExpertCache:
    """Routed experts in an Arena, filled through ExpertReader (module docstring)."""

    def __init__(self, model, plan, io: IOSettings | None = None, settings=None):
        io = io or IOSettings()
        s = self.settings = settings or CacheSettings()
        self.table = expert_table(model)
        self.K = int(model.spec.n_expert_used)
        self.layout = slot_layout(model, io.cache_mode)
        if self.layout.slot_bytes > plan.slot_bytes:
            raise PlanError(
                f"the plan's slots hold {plan.slot_bytes} bytes but cache mode "
                f"{io.cache_mode} needs {self.layout.slot_bytes}: plan with that cache mode"
            )
        if (plan.cache_policy, plan.prefetch_slots) != (s.policy, s.prefetch_slots):
            raise PlanError(
                f"the plan counted slots for cache policy {plan.cache_policy} with "
                f"{plan.prefetch_slots} prefetch slots, the cache is set to {s.policy} with "
                f"{s.prefetch_slots}: plan with the cache's settings"
            )
        split = plan.slot_split
        if split.cache < self.K:
            need = self.K + split.streaming
            raise PlanError(
                f"{plan.slots} slots cannot hold {self.K} cache slots (K={self.K}) + "
                f"{split.streaming} streaming slots ({split.policy}): {need} slots needed, "
                f"minimum budget {plan.budget_for_slots(need) / (1 << 20):.1f} MB"
            )
        self.plan = plan
        self.policy = split.policy
        self._policy = BY_NAME[split.policy]
        self.arena = Arena(plan.slots, plan.slot_bytes, prefault=True)
        try:
            self.reader = ExpertReader(expert_file(model), self.table, self.layout, io)
        except BaseException:
            self.arena.close()
            raise
        self.views = ExpertViews(self.arena, self.table, self.layout)
        self.checksums = (
            ExpertChecksums(expert_file(model), self.table, drop_pages=io.cache_mode != "pagecache")
            if io.verify
            else None
        )
        self._checked: list[tuple[int, int] | None] = [None] * plan.slots  # slot -> key checked
        self._lock = threading.Lock()
        self._counters = dict.fromkeys(COUNTERS, 0)
        n_rows = len(self.table.layers)
        slots = list(range(plan.slots))
        prefetch_limit = s.prefetch_slots if self._policy.bypasses else 0
        self._streaming = StreamingSlots(slots[: split.streaming], prefetch_limit)
        self._residents = Residents(slots[split.streaming :], n_rows, s.half_life, self._counters)
        self.max_acquire = self._residents.capacity
        self._last_row = -1  # table row of the last acquire: a row not after it starts a token
        self._inflight: list[ReadBatch] = []
        self._read_ns = 0
        self._busy_ns = 0
        self._wait_ns = 0
        self._layer_counts = [[0, 0, 0] for _ in range(n_rows)]  # [L][lookups, hits, misses]
        nbytes = self.table.nbytes.sum(axis=2)  # [L, E]
        self._expert_bytes = nbytes.tolist()  # [L][E] Python ints
        # [L] one expert's bytes when a layer's experts are all the same size (a GGUF's always
        # are: one tensor per layer and part), else None: then lookups are summed one by one
        self._row_bytes = [int(r[0]) if (r == r[0]).all() else None for r in nbytes]
        self._closed = False

    # ---------------------------------------------------------------- public API

    def acquire(self, layer: int, expert_ids) -> ExpertHandle:
        """Pins the experts, submits every miss in one batch and returns without waiting."""
        row = self.table.row(layer)
        ids = tuple(int(e) for e in expert_ids)
        self._check_ids(ids)
        with self._lock:
            self._check_open()
            if row <= self._last_row:
                self.reader.check_path()  # a new token: is the path still the file we read?
            else:
                self.reader.check_open_file()
            self._harvest()
            res, streaming, c = self._residents, self._streaming, self._counters
            if row <= self._last_row:
                res.token += 1  # a new token (prefill chunks of one layer count as tokens too)
            self._last_row = row
            if streaming.streamed:
                c["prefetch_unused"] += streaming.drop_unrequested(row, ids)
            group = {(row, e) for e in ids}
            chooser = None  # the policy applied to this acquire, made at its first miss
            slots: list[int] = []
            pending: list[tuple[ReadBatch, int] | None] = []
            entries: list[Entry | None] = []
            hits: list[bool] = []  # found in a cache slot (a hit unless prefetched: served)
            served: list[int] = []  # found, but read by a prefetch: misses, prefetch hits
            n_streamed = 0  # misses served from a streaming slot a prefetch read: the same
            load: list[int] = []  # indices into ids that need a read
            scored = self._policy.scored
            score_of, token, decay = res.scores, res.token, res.decay
            lru, row_lru = res.lru, res.row_lru[row]
            streamed_of, stream_free = streaming.streamed, streaming.free
            try:
                for i, e in enumerate(ids):
                    key = (row, e)
                    if scored:
                        score, at = score_of.get(key, (0.0, token))
                        score_of[key] = (score * decay ** (token - at) + 1.0, token)
                    entry = res.lookup(key)
                    if entry is not None:
                        hits.append(True)
                        entry.pins += 1
                        lru.move_to_end(key)
                        row_lru.move_to_end(key)
                        if entry.prefetched:
                            entry.prefetched = False
                            served.append(i)
                        elif entry.pending is not None:
                            c["inflight_hits"] += 1
                        slots.append(entry.slot)
                        pending.append(entry.pending)
                        entries.append(entry)
                        continue
                    hits.append(False)
                    if chooser is None:
                        chooser = self._policy(res, row, group)
                    slot = chooser.slot_for(key)  # None: the policy streams this miss
                    streamed = streamed_of.pop(key, None) if streamed_of else None
                    if streamed is not None and _read_failed(streamed[1]):
                        stream_free.append(streamed[0])  # never served: read it again
                        c["read_errors"] += 1
                        streamed = None
                    if (
                        slot is None
                        and streamed is None
                        and not stream_free
                        and not streaming.wait_for_slot()
                    ):
                        c["overflow_admits"] += 1  # no streaming slot left: admit instead
                        slot = chooser.overflow_slot()
                    if slot is not None:
                        entry = res.register(key, slot)
                        entry.pins = 1
                        entries.append(entry)
                        if streamed is not None:  # swap: the prefetched slot joins the cache
                            stream_free.append(entry.slot)
                            entry.slot, entry.pending = streamed
                        slots.append(entry.slot)
                    else:
                        slots.append(stream_free.pop() if streamed is None else streamed[0])
                        entries.append(None)
                    if streamed is not None:
                        n_streamed += 1
                        pending.append(streamed[1])
                        continue
                    pending.append(None)
                    load.append(i)
            except BaseException:
                for i in served:
                    entries[i].prefetched = True
                self._undo(hits, slots, entries)
                raise
            n_served = len(served) + n_streamed
            self._count(row, ids, sum(hits) - len(served), n_served, load, entries)
            if served:
                hits = [h and i not in served for i, h in enumerate(hits)]
            if load:
                batch = self._submit(row, [ids[i] for i in load], [slots[i] for i in load])
                for g, i in enumerate(load):
                    pending[i] = (batch, g)
                    if entries[i] is not None:
                        entries[i].pending = (batch, g)
        return ExpertHandle(layer, ids, tuple(hits), slots, pending, entries, self)

    def wait(self, handle: ExpertHandle, i: int) -> None:
        """Blocks until expert i of `handle` is in its slot; ReadError (and the entry is
        dropped) if its read failed."""
        read = handle.pending[i]
        if read is None:
            self._verify(handle, i)
            return
        batch, g = read
        t0 = time.perf_counter_ns()
        try:
            batch.wait(g)
        except ReadError:
            with self._lock:
                entry = handle.entries[i]
                if entry is not None:
                    self._residents.drop(entry)  # counts the error
                else:
                    self._counters["read_errors"] += 1
            handle.pending[i] = None
            raise
        finally:
            waited = time.perf_counter_ns() - t0
            with self._lock:
                self._wait_ns += waited
        handle.pending[i] = None
        entry = handle.entries[i]
        if entry is not None and entry.pending is read:
            entry.pending = None  # plain attribute store: safe without the lock
        self._verify(handle, i)

    def _verify(self, handle: ExpertHandle, i: int) -> None:
        """With verify: expert i's bytes against its checksum, once per read into its slot
        (ReadError on a mismatch, and the entry is dropped)."""
        if self.checksums is None:
            return
        slot, key = handle.slots[i], (self.table.row(handle.layer), handle.experts[i])
        if self._checked[slot] == key:
            return
        try:
            self.checksums.check(key[0], key[1], handle.views(i))
        except ReadError:
            with self._lock:
                entry = handle.entries[i]
                if entry is not None:
                    self._residents.drop(entry)
            raise
        self._checked[slot] = key

    def release(self, handle: ExpertHandle) -> None:
        """Unpins the handle's experts (waits for any of its reads still running)."""
        if handle.released:
            return
        for read in handle.pending:
            if read is not None and self.reader.hung is None:  # a hung read: wait no more
                try:
                    read[0].wait(read[1])
                except ReadError:
                    pass  # the entry is dropped below
        with self._lock:
            handle.released = True
            res = self._residents
            for i, entry in enumerate(handle.entries):
                if entry is None:
                    self._streaming.free.append(handle.slots[i])
                    continue
                entry.pins -= 1
                if not entry.dropped:
                    res.settle(entry)  # a failed read drops it (and frees an unpinned slot)
                elif entry.pins == 0:
                    res.free.append(entry.slot)
            self._harvest()

    def prefetch(self, layer: int, expert_ids) -> int:
        """Starts reading experts that are not cached; returns how many.

        Best effort: experts for which no slot can be freed are skipped. No lookup is counted.
        """
        row = self.table.row(layer)
        ids = tuple(dict.fromkeys(int(e) for e in expert_ids))
        self._check_ids(ids)
        with self._lock:
            self._check_open()
            self.reader.check_open_file()
            self._harvest()
            if self._policy.bypasses:
                started = self._streaming.start(
                    row, ids, self._residents.entries, self._submit_prefetch
                )
            else:
                started = self._prefetch_cached(row, ids)
            self._counters["prefetches"] += started
            return started

    def cached(self, layer: int) -> list[int]:
        """Expert ids of `layer` currently in the arena's cache slots."""
        row = self.table.row(layer)
        with self._lock:
            return self._residents.cached(row)

    @property
    def stats(self) -> dict:
        """lookups, hits, misses (lookups = hits + misses; what a hit is: module docstring),
        hit_rate (hits / lookups), bypassed (misses read to a streaming slot, not admitted),
        evictions, inflight_hits (hits on a read an earlier lookup's miss started, still
        running), prefetches (experts a prefetch started reading), prefetch_hits (misses
        served by a prefetch's read, which read nothing themselves), prefetch_hit_rate
        (prefetch_hits / lookups), prefetch_unused (streamed prefetches nobody requested),
        read_errors, overflow_admits, reads (preads issued), bytes_read (device bytes incl.
        O_DIRECT page rounding; every read, prefetches and wrong guesses included),
        expert_bytes_read (the experts' own bytes of those reads), prefetch_bytes_read (the
        device bytes of prefetch reads, in bytes_read too), lookup_expert_bytes (the expert
        bytes an all-miss run would read: every lookup's expert), reads_avoided (1 -
        expert_bytes_read / lookup_expert_bytes), read_ms (submit to last byte, summed over
        batches), io_busy_ms (sum of every pread's own duration), wait_ms (time callers
        blocked in wait), policy, slots, slot_bytes, cached, streamed (prefetches waiting in
        streaming slots), layers {layer: [lookups, hits, misses]}. Reads still in flight are
        not yet in read_ms. Rates are 0.0 before the first lookup."""
        with self._lock:
            self._harvest()
            s = dict(self._counters)
            n, all_miss = s["lookups"], s["lookup_expert_bytes"]
            s["hit_rate"] = s["hits"] / n if n else 0.0
            s["prefetch_hit_rate"] = s["prefetch_hits"] / n if n else 0.0
            s["reads_avoided"] = 1.0 - s["expert_bytes_read"] / all_miss if all_miss else 0.0
            s["policy"] = self.policy
            s["read_ms"] = self._read_ns / 1e6
            s["io_busy_ms"] = self._busy_ns / 1e6
            s["wait_ms"] = self._wait_ns / 1e6
            s["slots"] = self.plan.slots
            s["slot_bytes"] = self.plan.slot_bytes
            s["cached"] = len(self._residents.entries)
            s["streamed"] = len(self._streaming.streamed)
            s["layers"] = {
                int(self.table.layers[r]): [int(x) for x in self._layer_counts[r]]
                for r in range(len(self.table.layers))
            }
            return s

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            inflight = list(self._inflight)
        for batch in inflight:
            _quiet_wait_all(batch)  # bounded by the read timeout
        hung = any(not batch.all_done() for batch in inflight)
        self.reader.close()
        self.views.close()
        if self.checksums is not None:
            self.checksums.close()
        if not hung:  # else the hung batch keeps the arena mapped: its read writes into it
            self.arena.close()

    def __enter__(self) -> ExpertCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- internals

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the expert cache is closed")

    def _check_ids(self, ids: tuple[int, ...]) -> None:
        if len(set(ids)) != len(ids):
            raise ValueError(f"expert ids must be distinct within one acquire: {list(ids)}")
        n = self.table.n_expert
        for e in ids:
            if not 0 <= e < n:
                raise ValueError(f"expert {e} out of range 0..{n - 1}")

    def _prefetch_cached(self, row: int, ids: tuple[int, ...]) -> int:
        """lru, layer_lrfu: uncached experts into free or evictable cache slots, ranked as
        from the layer now being computed; stops at the first that finds no slot."""
        res = self._residents
        now_row = self._last_row if self._last_row >= 0 else row
        chooser = self._policy(res, now_row, ())
        new: list[Entry] = []
        try:
            for e in ids:
                key = (row, e)
                if key in res.entries:
                    continue
                try:
                    slot = chooser.slot_for(key)
                except PlanError:
                    break
                entry = res.register(key, slot)
                entry.prefetched = True
                entry.pins = 1  # until its read is submitted: a later id must not evict it
                new.append(entry)
            if new:
                batch = self._submit_prefetch(
                    row, [en.key[1] for en in new], [en.slot for en in new]
                )
                for g, entry in enumerate(new):
                    entry.pending = (batch, g)
        finally:
            for entry in new:
                entry.pins = 0
        return len(new)

    def _count(self, row: int, ids, n_hits: int, n_served: int, load, entries) -> None:
        """Counts an acquire of experts `ids` of table row `row`: its lookups, hits, misses
        (n_served of them served by a prefetch's read), the expert bytes an all-miss run would
        read, and its misses read past the cache (indices `load` without a cache entry)."""
        c, n = self._counters, len(ids)
        c["lookups"] += n
        c["hits"] += n_hits
        c["misses"] += n - n_hits
        c["prefetch_hits"] += n_served
        size = self._row_bytes[row]
        if size is not None:
            c["lookup_expert_bytes"] += n * size
        else:
            sizes = self._expert_bytes[row]
            c["lookup_expert_bytes"] += sum(sizes[e] for e in ids)
        if load:
            c["bypassed"] += sum(1 for i in load if entries[i] is None)
        counts = self._layer_counts[row]
        counts[0] += n
        counts[1] += n_hits
        counts[2] += n - n_hits

    def _undo(self, hits, slots, entries) -> None:
        """Rolls back a failed acquire: unpin hits, free the slots it took."""
        for i in range(len(hits)):
            entry = entries[i] if i < len(entries) else None
            if hits[i]:
                entry.pins -= 1
            elif entry is None and i < len(slots):
                self._streaming.free.append(slots[i])
            elif entry is not None:
                self._residents.unadmit(entry)

    def _submit(
        self, row: int, experts: list[int], slots: list[int], prefetch: bool = False
    ) -> ReadBatch:
        base, size = self.arena.base, self.arena.slot_bytes
        addrs = [base + s * size for s in slots]
        checked = self._checked
        for s in slots:
            checked[s] = None
        batch, device_bytes = self.reader.submit(row, experts, addrs, keepalive=self.arena)
        self._inflight.append(batch)
        c = self._counters
        c["bytes_read"] += device_bytes
        if prefetch:
            c["prefetch_bytes_read"] += device_bytes
        sizes = self._expert_bytes[row]
        c["expert_bytes_read"] += sum(sizes[e] for e in experts)
        return batch

    def _submit_prefetch(self, row: int, experts: list[int], slots: list[int]) -> ReadBatch:
        return self._submit(row, experts, slots, prefetch=True)

    def _harvest(self) -> None:
        """Accounts finished batches (read time, failures of reads nobody waited for)."""
        if self._streaming.draining:
            self._streaming.reclaim()
        keep = []
        for batch in self._inflight:
            if not batch.all_done():
                keep.append(batch)
                continue
            reads, span_ns, busy_ns = batch.timing()
            self._read_ns += span_ns
            self._busy_ns += busy_ns
            self._counters["reads"] += reads
        self._inflight = keep


def _read_failed(read: tuple[ReadBatch, int]) -> bool:
    """Whether a read is over and failed (False while it runs)."""
    batch, g = read
    return batch.done(g) and batch.failed(g)


def _quiet_wait_all(batch: ReadBatch) -> None:
    try:
        batch.wait_all()
    except ReadError:
        pass
