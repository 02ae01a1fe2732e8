"""Anatomy of small GGUF files of several MoE layouts: spec, expert offsets, zero-copy views."""

import json
import time

import gguf
import numpy as np
import pytest
from gguf_builders import Layout, Q, write_model

from sdq.commands.info import render
from sdq.errors import GGUFError
from sdq.format.model import PARTS, anatomy, open_model, tensor_class


def build(tmp_path, name="m.gguf", **kw):
    return write_model(tmp_path / name, Layout(**kw))


def file_bytes(path, offset, n):
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)


def expected_slices(routed, layer, expert, fused_f=None):
    """The bytes gate/up/down of one expert as written, from the source arrays."""
    b = f"blk.{layer}"
    if f"{b}.ffn_gate.0.weight" in routed:  # one tensor per expert
        return [routed[f"{b}.ffn_{p}.{expert}.weight"].tobytes() for p in PARTS]
    if fused_f is not None:
        gu = routed[f"{b}.ffn_gate_up_exps.weight"][expert]  # [2F, row]
        gate, up = gu[:fused_f], gu[fused_f:]
    else:
        gate = routed[f"{b}.ffn_gate_exps.weight"][expert]
        up = routed[f"{b}.ffn_up_exps.weight"][expert]
    down = routed[f"{b}.ffn_down_exps.weight"][expert]
    return [np.ascontiguousarray(a).tobytes() for a in (gate, up, down)]


def check_offsets(model, routed, fused_f=None):
    ex = model.experts
    for i, layer in enumerate(ex.layers):
        for e in range(ex.n_expert):
            want = expected_slices(routed, layer, e, fused_f)
            for p, part in enumerate(PARTS):
                seg = ex.segment(layer, e, part)
                assert (seg.offset, seg.nbytes) == (ex.offsets[i, e, p], ex.nbytes[i, e, p])
                assert file_bytes(model.path, seg.offset, seg.nbytes) == want[p]
            assert ex.expert_bytes(layer, e) == sum(len(w) for w in want)


def test_qwen3moe_spec_and_offsets(tmp_path):
    path, routed = build(tmp_path, n_layer=3, n_expert=4, n_used=2)
    m = open_model(path)
    s = m.spec
    assert (s.arch, s.n_layer, s.n_embd, s.n_head, s.n_head_kv, s.head_dim) == (
        "qwen3moe",
        3,
        64,
        4,
        2,
        16,
    )
    assert (s.n_expert, s.n_expert_used, s.expert_ffn, s.n_shared_expert, s.shared_ffn) == (
        4,
        2,
        32,
        0,
        0,
    )
    assert (s.n_vocab, s.n_ctx_train, s.rope_base, s.rms_eps) == (100, 4096, 1e6, 1e-6)
    assert s.norm_topk_prob and not s.tied_embeddings
    assert s.moe_layers == (0, 1, 2) and s.n_nextn_layer == 0
    ex = m.experts
    assert ex.offsets.shape == ex.nbytes.shape == (3, 4, 3)
    assert ex.offsets.dtype == ex.nbytes.dtype == np.int64
    assert ex.qtypes.shape == (3, 3) and ex.qtypes.dtype == np.int32
    assert (ex.qtypes == int(Q.Q8_0)).all()
    assert ex.shapes == ((32, 64), (32, 64), (64, 32))
    check_offsets(m, routed)
    assert m.dense_bytes + ex.total_bytes == m.total_bytes
    with pytest.raises(GGUFError, match="expert 4 out of range"):
        ex.segment(0, 4, "gate")


def test_kquant_mix_like_the_seed(tmp_path):
    # gate/up Q4_K, down Q6_K: per-part sizes differ, as in seed 000 section 2
    path, routed = build(
        tmp_path,
        n_embd=256,
        expert_ffn=256,
        n_head=4,
        head_dim=64,
        expert_qtypes=(Q.Q4_K, Q.Q4_K, Q.Q6_K),
    )
    m = open_model(path)
    ex = m.experts
    assert ex.segment(0, 0, "gate").nbytes == 256 * 144  # rows F x (256 / 256 * 144)
    assert ex.segment(0, 0, "down").nbytes == 256 * 210
    assert ex.segment(0, 0, "down").qtype == Q.Q6_K
    assert ex.max_expert_bytes == 2 * 256 * 144 + 256 * 210
    check_offsets(m, routed)
    assert anatomy(m)["unsupported_compute"] == []


