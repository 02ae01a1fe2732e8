"""Saved I/O profiles and fair fio runs: where a profile is filed (sdq.paging.io_profile), which
one a run takes (sdq.run.settings), `sdq probe --profile-out` without a path, fio's huge-page
buffers and run length (sdq.measure.fio), the per-run figures paired verdicts need, the re-read
check and the engine probe's split sweep."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sdq.dirs import CACHE_ENV, cache_root
from sdq.measure import fio
from sdq.measure.device import describe_storage
from sdq.measure.probe import (
    MEMORY_FILESYSTEMS,
    Timing,
    pick_threads,
    reread_latency,
    reread_order,
    summarize,
)
from sdq.paging.io_profile import default_profile_path, device_id, find_profile, load_io_profile


@pytest.fixture
def disk_dir(tmp_path: Path) -> Path:
    if describe_storage(tmp_path).fstype in MEMORY_FILESYSTEMS:
        pytest.skip("the temporary directory is on a memory filesystem")
    return tmp_path


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty sdq cache folder for this test."""
    root = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(root))
    return root


def write_profile(path: Path, threads: int, split: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"version": 1, "io_threads": threads, "io_split": split, "cache_mode": "direct"}
    path.write_text(json.dumps(doc))
    return path


# ---------------------------------------------------------------------------- where profiles are


def fake_sysfs(root: Path, *, partition: bool, model: str = "", serial: str = "") -> Path:
    """/sys/dev/block/<maj:min> -> /sys/block/<disk>[/<part>] as the kernel lays it out."""
    disk = root / "devices" / "nvme0n1"
    (disk / "device").mkdir(parents=True)
    if model:
        (disk / "device" / "model").write_text(model + "\n")
    if serial:
        (disk / "serial").write_text(serial + "\n")
    node = disk
    if partition:
        node = disk / "nvme0n1p2"
        node.mkdir()
        (node / "partition").write_text("2\n")
    links = root / "dev-block"
    links.mkdir()
    return links, node


@pytest.mark.parametrize("partition", [False, True])
def test_device_id_names_the_whole_disk_and_its_model(tmp_path, partition):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"x")
    st = os.stat(f)
    links, node = fake_sysfs(
        tmp_path / "sys", partition=partition, model="Samsung SSD 980 PRO 1TB  "
    )
    (links / f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}").symlink_to(node)
    assert device_id(f, links) == "nvme0n1-Samsung_SSD_980_PRO_1TB"


def test_device_id_falls_back_to_serial_then_to_the_device_numbers(tmp_path):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"x")
    st = os.stat(f)
    links, node = fake_sysfs(tmp_path / "sys", partition=False, serial="BTHV/1234")
    (links / f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}").symlink_to(node)
    assert device_id(f, links) == "nvme0n1-BTHV_1234"
    empty = tmp_path / "no-block-devices"
    empty.mkdir()
    assert device_id(f, empty) == f"dev-{os.major(st.st_dev)}-{os.minor(st.st_dev)}"


def test_profiles_are_filed_by_device_in_the_cache(tmp_path, cache):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"x")
    path = default_profile_path(f)
    assert path == cache_root() / "io-profiles" / f"{device_id(f)}.json"
    assert path.parent.parent == cache
    assert find_profile(f) is None and not path.parent.exists()  # looking creates nothing
    write_profile(path, 6, 1)
    assert find_profile(f) == path
    other = tmp_path / "other.gguf"  # same filesystem, same device: the same profile
    other.write_bytes(b"y")
    assert find_profile(other) == path
    assert find_profile(tmp_path / "missing.gguf") is None
    assert device_id(f) == describe_storage(f).device_id


# ---------------------------------------------------------------------- which profile a run takes


def chat_settings(*argv: str):
    from sdq.commands import chat
    from sdq.run.settings import RunSettings

    parser = argparse.ArgumentParser()
    chat.add_arguments(parser)
    return RunSettings.from_args(parser.parse_args(["-p", "hi", *argv]))


def test_a_run_takes_the_saved_profile_of_its_models_device(tmp_path, cache):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    m = ("-m", str(model))
    none = chat_settings(*m)  # no profile saved: defaults
    assert none.io_profile is None and none.io_threads is None and none.io_split == 1
    saved = write_profile(default_profile_path(model), 6, 4)
    s = chat_settings(*m)
    assert (s.io_threads, s.io_split, s.io_mode, s.io_profile) == (6, 4, "split", str(saved))


