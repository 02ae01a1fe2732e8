"""Readers (and writers) for routing traces, into `RouteTrace`.

Formats:
- `engine`: sdq's own route log (`sdq chat --route-log PATH`): JSON lines
  `{"phase": "prefill"|"decode", "pos": int, "layer": int, "experts": [...], "weights": [...]}`,
  optional `"seq"` (sequence name) and `"token"` (token id); an optional header line
  `{"model": ..., "n_expert": ..., "top_k": ...}` carries what the lines cannot.
- `granite`: one JSON object `{"model", "num_layers", "num_experts", "top_k",
  "prompts": {name: {"prompt_len", "prefill": [pos][layer][K], "decode": [step][layer][K]}}}`.
- `mixtral`: JSON lines `{"dataset", "problem_id", "layer", "experts", "gating_probs",
  "token_idx"}`; generated tokens only; token_idx is renumbered per layer after dropped tokens.
- `deepseek`: CSV `Layer ID,Batch Number,Token,Activated Expert IDs`, one prompt pass.

A Mixtral `*_outputs.jsonl` (prompts and generated text) reads as its `*_routing.jsonl` twin.

Every reader raises `TraceError("<file>:<line>: <what>")` on the first malformed line.
"""

from __future__ import annotations

import csv
import json
import os
from collections import defaultdict
from pathlib import Path

import numpy as np

from sdq.analysis.trace import PhaseRoutes, RouteTrace, Sequence, empty_phase
from sdq.errors import TraceError

FORMATS = ("engine", "granite", "mixtral", "deepseek")
DEEPSEEK_HEADER = ["Layer ID", "Batch Number", "Token", "Activated Expert IDs"]
# Facts of the published traces that the files themselves do not carry (see data/traces/README.md).
MIXTRAL_EXPERTS = 8
DEEPSEEK_EXPERTS = 64
# Bounds on what a trace may declare: arrays are sized by expert counts, so an id of 2**40 in a
# damaged file must be refused, not allocated for.
MAX_EXPERTS = 2**16  # expert ids are below it
MAX_INT = 2**31 - 1  # positions, layers, counts


