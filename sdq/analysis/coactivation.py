"""Co-activation: which experts one token uses together, and a layout that keeps them close.

Dimension key: T tokens, L MoE layers (the model's ExpertTable rows), K experts a token uses,
E experts per layer.

`coactivation_order` turns routing into a per-layer order of the experts for a pack
(sdq.paging.pack): a chain built greedily from the co-activation counts: start at the most used
expert, then always append the unplaced expert used most often together with the last one
placed (ties: the more used, then the lower id). Experts one token uses together then tend to
sit side by side, so the pager's mode `merged` can read them with one request.
"""

from __future__ import annotations

import numpy as np

from sdq.errors import TraceError


def coactivation_order(experts_tle: np.ndarray, n_expert: int) -> np.ndarray:
    """int64 [L, E]: per row, the greedy co-activation chain (module docstring).

    experts_tle: int [T, L, K] routed ids per token and row, -1 where not recorded."""
    T, L, K = experts_tle.shape
    order = np.zeros((L, n_expert), dtype=np.int64)
    for row in range(L):
        ids = experts_tle[:, row, :]  # [T, K]
        ids = ids[(ids >= 0).all(axis=1)]  # [T', K] tokens recorded for this row
        hot = np.zeros((len(ids), n_expert), dtype=np.int64)  # [T', E] one-hot per token
        np.put_along_axis(hot, ids, 1, axis=1)
        together = hot.T @ hot  # [E, E] tokens that used both
        used = np.diag(together).copy()  # [E]
        np.fill_diagonal(together, -1)
        placed = np.zeros(n_expert, dtype=bool)
        # most used first, ties to the lower id
        last = int(np.lexsort((np.arange(n_expert), -used))[0])
        chain = [last]
        placed[last] = True
        for _ in range(n_expert - 1):
            # score: together with the last, then use, then lower id; placed ones excluded
            key = np.lexsort((np.arange(n_expert), -used, -together[last]))
            nxt = int(next(e for e in key if not placed[e]))
            chain.append(nxt)
            placed[nxt] = True
            last = nxt
        order[row] = chain
    return order


def order_from_log(path, table) -> np.ndarray:
    """The co-activation order [L, E] from a route log or trace; TraceError when it does not
    fit the model (layers, expert ids)."""
    from sdq.analysis.readers import read_trace

    trace = read_trace(path, n_expert=table.n_expert)
    if trace.n_expert != table.n_expert:
        raise TraceError(
            f"{path}: route log has {trace.n_expert} experts per layer, the model {table.n_expert}"
        )
    missing = [lay for lay in table.layers if lay not in trace.layer_ids]
    if missing:
        raise TraceError(
            f"{path}: route log has no routes for MoE layer {missing[0]} "
            f"({len(missing)} of {len(table.layers)} layers missing)"
        )
    cols = [trace.layer_ids.index(lay) for lay in table.layers]
    parts = []
    for seq in trace.sequences:
        for phase in (seq.prefill, seq.decode):
            if phase is not None and phase.n_tokens:
                parts.append(phase.experts[:, cols, :])  # [T, L, K]
    if not parts:
        raise TraceError(f"{path}: route log has no routed tokens")
    return coactivation_order(np.concatenate(parts, axis=0), table.n_expert)
