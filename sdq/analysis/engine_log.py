"""sdq's own route log (`sdq chat --route-log`) with the run's token ids attached: the route log
itself carries no tokens, `sdq chat --json` prints them."""

from __future__ import annotations

from dataclasses import replace

from sdq.analysis.trace import RouteTrace


def attach_tokens(trace: RouteTrace, stream: list[int]) -> RouteTrace:
    """Give each routed position of the (single) sequence its token id from `stream`."""
    seqs = []
    for seq in trace.sequences:
        phases = {}
        for name in ("prefill", "decode"):
            ph = seq.phase(name)
            pos = ph.positions if ph.positions is not None else range(ph.n_tokens)
            toks = tuple(stream[p] if p < len(stream) else None for p in pos)
            phases[name] = replace(ph, tokens=toks if ph.n_tokens else None)
        seqs.append(replace(seq, **phases))
    return replace(trace, sequences=tuple(seqs))
