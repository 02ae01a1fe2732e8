"""Next-layer expert prefetch: what it relies on from the pager (a prefetch never takes a
pinned slot, the experts of one prefetch never share a slot), and the engine's decode with it.

Dimension key: E experts per layer, K used per token (engine_support.Dims: 12, 3).
"""

import numpy as np
import pytest
from engine_support import Dims, write_model
from gguf.constants import GGMLQuantizationType as Q

from sdq.format.model import open_model
from sdq.paging.cache import CacheSettings, ExpertCache
from sdq.run.engine import Engine, ResidentExperts
from sdq.run.plan import plan_for_slots
from sdq.run.workspace import Workspace


@pytest.fixture(scope="module")
def q8_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "q8.gguf"
    return open_model(write_model(path, Dims(), qtype=Q.Q8_0, seed=3))


def file_bytes(model, layer, expert):
    with open(model.path, "rb") as f:
        parts = []
        for part in range(3):
            seg = model.experts.segment(layer, expert, part)
            f.seek(seg.offset)
            parts.append(f.read(seg.nbytes))
        return parts


def wait_all(handle):
    for i in range(len(handle.experts)):
        handle.wait(i)


def test_prefetch_never_takes_a_pinned_slot(q8_model):
    K, E = q8_model.spec.n_expert_used, q8_model.spec.n_expert
    pinned = [1, 4, 7]
    with ExpertCache(q8_model, plan_for_slots(q8_model, K + 2)) as cache:
        handle = cache.acquire(0, pinned)
        wait_all(handle)
        # all 12 experts of the next layer with 2 slots unpinned: 2 reads start, and no later
        # id takes the slot of an earlier one (that would put two reads into one slot)
        started = cache.prefetch(1, range(E))
        assert started == 2
        assert sorted(cache.cached(0)) == pinned
        assert len(cache.cached(1)) == 2
        for i, e in enumerate(pinned):
            got = [view.tobytes() for view in handle.views(i)]
            assert got == file_bytes(q8_model, 0, e)
        cache.release(handle)
        stats = cache.stats
    assert stats["prefetches"] == 2 and stats["lookups"] == K


def test_prefetched_experts_hold_their_own_bytes(q8_model):
    """Prefetches into a nearly full arena, then acquires what they left cached: every slot
    holds the expert its entry names (a slot read twice would mix two experts)."""
    K, E = q8_model.spec.n_expert_used, q8_model.spec.n_expert
    with ExpertCache(q8_model, plan_for_slots(q8_model, K + 2)) as cache:
        for layer in range(3):
            handle = cache.acquire(layer, [0, 5, 9])
            wait_all(handle)
            cache.prefetch((layer + 1) % 3, range(E))
            cache.release(handle)
            nxt = (layer + 1) % 3
            ids = cache.cached(nxt)
            assert ids
            check = cache.acquire(nxt, ids)
            wait_all(check)
            for i, e in enumerate(ids):
                assert [v.tobytes() for v in check.views(i)] == file_bytes(q8_model, nxt, e)
            cache.release(check)
        assert cache.stats["prefetch_hits"] > 0


def decode(model, experts, tokens, prefetch, depth=1):
    """Prefill tokens[:4], then decode the rest one at a time; -> logits [T-4, V]."""
    ws = Workspace.allocate(model.spec, 64, 8)
    engine = Engine(model, experts, ws, 64, 8)
    engine.prefetch_next = model.spec.n_expert_used if prefetch else 0
    engine.prefetch_depth = depth
    engine.forward(tokens[:4], "none")
    engine.phase = "decode"
    return np.stack(
        [engine.forward(tokens[i : i + 1], "last").copy() for i in range(4, len(tokens))]
    )


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("policy, extra", [("lrfu_bypass", 0), ("lru", 12), ("layer_lrfu", 12)])
def test_prefetch_ahead_keeps_the_logits(q8_model, policy, extra, depth):
    """Decoding with guesses one or two layers ahead gives the resident logits to the bit; the
    guesses are counted (used ones read nothing again, wrong ones are extra reads)."""
    spec = q8_model.spec
    K, L = spec.n_expert_used, spec.n_layer
    tokens = np.random.default_rng(2).integers(0, spec.n_vocab, 30)
    base = decode(q8_model, ResidentExperts(q8_model), tokens, prefetch=False)
    settings = CacheSettings(policy=policy, prefetch_slots=K * depth)
    slots = L * K - 1 + K * depth + extra  # < a token's experts + the streaming slots
    plan = plan_for_slots(q8_model, slots, cache=settings)
    with ExpertCache(q8_model, plan, settings=settings) as cache:
        got = decode(q8_model, cache, tokens, prefetch=True, depth=depth)
        s = cache.stats
    assert np.array_equal(got, base)
    assert s["policy"] == policy
    assert s["prefetches"] > 0 and s["prefetch_hits"] > 0
    # a lookup a prefetch's read served is a miss, never a hit, under every policy
    assert s["hits"] + s["misses"] == s["lookups"] and s["prefetch_hits"] <= s["misses"]
    if policy == "lrfu_bypass":
        assert s["prefetches"] == s["prefetch_hits"] + s["prefetch_unused"] + s["streamed"]


