"""Exact expert-cache simulations over routing traces (Numba), with a plain-Python reference.

Dimension key: N lookup groups, K experts per group (-1 padding), S cache slots, M keys
(an expert id for a per-layer cache, layer*E + expert for one global cache).

Model of the cache
- A *group* is one token's K experts in one layer. They are looked up together and must be
  resident together, so a miss never evicts a key of its own group (slots >= K).
- A *miss* is a lookup not served from the cache, whatever the policy does with it (admit,
  bypass, refuse admission). Every simulation starts cold; each sequence of a trace is an
  independent run (cold again).
- `belady`: every miss is admitted and the resident key requested farthest in the future is
  evicted (optimal among policies that admit every miss).
- `belady_bypass`: the fewest misses of any policy, a miss being allowed to skip the cache
  (sdq.analysis.optimal: a min-cost flow; the per-miss Belady-with-bypass rule is not
  optimal once a token's experts must be resident together).
- `lru`, `fifo`: evict the least recently used / earliest admitted key.
- `lfu`: evict the key with the fewest hits since it was admitted (ties: least recently used).
- `pin`: a static set of S keys is kept once loaded (their first request is a miss); every
  other request is read past the cache. By default the set is the S most requested keys of
  the stream itself (the best any static table can do); sdq.analysis.replay's `pin_other`
  ranks them on other sequences instead, as a popularity table from earlier runs would.
- `admit`: LRU, but a missed key is admitted only from its `min_hits`-th request on.
- `lrfu`: online frequency-aware LRU (see sdq.analysis.policies): evict the key with the
  lowest score  sum over its past requests of 2^(-age / half_life), age in groups of its scope.
- `layer_lrfu` (global scope only): evict from the layer whose next visit is farthest, then by
  lrfu score within it: the model's layer order is known to an online cache.
- `lrfu_bypass`: frequency retention with bypass, for caches smaller than a token's working
  set (where LRU cycles and hits nothing). K of the `slots` are streaming slots (as the pager
  lays them out: a bypassed expert needs room while it is used), S - K cache. A key's score
  is its decayed request count, sum over its requests of 2^(-age / half_life), age in
  tokens (groups // n_layer). A miss takes a free cache slot if there is one; otherwise it
  replaces the weakest cached key outside its group (lowest score, then least recently used)
  only if its own score, this request included, is strictly higher; else it is read past
  the cache and dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sdq.analysis.optimal import optimal_bypass_misses, optimal_bypass_misses_ref
from sdq.errors import ParamsError
from sdq.kernels.jit import kernel

# policy codes shared by the kernel and the reference
LRU, FIFO, LFU, BELADY, BELADY_BYPASS, PIN, ADMIT, LRFU, LAYER_LRFU, LRFU_BYPASS = range(10)
POLICIES = {
    "lru": LRU,
    "fifo": FIFO,
    "lfu": LFU,
    "belady": BELADY,
    "belady_bypass": BELADY_BYPASS,
    "pin": PIN,
    "admit": ADMIT,
    "lrfu": LRFU,
    "layer_lrfu": LAYER_LRFU,
    "lrfu_bypass": LRFU_BYPASS,
}
NEVER = np.iinfo(np.int64).max  # next request of a key that is never requested again


@dataclass(frozen=True)
class PolicyParams:
    """Knobs of the parameterized policies (ignored by the others)."""

    min_hits: int = 2  # admit: a key enters the cache from its min_hits-th request on
    half_life: float = 16.0  # lrfu / layer_lrfu / lrfu_bypass: tokens per halving of a request
    n_layer: int = 1  # layer_lrfu, lrfu_bypass: groups per token; key // n_expert is its layer
    n_expert: int = 1


def next_use(groups: np.ndarray) -> np.ndarray:
    """int64 [N, K]: index of the next group that requests the same key (NEVER if none)."""
    out = np.full(groups.shape, NEVER, dtype=np.int64)
    last: dict[int, int] = {}
    for g in range(groups.shape[0] - 1, -1, -1):
        for j in range(groups.shape[1]):
            k = int(groups[g, j])
            if k < 0:
                continue
            out[g, j] = last.get(k, NEVER)
            last[k] = g
    return out


def pin_set(groups: np.ndarray, n_keys: int, slots: int) -> np.ndarray:
    """bool [M]: the `slots` most requested keys (ties: lower key first)."""
    counts = np.bincount(groups[groups >= 0], minlength=n_keys)  # [M]
    order = np.lexsort((np.arange(n_keys), -counts))
    pinned = np.zeros(n_keys, dtype=np.bool_)
    top = order[: min(slots, n_keys)]
    pinned[top[counts[top] > 0]] = True
    return pinned


def check_groups(groups: np.ndarray, n_keys: int, slots: int) -> None:
    if groups.ndim != 2:
        raise ParamsError(f"lookup groups must be 2-D [N, K], got shape {groups.shape}")
    k = groups.shape[1]
    if slots < k:
        raise ParamsError(f"slots={slots} is below the {k} experts one token needs in one layer")
    if groups.size and int(groups.max()) >= n_keys:
        raise ParamsError(f"key {int(groups.max())} out of range for {n_keys} keys")
    for row in groups:
        ids = row[row >= 0]
        if len(np.unique(ids)) != len(ids):
            raise ParamsError(f"repeated expert in one lookup group: {row.tolist()}")


# ---------------------------------------------------------------------------------------------
# Numba kernel


@kernel
def _simulate_kernel(
    groups, n_keys, slots, policy, min_hits, half_life, n_layer, n_expert, nxt_use, pinned
):
    n, kk = groups.shape
    key_slot = np.full(n_keys, -1, dtype=np.int64)  # [M] slot of a resident key
    slot_key = np.full(slots, -1, dtype=np.int64)  # [S]
    stamp = np.zeros(slots, dtype=np.int64)  # [S] last use (lru, lfu ties) or admission (fifo)
    hits = np.zeros(slots, dtype=np.int64)  # [S] hits since admission (lfu)
    nxt = np.zeros(slots, dtype=np.int64)  # [S] next request (belady)
    score = np.zeros(n_keys, dtype=np.float64)  # [M] decayed request count (lrfu)
    score_t = np.zeros(n_keys, dtype=np.int64)  # [M] group time the score refers to
    current = np.full(n_keys, -1, dtype=np.int64)  # [M] last group that requested the key
    seen = np.zeros(n_keys, dtype=np.int64)  # [M] requests so far
    decay = 0.5 ** (1.0 / half_life)
    cap = slots - kk if policy == LRFU_BYPASS else slots  # cache slots (the rest stream)
    used = 0
    misses = 0
    clock = 0
    for g in range(n):
        # time in the key's own scope: tokens for layer_lrfu (g // n_layer), groups otherwise
        now_layer = g % n_layer
        for j in range(kk):
            k = groups[g, j]
            if k >= 0:
                current[k] = g
        for j in range(kk):
            k = groups[g, j]
            if k < 0:
                continue
            seen[k] += 1
            if policy == LRFU or policy == LAYER_LRFU or policy == LRFU_BYPASS:
                t = g if policy == LRFU else g // n_layer
                score[k] = score[k] * decay ** (t - score_t[k]) + 1.0
                score_t[k] = t
            s = key_slot[k]
            if s >= 0:  # hit
                if policy != FIFO:
                    stamp[s] = clock
                hits[s] += 1
                nxt[s] = nxt_use[g, j]
                clock += 1
                continue
            misses += 1
            if policy == PIN and not pinned[k]:
                clock += 1
                continue
            if policy == ADMIT and seen[k] < min_hits:
                clock += 1
                continue
            if used < cap:
                s = used
                used += 1
            elif policy == LRFU_BYPASS:
                t = g // n_layer
                victim = -1
                vs = 0.0
                for c in range(cap):
                    ck = slot_key[c]
                    if current[ck] == g:
                        continue
                    sc = score[ck] * decay ** (t - score_t[ck])
                    if victim < 0 or sc < vs or (sc == vs and stamp[c] < stamp[victim]):
                        victim = c
                        vs = sc
                if victim < 0 or not score[k] > vs:
                    clock += 1
                    continue  # read past the cache
                key_slot[slot_key[victim]] = -1
                s = victim
            else:
                victim = -1
                for c in range(slots):
                    ck = slot_key[c]
                    if current[ck] == g:
                        continue  # requested by this group: must stay
                    if victim < 0:
                        victim = c
                        continue
                    if policy == BELADY:
                        better = nxt[c] > nxt[victim]
                    elif policy == LFU:
                        better = hits[c] < hits[victim] or (
                            hits[c] == hits[victim] and stamp[c] < stamp[victim]
                        )
                    elif policy == LRFU or policy == LAYER_LRFU:
                        vk = slot_key[victim]
                        if policy == LAYER_LRFU:
                            t = g // n_layer
                            # layers until this key's layer is visited again (0 = visited next)
                            dc = (ck // n_expert - now_layer - 1) % n_layer
                            dv = (vk // n_expert - now_layer - 1) % n_layer
                        else:
                            t = g
                            dc = 0
                            dv = 0
                        sc = score[ck] * decay ** (t - score_t[ck])
                        sv = score[vk] * decay ** (t - score_t[vk])
                        better = dc > dv or (
                            dc == dv and (sc < sv or (sc == sv and stamp[c] < stamp[victim]))
                        )
                    else:  # LRU, FIFO, ADMIT
                        better = stamp[c] < stamp[victim]
                    if better:
                        victim = c
                key_slot[slot_key[victim]] = -1
                s = victim
            slot_key[s] = k
            key_slot[k] = s
            stamp[s] = clock
            hits[s] = 0
            nxt[s] = nxt_use[g, j]
            clock += 1
    return misses


def simulate_groups(
    groups: np.ndarray,
    n_keys: int,
    slots: int,
    policy: str,
    params: PolicyParams = PolicyParams(),
    check: bool = True,
    pinned: np.ndarray | None = None,
) -> int:
    """Misses of one cold cache of `slots` slots over a stream of lookup groups [N, K].

    `pinned` (bool [M], pin only): the static set; default: the stream's own top `slots` keys.
    """
    groups = np.ascontiguousarray(groups, dtype=np.int64)  # [N, K]
    if policy not in POLICIES:
        raise ParamsError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")
    if check:
        check_groups(groups, n_keys, slots)
    if groups.shape[0] == 0:
        return 0
    code = POLICIES[policy]
    if code == BELADY_BYPASS:
        return optimal_bypass_misses(groups, slots)
    nxt = next_use(groups) if code == BELADY else np.zeros((1, 1), np.int64)
    if code != PIN:
        pinned = np.zeros(1, np.bool_)
    elif pinned is None:
        pinned = pin_set(groups, n_keys, slots)
    else:
        pinned = np.asarray(pinned, dtype=np.bool_)
        if pinned.shape != (n_keys,) or int(pinned.sum()) > slots:
            raise ParamsError(f"pinned set of {int(pinned.sum())} keys does not fit {slots} slots")
    n_layer = params.n_layer if code in (LAYER_LRFU, LRFU_BYPASS) else 1
    return int(
        _simulate_kernel(
            groups,
            n_keys,
            slots,
            code,
            params.min_hits,
            float(params.half_life),
            n_layer,
            max(params.n_expert, 1),
            nxt,
            pinned,
        )
    )


# ---------------------------------------------------------------------------------------------
# plain-Python reference: the same cache as dictionaries, written for reading, not speed


def simulate_groups_ref(
    groups: np.ndarray,
    n_keys: int,
    slots: int,
    policy: str,
    params: PolicyParams = PolicyParams(),
    pinned: np.ndarray | None = None,
) -> int:
    groups = np.asarray(groups, dtype=np.int64)
    check_groups(groups, n_keys, slots)
    code = POLICIES[policy]
    if code == BELADY_BYPASS:
        return optimal_bypass_misses_ref(groups, slots)
    nxt_use = next_use(groups)
    if pinned is None:
        pinned = pin_set(groups, n_keys, slots)
    pinned = set(np.flatnonzero(pinned).tolist())
    n_layer = params.n_layer if code in (LAYER_LRFU, LRFU_BYPASS) else 1
    decay = 0.5 ** (1.0 / params.half_life)
    capacity = slots - groups.shape[1] if code == LRFU_BYPASS else slots
    cache: dict[int, dict] = {}  # key -> {"stamp", "hits", "next"}
    seen: dict[int, int] = {}
    score: dict[int, tuple[float, int]] = {}
    clock = 0
    misses = 0
    for g, row in enumerate(groups.tolist()):
        group = {k for k in row if k >= 0}
        for j, k in enumerate(row):
            if k < 0:
                continue
            seen[k] = seen.get(k, 0) + 1
            t = g // n_layer
            if code in (LRFU, LAYER_LRFU, LRFU_BYPASS):
                s, st = score.get(k, (0.0, t))
                score[k] = (s * decay ** (t - st) + 1.0, t)
            if k in cache:
                e = cache[k]
                if code != FIFO:
                    e["stamp"] = clock
                e["hits"] += 1
                e["next"] = int(nxt_use[g, j])
                clock += 1
                continue
            misses += 1
            admit = not (code == PIN and k not in pinned) and not (
                code == ADMIT and seen[k] < params.min_hits
            )
            if code == LRFU_BYPASS:
                if len(cache) >= capacity:

                    def now(c, t=t):
                        s, st = score[c]
                        return s * decay ** (t - st)

                    candidates = [c for c in cache if c not in group]
                    weakest = min(
                        candidates, key=lambda c: (now(c), cache[c]["stamp"]), default=None
                    )
                    if weakest is not None and score[k][0] > now(weakest):
                        del cache[weakest]
                    else:
                        admit = False
            elif admit and len(cache) >= slots:
                candidates = [c for c in cache if c not in group]
                if code == BELADY:
                    victim = max(candidates, key=lambda c: cache[c]["next"])
                elif code == LFU:
                    victim = min(candidates, key=lambda c: (cache[c]["hits"], cache[c]["stamp"]))
                elif code in (LRFU, LAYER_LRFU):

                    def rank(c, g=g, t=t):
                        s, st = score[c]
                        far = (c // params.n_expert - g % n_layer - 1) % n_layer
                        if code == LRFU:
                            far = 0
                        return (-far, s * decay ** (t - st), cache[c]["stamp"])

                    victim = min(candidates, key=rank)
                else:
                    victim = min(candidates, key=lambda c: cache[c]["stamp"])
                if admit:
                    del cache[victim]
            if admit:
                cache[k] = {"stamp": clock, "hits": 0, "next": int(nxt_use[g, j])}
            clock += 1
    return misses


# ---------------------------------------------------------------------------------------------
# brute force: the least misses any cache of `slots` slots can achieve (tiny traces only)


def optimal_misses(groups: np.ndarray, slots: int, bypass: bool) -> int:
    """Exhaustive search over cache contents after each group.

    Without bypass every key of a group is resident after it (any residents outside the group
    may be dropped); with bypass the group's hits stay and the cache after the group is any
    subset (of size <= slots) of what it held plus the group's keys.
    """
    from itertools import combinations

    states = {frozenset(): 0}
    for row in np.asarray(groups).tolist():
        group = frozenset(k for k in row if k >= 0)
        nxt: dict[frozenset, int] = {}
        for state, cost in states.items():
            cost += len(group - state)
            pool = state | group
            if bypass:  # hits stay (they serve this group); misses may be kept or not
                must, optional = group & state, sorted(pool - (group & state))
            else:
                must, optional = group, sorted(state - group)
            room = slots - len(must)
            for r in range(0, min(room, len(optional)) + 1):
                for extra in combinations(optional, r):
                    s = must | frozenset(extra)
                    if cost < nxt.get(s, 1 << 60):
                        nxt[s] = cost
        states = nxt
    return min(states.values())
