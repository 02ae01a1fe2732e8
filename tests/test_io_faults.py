"""Faults injected under the expert read path: every one is a one-line ReadError naming the file,
layer, expert, part, offset and length; no failed read is ever served; nothing hangs or leaks.

Faults come from kernels_c/fault_pread.c, built here as a shared library and loaded with
LD_PRELOAD into a child Python process (its pread replaces libc's there, and only there); the
child runs one of the SCENARIOS below and exits 0 when every check passed. The pager's own
bookkeeping (double release, acquire after close) is checked in this process.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from pager_support import make_model

from sdq.errors import PlanError, ReadError
from sdq.paging.arena import Arena
from sdq.paging.cache import CacheSettings, ExpertCache
from sdq.paging.reads import ExpertReader, IOSettings, SlotLayout
from sdq.run.plan import plan_for_slots

TESTS = Path(__file__).resolve().parent
SHIM_C = TESTS.parent / "kernels_c" / "fault_pread.c"
CHILD_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shim") / "libfault_pread.so"
    cmd = ["gcc", "-shared", "-fPIC", "-O1", "-std=c11", "-Wall", "-Wextra", "-Werror"]
    cmd += ["-D_GNU_SOURCE", str(SHIM_C), "-ldl", "-lpthread", "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def run_child(shim: Path, scenario: str, tmp_path: Path, env=None, timeout=CHILD_TIMEOUT_S):
    code = (
        f"import sys; sys.path.insert(0, {str(TESTS)!r}); import test_io_faults as t; "
        f"t.SCENARIOS[{scenario!r}]({str(tmp_path)!r})"
    )
    env = dict(os.environ, LD_PRELOAD=str(shim), **(env or {}))
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc, time.monotonic() - t0


# ---------------------------------------------------------------- in the child process


def faults():
    """The preloaded fault library: set(spec) and fired()."""
    lib = ctypes.CDLL(os.environ["LD_PRELOAD"])
    lib.sdq_faults_set.argtypes = [ctypes.c_char_p]
    lib.sdq_faults_fired.restype = ctypes.c_int64

    class Faults:
        @staticmethod
        def set(spec: str) -> None:
            assert lib.sdq_faults_set(spec.encode()) == 0, spec

        @staticmethod
        def fired() -> int:
            return int(lib.sdq_faults_fired())

    return Faults


def child_model(tmp: str):
    # segments of 12-36 KB, several pages each
    return make_model(
        Path(tmp) / "experts.bin", n_layers=3, n_expert=8, row_bytes=(4321, 6007, 2999)
    )


def seg(model, layer: int, expert: int, part: int) -> tuple[int, int]:
    t = model.experts
    r = t.row(layer)
    return int(t.offsets[r, expert, part]), int(t.nbytes[r, expert, part])


def check_views(model, h, indices=None):
    for i in range(len(h.experts)) if indices is None else indices:
        h.wait(i)
        for view, want in zip(h.views(i), model.expert_bytes(h.layer, h.experts[i]), strict=True):
            assert view.tobytes() == want, (h.layer, h.experts[i])


def one_line(exc: BaseException, *parts: str) -> None:
    text = str(exc)
    assert "\n" not in text, text
    for p in parts:
        assert p in text, (p, text)


def scenario_reader(tmp: str) -> None:
    """ExpertReader under each fault, in every read layout."""
    f = faults()
    model = child_model(tmp)
    t = model.experts
    layer, e = t.layers[1], 3
    off, n = seg(model, layer, e, 1)  # expert 3's up
    where = f"reading layer {layer} expert {e} up at offset {off} length {n}"
    failures = [
        (f"eio:at={off}", f"I/O error {where}: Input/output error"),
        (f"eintr:at={off},times=0", f"I/O error {where}: Interrupted system call"),
        (f"short:at={off}", f"short read {where}, got {n // 2} bytes"),
    ]
    recovered = [(f"eintr:at={off},times=5", 5), (f"partial:at={off}", 1)]
    for mode, split in (("serial", 1), ("parallel", 1), ("split", 3)):
        io = IOSettings(threads=3, mode=mode, split=split)
        layout = SlotLayout.for_table(t, "pagecache")
        reader = ExpertReader(model.path, t, layout, io)
        arena = Arena(2, layout.slot_bytes)
        addrs = [arena.address(0), arena.address(1)]
        for spec, message in failures:
            if mode == "split":  # the failed read is a chunk: the segment's first, shorter
                message = message.split(f" length {n}")[0] + " length "
            f.set(spec)
            batch, _ = reader.submit(t.row(layer), [e, 5], addrs, arena)
            batch.wait(1)  # the other expert is unaffected
            try:
                batch.wait(0)
                raise AssertionError(f"{spec}: no error")
            except ReadError as exc:
                one_line(exc, model.path.name, message)
            assert f.fired() >= 1
        for spec, fired in recovered:
            f.set(spec)
            arena.buf[:] = 0
            batch, _ = reader.submit(t.row(layer), [e], addrs[:1], arena)
            batch.wait_all()
            assert f.fired() == fired, spec
            for p in range(3):
                o, m = seg(model, layer, e, p)
                v = layout.view_offset(o, p)
                assert arena.slot(0)[v : v + m].tobytes() == model.data[o : o + m].tobytes()
        f.set("")
        reader.close()
        arena.close()
    # a descriptor closed underneath: EBADF from then on, and close() still works
    layout = SlotLayout.for_table(t, "pagecache")
    reader = ExpertReader(model.path, t, layout, IOSettings(threads=2))
    arena = Arena(1, layout.slot_bytes)
    f.set(f"closefd:fd={reader.fd}")
    batch, _ = reader.submit(t.row(layer), [e], [arena.address(0)], arena)
    try:
        batch.wait_all()
        raise AssertionError("closed fd: no error")
    except ReadError as exc:
        one_line(exc, model.path.name, "Bad file descriptor", f"layer {layer} expert {e}")
    f.set("")
    reader.close()
    arena.close()


def merged_faults(f, reader, arena, row, experts, target, off, n, where, check_bytes) -> None:
    """Mode merged: `experts` [3] whose reads continue each other in the file, so each of their
    parts is one preadv; faults at `off` (the target expert's part of `n` bytes, `where` its
    name in an error). The preadv is half done or fails, and each read must then finish, or
    fail, on its own: every served expert holds the file's bytes (`check_bytes()`)."""
    addrs = [arena.address(k) for k in range(len(experts))]
    k_bad = experts.index(target)

    def submit(spec: str):
        f.set(spec)
        arena.buf[:] = 0
        batch, _ = reader.submit(row, experts, addrs, arena)
        return batch

    failures = [
        (f"eio:at={off},times=0", f"I/O error {where}: Input/output error"),
        (f"eintr:at={off},times=0", f"I/O error {where}: Interrupted system call"),
        # the preadv stops at half its range, in the target's read: end of file from there
        (f"short:at={off}", f"short read {where}, got {n // 2} bytes"),
    ]
    for spec, message in failures:
        batch = submit(spec)
        try:
            batch.wait(k_bad)
            raise AssertionError(f"{spec}: no error")
        except ReadError as exc:
            one_line(exc, Path(reader.path).name, message)
        assert f.fired() >= 1, spec
    recovered = [
        (f"eio:at={off}", 1),  # the preadv fails once; the reads retry one by one
        (f"eintr:at={off},times=5", 5),
        # the preadv stops at half its range, in the middle of the target's read, which the
        # pool must complete with pread
        (f"partial:at={off}", 1),
    ]
    for spec, fired in recovered:
        batch = submit(spec)
        batch.wait_all()
        assert f.fired() == fired, (spec, f.fired())
        check_bytes()
    f.set("")


