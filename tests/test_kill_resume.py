"""Killed with SIGKILL at random moments: the experiment sweep resumes with no finished row lost
and none run twice; the lab runner leaves the previous outputs of a notebook intact; and a lab
run's provenance.json names the commit it ran at and whether the tree was dirty.

The processes killed are whole process groups (the runner and the `sdq` or kernel children it
started), as a kill -9 of a terminal's job would be.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from gguf_builders import Layout, write_model
from lab_support import make_notebook, make_repo

from sdq.measure.experiments.journal import Journal

SWEEP = textwrap.dedent(
    """
    import sys
    from sdq.measure.experiments.config import RunConfig
    from sdq.measure.experiments.journal import Journal
    from sdq.measure.experiments.runner import run_sweep

    model, journal = sys.argv[1], sys.argv[2]
    configs = [
        RunConfig("kill", f"info e{e}", ("info", model, "--json", "--expert", str(e)), model,
                  file_cache="untouched")
        for e in range(3)
    ]
    run_sweep(configs, 2, Journal(journal), progress=False, timeout_s=60)
    """
)
N_RUNS = 6  # 3 configurations x 2 repeats


def start(*argv: str, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, *argv],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: killed with its children
    )


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def finished(journal: Path) -> list[tuple[str, int]]:
    return [(r["key"], int(r["repeat"])) for r in Journal(journal).read()]


def whole_sweep_s(model: Path, journal: Path) -> float:
    t0 = time.perf_counter()
    proc = start("-c", SWEEP, str(model), str(journal))
    assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()
    return time.perf_counter() - t0


def test_a_sweep_killed_at_random_moments_resumes_without_loss_or_duplicates(tmp_path):
    model, _ = write_model(tmp_path / "m.gguf", Layout())
    journal = tmp_path / "kill.jsonl"
    # how long a whole sweep takes on this machine, so that the random moments fall inside it:
    # each is at most 0.4 of a whole sweep, and a killed sweep leaves more than 0.6 to resume
    # (the faster of two, the first paying for cold caches)
    whole_s = min(whole_sweep_s(model, tmp_path / f"timing{i}.jsonl") for i in range(2))
    rng = random.Random(20261201)
    kills = 0
    for _ in range(8):
        before = finished(journal)
        proc = start("-c", SWEEP, str(model), str(journal))
        try:
            proc.wait(timeout=rng.uniform(0.1, 0.4) * whole_s)  # a random moment, or the end
        except subprocess.TimeoutExpired:
            kill_group(proc)
            kills += 1
        else:
            assert proc.returncode == 0, proc.stderr.read().decode()
        after = finished(journal)
        assert after[: len(before)] == before  # nothing finished was lost or rewritten
        assert len(set(after)) == len(after)  # nothing ran twice
        if len(after) == N_RUNS and proc.returncode == 0:
            break
    proc = start("-c", SWEEP, str(model), str(journal))
    assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()
    rows = finished(journal)
    assert len(rows) == N_RUNS and len(set(rows)) == N_RUNS
    assert kills >= 2  # the seed above kills it mid-sweep more than once
    statuses = {r["status"] for r in Journal(journal).read()}
    assert statuses == {"ok"}


OK_CELL = """import pandas as pd
from sdq.lab import Outputs
out = Outputs("00_ok", params_name)
out.table("T1", pd.DataFrame({"n": [n]}), title="n")"""
SLOW_CELL = """import pathlib, time
pathlib.Path(marker).write_text("running")
time.sleep(60)"""
PARAMS = "model: {preset: tiny, qtype: Q4_K_M, seed: 0}\n00_ok: {n: 7}\n"
RUN = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from sdq.lab import reproduce
    from sdq.lab.params import load_params

    root = Path(sys.argv[1])
    params = load_params("smoke", root=root)
    (result,) = reproduce.run(params, root=root, model_path=root / "model.gguf", log=print)
    sys.exit(0 if result.ok else 1)
    """
)


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def lab_repo(tmp_path):
    """A throw-away lab repository under git: one notebook, one parameter set."""
    root = make_repo(tmp_path / "repo", {"smoke": PARAMS}, {"00_ok": ("n = 1\n", OK_CELL)})
    (root / "model.gguf").write_bytes(b"GGUF")
    (root / ".gitignore").write_text("outputs/\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "start")
    return root


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def run_lab(root: Path) -> dict:
    """Run the lab on `root` to the end; its provenance record's git part."""
    proc = subprocess.run([sys.executable, "-c", RUN, str(root)], capture_output=True)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    prov = root / "outputs" / "00_ok" / "smoke" / "provenance.json"
    return json.loads(prov.read_text())["git"]


@pytest.mark.slow
def test_a_lab_run_killed_mid_notebook_keeps_the_previous_outputs(lab_repo):
    """Also: provenance.json records the commit the run ran at and whether tracked files
    differed from it (dirty)."""
    head = git(lab_repo, "rev-parse", "HEAD")
    record = run_lab(lab_repo)
    assert (record["sha"], record["dirty"], record["changed_files"]) == (head, False, 0)
    final = lab_repo / "outputs" / "00_ok" / "smoke"
    before = tree(final)
    assert json.loads(before["tables/T1.json"])["records"] == [{"n": 7}]

    marker = lab_repo / "marker"
    make_notebook(  # a tracked file changed: the tree is dirty from here on
        lab_repo / "notebooks" / "00_ok.ipynb",
        f"n = 1\nmarker = {str(marker)!r}\n",
        OK_CELL.replace("[n]", "[n + 1]"),
        SLOW_CELL,
    )
    proc = start("-c", RUN, str(lab_repo))
    deadline = time.monotonic() + 120
    while not marker.exists():  # the kernel is inside the notebook, outputs half written
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "the notebook never started"
        time.sleep(0.05)
    kill_group(proc)
    assert tree(final) == before  # the previous run, whole
    staging = [p.name for p in (lab_repo / "outputs").iterdir() if p.name.startswith(".")]
    assert len(staging) == 1  # the killed run's staging folder, until the next run

    make_notebook(lab_repo / "notebooks" / "00_ok.ipynb", "n = 1\n", OK_CELL + "\n# edited")
    record = run_lab(lab_repo)
    assert (record["sha"], record["dirty"], record["changed_files"]) == (head, True, 1)
    assert json.loads((final / "tables" / "T1.json").read_text())["records"] == [{"n": 7}]
    assert [p for p in (lab_repo / "outputs").iterdir() if p.name.startswith(".")] == []
