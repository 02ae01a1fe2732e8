"""`sdq probe` on the command line: a smoke run, the JSON and profile outputs, bad arguments."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sdq.cli import main
from sdq.measure.device import describe_storage
from sdq.measure.probe import MEMORY_FILESYSTEMS
from sdq.paging.io_profile import load_io_profile

SMOKE_ARGS = [
    "--size", "256k", "--threads", "1,2", "--reads", "8", "--split", "1,2",
    "--split-batch", "4", "--scratch-size", "8M",
]  # fmt: skip


@pytest.fixture
def disk_dir(tmp_path: Path) -> Path:
    if describe_storage(tmp_path).fstype in MEMORY_FILESYSTEMS:
        pytest.skip("the temporary directory is on a memory filesystem")
    return tmp_path


def run_cli(argv, capsys):
    code = main(["probe", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_probe_json_and_profile(disk_dir, capsys):
    prof = disk_dir / "io.json"
    code, out, err = run_cli(
        [*SMOKE_ARGS, "--scratch-dir", str(disk_dir), "--json", "--profile-out", str(prof)],
        capsys,
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["cache_mode"] == "direct" and data["scratch"] is True
    assert len(data["levels"]) == 2 and len(data["small"]) == 2 and len(data["split"]) == 4
    profile = load_io_profile(prof)
    assert profile.io_threads == data["recommendation"]["io_threads"]
    assert [p.name for p in disk_dir.iterdir()] == ["io.json"]  # scratch file gone


def test_probe_text_report_states_its_labels(disk_dir, capsys):
    code, out, _ = run_cli(
        [*SMOKE_ARGS, "--scratch-dir", str(disk_dir), "--cache-mode", "dontneed"], capsys
    )
    assert code == 0
    assert "cache mode: dontneed" in out and "scratch file (removed)" in out
    assert "% of RAM" in out and "recommendation: io_threads=" in out


def one_line_error(code, err, *fragments):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sdq probe: error: "), err
    for f in fragments:
        assert f in lines[0]


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["--threads", "0,4"], ["--threads", "0"]),
        (["--threads", "a,b"], ["--threads"]),
        (["--reads", "0"], ["--reads"]),
        (["--split", "16"], ["--split", "16"]),
        (["--cache-mode", "pagecache"], ["--cache-mode", "pagecache"]),
        (["--size", "16M", "--scratch-size", "8M"], ["--size", "scratch"]),
        (["--scratch-dir", "/nonexistent-sdq-dir"], ["/nonexistent-sdq-dir", "does not exist"]),
        (["--file", "/nonexistent-sdq-file"], ["/nonexistent-sdq-file", "no such file"]),
    ],
)
def test_bad_arguments_give_one_line_errors(argv, fragments, capsys):
    one_line_error(*run_cli(argv, capsys)[::2], *fragments)


def test_size_larger_than_file(tmp_path, capsys):
    f = tmp_path / "small.bin"
    f.write_bytes(b"\0" * 10_000)
    code, _, err = run_cli(["--file", str(f), "--size", "20000"], capsys)
    one_line_error(code, err, "--size 20000", str(f), "10000 B")


def test_unwritable_scratch_directory(tmp_path, capsys):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    code, _, err = run_cli(["--scratch-dir", str(not_a_dir)], capsys)
    one_line_error(code, err, "not a directory")
    if os.geteuid() != 0:  # root writes anywhere: permission bits prove nothing then
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        code, _, err = run_cli(["--scratch-dir", str(locked)], capsys)
        one_line_error(code, err, "not writable")


def test_unwritable_profile_directory(tmp_path, capsys):
    code, _, err = run_cli(["--profile-out", str(tmp_path / "no" / "such" / "p.json")], capsys)
    one_line_error(code, err, "--profile-out", "does not exist")


def test_memory_filesystem_is_refused(capsys):
    shm = Path("/dev/shm")
    if not shm.is_dir() or describe_storage(shm).fstype not in MEMORY_FILESYSTEMS:
        pytest.skip("no tmpfs at /dev/shm")
    f = shm / f"sdq-probe-test-{os.getpid()}"
    f.write_bytes(b"\0" * (1 << 20))
    try:
        code, _, err = run_cli(["--file", str(f), "--size", "64k"], capsys)
    finally:
        f.unlink()
    one_line_error(code, err, "tmpfs", "RAM")


def test_model_sets_read_size_and_batch_from_its_experts(disk_dir, capsys):
    from gguf_builders import Layout, write_model

    from sdq.format.model import open_model

    path, _ = write_model(disk_dir / "m.gguf", Layout(n_embd=256, expert_ffn=256, n_expert=8))
    model = open_model(path)
    code, out, err = run_cli(
        ["--model", str(path), "--threads", "1,2", "--reads", "4", "--split", "1,2", "--json"],
        capsys,
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["settings"]["size"] == int(model.experts.nbytes.max())
    assert data["settings"]["split_batch"] == 3 * model.spec.n_expert_used
    assert {c["batch"] for c in data["split"]} == {1, 3 * model.spec.n_expert_used}
    assert path.exists()  # a given file is read, never removed


def test_fio_side_by_side(disk_dir, capsys):
    import shutil

    if shutil.which("fio") is None:
        pytest.skip("fio is not installed")
    code, out, err = run_cli(
        [*SMOKE_ARGS, "--scratch-dir", str(disk_dir), "--fio", "--fio-seconds", "0", "--json"],
        capsys,
    )
    assert code == 0, err
    data = json.loads(out)
    assert [f["threads"] for f in data["fio"]] == [1, 2]
    for f, level in zip(data["fio"], data["levels"], strict=True):
        assert f["reads"] == 8 and f["mb_s"] > 0 and f["median_ms"] > 0  # as many reads as sdq
        assert "--direct=1" in f["command"] and "--bs=262144" in f["command"]
        assert "--number_ios=" in f["command"] and "--time_based" not in f["command"]
        assert f["sdq_over_fio"] == pytest.approx(level["mb_s"] / f["mb_s"])
        # huge-page buffers where they could be reserved, and the run says which
        huge = "--iomem=shmhuge" in f["command"]
        assert f["page_bytes"] == ([2 << 20] if huge else [4096])
    assert data["fio_note"].startswith("fio") and "pages" in data["fio_memory"]
    code, out, err = run_cli(
        [*SMOKE_ARGS, "--scratch-dir", str(disk_dir), "--fio", "--fio-seconds", "0.2"], capsys
    )
    assert code == 0, err
    assert "sdq/fio" in out and "buffers:" in out and "--runtime=200ms" in out


def test_fio_missing_is_said_not_fatal(disk_dir, capsys, monkeypatch):
    import sdq.measure.fio

    monkeypatch.setattr(sdq.measure.fio, "fio_binary", lambda: None)
    code, out, err = run_cli([*SMOKE_ARGS, "--scratch-dir", str(disk_dir), "--fio"], capsys)
    assert code == 0, err
    assert "fio: fio is not installed" in out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_scratch_file_removed_when_the_command_is_interrupted(disk_dir, sig):
    """Ctrl-C (SIGINT) or SIGTERM during a run: exit 130, one line, no scratch file left."""
    cmd = [sys.executable, "-m", "sdq", "probe", "--scratch-dir", str(disk_dir),
           "--scratch-size", "64M", "--reads", "64", "--repeat", "1000"]  # fmt: skip

    def default_sigint():  # a shell may start background jobs with SIGINT ignored
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not list(disk_dir.glob(".sdq-probe-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(disk_dir.glob(".sdq-probe-*")), "the scratch file never appeared"
        time.sleep(1.0)  # let it write, flush and start reading
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert err.strip() == "sdq probe: interrupted"
    assert list(disk_dir.iterdir()) == []


def test_scratch_larger_than_free_space(disk_dir, capsys):
    code, _, err = run_cli(["--scratch-dir", str(disk_dir), "--scratch-size", "1000000G"], capsys)
    one_line_error(code, err, "does not fit", "free")
    assert list(disk_dir.iterdir()) == []


def test_engine_reads_of_a_model(tiny_model, capsys):
    code, out, err = run_cli(
        ["--model", str(tiny_model), "--threads", "1,2", "--reads", "4", "--split", "1",
         "--engine", "--engine-layers", "2", "--json"],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    eng = json.loads(out)["engine"]
    assert [c["threads"] for c in eng["cells"]] == [1, 2] and eng["layers"] == 2
    for c in eng["cells"]:
        assert c["arena_mb_s"] > 0 and c["one_slot_mb_s"] > 0
        assert c["fio_mb_s"] is None and c["arena_over_fio"] is None  # no --fio: null
    assert "NaN" not in out
    code, out, err = run_cli(
        ["--model", str(tiny_model), "--threads", "1", "--reads", "4", "--split", "1",
         "--engine", "--engine-layers", "1"],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    assert "the pager's own expert reads (direct)" in out and "one slot" in out


def test_engine_needs_a_model(disk_dir, capsys):
    code, _, err = run_cli([*SMOKE_ARGS, "--scratch-dir", str(disk_dir), "--engine"], capsys)
    one_line_error(code, err, "--engine", "--model")
