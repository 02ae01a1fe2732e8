"""The fewest misses any cache can achieve when a miss may bypass it: a min-cost flow.

Dimension key: N lookup groups, K keys per group (-1 padding), S slots, Q lookups (valid
entries of the [N, K] groups, row-major).

Why a flow and not a replacement rule: for one request at a time, "admit a miss only if it
is requested again before the farthest resident" (Belady with bypass) is optimal. When a
token's K experts must be resident together -- a group's hits cannot give up their slots to
the same group's misses -- that rule is no longer optimal (tests/test_analysis_optimal.py
shows traces where it loses a hit). The exact optimum is a min-cost flow of S units (slots)
through time:

    idle chain   T_b -> T_b+1      capacity S, cost 0      (free slots before group b+1)
    admit        T_b -> R_i        capacity 1, cost 0      (lookup i of group b takes a slot)
    keep         R_i -> R_j        capacity 1, cost -1     (its key stays until its next
                                                            request j: one hit)
    release      R_i -> T_b+1      capacity 1, cost 0      (the slot is free after group b)

A slot that serves a hit at group b leaves through `keep` or `release` (to T_b+1), never to
an admission of group b: the co-residency rule. Hits = -cost; misses = Q - hits.
"""

from __future__ import annotations

import heapq

import numpy as np

from sdq.kernels.jit import kernel


def _build(groups: np.ndarray, slots: int):
    """Edge list of the flow network: (tail, head, capacity, cost) arrays, node count, Q."""
    n = groups.shape[0]
    valid = groups >= 0  # [N, K]
    q = int(valid.sum())
    grp = np.repeat(np.arange(n), valid.sum(axis=1))  # [Q] group of each lookup
    keys = groups[valid]  # [Q]
    nxt = np.full(q, -1, dtype=np.int64)  # [Q] lookup index of the key's next request
    last: dict[int, int] = {}
    for i in range(q - 1, -1, -1):
        k = int(keys[i])
        nxt[i] = last.get(k, -1)
        last[k] = i
    r = n + 1 + np.arange(q)  # [Q] node id of each lookup; T_b is node b
    has = nxt >= 0
    tail = np.concatenate([np.arange(n), grp, r, r[has]])
    head = np.concatenate([np.arange(1, n + 1), r, grp + 1, n + 1 + nxt[has]])
    cap = np.concatenate([np.full(n, slots), np.ones(2 * q + int(has.sum()), dtype=np.int64)])
    cost = np.concatenate([np.zeros(n + 2 * q, dtype=np.int64), -np.ones(int(has.sum()), np.int64)])
    return tail.astype(np.int64), head.astype(np.int64), cap, cost, n + 1 + q, q


def optimal_bypass_misses(groups: np.ndarray, slots: int) -> int:
    """Fewest misses of a cache of `slots` slots over [N, K] lookup groups, bypass allowed."""
    groups = np.asarray(groups, dtype=np.int64)
    if groups.shape[0] == 0:
        return 0
    tail, head, cap, cost, n_nodes, q = _build(groups, slots)
    hits = _flow_kernel(tail, head, cap, cost, n_nodes, 0, groups.shape[0], slots)
    return q - int(hits)


