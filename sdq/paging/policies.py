"""Replacement policies of the expert cache: which slot a missed expert takes, if any.

Each policy is one small class with the same name and decisions as the cache simulation of that
name in sdq.analysis.simulate (tests/test_pager_policy.py replays traces through both). An
instance is the policy applied to one acquire: the cache makes it at the acquire's first miss
and asks `slot_for(key)` for every missed key; an acquire never evicts an expert it requests
itself (`keep`). Evicting an entry goes through Residents.evict, which counts it.

  lru          every miss takes a slot: a free one, else the least recently used expert's.
  layer_lrfu   every miss takes a slot; the victim is a cached expert of the layer whose next
               visit is farthest (the layer order is known), the lowest score within it, then
               the least recent.
  lrfu_bypass  frequency retention with bypass, for arenas that cannot hold one token's
               experts over all layers (where LRU evicts exactly what the next token needs).
               A miss takes a free slot, else replaces the weakest cached expert (lowest
               score, then least recent) only if its own score, this lookup included, is
               strictly higher; otherwise it is read into a streaming slot and dropped at
               release. K streaming slots, plus the prefetch streaming slots.
  auto         lrfu_bypass when the slots are fewer than n_layers x K and leave 2K beside the
               prefetch slots (K cached, K streaming), else layer_lrfu.

A score is an expert's decayed request count: the sum over its lookups of 2^(-age / half_life),
age in tokens. The cache advances the token clock and updates scores; policies only read them.

Slot needs: every policy needs K cache slots (one layer's experts pinned at once) plus its
streaming slots; `split_slots` and `min_slots` are what the memory plan (sdq.run.plan) and the
cache both use, so a plan that passes never fails in the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from sdq.errors import PlanError
from sdq.paging.residents import Key, Residents

POLICIES = ("auto", "lru", "lrfu_bypass", "layer_lrfu")


class LRU:
    """Evicts the least recently used expert."""

    name = "lru"
    scored = False  # keeps decayed request counts
    bypasses = False  # may read a miss past the cache

    @staticmethod
    def streaming_slots(n_expert_used: int, prefetch_slots: int) -> int:
        return 0  # prefetches take cache slots, where a later acquire finds them

    def __init__(self, residents: Residents, row: int, keep):
        self.residents = residents
        self.keep = keep

    def slot_for(self, key: Key) -> int:
        free = self.residents.free
        return free.pop() if free else evict_least_recent(self.residents, self.keep)


class LayerLRFU:
    """Evicts from the layer visited farthest from now, the lowest score, then least recent."""

    name = "layer_lrfu"
    scored = True
    bypasses = False

    @staticmethod
    def streaming_slots(n_expert_used: int, prefetch_slots: int) -> int:
        return 0  # as lru

    def __init__(self, residents: Residents, row: int, keep):
        self.residents = residents
        self.keep = keep
        n = len(residents.row_lru)
        # table rows nearest first, so the farthest pops first; a row's entries are ranked
        # only when its turn comes (usually one row per acquire)
        self.rows = sorted(range(n), key=lambda r: (r - row - 1) % n)
        self.ranked: list[tuple[float, int, Key]] = []  # current row's candidates, victim last

    def slot_for(self, key: Key) -> int:
        res = self.residents
        if res.free:
            return res.free.pop()
        victim = self._next_victim()
        if victim is not None:
            return res.evict(victim)
        return evict_least_recent(res, self.keep)

    def _next_victim(self) -> Key | None:
        alive = self.residents.entries
        while True:
            while self.ranked:
                key = self.ranked.pop()[-1]
                if key in alive:  # not evicted meanwhile
                    return key
            if not self.rows:
                return None
            self.ranked = self._rank(self.rows.pop())

    def _rank(self, row: int) -> list[tuple[float, int, Key]]:
        """[(-score, -recency position, key)] of row's evictable entries, the victim last."""
        res = self.residents
        out = [(-res.score_now(k), -i, k) for i, k in res.evictable(res.row_lru[row], self.keep)]
        out.sort()
        return out


class LRFUBypass:
    """Replaces the weakest cached expert only for a stronger one; else streams the miss."""

    name = "lrfu_bypass"
    scored = True
    bypasses = True

    @staticmethod
    def streaming_slots(n_expert_used: int, prefetch_slots: int) -> int:
        return n_expert_used + prefetch_slots  # one layer's bypassed misses, the prefetches

    def __init__(self, residents: Residents, row: int, keep):
        self.residents = residents
        self.keep = keep
        # [(score, recency position, key)] over evictable entries, the weakest last
        weakest = [
            (residents.score_now(k), i, k) for i, k in residents.evictable(residents.lru, keep)
        ]
        weakest.sort(reverse=True)
        self.weakest = weakest

    def slot_for(self, key: Key) -> int | None:
        """A free slot, or the weakest entry's if key scores higher; None: stream key."""
        res = self.residents
        if res.free:
            return res.free.pop()
        weakest = self.weakest
        while weakest and weakest[-1][2] not in res.entries:
            weakest.pop()  # taken by an overflow slot of this acquire
        if not weakest or not res.score_now(key) > weakest[-1][0]:
            return None
        return res.evict(weakest.pop()[2])

    def overflow_slot(self) -> int:
        """A slot for a miss to stream when no streaming slot is left: the least recent's."""
        return evict_least_recent(self.residents, self.keep)


BY_NAME = {p.name: p for p in (LRU, LayerLRFU, LRFUBypass)}


def evict_least_recent(residents: Residents, keep) -> int:
    """Evicts the least recently used evictable entry; -> its slot. PlanError when every entry
    is pinned or loading."""
    for _, key in residents.evictable(residents.lru, keep):
        return residents.evict(key)  # the first only: the order changes as it goes
    raise PlanError(
        f"all {len(residents.lru)} slots of the arena are pinned or loading: release handles "
        f"before acquiring more (max_acquire = {residents.capacity})"
    )


def choose_policy(
    policy: str, slots: int, n_layers: int, n_expert_used: int, prefetch_slots: int
) -> str:
    """`policy` itself, or what "auto" means for this arena (module docstring)."""
    if policy != "auto":
        return policy
    K = n_expert_used
    small = slots < n_layers * K and slots - prefetch_slots >= 2 * K
    return "lrfu_bypass" if small else "layer_lrfu"


@dataclass(frozen=True)
class SlotSplit:
    """How a policy uses the arena: slot numbers [0, streaming) stream, the rest cache."""

    policy: str  # the replacement policy, "auto" resolved
    cache: int  # slots the policy manages
    streaming: int  # slots outside the cache: lrfu_bypass's K and its prefetch slots


def split_slots(
    policy: str, slots: int, n_layers: int, n_expert_used: int, prefetch_slots: int
) -> SlotSplit:
    chosen = choose_policy(policy, slots, n_layers, n_expert_used, prefetch_slots)
    streaming = BY_NAME[chosen].streaming_slots(n_expert_used, prefetch_slots)
    return SlotSplit(chosen, slots - streaming, streaming)


def min_slots(policy: str, n_expert_used: int, prefetch_slots: int) -> int:
    """The fewest slots `policy` works with: K cache slots plus its streaming slots ("auto"
    chooses layer_lrfu below lrfu_bypass's minimum, so it needs K)."""
    if policy == "auto":
        return n_expert_used
    return n_expert_used + BY_NAME[policy].streaming_slots(n_expert_used, prefetch_slots)
