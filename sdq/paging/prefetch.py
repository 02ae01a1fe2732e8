"""Prefetch of guessed experts into streaming slots (policy lrfu_bypass), and the prefetch width.

While layer l computes, the engine guesses the experts of layers l+1 .. l+depth with those
layers' routers and asks the cache to start reading them. Under lru and layer_lrfu the guesses
take cache slots and a later acquire finds them there. Under lrfu_bypass they must not change a
cache decision, so they are read into streaming slots outside the cache: the acquire that
requests one applies the policy (admitted: the prefetched slot becomes the cache slot and the
victim's slot a streaming one; bypassed: it is used from its streaming slot), but reads nothing.
Under every policy a lookup served by a prefetch's read counts as a miss and a `prefetch_hit`,
never as a hit (sdq.paging.cache). The acquire of a guessed layer drops that layer's streamed
experts it does not request (`prefetch_unused`: a wrong guess); their slots return to the pool
once their reads are over. Guesses for layers still ahead stay. Every prefetch read, used or
not, is counted in bytes_read, expert_bytes_read and prefetch_bytes_read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sdq.paging.reads import ReadBatch
    from sdq.paging.residents import Key

Pending = tuple["ReadBatch", int]  # (batch, group) of a read that may still run


def prefetch_width(n_expert_used: int, requested: int | None = None) -> int:
    """Experts to prefetch per layer: `requested` (default 3/4 of K), at most K."""
    return min(3 * n_expert_used // 4 if requested is None else requested, n_expert_used)


class StreamingSlots:
    """The slots outside the cache: a bypassed miss is read into one and gives it back at
    release; a prefetch waits in one (at most `prefetch_limit` at once) until an acquire
    uses it or drops it."""

    def __init__(self, slots: list[int], prefetch_limit: int):
        self.free = list(slots)  # taken from the end
        self.prefetch_limit = prefetch_limit
        self.streamed: dict[Key, tuple[int, Pending]] = {}  # key -> (slot, its read)
        self.draining: list[tuple[int, Pending]] = []  # dropped guesses still being read

    def start(
        self, row: int, ids, cached, submit: Callable[[int, list[int], list[int]], ReadBatch]
    ) -> int:
        """Starts reading the experts `ids` of table row `row` that are neither `cached` nor
        streamed already, as many as there are spare slots; -> how many."""
        spare = min(len(self.free), self.prefetch_limit - len(self.streamed))
        new = [(row, e) for e in ids if (row, e) not in cached and (row, e) not in self.streamed]
        keys = new[: max(spare, 0)]
        if not keys:
            return 0
        slots = [self.free.pop() for _ in keys]
        batch = submit(row, [e for _, e in keys], slots)
        for g, (key, slot) in enumerate(zip(keys, slots, strict=True)):
            self.streamed[key] = (slot, (batch, g))
        return len(keys)

    def drop_unrequested(self, row: int, ids) -> int:
        """Forgets the streamed experts of table rows up to `row` that an acquire of (row, ids)
        does not request (those of later rows are guesses still ahead); -> how many."""
        wanted = {(row, e) for e in ids}
        unused = [k for k in self.streamed if k[0] <= row and k not in wanted]
        for key in unused:
            self.draining.append(self.streamed.pop(key))
        self.reclaim()
        return len(unused)

    def wait_for_slot(self) -> bool:
        """Waits for the oldest dropped guess still being read and returns its slot to the
        pool; False when none is draining. A miss the policy streams then finds a streaming
        slot whether or not that wrong read had finished: no cache decision depends on I/O
        timing."""
        if not self.draining:
            return False
        slot, (batch, g) = self.draining.pop(0)
        batch.failed(g)  # blocks until its reads are over; a failed wrong guess is only dropped
        self.free.append(slot)
        return True

    def reclaim(self) -> None:
        """Returns the slots of dropped guesses whose reads are over."""
        keep = []
        for slot, (batch, g) in self.draining:
            if batch.done(g):
                self.free.append(slot)
            else:
                keep.append((slot, (batch, g)))
        self.draining = keep
