"""The bytes the pager serves are the file's bytes: thousands of acquires from several threads,
random layers and experts and prefetches, an arena far smaller than the experts so slots are
reused all the time, in every page-cache mode, read layout and cache policy; every view handed
out is compared with the file. The C pool itself runs under valgrind and ASan in
test_io_valgrind.py."""

from __future__ import annotations

import os
import random
import threading

import pytest
from pager_support import make_model

from sdq.errors import PlanError
from sdq.paging.cache import POLICIES, CacheSettings, ExpertCache
from sdq.paging.reads import IOSettings
from sdq.run.plan import plan_for_slots

N_THREADS = 3
ACQUIRES = 250  # per thread and configuration: 3 x 250 x 12 configurations = 9000 acquires
K = 3
IO = {
    "pagecache": IOSettings(threads=4, mode="parallel", cache_mode="pagecache"),
    "dontneed": IOSettings(threads=3, mode="split", split=3, cache_mode="dontneed"),
    "direct": IOSettings(threads=2, mode="serial", cache_mode="direct", verify=True),
}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # 4 layers x 12 experts = 48 experts for an arena of 9 + 2 slots; parts of 5-13 KB, so the
    # split layout really cuts them and direct reads span several pages
    return make_model(
        tmp_path_factory.mktemp("stress") / "experts.bin",
        n_layers=4,
        n_expert=12,
        k=K,
        row_bytes=(1301, 2203, 907),
    )


def direct_supported(path) -> bool:
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("cache_mode", sorted(IO))
def test_every_served_view_is_the_files_bytes(model, cache_mode, policy):
    if cache_mode == "direct" and not direct_supported(model.path):
        pytest.skip("this file system has no O_DIRECT")
    t = model.experts
    expected = {
        (layer, e): model.expert_bytes(layer, e) for layer in t.layers for e in range(t.n_expert)
    }
    cs = CacheSettings(policy=policy, prefetch_slots=2)
    streaming = (K + 2) if policy in ("lrfu_bypass", "auto") else 0
    slots = N_THREADS * K + streaming  # every thread can pin K experts at once, no more
    cache = ExpertCache(model, plan_for_slots(model, slots, cache_mode, cs), IO[cache_mode], cs)
    served = [0] * N_THREADS
    errors: list[BaseException] = []

    def work(n: int) -> None:
        rng = random.Random(1000 * n + hash((cache_mode, policy)) % 1000)
        try:
            for _ in range(ACQUIRES):
                r = rng.randrange(len(t.layers))
                ids = rng.sample(range(t.n_expert), rng.randint(1, K))
                try:
                    h = cache.acquire(t.layers[r], ids)
                except PlanError:  # every slot pinned by the other threads at this moment
                    continue
                try:
                    if r + 1 < len(t.layers) and rng.random() < 0.5:
                        cache.prefetch(t.layers[r + 1], rng.sample(range(t.n_expert), 2))
                    for i in h.ready_order():
                        h.wait(i)
                        views = h.views(i)
                        want = expected[(h.layer, h.experts[i])]
                        for view, part in zip(views, want, strict=True):
                            assert view.tobytes() == part, (h.layer, h.experts[i])
                        served[n] += 1
                finally:
                    cache.release(h)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(N_THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    try:
        assert not any(th.is_alive() for th in threads), "a thread hangs"
        assert not errors, repr(errors[0])
        s = cache.stats
        assert sum(served) == s["lookups"] > ACQUIRES * N_THREADS  # ~2 experts per acquire
        assert s["lookups"] == s["hits"] + s["misses"] and s["read_errors"] == 0
        assert s["evictions"] > 0 or s["bypassed"] > 0  # the slots really were reused
    finally:
        cache.close()
