"""The routing notebook's tables (T6-T8) as pandas DataFrames, one function per table.

A `Source` is one trace plus the token streams it offers for n-gram drafting. Slot counts are
given as fractions of the experts a cache scope holds (E per layer, L*E in all) so that traces
with 8, 32 or 64 experts per layer share one axis.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from sdq.analysis.ngram import mean_accepted, prompt_lookup, text_tokens, verify_reads
from sdq.analysis.readers import read_texts, read_trace
from sdq.analysis.replay import simulate_trace
from sdq.analysis.reuse import (
    layer_popularity,
    only_once_fraction,
    reuse_histogram,
    union_reads,
)
from sdq.analysis.simulate import PolicyParams
from sdq.analysis.trace import RouteTrace, phase_blocks
from sdq.errors import TraceError


@dataclass(frozen=True)
class Stream:
    name: str
    tokens: list
    start: int  # index of the first token that is produced (the rest is the prompt)
    token_kind: str  # where the tokens come from
    block: np.ndarray | None = None  # int32 [T, L, K] routing, row p = input token p


@dataclass(frozen=True)
class Source:
    label: str
    trace: RouteTrace
    phase: str
    streams: tuple[Stream, ...] = field(default_factory=tuple)

    def blocks(self) -> list[np.ndarray]:
        return phase_blocks(self.trace, self.phase)


def real_source(root: str | Path, pattern: str, label: str | None = None) -> Source:
    """A real trace under `root`; a glob `pattern` joins its files' sequences into one source.

    Token streams: DeepSeek's own tokens, Mixtral's generated text as word proxies.
    """
    root = Path(root)
    paths = sorted(root.glob(pattern)) if any(c in pattern for c in "*?[") else [root / pattern]
    if not paths:
        raise TraceError(f"{root / pattern}: no such trace file")
    traces = [read_trace(p) for p in paths]
    trace = traces[0] if len(traces) == 1 else merge_traces(traces, str(root / pattern))
    phase = "decode" if "decode" in trace.phases_present() else "prefill"
    streams = []
    if trace.format == "deepseek":
        for s in trace.sequences:
            toks = list(s.prefill.tokens)
            streams.append(
                Stream(s.name, toks, 1, "model tokens (prompt, teacher-forced)", s.prefill.experts)
            )
    elif trace.format == "mixtral":
        for path in paths:
            text = path.with_name(path.name.replace("_routing.jsonl", "_outputs.jsonl"))
            if text.is_file():
                for t in read_texts(text):
                    prompt, gen = text_tokens(t["prompt"]), text_tokens(t["generated"])
                    streams.append(Stream(t["name"], prompt + gen, len(prompt), "word proxy"))
    name = pattern.replace("_routing.jsonl", "").replace("_data.csv", "").rsplit(".", 1)[0]
    return Source(label or name, trace, phase, tuple(streams))


def merge_traces(traces: list[RouteTrace], source: str) -> RouteTrace:
    """One trace holding every sequence of several files of the same model and format."""
    first = traces[0]
    for t in traces[1:]:
        same = (t.format, t.layer_ids, t.n_expert, t.top_k)
        if same != (first.format, first.layer_ids, first.n_expert, first.top_k):
            raise TraceError(f"{t.source}: cannot join it with {first.source} (other model)")
    seqs = tuple(
        replace(s, name=f"{Path(t.source).stem}/{s.name}") for t in traces for s in t.sequences
    )
    notes = tuple(dict.fromkeys(n for t in traces for n in t.notes))
    return replace(first, source=source, sequences=seqs, notes=notes)


def engine_source(trace: RouteTrace, label: str) -> Source:
    """sdq's own route log with token ids attached (sdq.analysis.engine_log)."""
    streams = []
    for s in trace.sequences:
        if s.prefill.tokens is None or s.decode.tokens is None:
            continue
        toks = list(s.prefill.tokens) + list(s.decode.tokens)
        block = np.concatenate([s.prefill.experts, s.decode.experts])  # [T, L, K]
        streams.append(Stream(s.name, toks, s.prefill.n_tokens, "engine token ids", block))
    return Source(label, trace, "decode", tuple(streams))


def slots_for(source: Source, fraction: float, scope: str) -> int:
    t = source.trace
    room = t.n_expert * (t.n_layer if scope == "global" else 1)
    return max(t.top_k, int(round(fraction * room)))


