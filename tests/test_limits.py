"""sdq.measure.limits: RLIMIT_DATA and cgroup v1 memory limits on a child, page-cache dropping."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from sdq.errors import ParamsError
from sdq.measure import limits
from sdq.units import MIB

# allocates and touches n MiB, then prints "ok"
TOUCH = (
    "import sys; n = int(sys.argv[1]) << 20; b = bytearray(n)\n"
    "for i in range(0, n, 4096): b[i] = 1\n"
    "print('ok')"
)


def _child(mb: int, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", TOUCH, str(mb)], capture_output=True, text=True, timeout=60, **kw
    )


def test_memory_limit_checks_its_settings():
    assert limits.MemoryLimit().method == "none"
    assert limits.MemoryLimit.mb("rlimit_data", 512).limit_bytes == 512 * MIB
    assert limits.MemoryLimit.mb("cgroup", 256).limit_mb == 256
    with pytest.raises(ParamsError, match="expected one of"):
        limits.MemoryLimit("ulimit", MIB)
    with pytest.raises(ParamsError, match=">= 1 MiB"):
        limits.MemoryLimit("rlimit_data", None)


def test_rlimit_data_makes_a_large_allocation_fail_with_memory_error():
    capped = _child(400, preexec_fn=limits.rlimit_data_preexec(200 * MIB))
    assert capped.returncode == 1
    assert "MemoryError" in capped.stderr
    free = _child(50, preexec_fn=limits.rlimit_data_preexec(400 * MIB))
    assert free.returncode == 0 and free.stdout.strip() == "ok"


CGROUP_OK, CGROUP_WHY = limits.cgroup_status()


@pytest.mark.skipif(not CGROUP_OK, reason=f"cgroup v1 memory limit not usable here: {CGROUP_WHY}")
def test_cgroup_limit_kills_a_child_past_it_and_is_removed():
    with limits.MemoryCgroup(64 * MIB) as cg:
        path = cg.path
        assert (path / "memory.limit_in_bytes").read_text().strip() == str(64 * MIB)
        p = _child(256, preexec_fn=cg.preexec)
        assert p.returncode == -signal.SIGKILL
        assert cg.oom_kills() >= 1
        assert cg.peak_bytes() >= 60 * MIB
    assert not path.exists()


@pytest.mark.skipif(not CGROUP_OK, reason=f"cgroup v1 memory limit not usable here: {CGROUP_WHY}")
def test_cgroup_child_runs_inside_the_group_under_the_limit():
    show = "print(open('/proc/self/cgroup').read())"
    with limits.MemoryCgroup(256 * MIB) as cg:
        p = subprocess.run(
            [sys.executable, "-c", show], capture_output=True, text=True, preexec_fn=cg.preexec
        )
        assert p.returncode == 0
        memory_line = next(ln for ln in p.stdout.splitlines() if ":memory:" in ln)
        assert memory_line.endswith("/" + cg.path.name)
        ok = _child(32, preexec_fn=cg.preexec)
        assert ok.returncode == 0 and cg.oom_kills() == 0


def test_cgroup_status_explains_a_missing_controller(tmp_path):
    ok, why = limits.cgroup_status(tmp_path)
    assert not ok and "no cgroup v1 memory controller" in why
    with pytest.raises(ParamsError, match="memory limit cgroup"):
        limits.MemoryCgroup(64 * MIB, root=tmp_path)


def test_own_memory_cgroup_parses_proc_cgroup(tmp_path):
    f = tmp_path / "cgroup"
    f.write_text("9:name=systemd:/\n4:memory:/a/b\n1:cpu,cpuacct:/\n0::/\n")
    assert limits._own_memory_cgroup(str(f)) == "/a/b"
    f.write_text("0::/user.slice\n")
    assert limits._own_memory_cgroup(str(f)) == "/"


def test_drop_file_cache_empties_the_files_pages(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(8 * MIB))
    with open(path, "rb") as f:
        while f.read(MIB):
            pass
    before = limits.file_resident_fraction(path)
    if before == 0:
        pytest.skip(f"{tmp_path} keeps no page cache (a filesystem without one)")
    assert before > 0.9
    assert limits.drop_file_cache(path) < 0.05
    assert limits.file_resident_fraction(path) < 0.05


def test_drop_system_cache_needs_root(monkeypatch):
    # never emptied for real here: it would slow every other process on the machine
    monkeypatch.setattr(limits.os, "geteuid", lambda: 1000)
    assert limits.drop_system_cache() is False