class RecordingExperts(ResidentExperts):
    """Resident experts that remember every prefetch request: (layer, ids)."""

    def __init__(self, model):
        super().__init__(model)
        self.requests = []

    def prefetch(self, layer, expert_ids):
        self.requests.append((int(layer), [int(e) for e in expert_ids]))


def test_guess_accuracy_counts_each_depth_against_the_routing(q8_model, tmp_path):
    """The engine's guess counts per depth equal the share of each prefetched guess that its
    layer's routing (the route log) then chose, recomputed here from the two records."""
    import json

    from sdq.paging.route_log import RouteLog

    spec = q8_model.spec
    L, K = spec.n_layer, spec.n_expert_used
    tokens = np.random.default_rng(5).integers(0, spec.n_vocab, 12)
    experts = RecordingExperts(q8_model)
    log = RouteLog(tmp_path / "routes.jsonl")
    ws = Workspace.allocate(spec, 64, 8)
    engine = Engine(q8_model, experts, ws, 64, 8)
    engine.prefetch_next, engine.prefetch_depth, engine.route_log = K - 1, 2, log
    engine.forward(tokens[:4], "none")
    engine.phase = "decode"
    steps = []  # per decode step: its prefetch requests
    for i in range(4, len(tokens)):
        before = len(experts.requests)
        engine.forward(tokens[i : i + 1], "none")
        steps.append(experts.requests[before:])
    log.close()
    routed = {}  # (n_past, layer) -> routed ids
    for line in (tmp_path / "routes.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["phase"] == "decode":
            routed[(rec["pos"], rec["layer"])] = set(rec["experts"])
    want = {1: [0, 0], 2: [0, 0]}
    for step, requests in enumerate(steps):
        pos = 4 + step
        seen_at = {}  # a guessed layer: 1st request at depth 2 (when L > 2), then depth 1
        for layer, ids in requests:
            depth = 2 if layer not in seen_at and layer >= 2 else 1
            seen_at[layer] = depth
            want[depth][0] += len(ids)
            want[depth][1] += len(set(ids) & routed[(pos, layer)])
    assert len(requests) == 2 * (L - 1) - 1  # every layer but the first, once or twice
    assert engine.guess_counts == want
    assert 0 < want[1][1] <= want[1][0]


def test_session_prefetches_three_quarters_of_k_by_default(tiny_model):
    from sdq.errors import ParamsError
    from sdq.run.session import RunSettings, Session

    K = open_model(tiny_model).spec.n_expert_used
    base = dict(model=str(tiny_model), n_ctx=64, n_ubatch=8, ram_budget_mb=4000, reserve_mb=32)
    for extra, want in [({}, 3 * K // 4), ({"prefetch_next": 0}, 0), ({"prefetch_next": 99}, K)]:
        session = Session(RunSettings(**base, **extra))
        try:
            assert session.engine.prefetch_next == session.prefetch_next == want
            assert session.experts.settings.prefetch_slots == want
        finally:
            session.close()
    session = Session(RunSettings(model=str(tiny_model), n_ctx=64, n_ubatch=8, resident=True))
    assert session.engine.prefetch_next == 0
    session.close()
    with pytest.raises(ParamsError, match="--prefetch-next -1"):
        Session(RunSettings(**base, prefetch_next=-1))


def test_an_acquire_keeps_the_guesses_of_later_layers():
    """Streaming slots: the acquire of row 1 drops row 1's unrequested guesses (and stale ones
    of row 0), never the guesses already made for row 2."""
    from sdq.paging.prefetch import StreamingSlots

    class Batch:
        def done(self, g):
            return True

    streaming = StreamingSlots(list(range(8)), prefetch_limit=6)
    cached = {}
    assert streaming.start(0, [9], cached, lambda row, ids, slots: Batch()) == 1
    assert streaming.start(1, [3, 4], cached, lambda row, ids, slots: Batch()) == 2
    assert streaming.start(2, [5, 6], cached, lambda row, ids, slots: Batch()) == 2
    assert streaming.drop_unrequested(1, [4, 7]) == 2  # (1, 3) and the stale (0, 9)
    assert sorted(streaming.streamed) == [(1, 4), (2, 5), (2, 6)]
    assert len(streaming.free) == 5  # the two dropped reads are over: their slots are back


def test_session_prefetch_depth_takes_slots_per_layer(tiny_model):
    """Each guessed layer gets the prefetch width in slots of its own, planned before the
    arena is sized; a depth past the model's layers is cut to them."""
    from sdq.errors import ParamsError
    from sdq.run.session import RunSettings, Session

    model = open_model(tiny_model)
    K, L = model.spec.n_expert_used, len(model.experts.layers)
    base = dict(model=str(tiny_model), n_ctx=64, n_ubatch=8, ram_budget_mb=4000, reserve_mb=32)
    for asked in (2, 4):
        session = Session(RunSettings(**base, prefetch_depth=asked))
        try:
            depth, width = min(asked, L - 1), 3 * K // 4  # no deeper than the layers there are
            assert session.engine.prefetch_depth == session.prefetch_depth == depth
            assert session.experts.settings.prefetch_slots == depth * width
            assert session.plan.prefetch_slots == depth * width
        finally:
            session.close()
    for bad in (0, 5):
        with pytest.raises(ParamsError, match=f"--prefetch-depth {bad}: expected 1..4"):
            Session(RunSettings(**base, prefetch_depth=bad))