@pytest.mark.parametrize(
    "flags",
    [("--io-threads", "3"), ("--io-split", "2"), ("--io-mode", "serial"), ("--io-profile", "none")],
)
def test_an_explicit_io_flag_or_none_keeps_the_saved_profile_out(tmp_path, cache, flags):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    write_profile(default_profile_path(model), 6, 4)
    s = chat_settings("-m", str(model), *flags)
    assert s.io_profile is None
    assert s.io_threads == (3 if "--io-threads" in flags else None)
    assert s.io_split == (2 if "--io-split" in flags else 1)


def test_an_explicit_profile_path_fills_what_the_flags_leave(tmp_path, cache):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    write_profile(default_profile_path(model), 6, 4)
    given = write_profile(tmp_path / "mine.json", 5, 2)
    s = chat_settings("-m", str(model), "--io-profile", str(given), "--io-threads", "3")
    assert (s.io_threads, s.io_split, s.io_profile) == (3, 2, str(given))


def test_resident_runs_and_commands_without_the_flag_take_no_profile(tmp_path, cache):
    from sdq.run.settings import RunSettings

    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    write_profile(default_profile_path(model), 6, 4)
    assert chat_settings("-m", str(model), "--resident").io_profile is None
    args = argparse.Namespace(model=str(model), threads=2)  # e.g. sdq bench resident's flags
    assert RunSettings.from_args(args).io_profile is None


def test_chat_json_says_which_saved_profile_it_used(tiny_model, tmp_path):
    """End to end: `sdq chat --json` with a saved profile for the model's device."""
    root = tmp_path / "cache"
    root.mkdir()
    for name in ("vocab", "models"):  # the real cache's tokenizer and models, shared
        if (cache_root() / name).exists():
            (root / name).symlink_to(cache_root() / name)
    env = dict(os.environ, **{CACHE_ENV: str(root)})
    profile_path = root / "io-profiles" / f"{device_id(tiny_model)}.json"
    write_profile(profile_path, 5, 2)
    cmd = [sys.executable, "-m", "sdq", "chat", "--json", "-m", str(tiny_model), "-p", "Hi",
           "-n", "2", "--temp", "0", "-c", "128", "-b", "16"]  # fmt: skip
    out = json.loads(
        subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    )
    assert out["io_profile"] == str(profile_path) == out["settings"]["io_profile"]
    assert (out["settings"]["io_threads"], out["settings"]["io_split"]) == (5, 2)
    out = subprocess.run([*cmd, "--io-profile", "none"], env=env, capture_output=True, text=True)
    assert json.loads(out.stdout)["io_profile"] is None