def test_quant_mix_varies_by_layer(tmp_path):
    # Q4_K_M gives some layers' down experts more bits (Q6_K) than others (Q4_K)
    mix = [(Q.Q4_K, Q.Q4_K, Q.Q6_K), (Q.Q4_K, Q.Q4_K, Q.Q4_K), (Q.Q4_K, Q.Q4_K, Q.Q6_K)]
    path, routed = build(
        tmp_path, n_layer=3, n_embd=256, expert_ffn=256, head_dim=64, expert_qtypes=mix
    )
    m = open_model(path)
    ex = m.experts
    assert ex.qtypes.tolist() == [[int(q) for q in layer] for layer in mix]
    assert ex.expert_bytes(0, 0) == 2 * 256 * 144 + 256 * 210
    assert ex.expert_bytes(1, 0) == 3 * 256 * 144
    assert ex.max_expert_bytes == ex.expert_bytes(2, 3)
    check_offsets(m, routed)
    parts = anatomy(m)["experts"]["part_qtypes"]
    assert parts["down"] == {"Q4_K": "1", "Q6_K": "0, 2"} and parts["gate"] == {"Q4_K": "0-2"}


def test_matches_gguf_reader(tmp_path):
    path, _ = build(tmp_path, shared_ffn=48, arch="qwen2moe")
    m = open_model(path)
    reader = gguf.GGUFReader(path)
    assert len(reader.tensors) == len(m.tensors)
    for t in reader.tensors:
        info = m.tensors[t.name]
        assert (info.offset, info.nbytes, info.qtype) == (t.data_offset, t.n_bytes, t.tensor_type)
        assert info.shape == tuple(int(d) for d in t.shape)
    for key, field in reader.fields.items():
        if not key.startswith("GGUF."):
            assert m.metadata[key] == pytest.approx(field.contents()), key
    assert reader.data_offset == m.header.data_offset


