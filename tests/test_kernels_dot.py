"""Quantized matrix products against a NumPy reference, threads, layouts and errors.

Tolerance: the kernels and matmul_ref use the same quantized activations, and each block's
dot product is an exact integer in both; they differ only in float rounding when the
per-block terms are scaled and summed (float32 in the kernels, float64 in the reference).
That error is bounded by a few float32 ulps of the sum of |terms|, so we allow
1e-5 * sum_i |w_i x_i| per output.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from kernels_support import FLOATS, QUANTIZED, random_matrix

from sdq.errors import UnsupportedError
from sdq.kernels import dequantize, matmul, matmul_q, matvec, matvec_q, quantize_activation
from sdq.kernels.dot import matmul_ref
from sdq.kernels.quant import QK_K

ALL = QUANTIZED + FLOATS


def _shape(qtype):
    """Rows not a power of two; 3 K-quant super-blocks of columns (whole blocks of any type)."""
    return 37, 3 * QK_K


def _bound(raw, qtype, rows, cols, X):
    w = np.abs(dequantize(raw, qtype, rows, cols)).astype(np.float64)
    return 1e-5 * (np.abs(X).astype(np.float64) @ w.T) + 1e-30


@pytest.mark.parametrize("qtype", ALL, ids=lambda q: q.name)
def test_matmul_matches_reference(qtype):
    rng = np.random.default_rng(int(qtype) + 10)
    rows, cols = _shape(qtype)
    raw = random_matrix(rng, qtype, rows, cols)
    X = rng.standard_normal((5, cols)).astype(np.float32)
    out = np.full((5, rows), np.nan, np.float32)
    matmul(raw, qtype, rows, cols, X, out)
    ref = matmul_ref(raw, qtype, rows, cols, X)
    assert (np.abs(out - ref) <= _bound(raw, qtype, rows, cols, X)).all()


@pytest.mark.parametrize("qtype", ALL, ids=lambda q: q.name)
def test_matvec_is_one_row_of_matmul(qtype):
    """Tokens are independent: matvec of token t equals row t of matmul bit for bit."""
    rng = np.random.default_rng(int(qtype) + 20)
    rows, cols = _shape(qtype)
    raw = random_matrix(rng, qtype, rows, cols)
    X = rng.standard_normal((3, cols)).astype(np.float32)
    out = np.empty((3, rows), np.float32)
    matmul(raw, qtype, rows, cols, X, out)
    one = np.empty(rows, np.float32)
    for t in range(3):
        matvec(raw, qtype, rows, cols, X[t], one)
        np.testing.assert_array_equal(one, out[t])
    qx = quantize_activation(X[1], qtype)  # converted once, reused
    matvec_q(raw, qtype, rows, cols, qx, one)
    np.testing.assert_array_equal(one, out[1])
    qX = quantize_activation(X, qtype)
    out2 = np.empty_like(out)
    matmul_q(raw, qtype, rows, cols, qX, out2)
    np.testing.assert_array_equal(out2, out)


def test_f32_products_take_ggml_s_two_orders():
    """F32 weights: 2+ tokens on rows a multiple of 4 sum in tinyBLAS's 16 lanes, one token
    (or per_row, ggml's mul_mat_id) in ggml_vec_dot_f32's 64; both are the product."""
    rng = np.random.default_rng(40)
    rows, cols = 36, 320  # 320 = 5 x 64: whole vec_dot steps, whole tinyBLAS vectors
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    X = rng.standard_normal((5, cols)).astype(np.float32)
    qx = quantize_activation(X, QT.F32)
    tiny, per_row = np.empty((5, rows), np.float32), np.empty((5, rows), np.float32)
    matmul_q(w, QT.F32, rows, cols, qx, tiny)
    matmul_q(w, QT.F32, rows, cols, qx, per_row, per_row=True)
    bound = _bound(w, QT.F32, rows, cols, X)
    ref = matmul_ref(w, QT.F32, rows, cols, X)
    assert (np.abs(tiny - ref) <= bound).all() and (np.abs(per_row - ref) <= bound).all()
    assert (tiny != per_row).any()  # the two orders round differently somewhere
    one = np.empty(rows, np.float32)
    for t in range(5):
        matvec(w, QT.F32, rows, cols, X[t], one)
        np.testing.assert_array_equal(one, per_row[t])


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K, QT.Q8_0], ids=lambda q: q.name)
def test_thread_count_does_not_change_results(qtype):
    rng = np.random.default_rng(30)
    rows, cols = 301, 512
    raw = random_matrix(rng, qtype, rows, cols)
    x = rng.standard_normal(cols).astype(np.float32)
    outs = []
    before = numba.get_num_threads()
    try:
        for n in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(n)
            o = np.empty(rows, np.float32)
            matvec(raw, qtype, rows, cols, x, o)
            outs.append(o)
    finally:
        numba.set_num_threads(before)
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


def test_quantized_product_is_close_to_float_product():
    """Sanity of the whole path: Q8_0 weights and activations lose < 1% of the result."""
    from gguf.quants import quantize

    rng = np.random.default_rng(40)
    w = rng.standard_normal((64, 1024)).astype(np.float32)
    x = rng.standard_normal(1024).astype(np.float32)
    raw = quantize(w, QT.Q8_0)
    out = np.empty(64, np.float32)
    matvec(raw, QT.Q8_0, 64, 1024, x, out)
    exact = w.astype(np.float64) @ x
    assert np.linalg.norm(out - exact) / np.linalg.norm(exact) < 0.01


def test_read_only_memmap_input(tmp_path):
    rng = np.random.default_rng(50)
    raw = random_matrix(rng, QT.Q4_K, 8, 256)
    path = tmp_path / "w.bin"
    raw.tofile(path)
    mm = np.memmap(path, dtype=np.uint8, mode="r", shape=raw.shape)
    x = rng.standard_normal(256).astype(np.float32)
    a, b = np.empty(8, np.float32), np.empty(8, np.float32)
    matvec(mm, QT.Q4_K, 8, 256, x, a)
    matvec(raw, QT.Q4_K, 8, 256, x, b)
    np.testing.assert_array_equal(a, b)


def test_errors():
    x = np.zeros(256, np.float32)
    with pytest.raises(UnsupportedError, match="Q3_K"):
        matvec(np.zeros(110, np.uint8), QT.Q3_K, 1, 256, x, np.empty(1, np.float32))
    with pytest.raises(ValueError, match="out must be"):
        matvec(np.zeros(144, np.uint8), QT.Q4_K, 1, 256, x, np.empty(2, np.float32))
    with pytest.raises(ValueError, match="Q4_K weights take Q8_K activations, got Q8_0"):
        qx = quantize_activation(np.zeros(256, np.float32), QT.Q8_0)
        matvec_q(np.zeros(144, np.uint8), QT.Q4_K, 1, 256, qx, np.empty(1, np.float32))
    with pytest.raises(ValueError, match="activation length 512 != weight columns 256"):
        qx = quantize_activation(np.zeros(512, np.float32), QT.Q4_K)
        matvec_q(np.zeros(144, np.uint8), QT.Q4_K, 1, 256, qx, np.empty(1, np.float32))


@pytest.mark.parametrize("qtype", QUANTIZED, ids=lambda q: q.name)
def test_simd_and_portable_kernels_agree(qtype):
    """The AVX2 block dots compute the same integer block sums as the plain-Numba kernels:
    K-quants and Q8_0 (ggml's eight lanes, one FMA per block) give identical floats; Q4_0's
    portable kernel keeps 32 per-value float lanes, so only the order of the scaled terms
    differs."""
    from sdq.kernels.simd import HAVE_AVX2

    if not HAVE_AVX2:
        pytest.skip("this CPU has no AVX2: only the portable kernels run")
    rng = np.random.default_rng(int(qtype) + 60)
    rows, cols = 45, 768
    raw = random_matrix(rng, qtype, rows, cols)
    X = rng.standard_normal((3, cols)).astype(np.float32)
    qx = quantize_activation(X, qtype)
    simd, plain = np.empty((3, rows), np.float32), np.empty((3, rows), np.float32)
    matmul_q(raw, qtype, rows, cols, qx, simd)
    matmul_q(raw, qtype, rows, cols, qx, plain, portable=True)
    if qtype == QT.Q4_0:
        assert (np.abs(simd - plain) <= _bound(raw, qtype, rows, cols, X)).all()
    else:
        np.testing.assert_array_equal(simd, plain)


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q5_K, QT.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("rows", [16, 19], ids=["rows16", "rows19"])
def test_k_quant_products_take_ggml_s_orders(qtype, rows):
    """Every K-quant product equals kquant_ref's NumPy model of ggml's x86 float order for
    its shape, bit for bit: vec_dot below 8 tokens, the tiled kernel from 8, repacked Q4_K
    (rows % 8 == 0) with mul_mat's groups of 4 tokens in the gemm order and the rest, and
    every per-expert product, in the gemv order. SIMD tiles (up to 8 tokens, one tile or
    several) and the portable kernels alike."""
    from sdq.kernels.kquant_ref import kquant_matmul_ref
    from sdq.kernels.simd import HAVE_AVX2

    rng = np.random.default_rng(int(qtype) + 70 + rows)
    cols = 768
    raw = random_matrix(rng, qtype, rows, cols)
    X = rng.standard_normal((19, cols)).astype(np.float32)
    for T in [*range(1, 10), 16, 19]:
        qx = quantize_activation(X[:T], qtype)
        for per_row in (False, True):
            want = kquant_matmul_ref(raw, qtype, rows, cols, qx.qs, qx.d, qx.bsums, per_row)
            for portable in (True, False) if HAVE_AVX2 else (True,):
                got = np.empty((T, rows), np.float32)
                matmul_q(raw, qtype, rows, cols, qx, got, portable=portable, per_row=per_row)
                np.testing.assert_array_equal(got, want, err_msg=f"T={T} per_row={per_row}")


def test_k_quant_orders_differ_where_ggml_s_do():
    """The orders are real alternatives, not one computation under four names: on the same
    bytes, repacked gemm vs gemv and tiled vs vec_dot give different last bits somewhere."""
    rng = np.random.default_rng(75)
    rows, cols, T = 16, 2048, 8
    raw = random_matrix(rng, QT.Q4_K, rows, cols)
    qx = quantize_activation(rng.standard_normal((T, cols)).astype(np.float32), QT.Q4_K)
    gemm, gemv = np.empty((T, rows), np.float32), np.empty((T, rows), np.float32)
    matmul_q(raw, QT.Q4_K, rows, cols, qx, gemm)  # mul_mat: 8 tokens in the gemm order
    matmul_q(raw, QT.Q4_K, rows, cols, qx, gemv, per_row=True)  # mul_mat_id: gemv
    assert (gemm != gemv).any()
    raw6 = random_matrix(rng, QT.Q6_K, rows, cols)
    X6 = rng.standard_normal((T, cols)).astype(np.float32)
    tiled = np.empty((T, rows), np.float32)
    matmul(raw6, QT.Q6_K, rows, cols, X6, tiled)  # 8 tokens: the tiled kernel
    rows_vec = np.empty((T, rows), np.float32)
    for t in range(T):  # one token at a time: vec_dot (Q8_K is row-wise: the same quants)
        matvec(raw6, QT.Q6_K, rows, cols, X6[t], rows_vec[t])
    assert (tiled != rows_vec).any()