def test_probe_profile_out_without_a_path_saves_the_devices_profile(disk_dir, cache, capsys):
    from sdq.cli import main

    args = ["probe", "--size", "256k", "--threads", "1,2", "--reads", "8", "--split", "1",
            "--scratch-size", "8M", "--scratch-dir", str(disk_dir), "--profile-out"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    saved = default_profile_path(disk_dir)
    assert f"I/O profile written to {saved}" in out
    profile = load_io_profile(saved)
    assert profile.device["device_id"] == device_id(disk_dir)
    assert profile.measured["basis"] == "levels"
    assert find_profile(disk_dir / "any-file-there") is None  # the file must exist
    (disk_dir / "m.gguf").write_bytes(b"x")
    assert find_profile(disk_dir / "m.gguf") == saved


# ---------------------------------------------------------------------------- fair fio


def test_fio_command_runs_for_a_time_into_huge_pages(tmp_path):
    cmd = fio.fio_command(tmp_path / "f", size=860160, threads=4, reads=64, cache_mode="direct",
                          runtime_s=0.5, iomem="shmhuge")  # fmt: skip
    assert "--time_based" in cmd and "--runtime=500ms" in cmd and "--iomem=shmhuge" in cmd
    assert not any(c.startswith("--number_ios") for c in cmd)
    plain = fio.fio_command(tmp_path / "f", size=860160, threads=4, reads=64, cache_mode="direct")
    assert "--number_ios=16" in plain and not any(c.startswith("--iomem") for c in plain)


def test_huge_pages_for_fio_jobs():
    mib2 = 2 << 20
    assert fio.huge_pages_for(860_160, 16, mib2) == 32  # two pages per job
    assert fio.huge_pages_for(1_900_544, 1, mib2) == 2
    assert fio.huge_pages_for(mib2, 8, mib2) == 24  # a 2 MiB read needs three


class FakeSysctl:
    """A stand-in for /proc/sys/vm/nr_hugepages and /proc/meminfo (the kernel's side)."""

    def __init__(self, value: int, *, made: int | None = None, writable: bool = True):
        self.value, self.made, self.writable, self.writes = value, made, writable, []

    def read_text(self) -> str:
        return f"{self.value}\n"

    def write_text(self, text: str) -> None:
        if not self.writable:
            raise PermissionError(13, "Permission denied")
        self.writes.append(int(text))
        self.value = int(text)

    def meminfo(self):
        total = self.value if self.made is None else min(self.value, self.made)
        return FakeText(f"HugePages_Total:    {total}\nHugepagesize:       2048 kB\n")


class FakeText:
    def __init__(self, text: str):
        self.text = text

    def read_text(self) -> str:
        return self.text


def test_huge_page_buffers_are_reserved_then_restored(monkeypatch):
    sysctl = FakeSysctl(3)
    monkeypatch.setattr(fio, "NR_HUGEPAGES", sysctl)
    monkeypatch.setattr(fio, "MEMINFO", _Live(sysctl))
    with fio.huge_page_buffers(32) as mem:
        assert mem.iomem == "shmhuge" and mem.page_bytes == 2 << 20
        assert sysctl.value == 35 and "3 -> 35" in mem.note
    assert sysctl.value == 3 and sysctl.writes == [35, 3]


def test_huge_page_buffers_fall_back_to_small_pages_and_say_why(monkeypatch):
    sysctl = FakeSysctl(0, made=10)  # the kernel makes only 10 of the 32
    monkeypatch.setattr(fio, "NR_HUGEPAGES", sysctl)
    monkeypatch.setattr(fio, "MEMINFO", _Live(sysctl))
    with fio.huge_page_buffers(32) as mem:
        assert mem.iomem == "malloc" and mem.page_bytes == 4096
        assert "only 10 of the 32" in mem.note
    assert sysctl.value == 0
    locked = FakeSysctl(0, writable=False)  # not root
    monkeypatch.setattr(fio, "NR_HUGEPAGES", locked)
    with fio.huge_page_buffers(8) as mem:
        assert mem.page_bytes == 4096 and "could not be raised" in mem.note
    with pytest.raises(RuntimeError):  # the count is restored however the block exits
        with fio.huge_page_buffers(8):
            raise RuntimeError
    assert locked.value == 0


class _Live:
    """/proc/meminfo that follows the fake nr_hugepages."""

    def __init__(self, sysctl: FakeSysctl):
        self.sysctl = sysctl

    def read_text(self) -> str:
        return self.sysctl.meminfo().read_text()


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
def test_fio_runs_say_their_buffer_pages_and_length(disk_dir):
    data = disk_dir / "data.bin"
    data.write_bytes(np.random.default_rng(0).integers(0, 256, 8 << 20, np.uint8).tobytes())
    with fio.huge_page_buffers(fio.huge_pages_for(262_144, 2)) as mem:
        st = fio.run_fio(data, size=262_144, threads=2, reads=8, cache_mode="direct",
                         runtime_s=0.2, memory=mem)  # fmt: skip
    assert st.page_bytes == mem.page_bytes and 195 <= st.runtime_ms <= 260
    assert st.reads > 8 and st.mb_s > 0  # it read for 200 ms, not 8 reads
    small = fio.run_fio(data, size=262_144, threads=2, reads=8, cache_mode="direct")
    assert small.page_bytes == 4096 and small.reads == 8


# ---------------------------------------------------------------------------- per-run figures


def test_summarize_keeps_each_runs_figures_in_order():
    runs = [
        Timing(np.array([1_000_000, 3_000_000]), 4_000_000, 8_000_000),
        Timing(np.array([2_000_000, 2_000_000]), 2_000_000, 8_000_000),
    ]
    s = summarize(runs, threads=2, size=4_000_000)
    assert s.mb_s_runs == pytest.approx((2000.0, 4000.0))
    assert s.iops_runs == pytest.approx((500.0, 1000.0))
    assert s.median_ms_runs == pytest.approx((2.0, 2.0))
    assert s.mb_s == pytest.approx(3000.0)


@pytest.mark.parametrize("n", [1, 2, 5, 64])
def test_reread_order_reads_each_block_twice_interleaved(n):
    order, first, second = reread_order(n)
    assert len(order) == 2 * n and sorted(order.tolist()) == sorted(list(range(n)) * 2)
    assert (order[first] == np.arange(n)).all() and (order[second] == np.arange(n)).all()
    assert (first < second).all()
    assert (order[second[:-1] - 1] == np.arange(1, n)).all()  # right after the next first read
    assert first.tolist() == sorted(first.tolist())


def test_reread_slower_share_and_its_interval():
    from sdq.measure.probe import Reread

    a = tuple([0.2] * 50 + [1.0] * 10)  # cold first reads: a slow tail
    b = tuple([0.2] * 60)
    r = Reread("f", 60, 1.0, 0.2, 1.0, sum(a) / 60, 0.2, 0.2, 0.2, a, b)
    assert r.mean_ratio > 1
    assert r.slower_share == pytest.approx(10 / 60)  # ties are not "slower"
    same = Reread("f", 60, 1.0, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, b, b)
    assert same.mean_ratio == 1.0 and same.slower_share_interval() == (0.0, 0.0)
    # every first read slower by a little: the share sees it, whatever the tails do
    c = tuple(x + 0.01 for x in b)
    r = Reread("f", 60, 1.0, 0.21, 0.21, 0.21, 0.2, 0.2, 0.2, c, b)
    assert r.slower_share == 1.0 and r.slower_share_interval() == (1.0, 1.0)
    alternate = tuple(0.3 if i % 2 else 0.1 for i in range(60))
    r = Reread("f", 60, 1.0, 0.2, 0.3, 0.2, 0.2, 0.2, 0.2, alternate, b)
    lo, hi = r.slower_share_interval()
    assert r.slower_share == 0.5 and lo < 0.5 < hi


def test_reread_reads_the_same_blocks_twice(disk_dir):
    data = disk_dir / "data.bin"
    data.write_bytes(np.random.default_rng(0).integers(0, 256, 4 << 20, np.uint8).tobytes())
    r = reread_latency(data, reads=64, seed=1)
    assert r.reads == 64 and 0 <= r.file_age_s < 600
    for v in (r.first_median_ms, r.second_median_ms, r.first_mean_ms, r.second_mean_ms):
        assert 0 < v < 1000
    assert r.first_median_ms <= r.first_p90_ms and r.second_median_ms <= r.second_p90_ms
    assert r.mean_ratio == pytest.approx(r.first_mean_ms / r.second_mean_ms)
    assert len(r.first_ms) == len(r.second_ms) == 64
    assert r.first_mean_ms == pytest.approx(np.mean(r.first_ms))


# ---------------------------------------------------------------------------- engine splits


def test_engine_split_sweep_in_the_pagers_split_mode(tiny_model):
    from sdq.measure.probe_engine import engine_vs_fio

    res = engine_vs_fio(tiny_model, (1, 2), layers=2, repeat=2, fio=False, splits=(1, 2, 4))
    assert [c.split for c in res.splits] == [1, 2, 4]
    # at the thread count the recommendation rule takes from the engine cells
    picked = pick_threads([(c.threads, c.arena_mb_s) for c in res.cells])[0][0]
    assert {c.threads for c in res.splits} == {picked}
    for c in res.splits:
        assert c.runs == 2 and len(c.mb_s_runs) == 2 and c.read_ms > 0
        assert c.mb_s_min <= c.mb_s <= c.mb_s_max
    for c in res.cells:
        assert len(c.arena_mb_s_runs) == 2 and math.isnan(c.fio_small_pages_mb_s)
    fixed = engine_vs_fio(tiny_model, (1,), layers=1, repeat=1, fio=False, splits=(1, 8),
                          split_threads=3)  # fmt: skip
    assert {c.threads for c in fixed.splits} == {3}
    assert engine_vs_fio(tiny_model, (1,), layers=1, repeat=1, fio=False, splits=()).splits == []


def test_a_profile_with_unmeasured_columns_is_saved_as_json(tiny_model, tmp_path):
    """Engine cells without fio hold NaN; the saved profile holds null there (valid JSON)."""
    from sdq.measure.probe import profile_from, run_probe, settings_for_model
    from sdq.measure.probe_engine import engine_vs_fio
    from sdq.paging.io_profile import write_io_profile

    settings = settings_for_model(tiny_model, threads=(1, 2), reads=4, splits=(1,), repeat=1)
    result = run_probe(settings)
    engine = engine_vs_fio(tiny_model, (1, 2), layers=1, repeat=1, fio=False, splits=(1, 2))
    out = tmp_path / "io.json"
    write_io_profile(out, profile_from(result, engine))
    saved = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert saved["measured"]["basis"] == "engine"
    assert saved["measured"]["engine"][0]["fio_mb_s"] is None
    assert [c["split"] for c in saved["measured"]["engine_split"]] == [1, 2]
    assert load_io_profile(out).io_threads in (1, 2)
