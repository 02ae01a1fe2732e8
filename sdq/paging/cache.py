"""The expert pager: a fixed RAM arena of expert slots and the cache that fills it from disk.

Dimension key: L MoE layers, E experts per layer, K experts requested at once, P = 3 parts
(gate, up, down).

Use (the engine):

    cache = ExpertCache(model, plan, io=IOSettings(threads=8, mode="parallel"),
                        settings=CacheSettings(scope="global", policy="auto"))
    h = cache.acquire(layer, expert_ids)     # submits every miss at once, returns at once
    for i in h.ready_order():                # hits first, then misses in submission order
        h.wait(i)                            # no-op for a hit; blocks (GIL released) for a miss
        gate, up, down = h.views(i)          # uint8 [rows, row_bytes] raw quantized bytes
        ...
    cache.release(h)                         # unpins; views must not be used afterwards
    cache.log_route("decode", pos, layer, expert_ids, weights)   # when a route log is set
    cache.stats                              # counters, see ExpertCache.stats
    cache.close()

`layer` is the model's layer number; expert ids must be distinct within one acquire and at
most `cache.max_acquire` of them (the slots one layer can hold at once; prefill with a large
union of experts acquires in chunks of that size).

Policy.
  scope "global": one cache over every slot; scope "layer": each MoE layer owns an equal share of
  the slots and its own cache.
  Replacement (CacheSettings.policy):
  "lru": every miss takes a slot, evicting the least recently used expert.
  "lrfu_bypass" (frequency retention with bypass, sdq.analysis.simulate's policy of that name):
  for arenas that cannot hold one token's experts over all layers, where LRU evicts exactly what
  the next token needs and hits almost nothing. K slots are streaming slots. Each expert has a
  score, its decayed request count (sum over its lookups of 2^(-age / half_life), age in
  tokens). A miss takes a free slot if there is one, else it replaces the weakest cached
  expert (lowest score, then least recent) only if its own score, this lookup included, is
  strictly higher; otherwise it is read into a streaming slot and dropped at release
  (counted as `bypassed`). A token starts when an acquire's layer is not after the previous
  acquire's layer (prefill chunks of one layer count as tokens too).
  "layer_lrfu" (global scope; sdq.analysis.simulate's policy of that name): every miss takes a
  slot; the victim is a cached expert of the layer whose next visit is farthest (the layer
  order is known), the lowest score within it, then the least recent.
  "auto" (default), for global scope with admission on the first lookup: lrfu_bypass when the
  slots are fewer than n_layers x K (and leave K for the cache beside the streaming slots),
  else layer_lrfu; lru for layer scope or min_hits > 1.
  An acquire never evicts an expert it requests itself.
  Pinning: every expert of an acquire is pinned until release; a pinned slot is never evicted.
  When no slot can be evicted the acquire fails with PlanError (all slots pinned).
  Admission (seed SDQ_ADMIT_MIN_HITS): a missing expert takes a slot only on its min_hits-th
  lookup; before that it is read into one of K scratch slots (counted as `bypassed`) and
  forgotten. When every scratch slot is taken (a prefill union of many first-seen experts),
  the expert is admitted after all (counted as `overflow_admits`) rather than failing.
  Hot pinning (seed SDQ_HOT_PIN): the first `hot_pin` entries of a (layer, expert) ranking are
  read at start and stay pinned for the whole run, outside the LRU.
  Prefetch: `prefetch(layer, ids)` reads experts that are not cached without counting
  lookups. Under lru and layer_lrfu they take free or evictable slots (layer_lrfu ranks victims
  from the layer now being computed) and a later acquire finds them as hits.
  Under lrfu_bypass they are read into `prefetch_slots` extra streaming slots and change no
  cache decision: the acquire that requests one still counts a miss and applies the policy
  (admitted: the prefetched slot becomes the cache slot and the victim's slot a streaming one;
  bypassed: it is used from its streaming slot), but reads nothing (`prefetch_hits`). The
  next acquire drops the streamed experts it does not request (`prefetch_unused`: a wrong
  guess, whose bytes stay counted in bytes_read).
  Several Python threads may acquire and release concurrently: the bookkeeping is under one
  lock; waiting for reads happens outside it.

Route log (CacheSettings.route_log or RouteLog(path)): JSON lines, one per token and layer,
    {"phase": "prefill" | "decode", "pos": int, "layer": int, "experts": [int, ...],
     "weights": [float, ...]}
pos is the token's position in the sequence (0-based), layer the model layer number, experts
the router's top-k ids in router order and weights their mixing weights (same order, rounded to
6 digits; omitted as [] when unknown). The file is written to PATH.tmp and renamed on close.
"""