def scenario_merged(tmp: str) -> None:
    """The merged read path (one preadv per run of neighbouring reads), in the GGUF's layout
    and in a pack, under every fault: errors name the expert whose read failed; a run the
    preadv left half done is completed read by read with the file's bytes."""
    from gguf_builders import Layout, Q, write_model

    from sdq.format.model import open_model
    from sdq.paging.pack import open_pack, write_pack

    f = faults()
    lay = Layout(n_layer=2, n_expert=8, n_used=2, expert_qtypes=(Q.Q8_0, Q.F16, Q.Q8_0))
    path, _ = write_model(Path(tmp) / "m.gguf", lay)
    model = open_model(path)
    t = model.require_experts()
    data = path.read_bytes()
    row, experts, target = 1, [3, 4, 5], 4
    layer = t.layers[row]

    def check_bytes(table, layout, arena):
        """Each part of each expert in its slot, read through `table`, equals the GGUF's."""
        for k, e in enumerate(experts):
            for p in range(3):
                a, n = int(t.offsets[row, e, p]), int(t.nbytes[row, e, p])
                v = layout.view_offset(int(table.offsets[row, e, p]), p, row)
                assert arena.slot(k)[v : v + n].tobytes() == data[a : a + n], (e, p)

    def under_faults(file, table, layout, preadvs: int, off: int, n: int, part: str) -> None:
        """The three experts read from `file` in `preadvs` preadvs, under every fault at `off`
        (the target's `part`, `n` bytes)."""
        reader = ExpertReader(file, table, layout, IOSettings(threads=3, mode="merged"))
        arena = Arena(3, layout.slot_bytes)
        reads, _ = reader.plan(row, experts, [arena.address(k) for k in range(3)])
        assert len(set(reads[:, 5].tolist())) == preadvs, reads
        where = f"reading layer {layer} expert {target} {part} at offset {off} length {n}"
        merged_faults(f, reader, arena, row, experts, target, off, n, where,
                      lambda: check_bytes(table, layout, arena))  # fmt: skip
        reader.close()
        arena.close()

    # the GGUF's layout: expert e's up continues expert e-1's up; 9 reads, one preadv per part
    off, n = int(t.offsets[row, target, 1]), int(t.nbytes[row, target, 1])
    under_faults(path, t, SlotLayout.for_table(t, "pagecache"), 3, off, n, "up")
    # a pack whose order puts experts 3, 4, 5 next to each other: 3 records, one preadv
    out = Path(tmp) / "m.sdqpack"
    write_pack(model, out)
    pack = open_pack(model, out)
    off, n = int(pack.table.offsets[row, target, 0]), int(pack.record_bytes[row])
    under_faults(pack.path, pack.table, SlotLayout.for_pack(pack, "pagecache"), 1, off, n, "record")