def policy_sweep(
    sources: list[Source],
    fractions: list[float],
    policies: list[str],
    scope: str = "layer",
    params: PolicyParams | None = None,
) -> pd.DataFrame:
    """Misses and hit rate per source, slot count and policy; misses also as a ratio to Belady."""
    rows = []
    for src in sources:
        for f in fractions:
            slots = slots_for(src, f, scope)
            res = {}
            for p in policies:
                if p == "pin_other" and len(src.blocks()) < 2:
                    continue  # nothing to rank on: a single sequence
                res[p] = simulate_trace(src.trace, p, slots, scope, src.phase, params)
            base = res["belady"].misses if "belady" in res else None
            for p, r in res.items():
                rows.append(
                    {
                        "trace": src.label,
                        "scope": scope,
                        "slots_frac": f,
                        "slots": slots,
                        "top_k": src.trace.top_k,
                        "room": slots_for(src, 1.0, scope),  # slots that hold every expert
                        "policy": p,
                        "lookups": r.lookups,
                        "misses": r.misses,
                        "hit_rate": r.hit_rate,
                        "misses_vs_belady": r.misses / base if base else np.nan,
                    }
                )
    return pd.DataFrame(rows)


def reuse_table(sources: list[Source], window: int) -> pd.DataFrame:
    rows = []
    for src in sources:
        blocks = src.blocks()
        row = {"trace": src.label, "tokens": sum(b.shape[0] for b in blocks)}
        row["only_once"] = only_once_fraction(blocks, window)
        row.update({f"x{k}": v for k, v in reuse_histogram(blocks, window).items()})
        rows.append(row)
    return pd.DataFrame(rows)


def union_table(sources: list[Source], ks: list[int]) -> pd.DataFrame:
    rows = []
    for src in sources:
        for k in ks:
            batched = single = 0
            for b in src.blocks():
                u, s = union_reads(b, k)
                batched, single = batched + u, single + s
            rows.append(
                {
                    "trace": src.label,
                    "k": k,
                    "reads_batched": batched,
                    "reads_one_by_one": single,
                    "saving": 1.0 - batched / single,
                }
            )
    return pd.DataFrame(rows)


def ngram_table(sources: list[Source], ns: list[int], k: int) -> pd.DataFrame:
    """Mean accepted draft length per stream for each n-gram length (draft length k)."""
    rows = []
    for src in sources:
        for st in src.streams:
            row = {"trace": src.label, "stream": st.name, "tokens": st.token_kind}
            row["produced"] = len(st.tokens) - st.start
            for n in ns:
                row[f"n={n}"] = mean_accepted(prompt_lookup(st.tokens, st.start, n, k))
            rows.append(row)
    return pd.DataFrame(rows)


def verify_table(sources: list[Source], ns: list[int], k: int) -> pd.DataFrame:
    """Expert reads per produced token, plain decode vs batch verification of n-gram drafts."""
    rows = []
    for src in sources:
        for st in src.streams:
            if st.block is None:
                continue
            for n in ns:
                steps = prompt_lookup(st.tokens, st.start, n, k)
                r = verify_reads(st.block, steps, src.trace.n_expert)
                rows.append(
                    {
                        "trace": src.label,
                        "stream": st.name,
                        "n": n,
                        "steps": len(steps),
                        "mean_accepted": mean_accepted(steps),
                        "plain": r["plain_reads_per_token"],
                        "batch_optimistic": r["batch_reads_per_token_optimistic"],
                        "batch_pessimistic": r["batch_reads_per_token_pessimistic"],
                    }
                )
    return pd.DataFrame(rows)


def routing_summary(sources: list[Source], window: int, k: int = 4) -> pd.DataFrame:
    """One row per source: shape, popularity skew, reuse and U(k), for side-by-side reading."""
    rows = []
    for src in sources:
        t, blocks = src.trace, src.blocks()
        top = max(1, t.n_expert // 4)
        pop = pd.DataFrame(layer_popularity(blocks, t.n_expert, top, t.layer_ids))
        batched = single = 0
        for b in blocks:
            u, s = union_reads(b, k)
            batched, single = batched + u, single + s
        rows.append(
            {
                "trace": src.label,
                "model": t.model,
                "layers": t.n_layer,
                "experts": t.n_expert,
                "top_k": t.top_k,
                "phase": src.phase,
                "tokens": sum(b.shape[0] for b in blocks),
                "distinct_per_layer": pop["distinct"].mean() / t.n_expert,
                "top1_share": pop["top1_share"].mean(),
                "top_quarter_share": pop[f"top{top}_share"].mean(),
                "entropy_vs_uniform": pop["entropy_vs_uniform"].mean(),
                f"only_once_W{window}": only_once_fraction(blocks, window),
                f"U({k})_saving": 1.0 - batched / single,
            }
        )
    return pd.DataFrame(rows)
