"""The C pool under valgrind: no leak, no invalid access, no data race.

kernels_c/test_io_pool.c drives io_pool.c directly (every path the binding uses: batches,
dontneed, resizing with queued work, every failure kind, closing a busy pool). Running the pure
C driver instead of python under valgrind keeps the run to seconds and the report free of
CPython's own allocator noise, so any report is ours; the binding's reference handling is
covered by test_io_pool.py.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
C = ROOT / "kernels_c"

pytestmark = pytest.mark.skipif(
    not (shutil.which("valgrind") and shutil.which("gcc")), reason="needs valgrind and gcc"
)


@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("valgrind") / "test_io_pool"
    cmd = [
        "gcc",
        "-g",
        "-O1",
        "-std=c11",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-D_GNU_SOURCE",
        "-pthread",
        f"-I{C}",
        str(C / "test_io_pool.c"),
        str(C / "io_pool.c"),
        "-o",
        str(exe),
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return exe


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
def test_pool_is_clean_under_valgrind(driver, tmp_path, tool):
    proc = subprocess.run(
        ["valgrind", "-q", "--error-exitcode=3", *tool, str(driver), str(tmp_path / "scratch")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "all checks passed" in proc.stdout
