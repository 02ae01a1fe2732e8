"""Replay a RouteTrace through the cache simulations: lookup streams per scope, sweeps.

Dimension key: T tokens, L MoE layers, K experts per token, E experts per layer, N groups.

Scopes
- `layer`: one cache of `slots` slots per layer (the per-layer arena of the seed's pager);
  a layer's stream is its tokens in order, tokens the recorder missed left out.
- `global`: one cache of `slots` slots for all layers; keys are layer*E + expert and the
  stream visits layer 0..L-1 for each token in turn (as the forward pass does).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from sdq.analysis.simulate import POLICIES, PolicyParams, pin_set, simulate_groups
from sdq.analysis.trace import RouteTrace, phase_blocks
from sdq.errors import ParamsError

SCOPES = ("layer", "global")
# policies a trace can be replayed with: the kernel's, plus a static pin ranked on the other
# sequences of the trace (a popularity table from earlier runs, not from the run it serves)
TRACE_POLICIES = (*POLICIES, "pin_other")


@dataclass(frozen=True)
class SimResult:
    policy: str
    slots: int
    scope: str
    phase: str
    lookups: int
    misses: int

    @property
    def hits(self) -> int:
        return self.lookups - self.misses

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else float("nan")

    def row(self) -> dict:
        return {
            "policy": self.policy,
            "slots": self.slots,
            "scope": self.scope,
            "phase": self.phase,
            "lookups": self.lookups,
            "misses": self.misses,
            "hit_rate": self.hit_rate,
        }


def layer_streams(block: np.ndarray) -> list[np.ndarray]:
    """Per layer, the [N, K] groups of one sequence (rows with no recorded expert left out)."""
    out = []
    for j in range(block.shape[1]):
        g = block[:, j, :]  # [T, K]
        out.append(g[(g >= 0).any(axis=1)])
    return out


def global_stream(block: np.ndarray, n_expert: int) -> np.ndarray:
    """[T*L, K] keys layer*E + expert in forward order; unrecorded entries stay -1."""
    T, L, K = block.shape
    layer = np.arange(L, dtype=np.int64)[None, :, None]  # [1, L, 1]
    keys = np.where(block >= 0, block.astype(np.int64) + layer * n_expert, -1)  # [T, L, K]
    return keys.reshape(T * L, K)


def simulate_trace(
    trace: RouteTrace,
    policy: str,
    slots: int,
    scope: str = "layer",
    phase: str = "decode",
    params: PolicyParams | None = None,
) -> SimResult:
    """Misses of `policy` over every sequence of the trace (each from a cold cache)."""
    per_seq = simulate_sequences(trace, policy, slots, scope, phase, params)
    lookups = sum(r.lookups for r in per_seq)
    misses = sum(r.misses for r in per_seq)
    return SimResult(policy, slots, scope, phase, lookups, misses)


def simulate_sequences(
    trace: RouteTrace,
    policy: str,
    slots: int,
    scope: str = "layer",
    phase: str = "decode",
    params: PolicyParams | None = None,
) -> list[SimResult]:
    """One SimResult per sequence of the trace (with `phase` tokens), each from a cold cache:
    the unit of the paired per-sequence comparisons (policy A vs B on the same sequence)."""
    if scope not in SCOPES:
        raise ParamsError(f"scope must be layer or global, got {scope!r}")
    if policy not in TRACE_POLICIES:
        raise ParamsError(f"unknown policy {policy!r} (known: {', '.join(TRACE_POLICIES)})")
    if policy == "layer_lrfu" and scope != "global":
        raise ParamsError("policy layer_lrfu needs --scope global (it ranks layers)")
    if slots < trace.top_k:
        raise ParamsError(f"slots={slots} is below top_k={trace.top_k} experts one token needs")
    params = params or PolicyParams()
    E, L = trace.n_expert, trace.n_layer
    blocks = phase_blocks(trace, phase)
    other = policy == "pin_other"
    if other and len(blocks) < 2:
        raise ParamsError(
            f"pin_other ranks experts on the trace's other sequences; {trace.source} has "
            f"{len(blocks)} with {phase} tokens"
        )
    kernel_policy = "pin" if other else policy
    out = []
    for i, block in enumerate(blocks):
        rest = [b for j, b in enumerate(blocks) if j != i]
        lookups = int((block >= 0).sum())
        misses = 0
        if scope == "layer":
            for j, g in enumerate(layer_streams(block)):
                pinned = None
                if other:
                    ranked = np.concatenate([layer_streams(b)[j] for b in rest])
                    pinned = pin_set(ranked, E, slots)
                misses += simulate_groups(
                    g, E, slots, kernel_policy, params, check=False, pinned=pinned
                )
        else:
            p = PolicyParams(params.min_hits, params.half_life, L, E)
            g = global_stream(block, E)
            pinned = None
            if other:
                pinned = pin_set(np.concatenate([global_stream(b, E) for b in rest]), E * L, slots)
            misses += simulate_groups(g, E * L, slots, kernel_policy, p, check=False, pinned=pinned)
        out.append(SimResult(policy, slots, scope, phase, lookups, int(misses)))
    return out


def sweep(
    trace: RouteTrace,
    policies: Iterable[str],
    slots: Iterable[int],
    scope: str = "layer",
    phase: str = "decode",
    params: PolicyParams | None = None,
) -> list[SimResult]:
    return [simulate_trace(trace, p, s, scope, phase, params) for s in slots for p in policies]
