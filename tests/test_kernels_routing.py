"""The biased / group-limited router (sdq.kernels.routing): the Numba kernel against its NumPy
reference, and the semantics that distinguish it from softmax top-K (bias for selection only,
group limits, renormalisation, scale)."""

from __future__ import annotations

import numpy as np
import pytest

from sdq.kernels import routing


def _run(logits, bias, K, renorm, scale, n_group=0, n_group_used=0, gating="sigmoid"):
    T = logits.shape[0]
    ids = np.empty((T, K), np.int32)  # [T, K]
    w = np.empty((T, K), np.float32)  # [T, K]
    routing.route_topk(logits, gating, bias, K, renorm, scale, ids, w, n_group, n_group_used)
    return ids, w


@pytest.mark.parametrize("gating", ["sigmoid", "softmax"])
@pytest.mark.parametrize(
    "renorm, scale, n_group, n_group_used",
    [
        (False, 1.0, 0, 0),
        (True, 1.0, 0, 0),
        (True, 2.5, 0, 0),
        (True, 1.0, 4, 2),
        (False, 1.8, 8, 3),
    ],
)
def test_kernel_matches_reference(gating, renorm, scale, n_group, n_group_used):
    rng = np.random.default_rng(0)
    T, E, K = 37, 32, 6
    logits = (rng.standard_normal((T, E)) * 3).astype(np.float32)  # [T, E]
    bias = (rng.standard_normal(E) * 0.03).astype(np.float32)  # [E]
    ids, w = _run(logits, bias, K, renorm, scale, n_group, n_group_used, gating)
    want_ids, want_w = routing.route_topk_ref(
        logits, gating, bias, K, renorm, scale, n_group, n_group_used
    )
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(w, want_w, rtol=1e-6, atol=1e-7)


def test_bias_moves_the_selection_not_the_weights():
    logits = np.array([[2.0, 1.0, 0.0, -1.0]], np.float32)  # [1, E]
    bias = np.array([0.0, 0.0, 0.0, 1.0], np.float32)  # expert 3 pushed into the top 2
    ids, w = _run(logits, bias, 2, False, 1.0)
    assert ids[0].tolist() == [3, 0]  # sigmoid(-1) + 1 = 1.27 > sigmoid(2) = 0.88
    sig = 1 / (1 + np.exp(-logits[0].astype(np.float64)))
    np.testing.assert_allclose(w[0], sig[[3, 0]], rtol=1e-6)  # weights from the unbiased scores
    ids0, _ = _run(logits, None, 2, False, 1.0)
    assert ids0[0].tolist() == [0, 1]


def test_groups_limit_the_selection():
    # 2 groups of 4: group 0 holds the single best expert, group 1 the better pair
    logits = np.array([[5.0, -3, -3, -3, 2.0, 2.0, 1.9, -3]], np.float32)
    ids, _ = _run(logits, None, 2, False, 1.0, n_group=2, n_group_used=1)
    assert ids[0].tolist() == [4, 5]  # top-2 sum: group 1 (2 x 0.88) beats group 0 (0.99 + 0.05)
    ids_all, _ = _run(logits, None, 2, False, 1.0)
    assert ids_all[0].tolist() == [0, 4]


def test_renorm_and_scale():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((5, 16)).astype(np.float32)
    _, w = _run(logits, None, 4, True, 2.5)
    np.testing.assert_allclose(w.sum(axis=1), 2.5, rtol=1e-6)
    _, raw = _run(logits, None, 4, False, 1.0)
    assert (raw.sum(axis=1) < 4).all() and not np.allclose(raw.sum(axis=1), 1.0)


def test_softmax_without_bias_or_groups_is_ops_softmax_topk():
    from sdq.kernels import ops

    rng = np.random.default_rng(2)
    logits = (rng.standard_normal((9, 24)) * 2).astype(np.float32)
    ids, w = _run(logits, None, 5, False, 1.0, gating="softmax")
    want_ids = np.empty((9, 5), np.int32)
    want_w = np.empty((9, 5), np.float32)
    ops.softmax_topk(logits, 5, False, want_ids, want_w)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(w, want_w)


def test_bad_groups_are_refused():
    with pytest.raises(ValueError, match="groups"):
        _run(np.zeros((1, 10), np.float32), None, 2, False, 1.0, n_group=3, n_group_used=1)