def detect_format(path: str | Path) -> str:
    """Name the format of a trace file from its first bytes."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    with open(path, encoding="utf-8", errors="replace") as f:
        head = f.read(4096)
    first = head.lstrip().split("\n", 1)[0].strip()
    if first.startswith(",".join(DEEPSEEK_HEADER[:3])):
        return "deepseek"
    if first.startswith("{"):
        if '"prompts"' in head and '"num_experts"' in head:
            return "granite"
        if '"gating_probs"' in first or ('"problem_id"' in first and '"token_idx"' in first):
            return "mixtral"
        if '"generated"' in first and '"prompt"' in first:
            return "mixtral_text"
        if '"phase"' in head or '"n_expert"' in first:
            return "engine"
    raise TraceError(f"{path}: unknown trace format (expected one of {', '.join(FORMATS)})")


def read_trace(path: str | Path, fmt: str | None = None, n_expert: int | None = None) -> RouteTrace:
    """Read any supported trace; `fmt` overrides detection, `n_expert` the expert count."""
    path = Path(path)
    fmt = fmt or detect_format(path)
    if fmt == "mixtral_text":
        # a Mixtral run is a pair: *_outputs.jsonl (text) beside *_routing.jsonl (routing)
        routing = path.with_name(path.name.replace("_outputs.jsonl", "_routing.jsonl"))
        if routing == path or not routing.is_file():
            raise TraceError(f"{path}: holds generated text, not routing, and {routing} is missing")
        trace = read_trace(routing, "mixtral", n_expert)
        note = f"read the routing of {path.name} from {routing.name}"
        return RouteTrace(**{**trace.__dict__, "notes": trace.notes + (note,)})
    readers = {
        "engine": read_engine,
        "granite": read_granite,
        "mixtral": read_mixtral,
        "deepseek": read_deepseek,
    }
    if fmt not in readers:
        raise TraceError(f"{path}: unknown format {fmt!r} (expected one of {', '.join(FORMATS)})")
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    try:
        trace = readers[fmt](path)
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x})") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
    if n_expert is not None:
        top = max_expert_id(trace)
        if top >= n_expert:
            raise TraceError(f"{path}: expert id {top} is out of range for n_expert={n_expert}")
        trace = RouteTrace(**{**trace.__dict__, "n_expert": int(n_expert)})
    return trace


def max_expert_id(trace: RouteTrace) -> int:
    top = -1
    for s in trace.sequences:
        for ph in (s.prefill, s.decode):
            if ph.n_tokens:
                top = max(top, int(ph.experts.max()))
    return top


# ---------------------------------------------------------------------------------------------
# helpers


def _ids(value, where: str, top_k: int | None = None) -> list[int]:
    if not isinstance(value, list) or not value:
        raise TraceError(f"{where}: expert ids must be a non-empty list, got {value!r}")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise TraceError(f"{where}: expert ids must be non-negative integers, got {value!r}")
    if max(value) >= MAX_EXPERTS:
        raise TraceError(f"{where}: expert id {max(value)} is not below {MAX_EXPERTS}")
    if len(set(value)) != len(value):
        raise TraceError(f"{where}: repeated expert id in {value!r}")
    if top_k is not None and len(value) != top_k:
        raise TraceError(f"{where}: {len(value)} expert ids, expected top_k={top_k}")
    return value


def _weights(value, n: int, key: str, where: str) -> None:
    """A list of `n` numbers (one per expert id), or TraceError."""
    if (
        not isinstance(value, list)
        or len(value) != n
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    ):
        raise TraceError(f"{where}: {key} must be a list of numbers as long as experts")


def _json_line(line: str, where: str) -> dict:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _require(obj: dict, keys: tuple[str, ...], where: str) -> None:
    missing = [k for k in keys if k not in obj]
    if missing:
        raise TraceError(f"{where}: missing field(s) {', '.join(missing)}")


def _int_field(obj: dict, key: str, where: str, least: int = 0, most: int = MAX_INT) -> int:
    v = obj[key]
    if not isinstance(v, int) or isinstance(v, bool) or not least <= v <= most:
        raise TraceError(f"{where}: {key} must be an integer in {least}..{most}, got {v!r}")
    return v


def _phase_from_rows(rows: dict, layers: list[int], top_k: int, with_weights: bool) -> PhaseRoutes:
    """rows: pos -> layer -> (ids, weights or None). Missing (pos, layer) stay -1 / NaN."""
    if not rows:
        return empty_phase(len(layers), top_k)
    positions = sorted(rows)
    col = {layer: i for i, layer in enumerate(layers)}
    experts = np.full((len(positions), len(layers), top_k), -1, dtype=np.int32)  # [T, L, K]
    weights = np.full(experts.shape, np.nan, dtype=np.float32) if with_weights else None
    tokens = []
    for t, pos in enumerate(positions):
        for layer, (ids, w) in rows[pos]["layers"].items():
            experts[t, col[layer], : len(ids)] = ids
            if weights is not None and w is not None:
                weights[t, col[layer], : len(w)] = w
        tokens.append(rows[pos].get("token"))
    toks = tuple(tokens) if any(x is not None for x in tokens) else None
    return PhaseRoutes(experts, weights, toks, np.asarray(positions, dtype=np.int64))


# ---------------------------------------------------------------------------------------------
# engine route log


def read_engine(path: Path) -> RouteTrace:
    meta: dict = {}
    # seq -> phase -> pos -> {"layers": {layer: (ids, weights)}, "token": tok}
    data: dict = defaultdict(lambda: {"prefill": {}, "decode": {}})
    layers: set[int] = set()
    top_k = 0
    has_weights = False
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            obj = _json_line(line, where)
            if "phase" not in obj and "layer" not in obj:
                meta.update(obj)  # header line
                continue
            _require(obj, ("phase", "pos", "layer", "experts"), where)
            phase = obj["phase"]
            if phase not in ("prefill", "decode"):
                raise TraceError(f"{where}: phase must be prefill or decode, got {phase!r}")
            pos, layer = _int_field(obj, "pos", where), _int_field(obj, "layer", where)
            ids = _ids(obj["experts"], where)
            w = obj.get("weights") or None  # [] = unknown
            if w is not None:
                _weights(w, len(ids), "weights", where)
                has_weights = True
            row = data[str(obj.get("seq", "0"))][phase].setdefault(pos, {"layers": {}})
            if layer in row["layers"]:
                raise TraceError(f"{where}: {phase} pos {pos} layer {layer} appears twice")
            row["layers"][layer] = (ids, w)
            if "token" in obj:
                row["token"] = _int_field(obj, "token", where)
            layers.add(layer)
            top_k = max(top_k, len(ids))
    if not layers:
        raise TraceError(f"{path}: no routing lines")
    layer_list = sorted(layers)
    seqs = tuple(
        Sequence(
            name=name,
            prefill=_phase_from_rows(ph["prefill"], layer_list, top_k, has_weights),
            decode=_phase_from_rows(ph["decode"], layer_list, top_k, has_weights),
        )
        for name, ph in data.items()
    )
    trace = RouteTrace(
        source=str(path),
        format="engine",
        model=str(meta.get("model", "")),
        layer_ids=tuple(layer_list),
        n_expert=0,
        top_k=_int_field({"top_k": top_k, **meta}, "top_k", f"{path}", top_k, MAX_EXPERTS),
        sequences=seqs,
    )
    n_expert = max_expert_id(trace) + 1
    if "n_expert" in meta:
        n_expert = _int_field(meta, "n_expert", f"{path}", n_expert, MAX_EXPERTS)
    return RouteTrace(**{**trace.__dict__, "n_expert": n_expert})


def write_engine(trace: RouteTrace, path: str | Path) -> None:
    """Write a trace as an sdq route log (temp name, then rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        header = {"model": trace.model, "n_expert": trace.n_expert, "top_k": trace.top_k}
        f.write(json.dumps(header) + "\n")
        for seq in trace.sequences:
            for phase in ("prefill", "decode"):
                ph = seq.phase(phase)
                pos = ph.positions if ph.positions is not None else np.arange(ph.n_tokens)
                for t in range(ph.n_tokens):
                    for j, layer in enumerate(trace.layer_ids):
                        ids = ph.experts[t, j]
                        keep = ids >= 0
                        if not keep.any():
                            continue
                        rec = {"seq": seq.name, "phase": phase, "pos": int(pos[t])}
                        rec["layer"] = int(layer)
                        rec["experts"] = [int(x) for x in ids[keep]]
                        if ph.weights is not None:
                            rec["weights"] = [float(x) for x in ph.weights[t, j][keep]]
                        if ph.tokens is not None and ph.tokens[t] is not None:
                            rec["token"] = ph.tokens[t]
                        f.write(json.dumps(rec) + "\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# granite (onnx-genai moe_expert_trace.json)


def read_granite(path: Path) -> RouteTrace:
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    where = str(path)
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object")
    _require(obj, ("num_layers", "num_experts", "top_k", "prompts"), where)
    L = _int_field(obj, "num_layers", where, 1)
    E = _int_field(obj, "num_experts", where, 1, MAX_EXPERTS)
    K = _int_field(obj, "top_k", where, 1, E)
    if not isinstance(obj["prompts"], dict):
        raise TraceError(f"{where}: prompts must be an object of name: routing")
    seqs = []
    for name, p in obj["prompts"].items():
        if not isinstance(p, dict):
            raise TraceError(f"{where}: prompt {name!r} is not an object")
        phases = {}
        for phase in ("prefill", "decode"):
            steps = p.get(phase, [])
            if not isinstance(steps, list):
                raise TraceError(f"{where}: prompt {name!r} {phase} must be a list")
            experts = np.full((len(steps), L, K), -1, dtype=np.int32)  # [T, L, K]
            for t, step in enumerate(steps):
                if not isinstance(step, list) or len(step) != L:
                    n = len(step) if isinstance(step, list) else "no"
                    raise TraceError(
                        f"{where}: prompt {name!r} {phase}[{t}] has {n} layers, not {L}"
                    )
                for layer, ids in enumerate(step):
                    ids = _ids(ids, f"{where}: prompt {name!r} {phase}[{t}][{layer}]", K)
                    if max(ids) >= E:
                        raise TraceError(
                            f"{where}: prompt {name!r} {phase}[{t}][{layer}] expert "
                            f"{max(ids)} >= num_experts {E}"
                        )
                    experts[t, layer] = ids
            offset = 0 if phase == "prefill" else len(p.get("prefill", []))
            positions = np.arange(offset, offset + len(steps), dtype=np.int64)
            phases[phase] = PhaseRoutes(experts, None, None, positions)
        seqs.append(Sequence(name=str(name), **phases))
    return RouteTrace(
        source=str(path),
        format="granite",
        model=str(obj.get("model", "")),
        layer_ids=tuple(range(L)),
        n_expert=E,
        top_k=K,
        sequences=tuple(seqs),
    )


def write_granite(trace: RouteTrace, path: str | Path) -> None:
    prompts = {}
    for seq in trace.sequences:
        prompts[seq.name] = {
            "prompt_len": seq.prefill.n_tokens,
            "prefill": seq.prefill.experts.tolist(),
            "decode": seq.decode.experts.tolist(),
        }
    obj = {
        "model": trace.model,
        "num_layers": trace.n_layer,
        "num_experts": trace.n_expert,
        "top_k": trace.top_k,
        "prompts": prompts,
    }
    _write_text(path, json.dumps(obj))


# ---------------------------------------------------------------------------------------------
# mixtral (speculative-moe routing_data_collected/*_routing.jsonl)


def read_mixtral(path: Path) -> RouteTrace:
    # (dataset, problem) -> layer -> token_idx -> (ids, probs)
    data: dict = defaultdict(lambda: defaultdict(dict))
    top_k = 0
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            obj = _json_line(line, where)
            _require(obj, ("problem_id", "layer", "experts", "token_idx"), where)
            layer = _int_field(obj, "layer", where)
            tok = _int_field(obj, "token_idx", where)
            ids = _ids(obj["experts"], where)
            probs = obj.get("gating_probs")
            if probs is not None:
                _weights(probs, len(ids), "gating_probs", where)
            problem = obj["problem_id"]
            if not isinstance(problem, int | str) or isinstance(problem, bool):
                raise TraceError(f"{where}: problem_id must be an integer or a string")
            key = (str(obj.get("dataset", "")), problem)
            if tok in data[key][layer]:
                raise TraceError(f"{where}: problem {key[1]} layer {layer} token {tok} repeated")
            data[key][layer][tok] = (ids, probs)
            top_k = max(top_k, len(ids))
    if not data:
        raise TraceError(f"{path}: no routing lines")
    layers = sorted({layer for per_layer in data.values() for layer in per_layer})
    seqs = []
    short_layers = 0
    for (dataset, problem), per_layer in data.items():
        n_tok = max(len(toks) for toks in per_layer.values())
        experts = np.full((n_tok, len(layers), top_k), -1, dtype=np.int32)  # [T, L, K]
        weights = np.full(experts.shape, np.nan, dtype=np.float32)
        for j, layer in enumerate(layers):
            toks = per_layer.get(layer, {})
            if sorted(toks) != list(range(len(toks))):
                raise TraceError(f"{path}: problem {problem} layer {layer} token_idx has gaps")
            short_layers += len(toks) < n_tok
            for t, (ids, probs) in toks.items():
                experts[t, j, : len(ids)] = ids
                if probs is not None:
                    weights[t, j, : len(probs)] = probs
        name = f"{dataset}/{problem}" if dataset else str(problem)
        seqs.append(
            Sequence(
                name=name,
                prefill=empty_phase(len(layers), top_k),
                decode=PhaseRoutes(experts, weights, None, None),
                aligned=False,
            )
        )
    notes = (
        "the recorder dropped tokens whose two gate weights were exactly 0.5/0.5 and "
        f"renumbered the rest ({short_layers} (problem, layer) lists are shorter than the "
        "longest); per-layer replay is exact, aligning layers by token_idx may be off by 1-3",
    )
    top = max(int(s.decode.experts.max()) for s in seqs)
    return RouteTrace(
        source=str(path),
        format="mixtral",
        model="Mixtral-8x7B-Instruct",
        layer_ids=tuple(layers),
        n_expert=max(MIXTRAL_EXPERTS, top + 1),
        top_k=top_k,
        sequences=tuple(seqs),
        notes=notes,
    )


def write_mixtral(trace: RouteTrace, path: str | Path, dataset: str = "synthetic") -> None:
    lines = []
    for problem, seq in enumerate(trace.sequences):
        ph = seq.decode
        for j, layer in enumerate(trace.layer_ids):
            idx = 0
            for t in range(ph.n_tokens):
                ids = ph.experts[t, j]
                if (ids < 0).all():
                    continue
                rec = {"dataset": dataset, "problem_id": problem, "layer": int(layer)}
                rec["experts"] = [int(x) for x in ids[ids >= 0]]
                if ph.weights is not None:
                    rec["gating_probs"] = [float(x) for x in ph.weights[t, j][ids >= 0]]
                rec["token_idx"] = idx
                idx += 1
                lines.append(json.dumps(rec))
    _write_text(path, "\n".join(lines) + "\n")


def read_texts(path: str | Path) -> list[dict]:
    """The Mixtral `*_outputs.jsonl`: [{"name", "prompt", "generated"}] in file order."""
    path = Path(path)
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            obj = _json_line(line, where)
            _require(obj, ("prompt", "generated"), where)
            name = str(obj.get("task_id", obj.get("problem_id", lineno)))
            out.append({"name": name, "prompt": obj["prompt"], "generated": obj["generated"]})
    return out


# ---------------------------------------------------------------------------------------------
# deepseek (moe-beyond training_data_eamc/prompt_*_data.csv)


def read_deepseek(path: Path) -> RouteTrace:
    # batch -> layer -> list of (token, ids)
    data: dict = defaultdict(lambda: defaultdict(list))
    top_k = 0
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header != DEEPSEEK_HEADER:
            raise TraceError(f"{path}:1: header {header!r} is not {DEEPSEEK_HEADER!r}")
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if not row:
                continue
            if len(row) != 4:
                raise TraceError(f"{where}: {len(row)} columns, expected 4")
            try:
                layer, batch = int(row[0]), int(row[1])
                ids = json.loads(row[3])
            except (ValueError, json.JSONDecodeError):
                raise TraceError(f"{where}: cannot parse {row!r}") from None
            if not (0 <= layer <= MAX_INT and 0 <= batch <= MAX_INT):
                raise TraceError(f"{where}: layer and batch must be in 0..{MAX_INT}, got {row!r}")
            ids = _ids(ids, where)
            data[batch][layer].append((row[2], ids))
            top_k = max(top_k, len(ids))
    if not data:
        raise TraceError(f"{path}: no routing rows")
    layers = sorted({layer for per_layer in data.values() for layer in per_layer})
    seqs = []
    for batch, per_layer in sorted(data.items()):
        counts = {layer: len(rows) for layer, rows in per_layer.items()}
        n_tok = max(counts.values())
        if min(counts.values()) != n_tok or len(per_layer) != len(layers):
            raise TraceError(f"{path}: batch {batch} has unequal token counts per layer {counts}")
        experts = np.full((n_tok, len(layers), top_k), -1, dtype=np.int32)  # [T, L, K]
        first = per_layer[layers[0]]
        for j, layer in enumerate(layers):
            for t, (tok, ids) in enumerate(per_layer[layer]):
                if tok != first[t][0]:
                    raise TraceError(
                        f"{path}: batch {batch} layer {layer} token {t} is {tok!r}, "
                        f"layer {layers[0]} has {first[t][0]!r}"
                    )
                experts[t, j, : len(ids)] = ids
        tokens = tuple(tok for tok, _ in first)
        seqs.append(
            Sequence(
                name=f"batch{batch}",
                prefill=PhaseRoutes(experts, None, tokens, None),
                decode=empty_phase(len(layers), top_k),
            )
        )
    top = max(int(s.prefill.experts.max()) for s in seqs)
    return RouteTrace(
        source=str(path),
        format="deepseek",
        model="DeepSeek-V2-Lite-Chat",
        layer_ids=tuple(layers),
        n_expert=max(DEEPSEEK_EXPERTS, top + 1),
        top_k=top_k,
        sequences=tuple(seqs),
        notes=("one forward pass over the prompt: prefill tokens only, no generation",),
    )


def write_deepseek(trace: RouteTrace, path: str | Path) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(DEEPSEEK_HEADER)
        for batch, seq in enumerate(trace.sequences):
            ph = seq.prefill
            toks = ph.tokens or tuple(f"t{i}" for i in range(ph.n_tokens))
            for j, layer in enumerate(trace.layer_ids):
                for t in range(ph.n_tokens):
                    ids = ph.experts[t, j]
                    w.writerow([layer, batch, toks[t], json.dumps([int(x) for x in ids])])
    os.replace(tmp, path)


def _write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