def scenario_stall(tmp: str) -> None:
    """A read that hangs: the wait gives up after the timeout with a one-line error, close()
    returns, and the process exits while the read still sleeps (the parent times it)."""
    f = faults()
    model = child_model(tmp)
    t = model.experts
    layer, e = t.layers[2], 6
    off, n = seg(model, layer, e, 0)
    cs = CacheSettings(policy="lru")
    io = IOSettings(threads=2, timeout_s=0.3)
    cache = ExpertCache(model, plan_for_slots(model, 4, cache=cs), io, cs)
    f.set(f"stall:at={off},ms=8000")
    h = cache.acquire(layer, [e, 1])
    check_views(model, h, [1])
    t0 = time.monotonic()
    try:
        h.wait(0)
        raise AssertionError("no timeout")
    except ReadError as exc:
        one_line(exc, model.path.name, f"read timed out after 0.3 s reading layer {layer}")
        one_line(exc, f"expert {e} gate at offset {off} length {n}")
    assert 0.25 < time.monotonic() - t0 < 2.0
    try:  # the hung read may still write into its slot: nothing more is read
        cache.acquire(layer, [2])
        raise AssertionError("acquire after a hung read")
    except ReadError as exc:
        one_line(exc, "read timed out")
    t0 = time.monotonic()
    cache.release(h)  # does not wait for the hung read again
    cache.close()
    assert time.monotonic() - t0 < 1.5  # close gave the hung read 0.3 s, once
    print("closed", flush=True)


