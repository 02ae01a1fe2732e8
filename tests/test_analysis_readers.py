"""Trace readers: the real files, round trips through every writer, malformed input."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdq.analysis.readers import (
    detect_format,
    read_texts,
    read_trace,
    write_deepseek,
    write_engine,
    write_granite,
    write_mixtral,
)
from sdq.analysis.trace import PhaseRoutes, RouteTrace, Sequence, empty_phase
from sdq.errors import TraceError

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
ROUTING_FILES = sorted(p for p in TRACES.rglob("*") if p.suffix in (".json", ".jsonl", ".csv"))


@pytest.mark.parametrize("path", ROUTING_FILES, ids=lambda p: p.name)
def test_every_real_trace_reads(path):
    trace = read_trace(path)
    assert trace.lookups("all") > 0
    for seq in trace.sequences:
        for ph in (seq.prefill, seq.decode):
            assert ph.experts.shape[1:] == (trace.n_layer, trace.top_k)
            assert ph.experts.max(initial=-1) < trace.n_expert


def test_real_trace_shapes_match_their_readme():
    granite = read_trace(TRACES / "granite-3.0-1b-a400m" / "moe_expert_trace.json")
    assert (granite.n_layer, granite.n_expert, granite.top_k) == (24, 32, 8)
    assert [s.prefill.n_tokens for s in granite.sequences] == [39, 44, 29]
    assert granite.lookups("decode") == 3 * 64 * 24 * 8
    mixtral = read_trace(TRACES / "mixtral-8x7b" / "gsm8k_2_routing.jsonl")
    assert (mixtral.n_layer, mixtral.n_expert, mixtral.top_k) == (32, 8, 2)
    assert not mixtral.aligned and mixtral.notes
    deepseek = read_trace(TRACES / "deepseek-v2-lite" / "prompt_1002_data.csv")
    assert deepseek.layer_ids == tuple(range(1, 27)) and deepseek.top_k == 6
    assert deepseek.sequences[0].prefill.tokens[1] == "I"


def test_outputs_file_reads_as_its_routing_twin():
    text = TRACES / "mixtral-8x7b" / "humaneval_2_outputs.jsonl"
    assert detect_format(text) == "mixtral_text"
    twin = read_trace(text)
    assert twin.lookups() == read_trace(text.with_name("humaneval_2_routing.jsonl")).lookups()
    assert [t["name"] for t in read_texts(text)] == ["HumanEval/0", "HumanEval/1"]


@st.composite
def route_traces(draw, prefill=True, decode=True, weights=False, tokens=False):
    n_layer = draw(st.integers(1, 3))
    n_expert = draw(st.integers(2, 6))
    k = draw(st.integers(1, n_expert))
    seqs = []
    for s in range(draw(st.integers(1, 3))):
        phases = {}
        for name, on in (("prefill", prefill), ("decode", decode)):
            t = draw(st.integers(1, 4)) if on else 0
            if not t:
                phases[name] = empty_phase(n_layer, k)
                continue
            ex = np.array(
                [
                    [draw(st.permutations(range(n_expert)))[:k] for _ in range(n_layer)]
                    for _ in range(t)
                ],
                dtype=np.int32,
            ).reshape(t, n_layer, k)
            w = np.round(np.random.default_rng(s).random(ex.shape), 3) if weights else None
            toks = tuple(f"tok{i}" for i in range(t)) if tokens else None
            offset = phases["prefill"].n_tokens if name == "decode" else 0
            pos = np.arange(offset, offset + t, dtype=np.int64)
            phases[name] = PhaseRoutes(ex, w if w is None else w.astype(np.float32), toks, pos)
        seqs.append(Sequence(name=f"s{s}", **phases))
    return RouteTrace("", "", "m", tuple(range(n_layer)), n_expert, k, tuple(seqs))


def same_routes(a: RouteTrace, b: RouteTrace, phases=("prefill", "decode")):
    assert len(a.sequences) == len(b.sequences)
    assert (a.n_layer, a.top_k) == (b.n_layer, b.top_k)
    for sa, sb in zip(a.sequences, b.sequences, strict=True):
        for p in phases:
            np.testing.assert_array_equal(sa.phase(p).experts, sb.phase(p).experts)


@settings(max_examples=40, deadline=None)
@given(route_traces(weights=True))
def test_engine_log_round_trip(tmp_path_factory, trace):
    path = tmp_path_factory.mktemp("rt") / "route.jsonl"
    write_engine(trace, path)
    back = read_trace(path)
    assert back.format == "engine" and back.n_expert == trace.n_expert
    same_routes(trace, back)
    for sa, sb in zip(trace.sequences, back.sequences, strict=True):
        np.testing.assert_allclose(sa.decode.weights, sb.decode.weights, rtol=1e-6)


@settings(max_examples=30, deadline=None)
@given(route_traces())
def test_granite_round_trip(tmp_path_factory, trace):
    path = tmp_path_factory.mktemp("rt") / "moe_expert_trace.json"
    write_granite(trace, path)
    same_routes(trace, read_trace(path))


@settings(max_examples=30, deadline=None)
@given(route_traces(prefill=False, weights=True))
def test_mixtral_round_trip(tmp_path_factory, trace):
    path = tmp_path_factory.mktemp("rt") / "x_routing.jsonl"
    write_mixtral(trace, path)
    same_routes(trace, read_trace(path, n_expert=trace.n_expert), phases=("decode",))


@settings(max_examples=30, deadline=None)
@given(route_traces(decode=False, tokens=True))
def test_deepseek_round_trip(tmp_path_factory, trace):
    path = tmp_path_factory.mktemp("rt") / "prompt_data.csv"
    write_deepseek(trace, path)
    back = read_trace(path, n_expert=trace.n_expert)
    same_routes(trace, back, phases=("prefill",))
    assert back.sequences[0].prefill.tokens == trace.sequences[0].prefill.tokens


@pytest.mark.parametrize(
    "text, fmt, match",
    [
        (
            '{"phase": "decode", "pos": 0, "layer": 0, "experts": [1, 2]}\n{oops\n',
            None,
            ":2: not valid JSON",
        ),
        (
            '{"phase": "decode", "pos": 0, "layer": 0, "experts": [1, 1]}\n',
            None,
            ":1: repeated expert",
        ),
        ('{"phase": "decode", "pos": 0, "layer": 0}\n', "engine", ":1: missing field"),
        ('{"phase": "sample", "pos": 0, "layer": 0, "experts": [1]}\n', None, ":1: phase must be"),
        (
            'Layer ID,Batch Number,Token,Activated Expert IDs\n1,0,a,"[1, 2"\n',
            None,
            ":2: cannot parse",
        ),
        (
            '{"dataset": "d", "problem_id": 0, "layer": 0, "experts": [1, -2], '
            '"gating_probs": [0.5, 0.5], "token_idx": 0}\n',
            None,
            ":1: expert ids must be",
        ),
        ("hello\n", None, "unknown trace format"),
    ],
)
def test_malformed_input_names_file_and_line(tmp_path, text, fmt, match):
    path = tmp_path / "trace.txt"
    path.write_text(text)
    with pytest.raises(TraceError, match=match) as info:
        read_trace(path, fmt)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_engine_log_with_unknown_weights_and_a_header(tmp_path):
    path = tmp_path / "route.jsonl"
    path.write_text(
        '{"model": "m", "n_expert": 16, "top_k": 2}\n'
        '{"phase": "prefill", "pos": 0, "layer": 3, "experts": [4, 1], "weights": []}\n'
        '{"phase": "decode", "pos": 1, "layer": 3, "experts": [1, 9], "weights": []}\n'
    )
    trace = read_trace(path)
    assert (trace.n_expert, trace.top_k, trace.layer_ids) == (16, 2, (3,))
    assert trace.sequences[0].decode.experts.tolist() == [[[1, 9]]]
    assert trace.sequences[0].decode.weights is None
