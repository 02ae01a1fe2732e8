"""Run one configuration in a fresh `sdq` subprocess and describe how it went, crash included.

Each run is a cold process: a new interpreter, a new arena, nothing inherited but the page
cache, which is dropped for the model file first (`file_cache="dropped"`), warmed by reading
the whole file once (`"warm"`, reported as such), or left as it is (`"untouched"`: for a
benchmark that drops or warms the pages itself before every timed read). The child runs under
the configuration's RAM limit (sdq.measure.limits: RLIMIT_DATA set between fork and exec, or
a cgroup v1 memory group).

Peak RSS is the child's own VmHWM from /proc/<pid>/status, polled while it runs: the kernel's
ru_maxrss (getrusage, wait4) of a child starts from its parent's high-water mark at fork, so a
large launcher (a notebook kernel) would show up as the child's peak. Beside it, the largest
RssAnon (anonymous memory: what a budget has to hold), RssFile (mapped file pages: the model's
dense tensors while they are copied, shared libraries; reclaimable) and VmData (what
RLIMIT_DATA counts) seen. Growth in the last poll interval (20 ms) before exit can be missed.

A run that dies is a row, not an exception: status "crashed" with the kind of death
(MemoryError, out of memory, killed by the limit, signal, exit status) and its last stderr line;
"refused" when sdq declined the settings with its one-line error (e.g. the plan's PlanError:
the budget cannot hold the minimum), "timeout" when it ran past the time limit.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime

from sdq.measure import limits
from sdq.measure.experiments.config import RunConfig
from sdq.proc import proc_status_kib
from sdq.units import MIB

POLL_S = 0.02
COLD_SHARE = 0.05  # a run is cold when at most this share of the file is cached at its start
DROP_WAIT_S = 60.0  # how long to keep dropping pages another process holds before a run
DROP_RETRY_S = 2.0
# /proc/<pid>/status fields polled: peak RSS (kernel high-water mark), its anonymous and file
# parts (largest seen), the data segment RLIMIT_DATA counts, swap
VM_FIELDS = ("VmHWM", "RssAnon", "RssFile", "VmData", "VmSwap")
# dropped from a chat's JSON before it is journaled (text and per-token lists)
BULKY = ("text", "prompt", "prompt_ids", "generated_ids", "token_ms")


def run_config(
    config: RunConfig,
    repeat: int,
    timeout_s: float = 900.0,
    system_drop: bool = False,
    cold_wait_s: float = DROP_WAIT_S,
) -> dict:
    """Runs the configuration once; returns its journal row."""
    cached_before = _prepare_cache(config, system_drop, cold_wait_s)
    cgroup = None
    if config.limit.method == "cgroup":
        cgroup = limits.MemoryCgroup(config.limit.limit_bytes)
        preexec = cgroup.preexec
    elif config.limit.method == "rlimit_data":
        preexec = limits.rlimit_data_preexec(config.limit.limit_bytes)
    else:
        preexec = None
    started = datetime.now(UTC).isoformat(timespec="seconds")
    cmd = [sys.executable, "-m", "sdq", *config.args]
    try:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, preexec_fn=preexec
            )
            rc, peaks, timed_out = _wait(proc, timeout_s)
            wall = time.perf_counter() - t0
            out.seek(0)
            err.seek(0)
            stdout = out.read().decode("utf-8", "replace")
            stderr = err.read().decode("utf-8", "replace")
        cg = _cgroup_figures(cgroup) if cgroup is not None else {}
    finally:
        if cgroup is not None:
            cgroup.close()
    # share of the routed experts' bytes cached right after the run (its dense weights, read
    # once at load, are left out): pages another process read meanwhile, or pages the run
    # itself left behind
    cached_after = (
        limits.file_resident_fraction(config.pack)
        if config.pack
        else limits.file_resident_fraction(config.model, expert_ranges(config.model))
    )
    result = _parse(stdout) if rc == 0 else None
    status, kind, error = classify(rc, stderr, timed_out, cg.get("cgroup_oom_kills", 0), result)
    row = {
        "key": config.key,
        "repeat": int(repeat),
        **config.describe(),
        "status": status,
        "returncode": rc,
        "error_kind": kind,
        "error": error,
        "wall_s": wall,
        "peak_rss_mb": peaks["VmHWM"] / 1024 or None,
        "peak_anon_mb": peaks["RssAnon"] / 1024 or None,
        "peak_file_mb": peaks["RssFile"] / 1024 or None,
        "peak_data_mb": peaks["VmData"] / 1024 or None,
        "swap_mb": peaks["VmSwap"] / 1024,
        "cached_before": cached_before,
        "cached_after": cached_after,
        "started": started,
        **cg,
        "result": _compact(result) if result is not None else None,
    }
    return row


@functools.lru_cache(maxsize=8)
def expert_ranges(model: str) -> tuple[tuple[int, int], ...]:
    """(offset, length) of each routed-expert tensor of the model (one per layer and part)."""
    from sdq.format.model import open_model

    table = open_model(model).require_experts()
    last = table.n_expert - 1
    return tuple(
        (
            int(table.offsets[r, 0, p]),
            int(table.offsets[r, last, p] + table.nbytes[r, last, p] - table.offsets[r, 0, p]),
        )
        for r in range(len(table.layers))
        for p in range(3)
    )


def _prepare_cache(config: RunConfig, system_drop: bool, cold_wait_s: float) -> float:
    """Drops, warms or leaves the model file's pages; returns the share cached at the start.

    Pages another process has mapped cannot be dropped: the drop is retried every DROP_RETRY_S
    for up to cold_wait_s, then the run starts anyway and `cached_before` tells the reader."""
    if config.file_cache == "dropped":
        deadline = time.monotonic() + cold_wait_s
        while True:
            if system_drop:
                limits.drop_system_cache()
            cached = limits.drop_file_cache(config.model)
            if config.pack:  # the experts are read from the pack: its share is the one asked
                cached = limits.drop_file_cache(config.pack)
            if cached <= COLD_SHARE or time.monotonic() > deadline:
                return cached
            time.sleep(DROP_RETRY_S)
    if config.file_cache == "untouched":
        return limits.file_resident_fraction(config.model)
    with open(config.model, "rb") as f:  # warm: read the whole file once through the cache
        while f.read(16 * MIB):
            pass
    return limits.file_resident_fraction(config.model)


def _wait(proc: subprocess.Popen, timeout_s: float) -> tuple[int, dict, bool]:
    """Waits for the child, polling its memory figures (KiB, largest seen); kills it after
    timeout_s. Returns (returncode, peaks, timed out)."""
    peaks = dict.fromkeys(VM_FIELDS, 0)
    deadline = time.monotonic() + timeout_s
    timed_out = False
    status_path = f"/proc/{proc.pid}/status"
    while True:
        pid, wstatus, _ = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(wstatus)
            return proc.returncode, peaks, timed_out
        for name, kb in proc_status_kib(status_path, VM_FIELDS).items():
            peaks[name] = max(peaks[name], kb)
        if not timed_out and time.monotonic() > deadline:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)
        time.sleep(POLL_S)


def _cgroup_figures(cg: limits.MemoryCgroup) -> dict:
    return {
        "cgroup_peak_mb": cg.peak_bytes() / MIB,
        "cgroup_failcnt": cg.failcnt(),
        "cgroup_oom_kills": cg.oom_kills(),
    }


def _parse(stdout: str) -> dict | None:
    text = stdout.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        last = text.splitlines()[-1]  # a chat prints one JSON line last
        try:
            return json.loads(last)
        except json.JSONDecodeError:
            return None


def classify(
    rc: int, stderr: str, timed_out: bool, oom_kills: int = 0, result: dict | None = None
) -> tuple[str, str, str]:
    """(status, error kind, one-line error) of a finished child."""
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    if timed_out:
        return "timeout", "timeout", "killed after the time limit"
    if rc == 0:
        if result is None:
            return "crashed", "no result", f"exit status 0 but no JSON on stdout ({last})"
        return "ok", "", ""
    if rc < 0:
        sig = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        if oom_kills:
            return "crashed", "killed by the limit", f"{sig} from the cgroup OOM killer"
        if "bad_alloc" in stderr:  # a C++ allocation failed (llvmlite, inside numba)
            return "crashed", "std::bad_alloc", f"{sig}: {last}"
        return "crashed", "signal", f"killed by {sig}" + (f": {last}" if last else "")
    if rc == 2 and last.startswith("sdq ") and ": error: " in last:
        # sdq refused the settings with its one-line error (a PlanError: budget too small)
        kind = "PlanError" if "RAM budget" in last else "refused"
        return "refused", kind, last.split(": error: ", 1)[1]
    if "can't start new thread" in stderr:  # pthread_create refused: its stack did not fit
        return "crashed", "thread not started", last
    if "MemoryError" in stderr:
        line = next(
            (ln.strip() for ln in reversed(stderr.splitlines()) if "MemoryError" in ln), last
        )
        return "crashed", "MemoryError", line
    lowered = stderr.lower()
    if any(s in lowered for s in ("cannot allocate memory", "bad_alloc", "out of memory")):
        return "crashed", "out of memory", last
    return "crashed", "exit status", f"exit status {rc}: {last}"


def _compact(result: dict) -> dict:
    out = {k: v for k, v in result.items() if k not in BULKY}
    ids = result.get("generated_ids")
    if ids is not None:
        out["generated_digest"] = hashlib.sha1(json.dumps(ids).encode()).hexdigest()[:16]
    return out