def scenario_failed_wait(tmp: str) -> None:
    """A failed read fails its waiting expert only; the expert is not kept and its slot is
    free again; the next acquire reads it again (the fault fired once)."""
    f = faults()
    model = child_model(tmp)
    layer = model.experts.layers[1]
    for policy in ("lru", "layer_lrfu", "lrfu_bypass"):
        cs = CacheSettings(policy=policy)
        slots = 4 + (2 if policy == "lrfu_bypass" else 0)
        cache = ExpertCache(
            model, plan_for_slots(model, slots, cache=cs), IOSettings(threads=2), cs
        )
        off, _ = seg(model, layer, 3, 1)
        f.set(f"eio:at={off}")
        h = cache.acquire(layer, [0, 3])
        check_views(model, h, [0])
        try:
            h.wait(1)
            raise AssertionError("no error")
        except ReadError as exc:
            one_line(exc, model.path.name, f"layer {layer} expert 3 up at offset {off}")
        cache.release(h)
        assert 3 not in cache.cached(layer), policy
        assert cache.stats["read_errors"] == 1, policy
        h = cache.acquire(layer, [3])
        assert h.hits == (False,)
        check_views(model, h)
        cache.release(h)
        # no slot leaked: every cache slot can be pinned at once
        ids = list(range(cache.max_acquire))
        h = cache.acquire(layer, ids)
        check_views(model, h)
        cache.release(h)
        cache.close()


def scenario_failed_prefetch(tmp: str) -> None:
    """A prefetch whose read fails and that nobody waits for is never served: the acquire that
    requests the expert reads it again (a miss, not a prefetch hit), and the slot is not lost."""
    f = faults()
    model = child_model(tmp)
    layer = model.experts.layers[2]
    for policy in ("lru", "layer_lrfu", "lrfu_bypass"):
        cs = CacheSettings(policy=policy, prefetch_slots=2)
        slots = 4 + (4 if policy == "lrfu_bypass" else 0)
        cache = ExpertCache(
            model, plan_for_slots(model, slots, cache=cs), IOSettings(threads=2), cs
        )
        off, _ = seg(model, layer, 5, 0)
        f.set(f"eio:at={off}")
        assert cache.prefetch(layer, [5]) == 1
        deadline = time.monotonic() + 10
        while f.fired() == 0 or not all(b.all_done() for b in cache._inflight):
            assert time.monotonic() < deadline
            time.sleep(0.005)
        h = cache.acquire(layer, [5])
        check_views(model, h)
        cache.release(h)
        s = cache.stats
        assert s["prefetch_hits"] == 0 and s["misses"] == 1, (policy, s)
        assert s["read_errors"] == 1 and f.fired() == 1, (policy, s)
        ids = list(range(cache.max_acquire))
        h = cache.acquire(layer, ids)
        check_views(model, h)
        cache.release(h)
        cache.close()


def scenario_inflight_hit(tmp: str) -> None:
    """A second lookup of an expert whose read is still running is an in-flight hit: it waits
    for that read and reads nothing itself."""
    f = faults()
    model = child_model(tmp)
    layer = model.experts.layers[0]
    off, _ = seg(model, layer, 2, 2)
    cs = CacheSettings(policy="lru")
    cache = ExpertCache(model, plan_for_slots(model, 4, cache=cs), IOSettings(threads=2), cs)
    f.set(f"stall:at={off},ms=300")
    h1 = cache.acquire(layer, [2])
    h2 = cache.acquire(layer, [2])
    assert h1.hits == (False,) and h2.hits == (True,)
    s = cache.stats
    assert s["inflight_hits"] == 1 and s["hits"] == 1 and s["misses"] == 1, s
    check_views(model, h2)
    check_views(model, h1)
    cache.release(h1)
    cache.release(h2)
    assert cache.stats["reads"] == 3  # one expert's three segments, read once
    cache.close()


def scenario_cancel(tmp: str) -> None:
    """Closing a pool whose one worker is stuck in the first read: every other read is
    canceled, the first completes with the file's bytes; none is reported done without running."""
    from sdq import _io

    f = faults()
    data = np.random.default_rng(5).integers(0, 256, 1 << 18, dtype=np.uint8)
    path = Path(tmp) / "c.bin"
    path.write_bytes(data.tobytes())
    fd = os.open(path, os.O_RDONLY)
    buf = np.zeros(1 << 18, np.uint8)
    rows = np.array(
        [(fd, i * 4096, 4096, 4096, buf.ctypes.data + i * 4096, i, i) for i in range(64)],
        dtype=np.int64,
    )  # [64, 7]
    f.set("stall:at=0,ms=300")
    pool = _io.Pool(1, timeout=10.0)
    batch = pool.submit(rows, 0, buf)
    while f.fired() == 0:
        time.sleep(0.001)
    pool.close()
    rep = np.frombuffer(batch.report(), np.int64).reshape(-1, 6)  # [64, 6]
    assert rep[0, 5] == 0 and rep[0, 3] == 4096 and np.array_equal(buf[:4096], data[:4096])
    assert (rep[1:, 5] == 4).all() and (rep[1:, 3] == 0).all(), rep[:, 5]
    try:
        batch.wait(7)
        raise AssertionError("a canceled read waited without error")
    except _io.IOFailure as exc:
        assert exc.kind == "canceled" and exc.offset == 7 * 4096 and exc.length == 4096
    batch.wait(0)
    os.close(fd)


