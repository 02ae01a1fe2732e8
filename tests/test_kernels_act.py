"""Activation quantization (Q8_K, Q8_0, F16, BF16): Numba kernels bit-exact with NumPy refs."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from sdq.errors import SdqError
from sdq.kernels import quantize_activation
from sdq.kernels.act_quant import (
    quantize_q8_0_ref,
    quantize_q8_k_ref,
    round_bf16_ref,
    round_f16_ref,
)


def _activations(rng, T, cols):
    x = rng.standard_normal((T, cols)).astype(np.float32) * 3
    x[0, :256] = 0  # an all-zero block
    x[-1, 5] = -40  # a block whose largest magnitude is negative
    x[-1, 40:48] = np.float32(0.5)  # exact ties after scaling are likely in some block
    return x


def test_q8_k_matches_reference():
    x = _activations(np.random.default_rng(0), 3, 768)
    qx = quantize_activation(x, QT.Q4_K)
    assert qx.qtype == QT.Q8_K
    qs, d, bsums = quantize_q8_k_ref(x)
    np.testing.assert_array_equal(qx.qs, qs)
    np.testing.assert_array_equal(qx.d.view(np.uint32), d.view(np.uint32))
    np.testing.assert_array_equal(qx.bsums, bsums)
    # the value of largest magnitude maps to -127 (ggml's sign convention), zero block to 0
    assert qx.qs[-1, 5] == -127 and qx.d[-1, 0] > 0
    assert not qx.qs[0, :256].any() and qx.d[0, 0] == 0
    # d * q reconstructs x to half a step
    err = np.abs(qx.qs.reshape(3, 3, 256) * qx.d[..., None] - x.reshape(3, 3, 256))
    assert (err <= np.abs(qx.d[..., None]) * 0.5 + 1e-6).all()


def test_q8_0_matches_reference():
    x = _activations(np.random.default_rng(1), 3, 512)
    for wt in (QT.Q8_0, QT.Q4_0):
        qx = quantize_activation(x, wt)
        assert qx.qtype == QT.Q8_0
        qs, d = quantize_q8_0_ref(x)
        np.testing.assert_array_equal(qx.qs, qs)
        np.testing.assert_array_equal(qx.d.view(np.uint32), d.view(np.uint32))
    assert np.abs(qx.qs).max() == 127


def test_q8_0_rounds_ties_to_even():
    """ggml's x86 quantize_row_q8_0 rounds with _MM_ROUND_NEAREST: 2.5 -> 2, 3.5 -> 4."""
    x = np.zeros((1, 32), np.float32)
    x[0, :3] = [127.0, 2.5, 3.5]  # amax 127: the multiplier is exactly 1
    qx = quantize_activation(x, QT.Q8_0)
    assert list(qx.qs[0, :3]) == [127, 2, 4]


def test_vector_and_matrix_inputs_agree():
    x = np.random.default_rng(2).standard_normal(512).astype(np.float32)
    a = quantize_activation(x, QT.Q6_K)
    b = quantize_activation(x[None, :], QT.Q6_K)
    assert a.T == 1 and np.array_equal(a.qs, b.qs) and np.array_equal(a.d, b.d)


def test_block_misaligned_activation_is_an_error():
    with pytest.raises(ValueError, match="not a multiple of Q8_K block 256"):
        quantize_activation(np.zeros(100, np.float32), QT.Q4_K)


_f32 = arrays(
    np.float32,
    (4, 16),
    elements=st.floats(width=32, allow_nan=False, allow_infinity=True),
)


@settings(max_examples=60, deadline=None)
@given(_f32)
def test_f16_rounding_matches_numpy(x):
    got = quantize_activation(x, QT.F16).xf
    np.testing.assert_array_equal(got, round_f16_ref(x))


@settings(max_examples=60, deadline=None)
@given(_f32)
def test_bf16_rounding_matches_reference(x):
    got = quantize_activation(x, QT.BF16).xf
    np.testing.assert_array_equal(got, round_bf16_ref(x))


def test_f16_bf16_rounding_edges():
    edges = np.array(
        [[65504, 65519.99, 65520, 1e-8, 2.98e-08, 6.1e-5, -0.0, 1 + 2**-11, 3.4e38, 1 + 2**-8]],
        dtype=np.float32,
    )
    np.testing.assert_array_equal(quantize_activation(edges, QT.F16).xf, round_f16_ref(edges))
    np.testing.assert_array_equal(quantize_activation(edges, QT.BF16).xf, round_bf16_ref(edges))


def test_f32_activations_pass_through():
    x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    np.testing.assert_array_equal(quantize_activation(x, QT.F32).xf, x)


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K])  # Q8_K activations
def test_infinite_activation_is_a_clear_error(qtype):
    x = np.ones((2, 256), np.float32)
    x[1, 7] = -np.inf
    with pytest.raises(SdqError, match="infinite value"):
        quantize_activation(x, qtype)
