"""One in-memory form for every routing trace: per sequence, per phase, per token, per layer.

Dimension key: T tokens of a phase, L MoE layers (in file order), K experts used per token,
E routed experts per layer, N lookup groups of a simulation stream.

A trace holds one or more sequences (prompts, problems); each is an independent run of a
model, so simulations start each sequence from a cold cache. A missing entry (a token the
recorder did not write for some layer) is -1 in `experts`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class PhaseRoutes:
    """The routing of one phase of one sequence."""

    experts: np.ndarray  # int32 [T, L, K]; -1 where not recorded
    weights: np.ndarray | None = None  # float32 [T, L, K]; NaN where not recorded; None if unknown
    tokens: tuple | None = None  # token text or ids, one per token, when the source has them
    positions: np.ndarray | None = None  # int64 [T] position in the sequence (None: 0..T-1)

    @property
    def n_tokens(self) -> int:
        return int(self.experts.shape[0])

    def recorded(self) -> np.ndarray:
        """bool [T, L]: the token's routing for that layer was recorded."""
        return (self.experts >= 0).any(axis=2)


@dataclass(frozen=True)
class Sequence:
    name: str
    prefill: PhaseRoutes
    decode: PhaseRoutes
    # False when tokens of different layers cannot be matched exactly (a recorder dropped
    # some tokens of some layers): per-layer replay stays exact, cross-layer order does not.
    aligned: bool = True

    def phase(self, name: str) -> PhaseRoutes:
        return self.prefill if name == "prefill" else self.decode


@dataclass(frozen=True)
class RouteTrace:
    """Routing of one model on one or more sequences."""

    source: str  # file it was read from
    format: str  # reader that read it: engine, granite, mixtral, deepseek
    model: str  # model name as the source states it
    layer_ids: tuple[int, ...]  # model layer index of each of the L columns
    n_expert: int  # E
    top_k: int  # K
    sequences: tuple[Sequence, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)  # caveats a reader found

    @property
    def n_layer(self) -> int:
        return len(self.layer_ids)

    @property
    def aligned(self) -> bool:
        return all(s.aligned for s in self.sequences)

    def phases_present(self) -> tuple[str, ...]:
        return tuple(p for p in PHASES if any(s.phase(p).n_tokens for s in self.sequences))

    def lookups(self, phase: str = "all") -> int:
        """Number of (token, layer, expert) requests in the chosen phase(s)."""
        return int(sum((x >= 0).sum() for x in phase_blocks(self, phase)))


def select_phases(phase: str) -> tuple[str, ...]:
    if phase == "all":
        return PHASES
    if phase not in PHASES:
        raise ValueError(f"phase must be prefill, decode or all, got {phase!r}")
    return (phase,)


def phase_blocks(trace: RouteTrace, phase: str = "all") -> list[np.ndarray]:
    """Per sequence, the [T, L, K] routing of the chosen phase(s), prefill before decode."""
    names = select_phases(phase)
    blocks = []
    for seq in trace.sequences:
        parts = [seq.phase(p).experts for p in names if seq.phase(p).n_tokens]
        if parts:
            blocks.append(np.concatenate(parts, axis=0))
    return blocks


def empty_phase(n_layer: int, top_k: int) -> PhaseRoutes:
    return PhaseRoutes(experts=np.full((0, n_layer, top_k), -1, dtype=np.int32))
