"""Record the routing of sdq's own engine: `sdq chat --route-log` in a subprocess, read back
with the token ids of the run attached (the route log itself carries no tokens)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from sdq.analysis.readers import read_trace
from sdq.analysis.trace import RouteTrace
from sdq.errors import SdqError


def record_route_log(
    model_path: str | Path,
    prompt: str,
    n_predict: int,
    out_path: str | Path,
    threads: int = 2,
    timeout_s: float = 1800.0,
) -> tuple[RouteTrace, dict]:
    """Greedy generation of `n_predict` tokens; returns (trace with token ids, chat JSON).

    The expert count comes from the model (a route log only shows the experts it used)."""
    from sdq.format.model import open_model

    spec = open_model(model_path).spec
    cmd = [
        sys.executable, "-m", "sdq", "chat", "-m", str(model_path), "-p", prompt,
        "-n", str(n_predict), "--temp", "0", "--ignore-eos", "-t", str(threads),
        "--route-log", str(out_path), "--json",
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise SdqError(f"sdq chat on {model_path} ran past {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise SdqError(f"sdq chat exited {proc.returncode}: {lines[-1] if lines else ''}")
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    trace = read_trace(out_path, "engine", n_expert=spec.n_expert)
    trace = replace(trace, model=f"synthetic {spec.arch} ({Path(model_path).name})")
    return attach_tokens(trace, info["prompt_ids"] + info["generated_ids"]), info


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
