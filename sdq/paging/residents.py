"""The experts resident in the cache slots: which expert is in which slot, how recently and how
often each was requested, and which of them a replacement may take now.

A key is (table row, expert): the row of the layer in the ExpertTable, not the layer number.
The replacement policies (sdq.paging.policies) choose victims from here; the cache registers
what it admits and counts evictions and failed reads in the counters it shares with this.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sdq.paging.reads import ReadBatch

Key = tuple[int, int]  # (table row, expert)


@dataclass(eq=False)
class Entry:
    """One cached expert: its slot, how many handles pin it, the read that may still fill it."""

    key: Key
    slot: int
    pins: int = 0
    prefetched: bool = False  # read by a prefetch, not yet requested
    pending: tuple[ReadBatch, int] | None = None  # (batch, group) while the read may run
    dropped: bool = False  # its read failed: forgotten; the slot frees at the last release


class Residents:
    """The cache slots and the experts in them.

    free: unused cache slots (taken from the end). lru: every key, least recently requested
    first; row_lru[r]: the same order restricted to table row r. scores: key -> (decayed
    request count, token it was last brought up to date at), kept by the scored policies;
    `token` is their clock and `decay` the factor per token."""

    def __init__(self, slots: list[int], n_rows: int, half_life: float, counters: dict):
        self.capacity = len(slots)
        self.free = slots[::-1]
        self.entries: dict[Key, Entry] = {}
        self.lru: OrderedDict[Key, None] = OrderedDict()
        self.row_lru: list[OrderedDict[Key, None]] = [OrderedDict() for _ in range(n_rows)]
        self.scores: dict[Key, tuple[float, int]] = {}
        self.decay = 0.5 ** (1.0 / half_life)
        self.token = 0
        self.counters = counters  # "evictions" and "read_errors" are counted here

    def register(self, key: Key, slot: int) -> Entry:
        """Makes key resident in slot as the most recently requested entry."""
        entry = Entry(key, slot)
        self.entries[key] = entry
        self.lru[key] = None
        self.row_lru[key[0]][key] = None
        return entry

    def forget(self, key: Key) -> None:
        """Takes key out of the recency orders (its entry is gone or dropped)."""
        self.lru.pop(key, None)
        self.row_lru[key[0]].pop(key, None)

    def evict(self, key: Key) -> int:
        """Removes key's entry; -> its slot, for the expert that replaces it."""
        entry = self.entries.pop(key)
        self.forget(key)
        self.counters["evictions"] += 1
        return entry.slot

    def evictable(self, keys, keep):
        """(position, key) for each key of a recency order whose entry may be evicted now:
        unpinned, outside `keep`, not dropped, its read finished."""
        entries = self.entries
        for i, key in enumerate(keys):
            entry = entries[key]
            if entry.pins or key in keep or entry.dropped:
                continue
            if entry.pending is not None:
                if not entry.pending[0].done(entry.pending[1]):
                    continue
                entry.pending = None
            yield i, key

    def score_now(self, key: Key) -> float:
        score, at = self.scores.get(key, (0.0, self.token))
        return score * self.decay ** (self.token - at)

    def lookup(self, key: Key) -> Entry | None:
        """The entry for key if it is cached and its read has not failed."""
        entry = self.entries.get(key)
        if entry is not None and entry.pending is not None:
            self.settle(entry)
            if entry.dropped:
                return None
        return entry

    def settle(self, entry: Entry) -> None:
        """Clears a finished read's pending mark; drops the entry if that read failed."""
        if entry.pending is None or entry.dropped:
            return
        batch, g = entry.pending
        if not batch.done(g):
            return
        if batch.failed(g):
            self.drop(entry)
        else:
            entry.pending = None

    def drop(self, entry: Entry) -> None:
        """Forgets an entry whose read failed; its slot is freed once nobody pins it."""
        if entry.dropped:
            return
        entry.dropped = True
        if self.entries.get(entry.key) is entry:
            del self.entries[entry.key]
        self.forget(entry.key)
        if entry.pins == 0:
            self.free.append(entry.slot)
        self.counters["read_errors"] += 1

    def unadmit(self, entry: Entry) -> None:
        """Undoes the admission of an entry this acquire registered (the acquire failed)."""
        entry.pins = 0
        del self.entries[entry.key]
        self.forget(entry.key)
        self.free.append(entry.slot)

    def cached(self, row: int) -> list[int]:
        return sorted(e for (r, e) in self.entries if r == row)
