"""Anatomy of the synthetic tiny model (llama.cpp-quantized Q4_K_M), from the conftest fixture."""

import pytest

from sdq.cli import main
from sdq.format.model import PARTS, anatomy, open_model


@pytest.fixture
def tiny(request):
    try:
        return request.getfixturevalue("tiny_model")
    except pytest.FixtureLookupError:
        pytest.skip("the tiny_model fixture (sdq.synth.build) is not in this tree")


def test_tiny_model_anatomy(tiny):
    m = open_model(tiny)
    s = m.spec
    assert s.arch == "qwen3moe" and s.n_vocab == 151_936
    assert s.moe_layers == tuple(range(s.n_layer)) and s.n_expert_used <= s.n_expert
    ex = m.experts
    assert ex.offsets.shape == (s.n_layer, s.n_expert, 3)
    assert ex.shapes == ((s.expert_ffn, s.n_embd),) * 2 + ((s.n_embd, s.expert_ffn),)
    m.require_compute()  # Q4_K_M uses types sdq computes
    size = tiny.stat().st_size
    assert ((ex.offsets + ex.nbytes) <= size).all()
    # each segment is expert e's slice of its layer tensor, as the mapped view shows it
    for layer in (ex.layers[0], ex.layers[-1]):
        for part in PARTS:
            t = m.tensors[f"blk.{layer}.ffn_{part}_exps.weight"]
            per_expert = m.tensor_data(t.name).reshape(s.n_expert, -1)  # [E, one expert]
            for e in (0, s.n_expert - 1):
                seg = ex.segment(layer, e, part)
                assert seg.qtype == t.qtype and seg.offset == t.offset + e * seg.nbytes
                with open(tiny, "rb") as f:
                    f.seek(seg.offset)
                    assert f.read(seg.nbytes) == per_expert[e].tobytes()
    info = anatomy(m)
    assert info["dense_bytes"] + info["routed_expert_bytes"] == info["total_bytes"]


def test_tiny_model_info_check(tiny, capsys):
    assert main(["info", str(tiny), "--check"]) == 0
    out = capsys.readouterr().out
    assert "T2: layer 0, expert 0" in out and "qwen3moe" in out
