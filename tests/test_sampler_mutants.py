"""sdq.run.sampler: temperature, top-k, top-p and seeds, each against numbers computed here
(tests/mutation/REPORT.md lists what the suite must catch)."""

from __future__ import annotations

import numpy as np
import pytest

from sdq.errors import ParamsError
from sdq.run.sampler import Sampler, SamplerSettings, _softmax, _top_k_ids

N_DRAWS = 4000  # a share's standard deviation is below 0.008: the bounds below are > 5 sigma


def _shares(settings, z, n=N_DRAWS):
    s = Sampler(settings)
    return np.bincount([s(z) for _ in range(n)], minlength=len(z)) / n  # [V]


@pytest.mark.parametrize("temp", [0.25, 0.5, 2.0, 4.0])
def test_temperature_divides_the_logits(temp):
    """Draw frequencies follow softmax(z / temp): 0.25 makes token 2 nearly certain, 4.0 makes
    the three close to uniform. Without the division every temperature gives softmax(z)."""
    z = np.array([0.0, 1.0, 2.0], dtype=np.float32)  # [V]
    want = np.exp(z / temp) / np.exp(z / temp).sum()
    got = _shares(SamplerSettings(temp=temp, top_k=0, top_p=1.0, seed=3), z)
    assert np.abs(got - want).max() < 0.04, (got, want)


def test_a_small_positive_temperature_samples():
    """temp just above 0 samples (token 1 is within 1e-3 of token 0); only temp <= 0 is greedy."""
    z = np.array([1.0, 0.9995, -5.0], dtype=np.float32)  # [V]
    s = Sampler(SamplerSettings(temp=0.01, top_k=0, top_p=1.0, seed=0))
    assert {s(z) for _ in range(200)} == {0, 1}
    for temp in (0.0, -1.0):
        g = Sampler(SamplerSettings(temp=temp, top_k=0, top_p=1.0))
        assert {g(z) for _ in range(20)} == {0}
    assert SamplerSettings().temp == 0.0  # greedy unless asked


def test_defaults():
    s = SamplerSettings()
    assert (s.temp, s.top_k, s.top_p, s.seed) == (0.0, 40, 0.95, 0)
    z = np.arange(100, dtype=np.float32) / 10  # [V]
    # default top-k 40: with temp the draws stay among the 40 largest
    warm = Sampler(SamplerSettings(temp=100.0, top_p=1.0))
    assert min(warm(z) for _ in range(300)) >= 60


def test_the_seed_is_the_settings_seed():
    z = np.zeros(50, dtype=np.float32)  # [V]
    a = Sampler(SamplerSettings(temp=1.0, top_k=0, top_p=1.0, seed=11))
    rng = np.random.default_rng(11)
    assert [a(z) for _ in range(20)] == [
        int(rng.choice(50, p=np.full(50, 0.02))) for _ in range(20)
    ]


def test_top_k_keeps_k_with_the_right_shares():
    z = np.array([3.0, 0.0, 2.0, 1.0, 2.5], dtype=np.float32)  # [V]
    got = _shares(SamplerSettings(temp=1.0, top_k=3, top_p=1.0, seed=1), z)
    kept = np.array([3.0, 0.0, 2.0, 0.0, 2.5])
    want = np.where(kept > 0, np.exp(kept), 0.0)
    want /= want.sum()
    assert got[1] == got[3] == 0.0
    assert np.abs(got - want).max() < 0.04, (got, want)


def test_top_p_boundary():
    """The smallest set whose mass reaches top_p: exactly reaching it stops there."""
    p = np.array([0.5, 0.25, 0.125, 0.125])
    z = np.log(p).astype(np.float64)  # [V]
    for top_p, kept in ((0.5, {0}), (0.75, {0, 1}), (0.76, {0, 1, 2}), (1.0, {0, 1, 2, 3})):
        s = Sampler(SamplerSettings(temp=1.0, top_k=0, top_p=top_p, seed=0))
        assert {s(z) for _ in range(300)} == kept, top_p