def test_tensor_data_is_a_zero_copy_view(tmp_path):
    path, routed = build(tmp_path)
    m = open_model(path)
    norm = m.tensor_data("blk.0.attn_norm.weight")
    assert norm.dtype == np.float32 and norm.shape == (64,)
    q = m.tensor_data("blk.1.attn_q.weight")
    assert q.dtype == np.float16 and q.shape == (4 * 16, 64)
    gate = m.tensor_data("blk.1.ffn_gate_exps.weight")
    assert gate.dtype == np.uint8 and gate.shape == (4 * 32, 64 // 32 * 34)
    assert gate.tobytes() == routed["blk.1.ffn_gate_exps.weight"].tobytes()
    for view in (norm, q, gate):
        assert not view.flags.owndata and not view.flags.writeable
        assert np.shares_memory(view, m._map)
    by_name = {t.name: t for t in gguf.GGUFReader(path).tensors}
    assert np.array_equal(norm, by_name["blk.0.attn_norm.weight"].data)
    assert np.array_equal(q, by_name["blk.1.attn_q.weight"].data)


def test_bf16_and_block_types_are_byte_rows(tmp_path):
    path, _ = build(tmp_path, extra_tensors={"rope_freqs.weight": ((3, 64), Q.BF16)})
    m = open_model(path)
    raw = m.tensor_data("rope_freqs.weight")
    assert raw.dtype == np.uint8 and raw.shape == (3, 128)
    assert m.tensors["rope_freqs.weight"].qtype == Q.BF16
    with pytest.raises(GGUFError, match="no tensor named 'nope'"):
        m.tensor_data("nope")


def test_dense_llama_has_no_experts(tmp_path):
    path, _ = build(tmp_path, arch="llama", n_expert=0)
    m = open_model(path)
    assert not m.has_experts and m.spec.n_expert == 0 and m.spec.moe_layers == ()
    assert m.dense_bytes == m.total_bytes and m.spec.dense_ffn == 96
    with pytest.raises(GGUFError) as err:
        m.require_experts()
    assert "has no routed experts (arch llama, 0 *_exps tensors)" in str(err.value)
    info = anatomy(m)
    assert info["experts"] is None
    assert "experts  none" in render(info)


def test_mixtral_style_llama(tmp_path):
    path, routed = build(tmp_path, arch="llama", n_expert=8, n_used=2)
    m = open_model(path)
    assert (m.spec.n_expert, m.spec.n_expert_used, m.spec.norm_topk_prob) == (8, 2, True)
    check_offsets(m, routed)


def test_legacy_per_expert_tensors(tmp_path):
    # early Mixtral GGUF files store blk.N.ffn_gate.E.weight, one 2-D tensor per expert
    path, routed = build(tmp_path, arch="llama", n_expert=4, legacy_experts=True)
    m = open_model(path)
    assert m.spec.n_expert == 4 and m.spec.moe_layers == (0, 1)
    assert m.experts.shapes == ((32, 64), (32, 64), (64, 32))
    check_offsets(m, routed)
    assert m.routed_bytes == m.experts.total_bytes
    assert anatomy(m)["tensor_classes"]["routed_experts"]["count"] == 2 * 4 * 3


def test_qwen2moe_shared_expert(tmp_path):
    path, routed = build(tmp_path, arch="qwen2moe", shared_ffn=48)
    m = open_model(path)
    assert (m.spec.n_shared_expert, m.spec.shared_ffn, m.spec.norm_topk_prob) == (1, 48, False)
    check_offsets(m, routed)
    classes = anatomy(m)["tensor_classes"]
    shexp = sum(t.nbytes for n, t in m.tensors.items() if "_shexp" in n)
    assert classes["shared_expert"]["bytes"] == shexp
    assert classes["shared_expert"]["count"] == 2 * 4
    assert m.dense_bytes == m.total_bytes - m.experts.total_bytes


def test_deepseek2_leading_dense_layer(tmp_path):
    path, routed = build(
        tmp_path,
        arch="deepseek2",
        n_layer=3,
        leading_dense=1,
        shared_ffn=64,
        extra_kv={
            "deepseek2.expert_shared_count": (2, gguf.GGUFValueType.UINT32),
            "deepseek2.expert_weights_norm": (True, gguf.GGUFValueType.BOOL),
        },
    )
    m = open_model(path)
    ex = m.experts
    assert m.spec.moe_layers == ex.layers == (1, 2)
    assert (m.spec.n_shared_expert, m.spec.shared_ffn, m.spec.norm_topk_prob) == (2, 64, True)
    assert ex.row(1) == 0 and ex.offsets.shape == (2, 4, 3)
    with pytest.raises(GGUFError, match="layer 0 has no routed experts"):
        ex.segment(0, 0, "gate")
    check_offsets(m, routed)
    assert anatomy(m)["tensor_classes"]["dense_ffn"]["count"] == 3
    assert anatomy(m)["experts"]["segments"][0]["layer"] == 1


def test_fused_gate_up_experts(tmp_path):
    # qwen35moe-style ffn_gate_up_exps: rows 0..F-1 are gate, F..2F-1 are up, per expert
    path, routed = build(tmp_path, arch="qwen35moe", fused_gate_up=True, expert_ffn=32)
    m = open_model(path)
    ex = m.experts
    assert ex.fused_gate_up and ex.shapes == ((32, 64), (32, 64), (64, 32))
    gate, up = ex.segment(0, 1, "gate"), ex.segment(0, 1, "up")
    assert up.offset == gate.offset + gate.nbytes
    check_offsets(m, routed, fused_f=32)


def test_nextn_layers_are_mtp_not_decoder_layers(tmp_path):
    path, _ = build(tmp_path, n_layer=2, nextn=1)
    m = open_model(path)
    assert (m.spec.n_layer, m.spec.n_nextn_layer, m.spec.moe_layers) == (2, 1, (0, 1))
    info = anatomy(m)
    mtp = info["mtp"]
    assert mtp["present"] and mtp["tensors"] == 2 and mtp["nextn_predict_layers"] == 1
    assert mtp["role_tensors"] == info["tensor_classes"]["mtp"]["count"]
    assert "MTP      present: 2 nextn/mtp tensors" in render(info)
    # the MTP layer's own experts are routed tensors on disk, but not decoder experts
    assert info["tensor_classes"]["mtp"]["count"] == len(
        [n for n in m.tensors if n.startswith("blk.2.")]
    )
    assert m.routed_bytes > m.experts.total_bytes
    assert tensor_class("blk.2.ffn_up_exps.weight", 2) == "mtp"
    assert tensor_class("blk.1.ffn_up_exps.weight", 2) == "routed_experts"


def test_tied_embeddings_and_olmoe(tmp_path):
    path, _ = build(tmp_path, arch="olmoe", tied=True)
    m = open_model(path)
    assert m.spec.tied_embeddings and not m.spec.norm_topk_prob
    assert "output.weight" not in m.tensors


def test_gpt_oss_separate_experts(tmp_path):
    path, routed = build(tmp_path, arch="gpt-oss", n_expert=4)
    m = open_model(path)
    assert m.spec.arch == "gpt-oss" and m.spec.moe_layers == (0, 1)
    check_offsets(m, routed)


def test_anatomy_json_and_text(tmp_path):
    path, _ = build(tmp_path)
    m = open_model(path)
    info = json.loads(json.dumps(anatomy(m)))
    assert info["n_tensors"] == len(m.tensors)
    assert sum(v["count"] for v in info["tensor_types"].values()) == len(m.tensors)
    assert sum(v["bytes"] for v in info["tensor_classes"].values()) == m.total_bytes
    assert info["dense_bytes"] + info["routed_expert_bytes"] == info["total_bytes"]
    t2 = info["experts"]["segments"]
    assert [s["part"] for s in t2] == ["gate", "up", "down"]
    for s in t2:
        seg = m.experts.segment(0, 0, s["part"])
        assert (s["offset"], s["nbytes"], s["qtype"]) == (seg.offset, seg.nbytes, seg.qtype.name)
    assert info["experts"]["part_qtypes"] == {p: {"Q8_0": "0-1"} for p in PARTS}
    other = anatomy(m, layer=1, expert=3)["experts"]["segments"]
    assert [s["offset"] for s in other] == [m.experts.segment(1, 3, p).offset for p in PARTS]
    text = render(info)
    for s in t2:
        assert f"{s['offset']:,}" in text and f"{s['nbytes']:,}" in text
    assert "MTP      none" in text


def test_open_is_fast_with_a_real_sized_vocabulary(tmp_path):
    # 151,936 tokens + token types + merges, like the Qwen2 BPE vocab; gguf.GGUFReader needs
    # tens of seconds for this header, sdq's reader well under one second (2 shared cores: 3 s)
    n = 151_936
    vt = gguf.GGUFValueType
    extra = {
        "tokenizer.ggml.merges": ([f"a{i} b{i}" for i in range(n - 549)], vt.ARRAY, vt.STRING),
        "tokenizer.ggml.token_type": ([1] * n, vt.ARRAY, vt.INT32),
    }
    path, _ = build(tmp_path, n_vocab=n, n_embd=32, extra_kv=extra)
    start = time.perf_counter()
    m = open_model(path)
    anatomy(m)
    elapsed = time.perf_counter() - start
    assert m.spec.n_vocab == n and len(m.metadata["tokenizer.ggml.merges"]) == n - 549
    assert m.metadata["tokenizer.ggml.tokens"][12345] == "tok12345"
    assert elapsed < 3.0


def test_hybrid_per_layer_metadata_and_linear_attention(tmp_path):
    # qwen35moe-style: per-layer head_count_kv (0 in linear-attention layers), ssm_* tensors
    vt = gguf.GGUFValueType
    path, routed = build(
        tmp_path,
        arch="qwen35moe",
        n_layer=4,
        n_head_kv=[0, 0, 0, 2],
        fused_gate_up=True,
        extra_kv={"qwen35moe.full_attention_interval": (4, vt.UINT32)},
        extra_tensors={f"blk.{i}.ssm_out.weight": ((64, 64), Q.F16) for i in range(3)},
    )
    m = open_model(path)
    assert m.spec.n_head_kv == 2 and m.spec.moe_layers == (0, 1, 2, 3)
    assert m.metadata["qwen35moe.attention.head_count_kv"] == [0, 0, 0, 2]
    assert anatomy(m)["tensor_classes"]["linear_attention"]["count"] == 3
    check_offsets(m, routed, fused_f=32)


def test_gpt_oss_expert_biases_stay_resident(tmp_path):
    biases = {
        f"blk.{i}.ffn_{p}_exps.bias": ((4, n), Q.F32)
        for i in range(2)
        for p, n in (("gate", 32), ("up", 32), ("down", 64))
    }
    path, routed = build(tmp_path, arch="gpt-oss", extra_tensors=biases)
    m = open_model(path)
    check_offsets(m, routed)
    classes = anatomy(m)["tensor_classes"]
    assert classes["routed_expert_extras"]["count"] == 6
    assert classes["routed_experts"]["bytes"] == m.experts.total_bytes == m.routed_bytes


@pytest.mark.parametrize(
    "name, role",
    [
        ("blk.3.ffn_gate_up_exps.weight", "routed_experts"),
        ("blk.3.ffn_down_exps.bias", "routed_expert_extras"),
        ("blk.3.ffn_gate_inp.weight", "router"),
        ("blk.3.exp_probs_b.bias", "router"),
        ("blk.3.ffn_gate_inp_shexp.weight", "shared_expert"),
        ("blk.3.ffn_down_shexp.weight", "shared_expert"),
        ("blk.3.attn_q_norm.weight", "norms"),
        ("blk.3.attn_qkv.weight", "attention"),
        ("blk.3.ssm_conv1d.weight", "linear_attention"),
        ("blk.3.ffn_up.weight", "dense_ffn"),
        ("token_embd.weight", "embeddings"),
        ("output.weight", "output"),
        ("blk.3.nextn.eh_proj.weight", "mtp"),
        ("blk.9.attn_q.weight", "mtp"),
        ("rope_freqs.weight", "other"),
    ],
)
def test_tensor_class(name, role):
    assert tensor_class(name, n_layer=8) == role