def scenario_chat_hangs(tmp: str) -> None:
    """`sdq chat` whose first MoE layer's reads hang (SDQ_FAULTS), with a 0.5 s read timeout:
    one line, exit code 2, and the process ends without waiting for the hung reads."""
    import dataclasses

    from sdq.cli import main

    init = ExpertReader.__init__

    def short_timeout(self, path, table, layout, io):
        init(self, path, table, layout, dataclasses.replace(io, timeout_s=0.5))

    ExpertReader.__init__ = short_timeout
    code = main(os.environ["SDQ_CHAT_ARGS"].split("\x1f"))
    sys.exit(0 if code == 2 else 1)  # a normal exit; the parent checks the line and the time


SCENARIOS = {
    name[len("scenario_") :]: fn for name, fn in globals().items() if name.startswith("scenario_")
}


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize(
    "scenario", ["reader", "merged", "failed_wait", "failed_prefetch", "inflight_hit", "cancel"]
)
def test_fault_scenario(shim, tmp_path, scenario):
    run_child(shim, scenario, tmp_path)


def test_hung_read_times_out_and_the_process_exits(shim, tmp_path):
    proc, seconds = run_child(shim, "stall", tmp_path)
    assert "closed" in proc.stdout
    assert seconds < 8.0  # the stalled read sleeps 8 s: the child did not wait for it


def test_chat_read_failure_is_one_line(shim, tiny_model, tmp_path):
    """`sdq chat` with the first MoE layer's expert reads failing: exit 2, one line naming the
    file, layer, expert, offset and length; no token printed."""
    from sdq.format.model import open_model

    t = open_model(tiny_model).require_experts()
    gate = t.offsets[0, :, 0]  # [E] the first MoE layer's gate segments
    rules = f"eio:at={int(gate.min())},to={int(gate.max() + t.nbytes[0, :, 0].max())},times=0"
    cmd = [sys.executable, "-m", "sdq", "chat", "-m", str(tiny_model), "-p", "hello there"]
    cmd += ["-n", "4", "--temp", "0", "-c", "128", "-b", "16", "--ram-budget-mb", "4000"]
    env = dict(os.environ, LD_PRELOAD=str(shim), SDQ_FAULTS=rules)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = proc.stderr
    assert err.count("\n") == 1 and err.startswith("sdq chat: error: "), err
    assert str(tiny_model) in err and "I/O error reading layer" in err
    assert "at offset" in err and "length" in err and "Input/output error" in err


def test_chat_hung_read_is_one_line_and_the_process_exits(shim, tiny_model, tmp_path):
    from sdq.format.model import open_model

    t = open_model(tiny_model).require_experts()
    gate = t.offsets[0, :, 0]  # [E]
    rules = f"stall:at={int(gate.min())},to={int(gate.max() + t.nbytes[0, :, 0].max())}"
    rules += ",times=0,ms=30000"
    args = ["chat", "-m", str(tiny_model), "-p", "hello there", "-n", "4", "--temp", "0"]
    args += ["-c", "128", "-b", "16", "--ram-budget-mb", "4000"]
    env = {"SDQ_FAULTS": rules, "SDQ_CHAT_ARGS": "\x1f".join(args)}
    proc, seconds = run_child(shim, "chat_hangs", tmp_path, env=env)
    err = proc.stderr
    assert err.count("\n") == 1 and err.startswith("sdq chat: error: "), err
    assert "read timed out after 0.5 s reading layer 0 expert" in err and "gate at offset" in err
    assert seconds < 25  # a hung read sleeps 30 s: nobody waited for it to end