def test_top_p_renormalises_the_kept_tokens():
    z = np.log(np.array([0.6, 0.3, 0.1])).astype(np.float32)  # [V]
    got = _shares(SamplerSettings(temp=1.0, top_k=0, top_p=0.8, seed=5), z)
    assert got[2] == 0.0 and abs(got[0] - 2 / 3) < 0.04


def test_top_p_after_top_k():
    """top-p is applied to the top-k probabilities renormalised."""
    z = np.log(np.array([0.4, 0.3, 0.2, 0.1])).astype(np.float32)  # [V]
    # top-k 2 leaves 0.4/0.7 and 0.3/0.7 = 0.571, 0.429; top-p 0.55 keeps token 0 only
    s = Sampler(SamplerSettings(temp=1.0, top_k=2, top_p=0.55, seed=0))
    assert {s(z) for _ in range(100)} == {0}
    s = Sampler(SamplerSettings(temp=1.0, top_k=2, top_p=0.6, seed=0))
    assert {s(z) for _ in range(200)} == {0, 1}


@pytest.mark.parametrize("top_p", [1e-9, 0.5, 1.0])
def test_top_p_in_range(top_p):
    assert SamplerSettings(top_p=top_p).top_p == top_p


@pytest.mark.parametrize("top_p", [-0.1, 0.0, 1.0000001, 2.0])
def test_top_p_out_of_range(top_p):
    with pytest.raises(ParamsError, match=rf"--top-p {top_p} must be in \(0, 1\]"):
        SamplerSettings(top_p=top_p)


def test_top_k_ids():
    z = np.array([0.5, 4.0, -1.0, 4.0, 2.0, 3.0], dtype=np.float32)  # [V]
    assert _top_k_ids(z, 1).tolist() == [1]
    assert _top_k_ids(z, 2).tolist() == [1, 3]
    assert _top_k_ids(z, 4).tolist() == [1, 3, 5, 4]
    assert _top_k_ids(z, 5).tolist() == [1, 3, 5, 4, 0]
    assert _top_k_ids(z, 6).tolist() == [1, 3, 5, 4, 0, 2]
    assert _top_k_ids(z, 7).tolist() == [1, 3, 5, 4, 0, 2]
    assert _top_k_ids(z, -1).tolist() == [1, 3, 5, 4, 0, 2]
    big = np.random.default_rng(0).standard_normal(1000).astype(np.float32)  # [V]
    assert _top_k_ids(big, 17).tolist() == np.argsort(-big, kind="stable")[:17].tolist()


def test_softmax_is_stable_for_large_logits():
    z = np.array([1000.0, 999.0, -1000.0])  # [V]
    p = _softmax(z)
    want = np.array([1.0, np.exp(-1.0), 0.0]) / (1.0 + np.exp(-1.0))
    assert np.allclose(p, want, rtol=1e-12, atol=1e-300)
    assert _softmax(np.array([-1000.0, -1001.0]))[0] == pytest.approx(1 / (1 + np.exp(-1.0)))


def test_large_logits_sample_finite():
    z = np.array([2000.0, 1999.0, 0.0], dtype=np.float32)  # [V]
    s = Sampler(SamplerSettings(temp=1.0, top_k=0, top_p=1.0, seed=0))
    assert {s(z) for _ in range(200)} == {0, 1}


def test_ties_keep_the_lower_id_first_in_a_long_vocabulary():
    """All-token ordering (top-k off) is a stable sort: equal logits in id order, also past the
    16 elements below which NumPy's default sort happens to be stable too."""
    z = np.repeat(np.array([1.0, 3.0, 2.0], dtype=np.float32), 400)  # [V] 1200 logits, 3 values
    want = list(range(400, 800)) + list(range(800, 1200)) + list(range(400))
    assert _top_k_ids(z, 0).tolist() == want
    assert _top_k_ids(z, 1200).tolist() == want
