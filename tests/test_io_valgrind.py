"""The C pool under valgrind and AddressSanitizer: no leak, no invalid access, no data race.

kernels_c/test_io_pool.c drives io_pool.c directly (every path the binding uses: batches,
dontneed, resizing with queued work, every failure kind, closing a busy pool); the `faults`
build links kernels_c/fault_pread.c into it, which adds injected faults (EINTR, partial and
short reads, EIO, stalls against bounded waits, a descriptor closed underneath, a deterministic
cancellation, a close that gives up on a hung read), in pread and in the merged path's preadv.
Running the pure C driver instead of python under valgrind keeps the run to seconds and the
report free of CPython's own allocator noise, so any report is ours; the binding's reference
handling is covered by test_io_pool.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
C = ROOT / "kernels_c"

needs_valgrind = pytest.mark.skipif(
    not (shutil.which("valgrind") and shutil.which("gcc")), reason="needs valgrind and gcc"
)
needs_gcc = pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")


def build(out: Path, faults: bool, extra=(), pool_c: Path = C / "io_pool.c") -> Path:
    sources = [C / "test_io_pool.c", pool_c] + ([C / "fault_pread.c"] if faults else [])
    cmd = ["gcc", "-g", "-O1", "-std=c11", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE"]
    cmd += ["-pthread", *extra, f"-I{C}", *map(str, sources), "-ldl", "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


@pytest.fixture(scope="module", params=["plain", "faults"])
def driver(request, tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("valgrind") / f"test_io_pool_{request.param}"
    return build(exe, request.param == "faults")


@pytest.mark.parametrize(
    "tool",
    [
        [
            "--tool=memcheck",
            "--leak-check=full",
            "--show-leak-kinds=definite,indirect,possible",
            "--errors-for-leak-kinds=definite,indirect,possible",
        ],
        ["--tool=helgrind"],
    ],
    ids=["memcheck", "helgrind"],
)
@needs_valgrind
def test_pool_is_clean_under_valgrind(driver, tmp_path, tool):
    proc = subprocess.run(
        ["valgrind", "-q", "--error-exitcode=3", *tool, str(driver), str(tmp_path / "scratch")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "all checks passed" in proc.stdout


@needs_gcc
def test_pool_is_clean_under_asan(tmp_path):
    """The fault build under AddressSanitizer and UndefinedBehaviorSanitizer."""
    try:
        exe = build(
            tmp_path / "asan", True, ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
        )
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"gcc cannot build with sanitizers here: {exc.stderr[-300:]}")
    env = dict(
        os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0", UBSAN_OPTIONS="halt_on_error=1"
    )
    proc = subprocess.run(
        [str(exe), str(tmp_path / "scratch")], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "all checks passed" in proc.stdout


# the merged path's completion step: a read a preadv left short is finished with pread
COMPLETE = "        if (r[i].done < r[i].need) read_rest(&r[i]);\n"
# ... planted bug: only reads the preadv did not reach at all are finished
PARTLY_FILLED = "        if (r[i].done == 0) read_rest(&r[i]);\n"


@needs_gcc
def test_a_merged_read_left_partly_filled_fails_the_fault_driver(tmp_path):
    """The fault suite guards the merged path: with the bug planted (a read that a short or
    partial preadv left partly filled is never completed, and would be served with stale
    bytes), the fault driver's merged checks fail; the real source passes them."""
    source = (C / "io_pool.c").read_text(encoding="utf-8")
    assert source.count(COMPLETE) == 1, "io_pool.c's merged completion step moved: update"
    planted = tmp_path / "io_pool.c"
    planted.write_text(source.replace(COMPLETE, PARTLY_FILLED), encoding="utf-8")
    runs = {}
    for name, pool_c in (("real", C / "io_pool.c"), ("planted", planted)):
        exe = build(tmp_path / f"driver_{name}", True, pool_c=pool_c)
        runs[name] = subprocess.run(
            [str(exe), str(tmp_path / f"scratch_{name}")],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert runs["real"].returncode == 0, runs["real"].stderr[-4000:]
    assert runs["planted"].returncode == 1
    failed = runs["planted"].stderr
    assert "b->reads[1].kind == SDQ_SHORT && b->reads[1].done == 2500" in failed, failed
    assert "read_is_right(&b->reads[k])" in failed, failed
