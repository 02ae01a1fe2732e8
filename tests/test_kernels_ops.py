"""Ops (rms_norm, RoPE, attention, router, silu_mul, sigmoid) and ggml's float primitives
(fma32, expf_simd): Numba kernels against NumPy references.

Tolerances: the kernels compute in float32 (in ggml's summation orders), the references in
float32/float64 as written beside them; 1e-5 relative (1e-6 absolute for values of order 1)
covers float32 rounding of sums over at most a few hundred terms.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from numba import njit

from sdq.kernels import ops


@njit
def _fma(a, b, c):
    return ops.fma32(a, b, c)


@njit
def _expf_simd(x, out):  # x, out [n]
    for i in range(x.shape[0]):
        out[i] = ops.expf_simd(x[i])


def test_fma32_rounds_once():
    a = np.float32(1 + 2**-12)  # a * a = 1 + 2^-11 + 2^-24: the last term is lost when rounded
    assert _fma(a, a, np.float32(-1.0)) == np.float32(2**-11 + 2**-24)
    assert a * a - np.float32(1.0) == np.float32(2**-11)


def test_fma32_ref_rounds_once_as_the_instruction():
    """ops.fma32_ref (NumPy, float64 with a round-to-odd step) equals the FMA
    instruction, including a sum that float64 alone would round twice: 1 + 2^-11 + 2^-24 +
    2^-60 lies just above a float32 midpoint that float64 cannot hold apart from it."""
    a, c = np.float32(1 + 2**-12), np.float32(2**-60)
    want = np.float32(1 + 2**-11 + 2**-23)
    assert _fma(a, a, c) == want
    assert ops.fma32_ref(a, a, c) == want
    assert np.float32(np.float64(a) * np.float64(a) + np.float64(c)) != want  # twice: wrong
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 20_000)).astype(np.float32) * np.float32(1e3)
    x[2] = -x[0] * x[1] * (1 + rng.standard_normal(20_000).astype(np.float32) * 1e-6)
    got = ops.fma32_ref(x[0], x[1], x[2])
    want = np.array([_fma(p, q, r) for p, q, r in x.T], np.float32)
    np.testing.assert_array_equal(got, want)


def test_expf_simd_is_exp_within_a_few_ulps_and_saturates():
    x = np.linspace(-87.0, 88.0, 20_001).astype(np.float32)
    got = np.empty_like(x)
    _expf_simd(x, got)
    want = np.exp(x.astype(np.float64))
    ulp = np.spacing(want.astype(np.float32)).astype(np.float64)
    assert (np.abs(got - want) <= 2.5 * ulp).all()  # ggml: 1.45 ulp + rounding
    ends = np.empty(2, np.float32)
    _expf_simd(np.array([-200.0, 100.0], np.float32), ends)
    assert ends[0] == 0.0 and ends[1] == np.inf


def test_rms_norm_2d_3d_and_in_place():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 96)).astype(np.float32) * 4
    w = rng.standard_normal(96).astype(np.float32)
    out = np.empty_like(x)
    ops.rms_norm(x, w, 1e-6, out)
    np.testing.assert_allclose(out, ops.rms_norm_ref(x, w, 1e-6), rtol=1e-5, atol=1e-6)
    heads = rng.standard_normal((3, 4, 16)).astype(np.float32)  # per-head q/k norm
    expected = ops.rms_norm_ref(heads, w[:16], 1e-6)
    ops.rms_norm(heads, w[:16], 1e-6, heads)  # in place
    np.testing.assert_allclose(heads, expected, rtol=1e-5, atol=1e-6)


def test_rope_tables_follow_the_closed_form():
    pos = np.array([0, 1, 7, 1000], dtype=np.int64)
    cos, sin = ops.rope_tables(pos, 1e6, 128)
    theta = pos[:, None] * 1e6 ** (-2.0 * np.arange(64) / 128)  # float64
    # ggml multiplies theta up pair by pair in float32: a few ulps of drift over 64 steps
    np.testing.assert_allclose(cos, np.cos(theta), atol=2e-4)
    np.testing.assert_allclose(sin, np.sin(theta), atol=2e-4)
    assert cos[0].tolist() == [1.0] * 64 and not sin[0].any()


def test_rope_neox_rotates_halves():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 32)).astype(np.float32)
    cos, sin = ops.rope_tables(np.array([0, 5, 9]), 10000.0, 32)
    expected = ops.rope_neox_ref(x, cos, sin)
    norms = np.linalg.norm(x[..., :16], axis=-1) ** 2 + np.linalg.norm(x[..., 16:], axis=-1) ** 2
    ops.rope_neox(x, cos, sin)
    np.testing.assert_allclose(x, expected, rtol=1e-6, atol=1e-6)
    after = np.linalg.norm(x[..., :16], axis=-1) ** 2 + np.linalg.norm(x[..., 16:], axis=-1) ** 2
    np.testing.assert_allclose(after, norms, rtol=1e-5)  # a rotation keeps lengths


@pytest.mark.parametrize("T,p0", [(1, 0), (1, 9), (6, 0), (5, 7)])
def test_attention_gqa_causal(T, p0):
    rng = np.random.default_rng(T * 10 + p0)
    H, Hkv, Dh, C = 8, 2, 32, 16
    q = rng.standard_normal((T, H, Dh)).astype(np.float32)
    k = rng.standard_normal((C, Hkv * Dh)).astype(np.float32)
    v = rng.standard_normal((C, Hkv * Dh)).astype(np.float32)
    out = np.empty_like(q)
    ops.attention(q, k, v, p0, Hkv, None, out)
    np.testing.assert_allclose(out, ops.attention_ref(q, k, v, p0, Hkv), rtol=1e-5, atol=1e-5)
    # causal: cache rows past the last token's position do not matter
    k[p0 + T :] = 1e3
    v[p0 + T :] = np.nan
    out2 = np.empty_like(q)
    ops.attention(q, k, v, p0, Hkv, None, out2)
    np.testing.assert_array_equal(out2, out)


def test_attention_first_token_returns_its_value():
    """At position 0 a token attends only to itself: the output is its V row, per KV group."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 4, 8)).astype(np.float32)
    k = rng.standard_normal((4, 16)).astype(np.float32)
    v = rng.standard_normal((4, 16)).astype(np.float32)
    out = np.empty_like(q)
    ops.attention(q, k, v, 0, 2, None, out)
    np.testing.assert_allclose(out[0, :2], np.broadcast_to(v[0, :8], (2, 8)), rtol=1e-6)
    np.testing.assert_allclose(out[0, 2:], np.broadcast_to(v[0, 8:], (2, 8)), rtol=1e-6)