@kernel
def _flow_kernel(tail, head, cap0, cost0, n_nodes, source, sink, units):
    """Successive shortest paths (Dijkstra on reduced costs); returns -(min cost)."""
    m = tail.shape[0]
    # residual graph: edge 2e forward, 2e+1 backward; adjacency as linked lists
    to = np.empty(2 * m, dtype=np.int64)
    cap = np.empty(2 * m, dtype=np.int64)
    cost = np.empty(2 * m, dtype=np.int64)
    nxt = np.empty(2 * m, dtype=np.int64)
    first = np.full(n_nodes, -1, dtype=np.int64)
    for e in range(m):
        u, v = tail[e], head[e]
        to[2 * e], cap[2 * e], cost[2 * e] = v, cap0[e], cost0[e]
        to[2 * e + 1], cap[2 * e + 1], cost[2 * e + 1] = u, 0, -cost0[e]
        nxt[2 * e] = first[u]
        first[u] = 2 * e
        nxt[2 * e + 1] = first[v]
        first[v] = 2 * e + 1
    # potentials: shortest distances in the initial graph, a DAG whose node ids are not in
    # topological order (T_b+1 has a lower id than group b's lookups), so relax by time
    big = np.int64(1) << 60
    pot = np.full(n_nodes, big, dtype=np.int64)
    pot[source] = 0
    order = _topological(first, nxt, to, cap, n_nodes)
    for u in order:
        if pot[u] == big:
            continue
        e = first[u]
        while e >= 0:
            if cap[e] > 0 and pot[u] + cost[e] < pot[to[e]]:
                pot[to[e]] = pot[u] + cost[e]
            e = nxt[e]
    for i in range(n_nodes):
        if pot[i] == big:
            pot[i] = 0
    dist = np.empty(n_nodes, dtype=np.int64)
    prev_e = np.empty(n_nodes, dtype=np.int64)
    done = np.zeros(n_nodes, dtype=np.bool_)
    total = 0
    sent = 0
    while sent < units:
        dist[:] = big
        prev_e[:] = -1
        done[:] = False
        dist[source] = 0
        heap = [(np.int64(0), np.int64(source))]
        while len(heap) > 0:
            d, u = heapq.heappop(heap)
            if done[u]:
                continue
            done[u] = True
            e = first[u]
            while e >= 0:
                if cap[e] > 0:
                    v = to[e]
                    nd = d + cost[e] + pot[u] - pot[v]
                    if nd < dist[v]:
                        dist[v] = nd
                        prev_e[v] = e
                        heapq.heappush(heap, (nd, v))
                e = nxt[e]
        if dist[sink] == big:
            break
        path_cost = dist[sink] - pot[source] + pot[sink]
        if path_cost >= 0:
            break  # no path saves a miss: the remaining slots stay idle
        far = 0
        for i in range(n_nodes):
            if dist[i] < big and dist[i] > far:
                far = dist[i]
        for i in range(n_nodes):  # unreached nodes move by the largest distance, so that
            pot[i] += dist[i] if dist[i] < big else far  # no reduced cost turns negative
        push = units - sent
        v = sink
        while v != source:
            e = prev_e[v]
            if cap[e] < push:
                push = cap[e]
            v = to[e ^ 1]
        v = sink
        while v != source:
            e = prev_e[v]
            cap[e] -= push
            cap[e ^ 1] += push
            v = to[e ^ 1]
        total += push * path_cost
        sent += push
    return -total


@kernel
def _topological(first, nxt, to, cap, n_nodes):
    """Kahn's order over forward (capacity > 0) edges."""
    indeg = np.zeros(n_nodes, dtype=np.int64)
    for u in range(n_nodes):
        e = first[u]
        while e >= 0:
            if cap[e] > 0:
                indeg[to[e]] += 1
            e = nxt[e]
    order = np.empty(n_nodes, dtype=np.int64)
    stack = np.empty(n_nodes, dtype=np.int64)
    top = 0
    for u in range(n_nodes):
        if indeg[u] == 0:
            stack[top] = u
            top += 1
    k = 0
    while top > 0:
        top -= 1
        u = stack[top]
        order[k] = u
        k += 1
        e = first[u]
        while e >= 0:
            if cap[e] > 0:
                v = to[e]
                indeg[v] -= 1
                if indeg[v] == 0:
                    stack[top] = v
                    top += 1
            e = nxt[e]
    return order[:k]


def optimal_bypass_misses_ref(groups: np.ndarray, slots: int) -> int:
    """The same flow solved by plain successive shortest paths with Bellman-Ford."""
    groups = np.asarray(groups, dtype=np.int64)
    if groups.shape[0] == 0:
        return 0
    tail, head, cap0, cost0, n_nodes, q = _build(groups, slots)
    edges: list[list[int]] = []  # [head, capacity, cost, reverse index]
    adj: list[list[int]] = [[] for _ in range(n_nodes)]
    for u, v, c, w in zip(tail.tolist(), head.tolist(), cap0.tolist(), cost0.tolist(), strict=True):
        adj[u].append(len(edges))
        edges.append([v, c, w, len(edges) + 1])
        adj[v].append(len(edges))
        edges.append([u, 0, -w, len(edges) - 1])
    source, sink = 0, groups.shape[0]
    saved = 0
    for _ in range(slots):
        dist = [None] * n_nodes
        via = [-1] * n_nodes
        dist[source] = 0
        queue, inq = [source], {source}
        while queue:  # SPFA
            u = queue.pop(0)
            inq.discard(u)
            for e in adj[u]:
                v, c, w, _ = edges[e]
                if c > 0 and (dist[v] is None or dist[u] + w < dist[v]):
                    dist[v], via[v] = dist[u] + w, e
                    if v not in inq:
                        queue.append(v)
                        inq.add(v)
        if dist[sink] is None or dist[sink] >= 0:
            break
        v = sink
        while v != source:
            e = via[v]
            edges[e][1] -= 1
            edges[edges[e][3]][1] += 1
            v = edges[edges[e][3]][0]
        saved -= dist[sink]
    return q - saved