from __future__ import annotations

import json
import mmap
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from sdq.errors import ParamsError, PlanError, ReadError
from sdq.paging.reads import ExpertReader, IOSettings, ReadBatch, SlotLayout, expert_table

__all__ = [
    "Arena",
    "CacheSettings",
    "ExpertCache",
    "ExpertHandle",
    "IOSettings",
    "RouteLog",
]

SCOPES = ("global", "layer")
POLICIES = ("auto", "lru", "lrfu_bypass", "layer_lrfu")
SCORED = ("lrfu_bypass", "layer_lrfu")  # policies that keep decayed request counts


@dataclass(frozen=True)
class CacheSettings:
    scope: str = "global"  # one cache over all slots, or one per "layer"
    policy: str = "auto"  # "lru", "lrfu_bypass" or "auto" (module docstring)
    half_life: float = 32.0  # lrfu_bypass, layer_lrfu: tokens per halving of a lookup's weight
    prefetch_slots: int = 0  # lrfu_bypass: streaming slots for prefetches (module docstring)
    min_hits: int = 1  # admission: take a slot on the min_hits-th lookup (1 = always)
    hot: tuple[tuple[int, int], ...] = ()  # (layer, expert) ranking, most used first
    hot_pin: int = 0  # pin the first hot_pin entries of `hot` for the whole run
    route_log: str | None = None  # JSON-lines route log path

    def __post_init__(self):
        if self.scope not in SCOPES:
            raise ParamsError(f"cache scope {self.scope!r}: expected one of {', '.join(SCOPES)}")
        if self.policy not in POLICIES:
            raise ParamsError(
                f"cache policy {self.policy!r}: expected one of {', '.join(POLICIES)}"
            )
        if not self.half_life > 0:
            raise ParamsError(f"half_life {self.half_life}: expected > 0 tokens")
        if self.min_hits < 1:
            raise ParamsError(f"min_hits {self.min_hits}: expected >= 1")
        if self.prefetch_slots < 0:
            raise ParamsError(f"prefetch_slots {self.prefetch_slots}: expected >= 0")
        if self.min_hits > 1 and self.policy in SCORED:
            raise ParamsError("min_hits > 1 is an LRU admission rule: use it with policy lru")
        if self.policy == "layer_lrfu" and self.scope != "global":
            raise ParamsError("cache policy layer_lrfu ranks layers: it needs scope global")
        if self.hot_pin < 0 or self.hot_pin > len(self.hot):
            raise ParamsError(f"hot_pin {self.hot_pin}: the ranking has {len(self.hot)} entries")


