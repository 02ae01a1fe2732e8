"""MXFP4 kernels (sdq.kernels.mxfp4) against gguf-py's dequantization and their NumPy
references; gpt-oss's ops (sdq.run.gpt_oss: clamped SwiGLU, attention with sinks and a
sliding window, YaRN RoPE tables) against theirs."""

import math

import numpy as np
import pytest
from gguf import quants
from gguf.constants import GGMLQuantizationType as Q

from sdq.kernels import mxfp4, ops
from sdq.kernels.act_quant import quantize_activation, quantize_q8_0_ref
from sdq.kernels.simd import HAVE_AVX2
from sdq.run import gpt_oss


def random_blocks(n_blocks: int, seed: int) -> np.ndarray:
    """MXFP4 bytes [n_blocks * 17]: random codes, scales over the whole E8M0 range but 255
    (2^127 * 12 overflows), with the denormal scales 0 and 1 and a few ordinary ones."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (n_blocks, mxfp4.BLOCK_BYTES), dtype=np.uint8)
    blocks[:, 0] = rng.integers(0, 255, n_blocks)
    blocks[:4, 0] = [0, 1, 2, 127]
    return blocks.reshape(-1)


def test_dequantize_is_bit_exact_with_gguf():
    raw = random_blocks(64, seed=0)
    rows, cols = 8, 64 * 32 // 8
    want = quants.dequantize(raw.reshape(rows, -1), Q.MXFP4)  # [rows, cols]
    got = mxfp4.dequantize(raw, rows, cols)
    assert got.dtype == np.float32 and want.shape == got.shape
    np.testing.assert_array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))
    np.testing.assert_array_equal(mxfp4.dequantize_ref(raw, rows, cols), got)
    assert (got == 0).sum() < got.size // 4 and np.isfinite(got).all()


def test_dequantize_of_gguf_quantized_values():
    x = np.random.default_rng(1).standard_normal((4, 128)).astype(np.float32)  # [R, C]
    raw = quants.quantize(x, Q.MXFP4)  # [R, C/32*17]
    got = mxfp4.dequantize(raw, 4, 128)
    np.testing.assert_array_equal(got, quants.dequantize(raw, Q.MXFP4))
    # a 4-bit code keeps a value to within half a step of the block's grid
    assert np.abs(got - x).max() < 0.3 * np.abs(x).max()


def test_nibble_order_and_scale():
    block = np.zeros(mxfp4.BLOCK_BYTES, np.uint8)
    block[0] = 128  # half scale 2^0 = 1: values are the doubled E2M1 codes
    block[1] = 0x9 << 4 | 0x7  # value 0: code 7 (12); value 16: code 9 (-1)
    out = mxfp4.dequantize(block, 1, 32)[0]
    assert out[0] == 12.0 and out[16] == -1.0 and not out[1:16].any()
    assert mxfp4.HALF_SCALES[0] == 2.0**-128 and mxfp4.HALF_SCALES[254] == 2.0**126


@pytest.mark.parametrize("portable", [True, False], ids=["portable", "avx2"])
@pytest.mark.parametrize("T,rows", [(1, 24), (5, 24), (7, 700)])  # 700 rows: several chunks
def test_matmul_matches_reference_and_dequantized_product(T, rows, portable):
    if not portable and not HAVE_AVX2:
        pytest.skip("this CPU has no AVX2: only the portable kernel runs")
    cols = 96
    raw = quants.quantize(
        np.random.default_rng(2).standard_normal((rows, cols)).astype(np.float32), Q.MXFP4
    )
    x = np.random.default_rng(3).standard_normal((T, cols)).astype(np.float32)  # [T, C]
    x[0, :32] *= 40  # one block's activations large: the int8 products near their bounds
    qx = quantize_activation(x, Q.Q8_0)
    out = np.empty((T, rows), np.float32)
    mxfp4.matmul(raw, rows, cols, qx, out, portable=portable)
    xq, xd = quantize_q8_0_ref(x)
    np.testing.assert_array_equal(out, mxfp4.matmul_ref(raw, rows, cols, xq, xd))
    # the same product in floats: dequantized weights times dequantized activations
    xf = (xq.reshape(T, -1, 32) * xd[..., None]).reshape(T, cols)
    want = xf @ mxfp4.dequantize(raw, rows, cols).T
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_matmul_rejects_a_ragged_row():
    with pytest.raises(ValueError, match="MXFP4"):
        mxfp4.dequantize(np.zeros(17, np.uint8), 1, 31)


# --- gpt-oss ops ------------------------------------------------------------------------


def test_swiglu_oai_matches_reference_and_clamps():
    rng = np.random.default_rng(4)
    gate = (rng.standard_normal((3, 64)) * 6).astype(np.float32)  # [T, F], some beyond 7
    up = (rng.standard_normal((3, 64)) * 6).astype(np.float32)
    want = gpt_oss.swiglu_oai_ref(gate, up)
    got = gate.copy()
    gpt_oss.swiglu_oai(got, up)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    g = np.array([100.0, -3.0], np.float32)
    gpt_oss.swiglu_oai(g, np.array([100.0, -100.0], np.float32))
    limit = 7 / (1 + math.exp(-1.702 * 7)) * 8
    np.testing.assert_allclose(g, [limit, -3 / (1 + math.exp(1.702 * 3)) * -6], rtol=1e-6)


@pytest.mark.parametrize("window", [0, 3])
def test_attention_with_sinks_matches_reference(window):
    rng = np.random.default_rng(5)
    T, H, Hkv, Dh, p0 = 6, 4, 2, 16, 5
    q = rng.standard_normal((T, H, Dh)).astype(np.float32)  # [T, H, Dh]
    kc = rng.standard_normal((16, Hkv * Dh)).astype(np.float32)  # [C, Hkv*Dh]
    vc = rng.standard_normal((16, Hkv * Dh)).astype(np.float32)
    sinks = rng.standard_normal(H).astype(np.float32) + 1  # [H]
    out = np.empty((T, H, Dh), np.float32)
    gpt_oss.attention_sinks(q, kc, vc, p0, Hkv, sinks, window, out)
    want = gpt_oss.attention_sinks_ref(q, kc, vc, p0, Hkv, sinks, window)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    # sinks at -inf and no window: plain causal attention
    plain = np.empty_like(out)
    gpt_oss.attention_sinks(q, kc, vc, p0, Hkv, np.full(H, -np.inf, np.float32), 0, plain)
    ops_out = np.empty_like(out)
    ops.attention(q, kc, vc, p0, Hkv, None, ops_out)
    np.testing.assert_allclose(plain, ops_out, rtol=1e-5, atol=1e-5)
    if window:  # the window drops keys: the output changes
        full = gpt_oss.attention_sinks_ref(q, kc, vc, p0, Hkv, sinks, 0)
        assert np.abs(full - want).max() > 1e-2


@pytest.mark.parametrize("p0", [0, 9, 40])
def test_a_windowed_layer_reads_its_ring_as_the_full_cache(p0):
    # a window of W keeps positions in a ring of W + T - 1 rows (row p % R): attention over it
    # equals attention over the full cache, for a ubatch that wraps the ring and one that not
    rng = np.random.default_rng(6)
    T, H, Hkv, Dh, W = 5, 4, 2, 16, 6
    R = W + T - 1
    q = rng.standard_normal((T, H, Dh)).astype(np.float32)  # [T, H, Dh]
    kc = rng.standard_normal((p0 + T, Hkv * Dh)).astype(np.float32)  # [C, Hkv*Dh] every position
    vc = rng.standard_normal((p0 + T, Hkv * Dh)).astype(np.float32)
    ring_k = np.full((R, Hkv * Dh), np.nan, np.float32)  # [R, Hkv*Dh]: rows never written stay NaN
    ring_v = ring_k.copy()
    for pos in range(max(0, p0 + T - R), p0 + T):  # what the ring holds after the ubatch
        ring_k[pos % R], ring_v[pos % R] = kc[pos], vc[pos]
    sinks = rng.standard_normal(H).astype(np.float32)  # [H]
    full = np.empty((T, H, Dh), np.float32)
    gpt_oss.attention_sinks(q, kc, vc, p0, Hkv, sinks, W, full)
    ring = np.empty_like(full)
    gpt_oss.attention_sinks(q, ring_k, ring_v, p0, Hkv, sinks, W, ring)
    assert np.array_equal(ring, full)  # the same keys in the same order: bit for bit
    want = gpt_oss.attention_sinks_ref(q, ring_k, ring_v, p0, Hkv, sinks, W)
    np.testing.assert_allclose(ring, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="window 6"):  # one row short of the ring
        gpt_oss.attention_sinks(q, ring_k[: R - 1], ring_v[: R - 1], p0 + R, Hkv, sinks, W, ring)


def yarn(factor: float, ext: float) -> gpt_oss.YarnRope:
    return gpt_oss.YarnRope(
        n_dims=64,
        freq_base=150000.0,
        freq_base_swa=150000.0,
        freq_scale=1 / factor,
        ext_factor=ext,
        attn_factor=1.0,
        beta_fast=32.0,
        beta_slow=1.0,
        n_ctx_orig=4096,
    )


def test_yarn_tables():
    pos = np.arange(0, 300, 7, dtype=np.float32)
    cos, sin = gpt_oss.yarn_tables(pos, yarn(1.0, 0.0), 150000.0)
    want = ops.rope_tables(pos, 150000.0, 64)
    np.testing.assert_array_equal(cos, want[0])
    np.testing.assert_array_equal(sin, want[1])
    low, high = gpt_oss.yarn_corr_dims(64, 4096, 150000.0, 32.0, 1.0)
    assert (low, high) == (8.0, 18.0)  # 64 ln(4096 / (b 2 pi)) / (2 ln 150000), b = 32 and 1
    cos, sin = gpt_oss.yarn_tables(pos, yarn(32.0, 1.0), 150000.0)
    mscale = 1 + 0.1 * math.log(32)
    np.testing.assert_allclose(np.hypot(cos, sin), mscale, rtol=1e-6)
    theta = pos[:, None] * 150000.0 ** (-np.arange(32) / 32)  # [T, 32]
    # below the ramp: extrapolated (unscaled) angles; above it: interpolated (1/32)
    np.testing.assert_allclose(cos[:, :8], mscale * np.cos(theta[:, :8]), atol=1e-4)
    np.testing.assert_allclose(cos[:, 18:], mscale * np.cos(theta[:, 18:] / 32), atol=1e-4)


def test_rms_norm_is_bit_exact_with_ggml_order():
    """ops.rms_norm squares in float32, sums the squares in float64 in order and scales as
    ggml does (no reassociation): on tiny-gptoss it equals llama.cpp's attn_norm output bit
    for bit, and a 1-ulp difference there moves Q8_0 roundings of the next product."""
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((64, 256)) * 3).astype(np.float32)  # [T, D]
    w = (1 + 0.1 * rng.standard_normal(256)).astype(np.float32)  # [D]
    out = np.empty_like(x)
    ops.rms_norm(x, w, 1e-5, out)
    sq = (x * x).astype(np.float64)  # [T, D] float32 squares
    mean = (np.cumsum(sq, axis=1)[:, -1] / 256).astype(np.float32)  # sequential sums
    scale = np.float32(1) / np.sqrt(mean + np.float32(1e-5))  # [T]
    np.testing.assert_array_equal(out, (x * scale[:, None]) * w)
    np.testing.assert_allclose(out, ops.rms_norm_ref(x, w, 1e-5), rtol=3e-7, atol=0)