# ---------------------------------------------------------------- bookkeeping, in process


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("faults") / "experts.bin", n_layers=2, n_expert=6)


def test_a_second_release_unpins_nothing(model):
    cs = CacheSettings(policy="lru")
    cache = ExpertCache(model, plan_for_slots(model, 2, cache=cs), IOSettings(threads=2), cs)
    layer = model.experts.layers[0]
    h1 = cache.acquire(layer, [0])
    h2 = cache.acquire(layer, [0])
    cache.release(h1)
    cache.release(h1)  # must not unpin h2's pin
    with pytest.raises(PlanError, match="pinned"):
        cache.acquire(layer, [1, 2])  # would evict expert 0 if it were unpinned
    check_views(model, h2)
    cache.release(h2)
    cache.release(cache.acquire(layer, [1, 2]))
    cache.close()


def test_nothing_works_after_close(model):
    cache = ExpertCache(model, plan_for_slots(model, 4))
    layer = model.experts.layers[1]
    cache.release(cache.acquire(layer, [1]))
    cache.close()
    for call in (lambda: cache.acquire(layer, [1]), lambda: cache.prefetch(layer, [2])):
        with pytest.raises(ValueError, match="closed"):
            call()
    cache.close()  # twice is fine


def test_replaced_file_is_detected_at_the_next_token(tmp_path):
    path = tmp_path / "m.bin"
    m = make_model(path, n_layers=2, n_expert=6)
    cache = ExpertCache(m, plan_for_slots(m, 4))
    first, second = m.experts.layers
    cache.release(cache.acquire(first, [0]))
    replacement = tmp_path / "new.bin"
    replacement.write_bytes(np.asarray(m.data).tobytes())
    os.replace(replacement, path)
    cache.release(cache.acquire(second, [0]))  # same token: the open file is unchanged
    with pytest.raises(ReadError, match="m.bin: the model file changed .* replaced"):
        cache.acquire(first, [1])  # a new token checks the path
    cache.close()


def test_verify_catches_bytes_that_differ_from_the_file(model):
    """With verify, an expert whose slot bytes differ from the file's (here: flipped after its
    read finished, before its first use) is a one-line ReadError naming the segment, and the
    expert is not kept; untouched experts pass."""
    io = IOSettings(threads=2, verify=True)
    cache = ExpertCache(model, plan_for_slots(model, 4), io)
    layer = model.experts.layers[1]
    h = cache.acquire(layer, [2, 4])
    for read in h.pending:
        read[0].wait_all()
    off = cache.layout.view_offset(int(model.experts.offsets[1, 4, 2]), 2)
    cache.arena.slot(h.slots[1])[off + 5] ^= 0xFF  # a byte of expert 4's down
    h.wait(0)
    with pytest.raises(ReadError, match=r"checksum mismatch for layer 2 expert 4 down at offset"):
        h.wait(1)
    cache.release(h)
    assert cache.cached(layer) == [2] and cache.stats["read_errors"] == 1
    h = cache.acquire(layer, [4])  # read again, and right this time
    h.wait(0)
    cache.release(h)
    cache.close()


def test_chat_verify_checks_every_expert_read(tiny_model, capsys, monkeypatch):
    """`sdq chat --verify` checks expert bytes (and generates what it does without)."""
    from sdq.cli import main
    from sdq.paging.checksums import ExpertChecksums

    checked = [0]
    original = ExpertChecksums.check

    def counting(self, row, expert, views):
        checked[0] += 1
        return original(self, row, expert, views)

    monkeypatch.setattr(ExpertChecksums, "check", counting)
    args = ["chat", "-m", str(tiny_model), "-p", "hello", "-n", "6", "--temp", "0", "--json"]
    args += ["-c", "128", "-b", "16", "--ram-budget-mb", "4000", "--max-slots", "12"]
    runs = []
    for flags in ([], ["--verify"]):
        assert main(args + flags) == 0
        runs.append(json.loads(capsys.readouterr().out))
        assert (checked[0] > 0) == bool(flags)
    assert runs[0]["generated_ids"] == runs[1]["generated_ids"]
    assert runs[1]["settings"]["verify"] and not runs[0]["settings"]["verify"]