class Arena:
    """One anonymous mapping cut into `n_slots` slots of `slot_bytes` (page-aligned base)."""

    def __init__(self, n_slots: int, slot_bytes: int):
        if n_slots < 1 or slot_bytes < 1:
            raise ValueError(f"arena needs slots and bytes, got {n_slots} x {slot_bytes}")
        self.n_slots = n_slots
        self.slot_bytes = slot_bytes
        self._map = mmap.mmap(-1, n_slots * slot_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        # transparent huge pages where the kernel allows them: an O_DIRECT read into 2 MiB pages
        # is a few physically contiguous segments, not one per 4 KiB page (sdq probe --engine)
        try:
            self._map.madvise(mmap.MADV_HUGEPAGE)
        except (AttributeError, OSError):  # no THP in this kernel or build: 4 KiB pages
            pass
        self.buf = np.frombuffer(self._map, dtype=np.uint8)  # [n_slots * slot_bytes]
        self.base = self.buf.ctypes.data

    @property
    def nbytes(self) -> int:
        return self.n_slots * self.slot_bytes

    def address(self, slot: int) -> int:
        return self.base + slot * self.slot_bytes

    def slot(self, slot: int) -> np.ndarray:
        start = slot * self.slot_bytes
        return self.buf[start : start + self.slot_bytes]  # [slot_bytes]

    def close(self) -> None:
        self.buf = None
        try:
            self._map.close()
        except BufferError:
            pass  # views still alive: the mapping goes when they do


class RouteLog:
    """Writes route records as JSON lines (format in the module docstring)."""

    def __init__(self, path):
        self.path = str(path)
        self._tmp = self.path + ".tmp"
        self._file = open(self._tmp, "w", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, phase: str, pos: int, layer: int, experts, weights=()) -> None:
        record = {
            "phase": phase,
            "pos": int(pos),
            "layer": int(layer),
            "experts": [int(e) for e in experts],
            "weights": [round(float(w), 6) for w in weights],
        }
        line = json.dumps(record, separators=(", ", ": ")) + "\n"
        with self._lock:
            self._file.write(line)

    def write_batch(self, phase: str, pos0: int, layer: int, ids, weights=None) -> None:
        """One record per token: ids int [T, K], weights float [T, K] or None; pos0 + t."""
        ids = np.asarray(ids)
        for t in range(ids.shape[0]):
            self.write(phase, pos0 + t, layer, ids[t], () if weights is None else weights[t])

    def __call__(self, phase: str, pos0: int, layer: int, ids, weights=None, tokens=None):
        """The engine's route-log hook: one record per token of ids [T, K] (tokens unused)."""
        self.write_batch(phase, pos0, layer, ids, weights)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
                os.replace(self._tmp, self.path)


@dataclass(eq=False)
class _Entry:
    key: tuple[int, int]  # (table row, expert)
    slot: int
    pins: int = 0
    hot: bool = False
    prefetched: bool = False
    pending: tuple[ReadBatch, int] | None = None  # (batch, group) while the read may run
    dropped: bool = False  # its read failed: forgotten; the slot frees at the last release


@dataclass(eq=False)
class ExpertHandle:
    """The experts of one acquire: slots, hit flags and the reads still to wait for."""

    layer: int
    experts: tuple[int, ...]
    hits: tuple[bool, ...]  # True: found in the arena (maybe still loading from a prefetch)
    _slots: list[int]
    _waits: list[tuple[ReadBatch, int] | None]
    _entries: list[_Entry | None]  # None for a bypassed (scratch) expert
    _cache: ExpertCache = field(repr=False)
    released: bool = False

    def __len__(self) -> int:
        return len(self.experts)

    @property
    def hit(self) -> tuple[bool, ...]:
        return self.hits

    def ready_order(self) -> list[int]:
        """Indices with nothing to wait for first, then the rest in submission order."""
        return sorted(range(len(self.experts)), key=lambda i: self._waits[i] is not None)

    def wait(self, i: int) -> None:
        """Blocks until expert i's bytes are in its slot; raises ReadError if its read failed."""
        pending = self._waits[i]
        if pending is None:
            return
        self._cache._wait(self, i, pending)

    def wait_all(self) -> None:
        for i in range(len(self.experts)):
            self.wait(i)

    def slot(self, i: int) -> int:
        return self._slots[i]

    def views(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(gate, up, down) raw bytes of expert i: uint8 [rows, row_bytes] views of the arena."""
        return self._cache._views(self.layer, self.experts[i], self._slots[i])


class ExpertCache:
    """LRU cache of routed experts in an Arena, filled through ExpertReader (module docstring)."""

    def __init__(self, model, plan, io: IOSettings | None = None, settings=None):
        self.io = io or IOSettings()
        self.settings = settings or CacheSettings()
        self.table = expert_table(model)
        self.K = int(model.spec.n_expert_used)
        self.layout = SlotLayout.for_table(self.table, self.io.cache_mode)
        if self.layout.slot_bytes > plan.slot_bytes:
            raise PlanError(
                f"the plan's slots hold {plan.slot_bytes} bytes but cache mode "
                f"{self.io.cache_mode} needs {self.layout.slot_bytes}: plan with that cache mode"
            )
        s = self.settings
        n_layers = len(self.table.layers)
        self.policy = self._resolve_policy(plan.slots, n_layers)
        n_scratch = self.K if s.min_hits > 1 or self.policy == "lrfu_bypass" else 0
        if self.policy == "lrfu_bypass":
            n_scratch += s.prefetch_slots
        n_lru = plan.slots - n_scratch - s.hot_pin
        per_scope_min = self.K * (n_layers if s.scope == "layer" else 1)
        if n_lru < per_scope_min:
            need = per_scope_min + n_scratch + s.hot_pin
            raise PlanError(
                f"{plan.slots} slots cannot hold {per_scope_min} LRU slots "
                f"({s.scope} scope, K={self.K}) + {n_scratch} scratch + {s.hot_pin} hot pins: "
                f"{need} slots needed, minimum budget "
                f"{plan.budget_for_slots(need) / (1 << 20):.1f} MB"
            )
        self.plan = plan
        self.arena = Arena(plan.slots, plan.slot_bytes)
        try:
            self.reader = ExpertReader(model.path, self.table, self.layout, self.io)
        except BaseException:
            self.arena.close()
            raise
        self._lock = threading.Lock()
        # slot pools: scope id -> free slots; scope id is 0 (global) or the table row
        slots = list(range(plan.slots))
        self._scratch = slots[:n_scratch]
        hot_slots = slots[n_scratch : n_scratch + s.hot_pin]
        lru_slots = slots[n_scratch + s.hot_pin :]
        self._free: dict[int, list[int]] = {}
        self._lru: dict[int, OrderedDict] = {}
        if s.scope == "global":
            self._free[0] = lru_slots[::-1]
            self._lru[0] = OrderedDict()
        else:
            share = len(lru_slots) // n_layers
            for r in range(n_layers):
                self._free[r] = lru_slots[r * share : (r + 1) * share][::-1]
                self._lru[r] = OrderedDict()
        self.max_acquire = min(len(v) for v in self._free.values())
        # the same recency order split by table row (layer_lrfu scores one layer at a time)
        self._row_lru = [OrderedDict() for _ in range(n_layers)]
        self._entries: dict[tuple[int, int], _Entry] = {}
        self._seen: dict[tuple[int, int], int] = {}
        self._score: dict[tuple[int, int], tuple[float, int]] = {}  # key -> (score, at token)
        self._decay = 0.5 ** (1.0 / s.half_life)
        self._token = 0  # token clock of lrfu_bypass
        self._last_row = -1
        self._inflight: list[ReadBatch] = []
        self._streamed: dict[tuple[int, int], tuple[int, tuple[ReadBatch, int]]] = {}
        self._draining: list[tuple[int, tuple[ReadBatch, int]]] = []  # dropped, still reading
        self._counters = dict.fromkeys(
            (
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
            ),
            0,
        )
        self._read_ns = 0
        self._busy_ns = 0
        self._wait_ns = 0
        self._layer_counts = [[0, 0, 0] for _ in range(n_layers)]  # [L][lookups, hits, misses]
        self._expert_bytes = self.table.nbytes.sum(axis=2).tolist()  # [L][E] Python ints
        self._view_specs: list[list | None] = [None] * n_layers  # see _view_rows
        # slot -> (row, expert, views) last cut from it: a hit reuses them
        self._slot_views: list[tuple | None] = [None] * plan.slots
        self.route_log = RouteLog(s.route_log) if s.route_log else None
        self._closed = False
        if s.hot_pin:
            self._load_hot(hot_slots)

    # ---------------------------------------------------------------- public API

    def acquire(self, layer: int, expert_ids) -> ExpertHandle:
        """Pins the experts, submits every miss in one batch and returns without waiting."""
        row = self.table.row(layer)
        ids = tuple(int(e) for e in expert_ids)
        self._check_ids(ids)
        with self._lock:
            self._check_open()
            self._harvest()
            if row <= self._last_row:
                self._token += 1
            self._last_row = row
            if self._streamed:
                self._drop_streamed(row, ids)
            bypass_policy = self.policy == "lrfu_bypass"
            scored = self.policy in SCORED
            group = {(row, e) for e in ids}
            weakest: list | None = None  # lrfu_bypass: eviction candidates, built on demand
            ranked: list | None = None  # layer_lrfu: eviction order, built on demand
            c = self._counters
            slots: list[int] = []
            waits: list[tuple[ReadBatch, int] | None] = []
            entries: list[_Entry | None] = []
            hits: list[bool] = []
            load: list[int] = []  # indices into ids that need a read
            seen_of, score_of, token, decay = self._seen, self._score, self._token, self._decay
            lru, row_lru = self._lru[self._scope(row)], self._row_lru[row]
            try:
                for i, e in enumerate(ids):
                    key = (row, e)
                    seen = seen_of.get(key, 0) + 1
                    seen_of[key] = seen
                    if scored:
                        score, at = score_of.get(key, (0.0, token))
                        score_of[key] = (score * decay ** (token - at) + 1.0, token)
                    entry = self._lookup(key)
                    if entry is not None:
                        hits.append(True)
                        entry.pins += 1
                        if not entry.hot:
                            lru.move_to_end(key)
                            row_lru.move_to_end(key)
                        if entry.prefetched:
                            entry.prefetched = False
                            c["prefetch_hits"] += 1
                        elif entry.pending is not None:
                            c["inflight_hits"] += 1
                        slots.append(entry.slot)
                        waits.append(entry.pending)
                        entries.append(entry)
                        continue
                    hits.append(False)
                    entry = None
                    if bypass_policy:
                        if weakest is None:
                            weakest = self._weakest(row, group)
                        entry = self._admit_if_stronger(row, key, weakest)
                        admit = entry is not None or not self._scratch
                    else:
                        admit = seen >= self.settings.min_hits or not self._scratch
                    streamed = self._streamed.pop(key, None)
                    if streamed is not None:
                        admit = entry is not None  # bypassed: its prefetch slot streams it
                    if admit:
                        if entry is None and (bypass_policy or seen < self.settings.min_hits):
                            c["overflow_admits"] += 1  # no scratch slot left: admit instead
                        if entry is None:
                            if ranked is None and self.policy == "layer_lrfu":
                                ranked = self._ranked(row, group)
                            entry = self._admit(row, key, group, ranked)
                        entry.pins = 1
                        entries.append(entry)
                        if streamed is not None:  # swap: the prefetched slot joins the cache
                            self._scratch.append(entry.slot)
                            entry.slot, entry.pending = streamed
                        slots.append(entry.slot)
                    else:
                        slots.append(self._scratch.pop() if streamed is None else streamed[0])
                        entries.append(None)
                    if streamed is not None:
                        c["prefetch_hits"] += 1
                        waits.append(streamed[1])
                        continue
                    waits.append(None)
                    load.append(i)
            except BaseException:
                self._undo(row, ids, hits, slots, entries)
                raise
            n_hits = sum(hits)
            c["lookups"] += len(ids)
            c["hits"] += n_hits
            c["misses"] += len(ids) - n_hits
            c["bypassed"] += sum(1 for i in load if entries[i] is None)
            counts = self._layer_counts[row]
            counts[0] += len(ids)
            counts[1] += n_hits
            counts[2] += len(ids) - n_hits
            if load:
                batch = self._submit(row, [ids[i] for i in load], [slots[i] for i in load])
                for g, i in enumerate(load):
                    waits[i] = (batch, g)
                    if entries[i] is not None:
                        entries[i].pending = (batch, g)
        return ExpertHandle(layer, ids, tuple(hits), slots, waits, entries, self)

    def release(self, handle: ExpertHandle) -> None:
        """Unpins the handle's experts (waits for any of its reads still running)."""
        if handle.released:
            return
        for pending in handle._waits:
            if pending is not None:
                try:
                    pending[0].wait(pending[1])
                except ReadError:
                    pass  # the entry is dropped below
        with self._lock:
            handle.released = True
            for i, entry in enumerate(handle._entries):
                if entry is None:
                    self._scratch.append(handle._slots[i])
                    continue
                entry.pins -= 1
                if not entry.dropped:
                    self._settle(entry)  # a failed read drops it (and frees an unpinned slot)
                elif entry.pins == 0:
                    self._free[self._scope(entry.key[0])].append(entry.slot)
            self._harvest()

    def prefetch(self, layer: int, expert_ids) -> int:
        """Starts reading experts that are not cached into evictable slots; returns how many.

        Best effort: experts for which no slot can be freed are skipped. No lookup is counted.
        """
        row = self.table.row(layer)
        ids = tuple(dict.fromkeys(int(e) for e in expert_ids))
        self._check_ids(ids)
        if self.policy == "lrfu_bypass":
            return self._prefetch_streamed(row, ids)
        with self._lock:
            self._check_open()
            self._harvest()
            new: list[_Entry] = []
            ranked = None
            if self.policy == "layer_lrfu":
                ranked = self._ranked(self._last_row if self._last_row >= 0 else row, ())
            try:
                for e in ids:
                    key = (row, e)
                    if key in self._entries:
                        continue
                    try:
                        entry = self._admit(row, key, ranked=ranked)
                    except PlanError:
                        break
                    entry.prefetched = True
                    entry.pins = 1  # until its read is submitted: a later id must not evict it
                    new.append(entry)
                if new:
                    batch = self._submit(row, [en.key[1] for en in new], [en.slot for en in new])
                    for g, entry in enumerate(new):
                        entry.pending = (batch, g)
                    self._counters["prefetches"] += len(new)
            finally:
                for entry in new:
                    entry.pins = 0
            return len(new)

    def _prefetch_streamed(self, row: int, ids: tuple[int, ...]) -> int:
        """lrfu_bypass prefetch: uncached experts into free streaming slots, at most
        prefetch_slots of them outstanding."""
        with self._lock:
            self._check_open()
            self._harvest()
            spare = min(len(self._scratch), self.settings.prefetch_slots - len(self._streamed))
            keys = [
                (row, e)
                for e in ids
                if (row, e) not in self._entries and (row, e) not in self._streamed
            ][: max(spare, 0)]
            if not keys:
                return 0
            slots = [self._scratch.pop() for _ in keys]
            batch = self._submit(row, [e for _, e in keys], slots)
            for g, (key, slot) in enumerate(zip(keys, slots, strict=True)):
                self._streamed[key] = (slot, (batch, g))
            self._counters["prefetches"] += len(keys)
            return len(keys)

    def log_route(self, phase: str, pos: int, layer: int, experts, weights=()) -> None:
        """Appends one route record when a route log is set (no-op otherwise)."""
        if self.route_log is not None:
            self.route_log.write(phase, pos, layer, experts, weights)

    def log_routes(self, phase: str, pos0: int, layer: int, ids, weights=None) -> None:
        """One record per token of a ubatch: ids [T, K], weights [T, K]."""
        if self.route_log is not None:
            self.route_log.write_batch(phase, pos0, layer, ids, weights)

    def set_io(self, io: IOSettings) -> None:
        """Changes threads / mode / split between tokens (not the cache mode)."""
        with self._lock:
            self.reader.set_io(io)
            self.io = io

    def cached(self, layer: int) -> list[int]:
        """Expert ids of `layer` currently in the arena (hot pins included)."""
        row = self.table.row(layer)
        with self._lock:
            return sorted(e for (r, e) in self._entries if r == row)

    @property
    def stats(self) -> dict:
        """lookups, hits, misses, hit_rate, bypassed (misses read to scratch, not admitted),
        evictions, inflight_hits (hits on a read still running), prefetches, prefetch_hits
        (lookups served by a prefetch: hits under lru / layer_lrfu, misses that read nothing
        under lrfu_bypass), prefetch_unused (streamed prefetches nobody requested),
        read_errors, overflow_admits, reads (preads issued), bytes_read (device bytes incl.
        O_DIRECT page rounding), expert_bytes_read, read_ms (submit to last byte, summed over
        batches), io_busy_ms (sum of every pread's own duration), wait_ms (time
        callers blocked in wait), policy, slots, slot_bytes, cached, streamed (prefetches
        waiting in streaming slots), layers {layer: [lookups, hits, misses]}. Reads still in
        flight are not yet in read_ms."""
        with self._lock:
            self._harvest()
            s = dict(self._counters)
            s["hit_rate"] = s["hits"] / s["lookups"] if s["lookups"] else 0.0
            s["policy"] = self.policy
            s["read_ms"] = self._read_ns / 1e6
            s["io_busy_ms"] = self._busy_ns / 1e6
            s["wait_ms"] = self._wait_ns / 1e6
            s["slots"] = self.plan.slots
            s["slot_bytes"] = self.plan.slot_bytes
            s["cached"] = len(self._entries)
            s["streamed"] = len(self._streamed)
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
            _quiet_wait_all(batch)
        self.reader.close()
        if self.route_log is not None:
            self.route_log.close()
        self._slot_views = [None] * self.plan.slots
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

    def _resolve_policy(self, slots: int, n_layers: int) -> str:
        s = self.settings
        if s.policy != "auto":
            return s.policy
        if s.scope != "global" or s.min_hits != 1:
            return "lru"
        room = slots - s.hot_pin - s.prefetch_slots  # K cache + K streaming at least
        small = slots < n_layers * self.K and room >= 2 * self.K
        return "lrfu_bypass" if small else "layer_lrfu"

    def _drop_streamed(self, row: int, ids: tuple[int, ...]) -> None:
        """Forgets prefetched experts this acquire does not request; their slots return to the
        streaming pool once their reads are over."""
        wanted = {(row, e) for e in ids}
        for key in [k for k in self._streamed if k not in wanted]:
            slot, pending = self._streamed.pop(key)
            self._counters["prefetch_unused"] += 1
            self._draining.append((slot, pending))
        self._reclaim()

    def _reclaim(self) -> None:
        keep = []
        for slot, (batch, g) in self._draining:
            if batch.done(g):
                self._scratch.append(slot)
            else:
                keep.append((slot, (batch, g)))
        self._draining = keep

    def _scope(self, row: int) -> int:
        return row if self.settings.scope == "layer" else 0

    def _admit(self, row: int, key: tuple[int, int], keep=frozenset(), ranked=None) -> _Entry:
        """A slot for key (free or evicted, never one of `keep`), registered as the most
        recent entry. `ranked` (layer_lrfu): eviction candidates, the victim last."""
        scope = self._scope(row)
        free = self._free[scope]
        if free:
            slot = free.pop()
        else:
            gone = ranked.pop(self._entries) if ranked is not None else None
            if gone is not None:
                victim = self._entries.pop(gone)
                self._forget(scope, gone)
                self._counters["evictions"] += 1
                slot = victim.slot
            else:
                slot = self._evict(scope, keep)
        return self._register(scope, key, slot)

    def _ranked(self, now_row: int, keep) -> _Victims:
        """layer_lrfu eviction order (global scope) over unpinned, loaded entries outside
        `keep`: the layer visited farthest from now_row's first, within it the lowest score,
        then the least recent."""
        n = len(self.table.layers)
        nearest_first = sorted(range(n), key=lambda r: (r - now_row - 1) % n)
        return _Victims(nearest_first, lambda row: self._candidates(row, keep))

    def _candidates(self, row: int, keep) -> list:
        """layer_lrfu: row's unpinned, loaded entries outside `keep`, the victim last:
        [(-score, -recency position, key)]."""
        out = [(-self._score_now(k), -i, k) for i, k in self._evictable(self._row_lru[row], keep)]
        out.sort()
        return out

    def _evictable(self, keys, keep):
        """(position, key) for each key of a recency order whose entry may be evicted now:
        unpinned, outside `keep`, not dropped, its read finished."""
        for i, key in enumerate(keys):
            entry = self._entries[key]
            if entry.pins or key in keep or entry.dropped:
                continue
            if entry.pending is not None:
                if not entry.pending[0].done(entry.pending[1]):
                    continue
                entry.pending = None
            yield i, key

    def _register(self, scope: int, key: tuple[int, int], slot: int) -> _Entry:
        entry = _Entry(key, slot)
        self._entries[key] = entry
        self._lru[scope][key] = None
        self._row_lru[key[0]][key] = None
        return entry

    def _forget(self, scope: int, key: tuple[int, int]) -> None:
        """Takes key out of the recency orders (its entry is gone or dropped)."""
        self._lru[scope].pop(key, None)
        self._row_lru[key[0]].pop(key, None)

    def _score_now(self, key: tuple[int, int]) -> float:
        score, at = self._score.get(key, (0.0, self._token))
        return score * self._decay ** (self._token - at)

    def _weakest(self, row: int, keep) -> list:
        """lrfu_bypass eviction candidates of row's scope, the weakest last: [(score, age,
        key)] over unpinned, loaded entries outside `keep` (age: LRU position, oldest 0)."""
        out = [
            (self._score_now(k), i, k)
            for i, k in self._evictable(self._lru[self._scope(row)], keep)
        ]
        out.sort(reverse=True)
        return out

    def _admit_if_stronger(self, row: int, key: tuple[int, int], weakest: list):
        """lrfu_bypass: a free slot, or the weakest candidate's slot if key's score is higher;
        None when key should be read past the cache."""
        scope = self._scope(row)
        free = self._free[scope]
        if free:
            return self._register(scope, key, free.pop())
        while weakest and weakest[-1][2] not in self._entries:
            weakest.pop()  # taken by an overflow admit of this acquire
        if not weakest or not self._score_now(key) > weakest[-1][0]:
            return None
        victim = self._entries.pop(weakest.pop()[2])
        self._forget(scope, victim.key)
        self._counters["evictions"] += 1
        return self._register(scope, key, victim.slot)

    def _evict(self, scope: int, keep=frozenset()) -> int:
        lru = self._lru[scope]
        for _, key in self._evictable(lru, keep):  # stops at the first: lru changes below
            entry = self._entries.pop(key)
            self._forget(scope, key)
            self._counters["evictions"] += 1
            return entry.slot
        where = (
            "the arena"
            if scope == 0 and self.settings.scope == "global"
            else (f"layer {self.table.layers[scope]}")
        )
        raise PlanError(
            f"all {len(lru)} slots of {where} are pinned or loading: release handles before "
            f"acquiring more (max_acquire = {self.max_acquire})"
        )

    def _lookup(self, key: tuple[int, int]) -> _Entry | None:
        """The entry for key, if cached and not failed."""
        entry = self._entries.get(key)
        if entry is not None:
            self._settle(entry)
            if entry.dropped:
                return None
        return entry

    def _settle(self, entry: _Entry) -> None:
        """Clears a finished read's pending mark; drops the entry if that read failed."""
        if entry.pending is None or entry.dropped:
            return
        batch, g = entry.pending
        if not batch.done(g):
            return
        if batch.failed(g):
            self._drop(entry)
        else:
            entry.pending = None

    def _drop(self, entry: _Entry) -> None:
        """Forgets an entry whose read failed; its slot is freed once nobody pins it."""
        if entry.dropped:
            return
        entry.dropped = True
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]
        scope = self._scope(entry.key[0])
        self._forget(scope, entry.key)
        if entry.pins == 0:
            self._free[scope].append(entry.slot)
        self._counters["read_errors"] += 1

    def _undo(self, row, ids, hits, slots, entries) -> None:
        """Rolls back a failed acquire: unpin hits, free new slots, forget the lookups."""
        for i in range(len(hits)):
            self._seen[(row, ids[i])] -= 1
            entry = entries[i] if i < len(entries) else None
            if hits[i]:
                entry.pins -= 1
            elif entry is None and i < len(slots):
                self._scratch.append(slots[i])
            elif entry is not None:
                entry.pins = 0
                scope = self._scope(row)
                del self._entries[entry.key]
                self._forget(scope, entry.key)
                self._free[scope].append(entry.slot)

    def _submit(self, row: int, experts: list[int], slots: list[int]) -> ReadBatch:
        base, size = self.arena.base, self.arena.slot_bytes
        addrs = [base + s * size for s in slots]
        batch, device_bytes = self.reader.submit(row, experts, addrs, keepalive=self.arena)
        self._inflight.append(batch)
        self._counters["bytes_read"] += device_bytes
        sizes = self._expert_bytes[row]
        self._counters["expert_bytes_read"] += sum(sizes[e] for e in experts)
        return batch

    def _harvest(self) -> None:
        """Accounts finished batches (read time, failures of reads nobody waited for)."""
        if self._draining:
            self._reclaim()
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

    def _wait(self, handle: ExpertHandle, i: int, pending: tuple[ReadBatch, int]) -> None:
        batch, g = pending
        t0 = time.perf_counter_ns()
        try:
            batch.wait(g)
        except ReadError:
            with self._lock:
                entry = handle._entries[i]
                if entry is not None:
                    self._drop(entry)
            handle._waits[i] = None
            raise
        finally:
            waited = time.perf_counter_ns() - t0
            with self._lock:
                self._wait_ns += waited
        handle._waits[i] = None
        entry = handle._entries[i]
        if entry is not None and entry.pending is pending:
            entry.pending = None  # plain attribute store: safe without the lock

    def _views(self, layer: int, expert: int, slot: int):
        row = self.table.row(layer)
        cached = self._slot_views[slot]
        if cached is not None and cached[0] == row and cached[1] == expert:
            return cached[2]  # the expert is still in this slot: same bytes, same views
        (g0, gn, gr, gc), (u0, un, ur, uc), (d0, dn, dr, dc) = self._view_rows(row)[expert]
        buf, base = self.arena.buf, slot * self.arena.slot_bytes
        views = (
            buf[base + g0 : base + g0 + gn].reshape(gr, gc),
            buf[base + u0 : base + u0 + un].reshape(ur, uc),
            buf[base + d0 : base + d0 + dn].reshape(dr, dc),
        )
        self._slot_views[slot] = (row, expert, views)  # a plain store: no lock needed
        return views

    def _view_rows(self, row: int) -> list:
        """Per expert of table row `row`, per part: (start in the slot, bytes, rows, row
        bytes) as Python ints, built on first use (views are cut per expert per token)."""
        specs = self._view_specs[row]
        if specs is None:
            t = self.table
            specs = [
                tuple(
                    (
                        self.layout.view_offset(int(t.offsets[row, e, p]), p),
                        int(t.nbytes[row, e, p]),
                        int(t.shapes[p][0]),
                        int(t.nbytes[row, e, p]) // int(t.shapes[p][0]),
                    )
                    for p in range(3)
                )
                for e in range(t.n_expert)
            ]
            self._view_specs[row] = specs
        return specs

    def _load_hot(self, hot_slots: list[int]) -> None:
        """Reads the first hot_pin experts of the ranking into their pinned slots."""
        by_row: dict[int, list[tuple[int, int]]] = {}
        for slot, (layer, e) in zip(
            hot_slots, self.settings.hot[: self.settings.hot_pin], strict=True
        ):
            row = self.table.row(layer)
            key = (row, int(e))
            if key in self._entries:
                raise ParamsError(f"hot ranking lists layer {layer} expert {e} twice")
            self._entries[key] = _Entry(key, slot, pins=1, hot=True)
            by_row.setdefault(row, []).append((int(e), slot))
        for row, items in by_row.items():
            batch = self._submit(row, [e for e, _ in items], [s for _, s in items])
            batch.wait_all()
        self._harvest()


class _Victims:
    """layer_lrfu victims in order: rows nearest first (the farthest is taken first); a row's
    entries are ranked only when its turn comes (usually one row per acquire)."""

    def __init__(self, rows: list[int], candidates):
        self.rows = rows
        self.candidates = candidates  # row -> [(-score, -recency position, key)], victim last
        self.current: list = []

    def pop(self, alive) -> tuple[int, int] | None:
        """The next victim still in `alive` (others were evicted meanwhile), or None."""
        while True:
            while self.current:
                key = self.current.pop()[-1]
                if key in alive:
                    return key
            if not self.rows:
                return None
            self.current = self.candidates(self.rows.pop())


def _quiet_wait_all(batch: ReadBatch) -> None:
    try:
        batch.wait_all()
    except ReadError:
        pass
