"""The probe's read pattern run by fio, the reference a user trusts, for a side-by-side check.

Same pattern as `sdq.measure.probe`: random reads of `size` bytes on `size`-aligned offsets of one
file with `threads` synchronous readers (fio's psync engine = pread, in threads), `reads` in
all (`number_ios` = reads / threads per job). Cache modes:

- direct:   `--direct=1`, exactly sdq's O_DIRECT mode;
- dontneed: `--direct=0 --invalidate=1 --fadvise_hint=1`: the file is dropped from the page
            cache before the run and readahead is off (POSIX_FADV_RANDOM), but fio has no
            "DONTNEED after each read"; with distinct random offsets no range is read twice
            within a job, and the labels say so.

fio reports the run's wall time in whole milliseconds and latency percentiles from bins
(about 1-2% resolution); its bandwidth is total bytes / that wall time.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sdq.errors import ReadError
from sdq.units import MB


def fio_binary() -> str | None:
    return shutil.which("fio")


def fio_version() -> str | None:
    exe = fio_binary()
    if exe is None:
        return None
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip() or None


@dataclass(frozen=True)
class FioStats:
    threads: int
    size: int
    reads: int
    median_ms: float
    mean_ms: float
    p90_ms: float
    mb_s: float
    iops: float
    cache_mode: str
    command: str


def bssplit(sizes) -> str:
    """fio's --bssplit for reads of these sizes in these proportions: '593920/83:864256/17'.

    Whole percents summing to 100 (the largest share takes the rounding); a size whose share
    rounds to 0 is left out.
    """
    sizes = [int(v) for v in sizes]
    if not sizes:
        raise ValueError("bssplit of no reads")
    counts = {v: sizes.count(v) for v in sorted(set(sizes))}
    pct = {v: round(100 * c / len(sizes)) for v, c in counts.items()}
    pct = {v: q for v, q in pct.items() if q > 0}
    top = max(pct, key=lambda v: counts[v])
    pct[top] += 100 - sum(pct.values())
    return ":".join(f"{v}/{q}" for v, q in pct.items())


def fio_command(
    path: Path, *, size: int, threads: int, reads: int, cache_mode: str, split: str = ""
) -> list[str]:
    """fio's command for the probe's pattern; `split` (a bssplit) replaces the one size `size`
    by a mix of sizes, each read at a 4 KiB-aligned offset."""
    exe = fio_binary() or "fio"
    per_job = max(1, math.ceil(reads / threads))
    sizes = [f"--bssplit={split}", "--blockalign=4096"] if split else [f"--bs={size}"]
    cmd = [
        exe,
        "--name=sdq-probe",
        f"--filename={path}",
        "--readonly",
        "--rw=randread",
        *sizes,
        "--ioengine=psync",
        "--thread",
        f"--numjobs={threads}",
        f"--number_ios={per_job}",
        "--group_reporting",
        "--output-format=json",
        "--lat_percentiles=1",
        "--percentile_list=50:90",
        "--randrepeat=0",  # fresh offsets per job (a fixed seed could repeat them across jobs)
        "--invalidate=1",
    ]
    if cache_mode == "direct":
        cmd.append("--direct=1")
    elif cache_mode == "dontneed":
        cmd += ["--direct=0", "--fadvise_hint=1"]
    else:
        raise ValueError(f"cache mode {cache_mode!r} has no fio equivalent here")
    return cmd


def parse_fio_json(text: str, *, threads: int, size: int, cache_mode: str, command: str):
    """FioStats from fio's --output-format=json (text before the first '{' is skipped)."""
    start = text.find("{")
    if start < 0:
        raise ReadError(f"fio printed no JSON: {text.strip()[:200]!r}")
    data = json.loads(text[start:])
    job = data["jobs"][0]
    if job.get("error"):
        raise ReadError(f"fio job failed with error {job['error']}")
    rd = job["read"]
    lat = rd["lat_ns"]
    pct = lat.get("percentile", {})

    def p(q: float) -> float:
        for key, value in pct.items():
            if abs(float(key) - q) < 1e-6:
                return value / 1e6
        return float("nan")

    return FioStats(
        threads=threads,
        size=size,
        reads=int(rd["total_ios"]),
        median_ms=p(50),
        mean_ms=lat["mean"] / 1e6,
        p90_ms=p(90),
        mb_s=rd["bw_bytes"] / MB,
        iops=float(rd["iops"]),
        cache_mode=cache_mode,
        command=command,
    )


def run_fio(
    path: Path,
    *,
    size: int,
    threads: int,
    reads: int,
    cache_mode: str,
    split: str = "",
    timeout: float = 600,
) -> FioStats:
    """fio's figures for one cell; with `split`, `size` is only the label (e.g. the mean)."""
    if fio_binary() is None:
        raise ReadError("fio is not installed")
    cmd = fio_command(
        path, size=size, threads=threads, reads=reads, cache_mode=cache_mode, split=split
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise ReadError(f"fio exited with {proc.returncode}: {proc.stderr.strip()[:300]}")
    shown = " ".join(c if c != cmd[0] else "fio" for c in cmd)
    return parse_fio_json(
        proc.stdout, threads=threads, size=size, cache_mode=cache_mode, command=shown
    )
