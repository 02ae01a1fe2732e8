"""The forward pass against a plain NumPy qwen3moe, ubatch splits, and paged vs resident experts."""

import json

import numba
import numpy as np
import pytest
from engine_support import Dims, reference_logits, write_model
from gguf.constants import GGMLQuantizationType as Q

from sdq.errors import SdqError
from sdq.format.model import open_model
from sdq.paging.cache import ExpertCache
from sdq.paging.route_log import RouteLog
from sdq.run.engine import DenseWeights, Engine, ResidentExperts
from sdq.run.plan import plan_for_slots
from sdq.run.workspace import Workspace, workspace_bytes

TOKENS = np.random.default_rng(5).integers(0, 300, 45)


@pytest.fixture(scope="module")
def f32_model(tmp_path_factory):
    return open_model(write_model(tmp_path_factory.mktemp("m") / "f32.gguf", Dims()))


@pytest.fixture(scope="module")
def q8_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "q8.gguf"
    return open_model(write_model(path, Dims(tied=True), qtype=Q.Q8_0, seed=1))


def run(model, tokens, n_ubatch, experts=None, n_ctx=64):
    experts = experts if experts is not None else ResidentExperts(model)
    ws = Workspace.allocate(model.spec, n_ctx, n_ubatch)
    engine = Engine(model, experts, ws, n_ctx, n_ubatch)
    out = [engine.forward(tokens[i : i + n_ubatch], "all") for i in range(0, len(tokens), n_ubatch)]
    return np.concatenate(out), engine


def rel_err(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_f32_matches_numpy_reference(f32_model):
    got, _ = run(f32_model, TOKENS, 16)
    want = reference_logits(f32_model, TOKENS)
    # float32 against float64 through 3 layers: rounding only, ~1e-6 relative
    assert rel_err(got, want) < 1e-4
    assert (got.argmax(1) == want.argmax(1)).all()


def test_q8_0_matches_numpy_reference(q8_model):
    got, _ = run(q8_model, TOKENS, 16)
    want = reference_logits(q8_model, TOKENS)
    # The engine quantizes activations to 8 bits (Q8_0 blocks of 32, as ggml does) where the
    # reference keeps float64: ~0.4% error per element, compounded through 3 layers of random
    # weights (measured: median 2% of the row's largest logit). Where a token's router choice
    # flips between two near-equal experts a position differs more, so the bound is on the
    # median, and top-1 agreement is checked separately (measured 41 of 45).
    per_pos = np.abs(got - want).max(1) / np.abs(want).max(1)
    assert np.median(per_pos) < 0.04
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.85


@pytest.mark.parametrize("n_ubatch", [1, 7, 45])
def test_ubatch_split_does_not_change_logits(f32_model, n_ubatch):
    base, _ = run(f32_model, TOKENS, 16)
    got, _ = run(f32_model, TOKENS, n_ubatch)
    assert rel_err(got, base) < 1e-5


@pytest.mark.parametrize("n_ubatch", [1, 8])
def test_paged_experts_give_the_resident_logits(q8_model, n_ubatch):
    base, _ = run(q8_model, TOKENS[:20], n_ubatch)
    spec = q8_model.spec
    # fewer slots than one prefill ubatch's union of experts: acquires in chunks, evicts
    plan = plan_for_slots(q8_model, spec.n_expert_used + 2)
    with ExpertCache(q8_model, plan) as cache:
        got, _ = run(q8_model, TOKENS[:20], n_ubatch, experts=cache)
        stats = cache.stats
    # same kernels, and each token's experts are summed in top-K order whatever order their
    # reads finished in: identical to the bit
    assert np.array_equal(got, base)
    assert stats["misses"] > 0 and stats["evictions"] > 0
    assert stats["lookups"] == stats["hits"] + stats["misses"]


def test_route_log_lines(f32_model, tmp_path):
    experts = ResidentExperts(f32_model)
    ws = Workspace.allocate(f32_model.spec, 32, 4)
    engine = Engine(f32_model, experts, ws, 32, 4)
    engine.route_log = RouteLog(tmp_path / "routes.jsonl")
    engine.forward(TOKENS[:6][:4], "none")
    engine.phase = "decode"
    engine.forward(TOKENS[4:5], "last")
    engine.route_log.close()
    lines = [json.loads(x) for x in (tmp_path / "routes.jsonl").read_text().splitlines()]
    spec = f32_model.spec
    assert len(lines) == 5 * spec.n_layer
    last = lines[-1]
    assert last["phase"] == "decode" and last["pos"] == 4 and last["layer"] == spec.n_layer - 1
    assert len(set(last["experts"])) == spec.n_expert_used
    assert abs(sum(last["weights"]) - 1.0) < 1e-5  # qwen3moe renormalises the top-k weights


def test_context_overflow_and_bad_tokens(f32_model):
    experts = ResidentExperts(f32_model)
    engine = Engine(f32_model, experts, Workspace.allocate(f32_model.spec, 8, 8), 8, 8)
    engine.forward(TOKENS[:6], "none")
    with pytest.raises(SdqError, match=r"6 tokens in the KV cache \+ 3 new > context length 8"):
        engine.forward(TOKENS[:3], "none")
    engine.reset()
    with pytest.raises(SdqError, match="token id out of range 0..299"):
        engine.forward([300], "none")


def test_workspace_is_what_the_plan_counts(f32_model):
    spec = f32_model.spec
    ws = Workspace.allocate(spec, 64, 16)
    assert ws.nbytes == sum(workspace_bytes(spec, 64, 16).values())


@pytest.mark.parametrize("n_ubatch", [1, 8])
def test_expert_sum_does_not_depend_on_compute_order(f32_model, monkeypatch, n_ubatch):
    """Hits are computed first and misses as their reads land, so the order varies with the
    cache; each token's experts are still summed in top-K order, giving the same bits."""
    import sdq.run.engine as engine_module

    base, _ = run(f32_model, TOKENS[:16], n_ubatch)
    monkeypatch.setattr(engine_module, "_ready_order", lambda handle, n: list(range(n))[::-1])
    got, _ = run(f32_model, TOKENS[:16], n_ubatch)
    assert np.array_equal(got, base)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 Numba threads")
def test_prefill_on_expert_workers_equals_one_thread(tiny_model):
    """A prefill ubatch's experts computed whole on 2 worker threads (each with its own row of
    the workspace's expert buffers) give the same logits as on one thread."""
    model = open_model(tiny_model)
    experts = ResidentExperts(model)
    weights = DenseWeights.load(model)
    tokens = np.arange(40, 72)
    threads = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    try:
        out = {}
        for workers in (1, 2):
            ws = Workspace.allocate(model.spec, 64, 32, workers)
            engine = Engine(model, experts, ws, 64, 32, weights=weights)
            out[workers] = engine.forward(tokens, logits="all")
            engine.close()
    finally:
        numba.set_num_threads(threads)
    np.testing.assert_array_equal(out[1], out[2])


def test_workspace_measures_the_data_segment_its_buffers_took(f32_model):
    """Workspace.allocate measures how far the KV cache and the compute buffers grew the data
    segment (what notebook 04 judges the seed's "compute buffer linear in ubatch" on): one
    figure per group, the buffers themselves as the layout names them."""
    import sys

    ws = Workspace.allocate(f32_model.spec, 32, 4)
    assert list(ws.buffers) == list(workspace_bytes(f32_model.spec, 32, 4))
    if sys.platform.startswith("linux"):
        assert set(ws.grown) == {"kv", "compute"}
        assert all(isinstance(v, int) and v >= 0 for v in ws.grown.values())
