"""The probe's read pattern run by fio, the reference a user trusts, for a side-by-side check.

Same pattern as `sdq.measure.probe`: random reads of `size` bytes on `size`-aligned offsets of one
file with `threads` synchronous readers (fio's psync engine = pread, in threads), `reads` in
all (`number_ios` = reads / threads per job). Cache modes:

- direct:   `--direct=1`, exactly sdq's O_DIRECT mode;
- dontneed: `--direct=0 --invalidate=1 --fadvise_hint=1`: the file is dropped from the page
            cache before the run and readahead is off (POSIX_FADV_RANDOM), but fio has no
            "DONTNEED after each read"; with distinct random offsets no range is read twice
            within a job, and the labels say so.

Fair to fio:
- buffers: the pager reads into an arena on 2 MiB (transparent huge) pages; fio's default
  buffers are 4 KiB pages, and on a virtual disk the page size of the destination can change the
  bandwidth severalfold (notebook 01 measures both). So fio reads into huge pages
  (`--iomem=shmhuge`) after `huge_page_buffers` reserved enough of them (vm.nr_hugepages, restored
  afterwards); where that is refused (not root, no hugetlb, fragmented memory) fio falls back to
  4 KiB pages and every result says which page size its buffers had (`FioStats.page_bytes`);
- run length: fio reports a run's wall time in whole milliseconds and computes its bandwidth as
  total bytes / that time, so a run of a few milliseconds is off by tens of percent. With
  `runtime_s` fio reads for that long (`--time_based --runtime`), e.g. 500 ms: the rounding is
  then at most 0.2 %. Without it fio reads the same count as sdq (`number_ios`).
fio's latency percentiles come from bins (about 1-2 % resolution).
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from sdq.errors import ReadError
from sdq.units import KIB, MB, MIB

PAGE = 4096
NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")
MEMINFO = Path("/proc/meminfo")
DEFAULT_RUNTIME_S = 0.5  # fio's whole-ms wall time is then within 0.2 % of the true one


def fio_binary() -> str | None:
    return shutil.which("fio")


def fio_version() -> str | None:
    exe = fio_binary()
    if exe is None:
        return None
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip() or None


@dataclass(frozen=True)
class FioMemory:
    """Where fio's read buffers live: fio's `--iomem` and the buffers' page size in bytes."""

    iomem: str  # "shmhuge" (hugetlb shared memory) or "malloc" (fio's default)
    page_bytes: int
    note: str  # how the buffers were obtained, or why they are not on huge pages


SMALL_PAGES = FioMemory("malloc", PAGE, "fio's default buffers, on 4 KiB pages")


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
    page_bytes: int = PAGE  # page size of fio's buffers in this run
    runtime_ms: int = 0  # fio's wall time of the run (whole ms)


