"""A file quantized by llama.cpp itself (Q4_K_M): its expert table matches gguf.GGUFReader's views.

Q4_K_M chooses the quant type per tensor (some layers' ffn_down_exps get Q6_K), so this checks the
per-layer parts of the ExpertTable on a layout sdq did not write.
"""

import ctypes

import gguf
import numpy as np
from gguf_builders import Layout, Q, write_model

from sdq.format.model import PARTS, anatomy, open_model


def test_llama_cpp_q4_k_m_layout(tmp_path):
    import llama_cpp  # a pinned runtime dependency (pyproject.toml)

    src, _ = write_model(
        tmp_path / "f16.gguf",
        Layout(
            n_layer=4,
            n_embd=256,
            expert_ffn=256,
            n_head=4,
            head_dim=64,
            n_expert=8,
            n_vocab=300,
            expert_qtypes=(Q.F16, Q.F16, Q.F16),
            dense_qtype=Q.F16,
        ),
    )
    dst = tmp_path / "q4_k_m.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.nthread = 1
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    assert rc == 0

    m = open_model(dst)
    reader = gguf.GGUFReader(dst)
    views = {t.name: t for t in reader.tensors}
    assert set(views) == set(m.tensors)
    for name, t in views.items():
        info = m.tensors[name]
        assert (info.offset, info.nbytes, info.qtype) == (t.data_offset, t.n_bytes, t.tensor_type)

    ex = m.experts
    down_types = {Q(int(q)) for q in ex.qtypes[:, 2]}
    assert {Q(int(q)) for q in ex.qtypes[:, :2].ravel()} == {Q.Q4_K}
    assert down_types <= {Q.Q4_K, Q.Q6_K} and Q.Q6_K in down_types
    data = dst.read_bytes()
    for layer in ex.layers:
        for part in PARTS:
            per_expert = views[f"blk.{layer}.ffn_{part}_exps.weight"].data.reshape(ex.n_expert, -1)
            for e in range(ex.n_expert):
                seg = ex.segment(layer, e, part)
                got = np.frombuffer(data, np.uint8, seg.nbytes, seg.offset)
                assert np.array_equal(got, per_expert[e])
    assert anatomy(m)["unsupported_compute"] == []
