"""The sampler: greedy, top-k, top-p, temperature, seeds."""

import numpy as np
import pytest

from sdq.errors import ParamsError
from sdq.run.sampler import Sampler, SamplerSettings, _top_k_ids


def _logits(seed=0, n=1000):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32) * 3


def test_greedy_is_argmax():
    z = _logits()
    assert Sampler(SamplerSettings(temp=0.0))(z) == int(np.argmax(z))


def test_top_k_one_and_tiny_top_p_are_greedy():
    z = _logits(1)
    for settings in (SamplerSettings(temp=1.5, top_k=1), SamplerSettings(temp=1.5, top_p=1e-6)):
        s = Sampler(settings)
        assert {s(z) for _ in range(20)} == {int(np.argmax(z))}


def test_same_seed_same_draws_other_seed_other_draws():
    z = _logits(2)

    def draws(seed):
        s = Sampler(SamplerSettings(temp=1.0, top_k=0, top_p=1.0, seed=seed))
        return [s(z) for _ in range(30)]

    assert draws(7) == draws(7)
    assert draws(1) != draws(2)


def test_draws_stay_inside_top_k():
    z = _logits(3)
    s = Sampler(SamplerSettings(temp=5.0, top_k=5, top_p=1.0, seed=0))
    allowed = set(np.argsort(-z)[:5].tolist())
    assert {s(z) for _ in range(200)} <= allowed


def test_frequencies_follow_softmax():
    z = np.array([0.0, 1.0, 2.0], dtype=np.float32)
    s = Sampler(SamplerSettings(temp=1.0, top_k=0, top_p=1.0, seed=0))
    counts = np.bincount([s(z) for _ in range(6000)], minlength=3) / 6000
    p = np.exp(z) / np.exp(z).sum()
    assert np.abs(counts - p).max() < 0.03  # 6000 draws: std of each share < 0.007


def test_top_p_keeps_smallest_set_reaching_p():
    z = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    s = Sampler(SamplerSettings(temp=1.0, top_k=0, top_p=0.8, seed=0))
    assert {s(z) for _ in range(300)} == {0, 1}


def test_top_k_ids_order_and_ties():
    z = np.array([1.0, 3.0, 3.0, 2.0], dtype=np.float32)
    assert _top_k_ids(z, 3).tolist() == [1, 2, 3]
    assert _top_k_ids(z, 0).tolist() == [1, 2, 3, 0]


@pytest.mark.parametrize("top_p", [0.0, 1.5])
def test_bad_top_p(top_p):
    with pytest.raises(ParamsError, match="--top-p"):
        SamplerSettings(top_p=top_p)