def _meminfo(key: str) -> int | None:
    try:
        for line in MEMINFO.read_text().splitlines():
            name, _, value = line.partition(":")
            if name == key:
                return int(value.split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return None


def huge_page_bytes() -> int:
    """The kernel's default huge page size (Hugepagesize in /proc/meminfo), else 2 MiB."""
    kib = _meminfo("Hugepagesize")
    return kib * KIB if kib else 2 * MIB


def huge_pages_for(max_read: int, jobs: int, page: int | None = None) -> int:
    """Huge pages fio's shmhuge buffers need for `jobs` jobs reading up to `max_read` bytes.

    Each job's buffer is one read plus a page of alignment, rounded up to whole huge pages,
    and fio 3.x takes one huge page more per job (measured: 2 pages per job for 0.86 MB and
    1.9 MB reads, 3 for 2 MiB).
    """
    page = page or huge_page_bytes()
    return jobs * (-(-(max_read + PAGE) // page) + 1)


@contextlib.contextmanager
def huge_page_buffers(pages: int) -> Iterator[FioMemory]:
    """Reserve `pages` more huge pages (vm.nr_hugepages) for fio's `--iomem=shmhuge` buffers
    while the block runs; the previous count is written back when it exits.

    Yields `SMALL_PAGES`, its note saying why, when they cannot be had: not root, no hugetlb
    support, or too little contiguous free memory for the kernel to make them.
    """
    try:
        before = int(NR_HUGEPAGES.read_text())
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        yield replace(SMALL_PAGES, note=f"4 KiB pages: no huge pages here ({why})")
        return
    try:
        NR_HUGEPAGES.write_text(str(before + pages))
    except OSError as exc:
        yield replace(
            SMALL_PAGES, note=f"4 KiB pages: vm.nr_hugepages could not be raised ({exc.strerror})"
        )
        return
    try:
        total = _meminfo("HugePages_Total") or 0
        size = huge_page_bytes()
        if total < before + pages:
            note = (
                f"4 KiB pages: the kernel made only {total - before} of the {pages} huge pages "
                "asked for"
            )
            yield replace(SMALL_PAGES, note=note)
        else:
            note = (
                f"{size // MIB} MiB huge pages (--iomem=shmhuge; vm.nr_hugepages {before} -> "
                f"{before + pages} during the runs, then {before} again)"
            )
            yield FioMemory("shmhuge", size, note)
    finally:
        with contextlib.suppress(OSError):
            NR_HUGEPAGES.write_text(str(before))


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
    path: Path,
    *,
    size: int,
    threads: int,
    reads: int,
    cache_mode: str,
    split: str = "",
    runtime_s: float | None = None,
    iomem: str = "malloc",
) -> list[str]:
    """fio's command for the probe's pattern; `split` (a bssplit) replaces the one size `size`
    by a mix of sizes, each read at a 4 KiB-aligned offset. With `runtime_s`, fio reads for that
    long instead of `reads` reads; `iomem` is fio's --iomem (buffer memory)."""
    exe = fio_binary() or "fio"
    sizes = [f"--bssplit={split}", "--blockalign=4096"] if split else [f"--bs={size}"]
    if runtime_s:
        amount = ["--time_based", f"--runtime={max(1, round(runtime_s * 1000))}ms"]
    else:
        amount = [f"--number_ios={max(1, math.ceil(reads / threads))}"]
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
        *amount,
        "--group_reporting",
        "--output-format=json",
        "--lat_percentiles=1",
        "--percentile_list=50:90",
        "--randrepeat=0",  # fresh offsets per job (a fixed seed could repeat them across jobs)
        "--invalidate=1",
    ]
    if iomem != "malloc":
        cmd.append(f"--iomem={iomem}")
    if cache_mode == "direct":
        cmd.append("--direct=1")
    elif cache_mode == "dontneed":
        cmd += ["--direct=0", "--fadvise_hint=1"]
    else:
        raise ValueError(f"cache mode {cache_mode!r} has no fio equivalent here")
    return cmd


def parse_fio_json(
    text: str, *, threads: int, size: int, cache_mode: str, command: str, page_bytes: int = PAGE
):
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
        page_bytes=page_bytes,
        runtime_ms=int(rd.get("runtime", 0)),
    )


def run_fio(
    path: Path,
    *,
    size: int,
    threads: int,
    reads: int,
    cache_mode: str,
    split: str = "",
    runtime_s: float | None = None,
    memory: FioMemory = SMALL_PAGES,
    timeout: float = 600,
) -> FioStats:
    """fio's figures for one cell; with `split`, `size` is only the label (e.g. the mean).

    With huge-page `memory`, a run whose buffers fio cannot get (another process took the
    reserved pages) is run again on 4 KiB pages, and its `page_bytes` says so.
    """
    if fio_binary() is None:
        raise ReadError("fio is not installed")
    for mem in (memory, SMALL_PAGES) if memory.iomem != "malloc" else (memory,):
        cmd = fio_command(path, size=size, threads=threads, reads=reads, cache_mode=cache_mode,
                          split=split, runtime_s=runtime_s, iomem=mem.iomem)  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode == 0:
            break
    if proc.returncode != 0:  # the last attempt's failure
        raise ReadError(f"fio exited with {proc.returncode}: {proc.stderr.strip()[:300]}")
    shown = " ".join(c if c != cmd[0] else "fio" for c in cmd)
    return parse_fio_json(proc.stdout, threads=threads, size=size, cache_mode=cache_mode,
                          command=shown, page_bytes=mem.page_bytes)  # fmt: skip
