"""Dequantization: bit-exact against gguf-py on random blocks and on real model files."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize as gguf_dequantize
from kernels_support import FLOATS, QUANTIZED, random_matrix

from sdq.errors import GGUFError, UnsupportedError
from sdq.format.model import open_model
from sdq.format.quants import block_facts
from sdq.kernels import dequantize
from sdq.kernels.quant import dequantize_ref


def _bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("qtype", QUANTIZED + FLOATS, ids=lambda q: q.name)
def test_dequantize_matches_gguf_bit_for_bit(qtype):
    rng = np.random.default_rng(int(qtype))
    bs = block_facts(qtype).block_size
    rows, cols = 7, bs * 5 if bs > 1 else 96  # neither a power of two
    raw = random_matrix(rng, qtype, rows, cols)
    expected = gguf_dequantize(raw, qtype).reshape(rows, cols)
    got = dequantize(raw, qtype, rows, cols)
    assert got.shape == (rows, cols) and got.dtype == np.float32
    np.testing.assert_array_equal(_bits(got), _bits(expected))
    np.testing.assert_array_equal(_bits(dequantize_ref(raw, qtype, rows, cols)), _bits(expected))
    # a flat view of the same bytes (as an arena slot hands them out) gives the same values
    np.testing.assert_array_equal(_bits(dequantize(raw.reshape(-1), qtype, rows, cols)), _bits(got))


@pytest.mark.parametrize("qtype", QUANTIZED, ids=lambda q: q.name)
def test_dequantize_extreme_scales(qtype):
    """Largest, subnormal and zero f16 scales still decode exactly."""
    rng = np.random.default_rng(1)
    bs, ts = block_facts(qtype)
    raw = random_matrix(rng, qtype, 4, bs * 3)
    blocks = raw.reshape(-1, ts)
    specials = np.array([65504.0, -65504.0, 6e-8, -6e-8, 0.0, 1e-5], dtype=np.float16)
    off = 208 if qtype == QT.Q6_K else 0
    for i in range(blocks.shape[0]):
        k = i % len(specials)
        blocks[i, off : off + 2] = specials[k : k + 1].view(np.uint8)
    expected = gguf_dequantize(raw, qtype).reshape(raw.shape[0], -1)
    got = dequantize(raw, qtype, raw.shape[0], expected.shape[1])
    np.testing.assert_array_equal(_bits(got), _bits(expected))


def test_unsupported_type_names_type_and_tensor():
    raw = np.zeros((2, 84), dtype=np.uint8)
    with pytest.raises(UnsupportedError, match=r"Q2_K of tensor blk\.0\.ffn_down") as exc:
        dequantize(raw, QT.Q2_K, 2, 256, name="blk.0.ffn_down")
    assert "supported" in str(exc.value)


def test_bad_sizes_are_clear_errors():
    with pytest.raises(
        GGUFError, match="row length 200 is not a multiple of the Q4_K block size 256"
    ):
        dequantize(np.zeros(144, np.uint8), QT.Q4_K, 1, 200)
    with pytest.raises(GGUFError, match=r"^tensor blk\.1\.attn_q\.weight: row length 200"):
        dequantize(np.zeros(144, np.uint8), QT.Q4_K, 1, 200, name="blk.1.attn_q.weight")
    with pytest.raises(UnsupportedError, match="144 bytes given, 288 needed"):
        dequantize(np.zeros(144, np.uint8), QT.Q4_K, 2, 256)


def _check_file(path, max_rows=512):
    """Every tensor of the file (a sample of rows of the big ones) decodes as gguf-py does."""
    model = open_model(path)
    rng = np.random.default_rng(0)
    seen = set()
    for name, info in model.tensors.items():
        qtype = QT(info.qtype)
        cols = int(info.shape[0])
        rows = int(np.prod(info.shape[1:])) if len(info.shape) > 1 else 1
        data = np.asarray(model.tensor_data(name)).reshape(rows, -1).view(np.uint8)
        if rows > max_rows:  # first, last and random rows: enough to catch layout mistakes
            pick = np.unique(np.r_[0, rows - 1, rng.integers(0, rows, max_rows - 2)])
            data, rows = np.ascontiguousarray(data[pick]), len(pick)
        expected = gguf_dequantize(data, qtype).reshape(rows, cols)
        got = dequantize(data, qtype, rows, cols, name=name)
        np.testing.assert_array_equal(_bits(got), _bits(expected), err_msg=name)
        seen.add(qtype)
    return seen


@pytest.mark.slow
def test_dequantize_real_q4_k_m_file(tiny_model):
    seen = _check_file(tiny_model)
    assert {QT.Q4_K, QT.Q6_K} <= seen


@pytest.mark.slow
def test_dequantize_real_q8_0_file(tiny_model_q8):
    assert QT.Q8_0 in _check_file(tiny_model_q8)