def test_attention_rejects_bad_shapes():
    q = np.zeros((2, 6, 8), np.float32)
    with pytest.raises(ValueError, match="not a multiple"):
        ops.attention(
            q, np.zeros((4, 32), np.float32), np.zeros((4, 32), np.float32), 0, 4, None, q
        )
    with pytest.raises(ValueError, match="KV cache holds 4 positions, 5 needed"):
        ops.attention(
            q, np.zeros((4, 16), np.float32), np.zeros((4, 16), np.float32), 3, 2, None, q
        )


@pytest.mark.parametrize("renorm", [True, False])
def test_softmax_topk(renorm):
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((7, 64)).astype(np.float32) * 3
    ids = np.empty((7, 8), np.int32)
    w = np.empty((7, 8), np.float32)
    ops.softmax_topk(logits, 8, renorm, ids, w)
    ref_ids, ref_w = ops.softmax_topk_ref(logits, 8, renorm)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(w, ref_w, rtol=1e-5)
    assert (np.diff(w, axis=1) <= 0).all()  # descending
    if renorm:
        np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-6)


def test_softmax_topk_ties_take_the_lower_index():
    logits = np.zeros((1, 6), np.float32)
    ids = np.empty((1, 3), np.int64)
    w = np.empty((1, 3), np.float32)
    ops.softmax_topk(logits, 3, False, ids, w)
    assert ids.tolist() == [[0, 1, 2]]
    np.testing.assert_allclose(w, 1 / 6, rtol=1e-6)


def test_silu_mul():
    rng = np.random.default_rng(5)
    g = (rng.standard_normal((3, 50)) * 6).astype(np.float32)
    g[0, :3] = [-100.0, 0.0, 100.0]  # saturation: silu(-100) ~ -0, silu(100) = 100
    u = rng.standard_normal((3, 50)).astype(np.float32)
    expected = ops.silu_mul_ref(g, u)
    ops.silu_mul(g, u)
    np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-6)
    assert g[0, 2] == pytest.approx(100.0 * u[0, 2]) and math.isfinite(g[0, 0])


def test_sigmoid():
    x = (np.random.default_rng(6).standard_normal((4, 33)) * 8).astype(np.float32)
    x[0, :2] = [-100.0, 100.0]
    want = ops.sigmoid_ref(x)
    ops.sigmoid(x)
    np.testing.assert_allclose(x, want, rtol=1e-6, atol=1e-7)
    assert x[0, 0] >= 0 and x[0, 1] == 1.0
