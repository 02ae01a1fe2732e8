"""sdq and llama.cpp side by side on the same GGUF file (table T12).

Every measured run is one fresh child process (`python -m sdq.measure.peers CHILD_JSON`), so no run
inherits another's arena, mapping, JIT state or page cache charge. The parent decides the
memory condition, the child only generates and reports:

  resident   no cap; the model file is read once beforehand (warm page cache); sdq copies every
             expert into RAM (`--resident`), llama.cpp loads without mmap (weights in anonymous
             memory). Each child runs one unmeasured warm-up generation, then the measured one.
  capped     the child runs inside a cgroup v1 memory group whose limit is the cap (it charges
             the page cache the child's reads bring in as well as its anonymous memory), started
             cold: the model file's pages are dropped first. Systems: `sdq` (expert arena,
             `--ram-budget-mb` = the cap), `llama-mmap` (llama.cpp's default: the file mapped,
             the kernel pages it in on faults) and `llama-lazy` (llama.cpp's `lazy_mode` =
             LLAMA_LAZY_MODE_ON: rows of the tensors its architecture marks read on demand)
             and `llama-mmap-norepack` (mmap with `use_extra_bufts` off: llama.cpp's default
             repacks the weight types its CPU kernels prefer, Q4_K among them, into copies in
             anonymous memory, so `llama-mmap` keeps those tensors in RAM, not in the mapping).
             No warm-up: the cold start is part of what a capped run measures.
  warm       capped as above (pages dropped, the same cgroup cap), but the child first runs one
             unmeasured generation of the same prompt (WARMUP_TOKENS tokens) under the cap:
             the measured one finds what the cap let it keep (sdq's arena, llama.cpp's
             page cache inside the cgroup), the steady state of a long session.

Both engines' OpenMP workers get the same wait policy (`OMP_WAIT_POLICY`, PASSIVE by default,
which is what sdq's kernels set for themselves): with ggml's default of spinning, llama.cpp's
decode on a busy two-core machine was measured several times slower and far more erratic.

Units: MB = 10**6 bytes for caps, device bytes and the cgroup's figures; `peak_rss_mb` is in MiB
(2**20 bytes), the DESIGN metric as every other sdq command reports it.

Device bytes come from `/proc/self/io` `read_bytes` read by the child before and after decode
(bytes the process caused to be fetched from the block device: page faults on the mapping,
readahead, pread and O_DIRECT alike; page-cache hits count nothing). Peak memory is the child's
VmHWM (resident set: anonymous memory plus mapped file pages it touched; `peak_rss_mb`) and,
under a cgroup, the group's `memory.max_usage_in_bytes` (anonymous memory plus charged page
cache).

When no cgroup can be made, capped runs fall back to RLIMIT_DATA (sdq.measure.limits), which
caps only anonymous memory: the page cache and llama.cpp's read-only mapping are not limited, so
a capped llama-mmap row then measures a machine with the whole model cached. Rows carry
`limit_method`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from sdq.errors import ParamsError
from sdq.proc import memory_figures
from sdq.units import MB, MIB

if TYPE_CHECKING:
    from sdq.run.settings import RunSettings

RESIDENT_SYSTEMS = ("sdq", "llama")
CAPPED_SYSTEMS = ("sdq", "llama-mmap", "llama-lazy", "llama-mmap-norepack")
ALL_SYSTEMS = ("sdq", "llama", *CAPPED_SYSTEMS[1:])
RESULT_PREFIX = "SDQ-PEERS-RESULT "
WARMUP_TOKENS = 4


@dataclass(frozen=True)
class PeerSettings:
    """What every system of a comparison shares: file, prompt, lengths, threads."""

    model: str
    prompt_ids: tuple[int, ...]
    tokens: int = 16  # generated tokens (greedy, EOS ignored); decode times tokens - 1 steps
    threads: int = 2
    ctx: int = 512
    ubatch: int = 128
    reserve_mb: float = 100.0  # sdq's head room inside its budget (the plan's `reserve`)
    # how sdq's pager reads experts (sdq chat --cache-mode): O_DIRECT reads land in the arena
    # without the page cache's copy, which costs CPU that the experts' compute needs
    sdq_cache_mode: str = "direct"
    sdq_cache_policy: str = "auto"  # sdq's expert replacement (sdq chat --cache-policy)
    sdq_prefetch_next: int | None = None  # sdq chat --prefetch-next N (None: its default)
    # sdq chat --device-model: every expert read held until this device model would finish it
    # (sdq.paging.device_model; the bytes from the page cache); None: this machine's device
    sdq_device_model: str | None = None
    io_threads: int | None = None  # sdq's expert read threads (None: 3 x threads)
    # OpenMP idle workers, for both engines alike: PASSIVE (block; sdq's own default) or ACTIVE
    # (spin). llama.cpp's ggml uses OpenMP too; spinning workers collapse on a busy machine.
    omp_wait_policy: str = "PASSIVE"
    timeout_s: float = 900.0

    @classmethod
    def from_run(cls, run: RunSettings, prompt: str, **kw) -> PeerSettings:
        """The comparison's settings from sdq's run settings (`sdq bench peers` flags, through
        `RunSettings.from_args`) and the prompt text, tokenized by the model's tokenizer: the
        lengths and threads both systems share, and how sdq pages; `kw` sets the rest."""
        from sdq.format.model import open_model
        from sdq.format.tokenizer import Tokenizer

        model = open_model(run.model)
        tokenizer = Tokenizer.from_metadata(model.metadata, source=str(model.path))
        paging = {"reserve_mb": run.reserve_mb} if run.reserve_mb is not None else {}
        return cls(
            model=str(model.path),
            prompt_ids=tuple(int(t) for t in tokenizer.encode(prompt)),
            tokens=run.n_predict,
            threads=run.threads,
            ctx=run.n_ctx,
            ubatch=min(run.n_ubatch, run.n_ctx),
            sdq_cache_mode=run.cache_mode,
            sdq_cache_policy=run.cache_policy,
            sdq_prefetch_next=run.prefetch_next,
            io_threads=run.io_threads,
            **paging,
            **kw,
        )

    def run_settings(self, resident: bool, budget_mib: float | None) -> RunSettings:
        """sdq's settings for one child run: greedy, EOS ignored, `tokens` generated, every
        expert in RAM when `resident`, else paged under `budget_mib` with `reserve_mb`."""
        from sdq.run.sampler import SamplerSettings
        from sdq.run.settings import RunSettings

        return RunSettings(
            model=self.model,
            n_ctx=self.ctx,
            n_ubatch=self.ubatch,
            threads=self.threads,
            n_predict=self.tokens,
            sampler=SamplerSettings(temp=0.0),
            stop_at_eos=False,
            resident=resident,
            ram_budget_mb=budget_mib,
            reserve_mb=None if resident else self.reserve_mb,
            io_threads=self.io_threads,
            cache_mode=self.sdq_cache_mode,
            cache_policy=self.sdq_cache_policy,
            prefetch_next=self.sdq_prefetch_next,
            device_model=self.sdq_device_model,
        )

    def validate(self) -> None:
        if self.tokens < 2:
            raise ParamsError(f"--tokens {self.tokens} must be >= 2 (decode needs 2 tokens)")
        if self.threads < 1:
            raise ParamsError(f"--threads {self.threads} must be >= 1")
        if not self.prompt_ids:
            raise ParamsError("the prompt is empty (0 tokens)")
        if self.omp_wait_policy not in ("PASSIVE", "ACTIVE"):
            raise ParamsError(f"OpenMP wait policy {self.omp_wait_policy!r}: PASSIVE or ACTIVE")
        if self.sdq_device_model and self.sdq_cache_mode != "pagecache":
            raise ParamsError(
                f"device model {self.sdq_device_model}: an emulated device reads from the page "
                f"cache; sdq's cache mode is {self.sdq_cache_mode!r}, expected 'pagecache'"
            )
        if len(self.prompt_ids) + self.tokens > self.ctx:
            raise ParamsError(
                f"prompt {len(self.prompt_ids)} + --tokens {self.tokens} tokens exceed "
                f"-c {self.ctx}"
            )


@dataclass(frozen=True)
class Condition:
    """The memory condition of one run: resident (cap None) or a cap with its method."""

    cap_mb: float | None = None  # MB = 10**6 bytes
    method: str = "none"  # none | cgroup | rlimit_data
    warm: bool = False  # capped: measure the child's second generation, not its cold start

    @property
    def resident(self) -> bool:
        return self.cap_mb is None

    @property
    def mode(self) -> str:
        """resident | capped (cold start) | warm (capped, after a warm-up under the cap)."""
        return "resident" if self.resident else "warm" if self.warm else "capped"

    @property
    def label(self) -> str:
        if self.resident:
            return "resident"
        return f"cap {self.cap_mb:.0f} MB ({self.method}{', warm' if self.warm else ''})"


# -- small pure helpers ----------------------------------------------------------------------


def parse_proc_io(text: str) -> dict[str, int]:
    """/proc/<pid>/io text ("rchar: 123" per line) -> {"rchar": 123, ...}."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            try:
                out[key.strip()] = int(value.strip())
            except ValueError:
                continue
    return out


def read_proc_io(pid: int | str = "self") -> dict[str, int]:
    """Counters of /proc/<pid>/io (read_bytes: bytes fetched from the block device)."""
    with open(f"/proc/{pid}/io") as f:
        return parse_proc_io(f.read())


def run_order(systems: Sequence[str], repeat: int) -> list[str]:
    """The order of repeat `repeat`: systems rotated by one each repeat, so with two systems
    the first one alternates and with three each system runs first, second and last."""
    n = len(systems)
    k = repeat % n if n else 0
    return list(systems[k:]) + list(systems[:k])


def median_rows(rows: Iterable[dict], keys: Sequence[str]) -> list[dict]:
    """Rows grouped by `keys`; numeric fields become the median over the group's successful
    rows (status "ok"), with `runs` (all) and `ok_runs` counts and `status` summarised: "ok"
    only when every run finished, "k of n runs finished; <last failure>" when some did not."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row.get(k) for k in keys), []).append(row)
    out = []
    for key, group in groups.items():
        ok = [r for r in group if r.get("status") == "ok"]
        m: dict = dict(zip(keys, key, strict=True))
        m["runs"], m["ok_runs"] = len(group), len(ok)
        failed = [r.get("status", "failed") for r in group if r.get("status") != "ok"]
        if not failed:
            m["status"] = "ok"
        elif ok:  # the medians are of the finished runs only: say so
            m["status"] = f"{len(ok)} of {len(group)} runs finished; {failed[-1]}"
        else:
            m["status"] = failed[-1]
        numeric = sorted(
            {
                k
                for r in ok
                for k, v in r.items()
                if k not in keys and isinstance(v, (int, float)) and not isinstance(v, bool)
            }
        )
        for k in numeric:
            vals = [r[k] for r in ok if isinstance(r.get(k), (int, float)) and r[k] == r[k]]
            m[k] = statistics.median(vals) if vals else None
        out.append(m)
    return out


def io_ceiling_tok_s(ssd_mb_per_token: float | None, bandwidth_mb_s: float | None):
    """Decode tok/s if reading the missed experts were the only cost: bandwidth / MB per token
    (None when nothing is read or the bandwidth is unknown)."""
    if not ssd_mb_per_token or not bandwidth_mb_s or ssd_mb_per_token <= 0:
        return None
    return bandwidth_mb_s / ssd_mb_per_token


def decode_bound_tok_s(io_ceiling: float | None, resident_tok_s: float | None):
    """The speed a capped run could reach at best, (tok/s, what limits it): reads and compute
    overlapped perfectly, so the slower of the I/O ceiling and the resident decode speed
    (everything in RAM: the compute and per-token overhead alone). Either may be unknown."""
    known = {k: v for k, v in (("io", io_ceiling), ("compute", resident_tok_s)) if v}
    if not known:
        return None, None
    what = min(known, key=known.get)
    return known[what], what


def probe_bandwidth(io_profile: str | os.PathLike) -> tuple[float, str]:
    """(MB/s, note) from a device probe's I/O profile (sdq probe --save-profile / notebook 01):
    the best aggregate bandwidth of its level sweep."""
    path = Path(io_profile)
    try:
        d = json.loads(path.read_text())
        bw = float(d["measured"]["best_mb_s"])
        mode = d.get("cache_mode", "?")
        size = d["measured"].get("size")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ParamsError(f"--io-profile {path}: not a readable probe profile ({exc})") from None
    return bw, f"probe profile {path.name}: best {bw:.0f} MB/s ({mode}, {size} B reads)"


def quick_bandwidth(model: str | os.PathLike, threads: int = 4, reads: int = 32):
    """(MB/s, note): a short O_DIRECT probe of expert-segment reads at one thread count, for
    when no device-probe profile is at hand."""
    from sdq.measure.probe import run_probe, settings_for_model

    st = settings_for_model(
        Path(model), threads=(threads,), reads=reads, small_threads=(), splits=(), repeat=1
    )
    res = run_probe(st)
    bw = res.levels[0].mb_s
    return bw, f"quick probe: {bw:.0f} MB/s (direct, {st.size} B reads, {threads} threads)"


# -- limits and cache ------------------------------------------------------------------------


def limit_method() -> tuple[str, str]:
    """(method, why): "cgroup" when a v1 memory cgroup can be made here, else "rlimit_data"."""
    from sdq.measure.limits import cgroup_status

    ok, why = cgroup_status()
    if ok:
        return "cgroup", why
    return "rlimit_data", (
        f"no cgroup ({why}); fallback RLIMIT_DATA caps anonymous memory only, not the page "
        "cache nor llama.cpp's file mapping"
    )


@contextlib.contextmanager
def private_copy(path: str | os.PathLike, directory: str | os.PathLike | None = None):
    """A copy of the model file that no other process maps, flushed and dropped from the page
    cache; removed when the block exits. Pages of a file that another process has mapped stay
    cached whatever this process asks, so on a shared machine a cold run needs its own copy."""
    src = Path(path)
    dst = Path(directory or src.parent) / f".{src.stem}.peers-{os.getpid()}.gguf"
    try:
        shutil.copyfile(src, dst)
        fd = os.open(dst, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        from sdq.measure.limits import drop_file_cache

        drop_file_cache(dst)
        yield dst
    finally:
        with contextlib.suppress(OSError):
            dst.unlink()


def warm_file(path: str | os.PathLike) -> None:
    """Read the whole file once so its pages are in the page cache."""
    with open(path, "rb", buffering=0) as f:
        while f.read(16 * MIB):
            pass


# -- parent: one child run -------------------------------------------------------------------


def run_one(
    system: str, settings: PeerSettings, cond: Condition, repeat: int = 0, python: str | None = None
) -> dict:
    """Run one system in a fresh child under `cond`; returns its row (status "ok" or why not)."""
    from sdq.measure import limits

    if system not in ALL_SYSTEMS:
        raise ParamsError(f"peer system {system!r}: expected one of {ALL_SYSTEMS}")
    row: dict = {
        "system": system,
        "mode": cond.mode,
        "cap_mb": cond.cap_mb,
        "limit_method": cond.method,
        "repeat": repeat,
    }
    if cond.resident:
        row["cache"] = "warm"
    else:
        row["cached_share_before"] = limits.drop_file_cache(settings.model)
        row["cache"] = "warm" if cond.warm else "cold"
    job = {"system": system, "settings": asdict(settings), "resident": cond.resident}
    job["warmup"] = cond.resident or cond.warm
    if not cond.resident:
        job["ram_budget_mb"] = cond.cap_mb * MB / MIB  # sdq's budget is in MiB, the cap in MB
    cmd = [python or sys.executable, "-m", "sdq.measure.peers", json.dumps(job)]
    t0 = time.perf_counter()
    if cond.method == "cgroup":
        with limits.MemoryCgroup(int(cond.cap_mb * MB)) as cg:
            rc, out, err = _spawn(cmd, cg.preexec, settings)
            row["cgroup_peak_mb"] = cg.peak_bytes() / MB
            row["cgroup_failcnt"] = cg.failcnt()
            row["oom_kills"] = cg.oom_kills()
    elif cond.method == "rlimit_data":
        rc, out, err = _spawn(cmd, limits.rlimit_data_preexec(int(cond.cap_mb * MB)), settings)
    else:
        rc, out, err = _spawn(cmd, None, settings)
    row["wall_s"] = time.perf_counter() - t0
    result = _result_line(out)
    if rc == 0 and result is not None:
        row.update(result)
        row["status"] = "ok"
    else:
        row["status"] = _failure(rc, err, result, row.get("oom_kills", 0))
    return row


def _spawn(cmd: list[str], preexec, settings: PeerSettings) -> tuple[int, str, str]:
    timeout_s = settings.timeout_s
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_WAIT_POLICY=settings.omp_wait_policy)
    # one OpenBLAS thread, as `sdq` itself runs (sdq.cli.cap_native_threads): a child started
    # with `python -m sdq.measure.peers` would otherwise get an OpenBLAS thread per core, whose
    # spinning after each F32 router product took the two cores from the compute (capped
    # decode measured 18.4 tok/s that way, 25.8 with one thread, same file and cap)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec,
        env=env,
    )
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        return -1000, out, f"timed out after {timeout_s:.0f} s"
    return p.returncode, out, err


def _result_line(out: str) -> dict | None:
    for line in reversed(out.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    return None


def _failure(rc: int, err: str, result: dict | None, oom_kills: int) -> str:
    if result is not None and "error" in result:
        return f"error: {result['error']}"
    if rc == -1000:
        return err
    if rc == -9 or oom_kills:
        return "killed (out of memory in the cgroup)" if oom_kills else "killed (SIGKILL)"
    last = [ln for ln in err.strip().splitlines() if ln.strip()]
    return f"exit {rc}: {last[-1][:300] if last else 'no message'}"


# -- parent: the comparison ------------------------------------------------------------------


@dataclass
class PeersResult:
    settings: dict
    limit_method: str
    limit_note: str
    rows: list[dict] = field(default_factory=list)  # every run
    bandwidth_mb_s: float | None = None
    bandwidth_note: str = ""
    provenance: dict = field(default_factory=dict)

    def medians(self) -> list[dict]:
        return median_rows(self.rows, ("mode", "cap_mb", "system"))

    def summary(self) -> list[dict]:
        """One row per condition (resident, then each cap): medians per system and ratios."""
        med = self.medians()
        by = {(m["mode"], m["cap_mb"], m["system"]): m for m in med}
        conds = sorted({(m["mode"], m["cap_mb"]) for m in med}, key=_cond_key)
        resident = by.get(("resident", None, "sdq"), {}).get("decode_tok_s")
        out = []
        for mode, cap in conds:
            for system in RESIDENT_SYSTEMS if mode == "resident" else CAPPED_SYSTEMS:
                m = by.get((mode, cap, system))
                if m is None:
                    continue
                row = dict(m)
                if system == "sdq" and mode != "resident" and m.get("ok_runs"):
                    row["io_ceiling_tok_s"] = io_ceiling_tok_s(
                        m.get("sdq_ssd_mb_per_token"), self.bandwidth_mb_s
                    )
                    row["compute_bound_tok_s"] = resident
                    row["bound_tok_s"], row["bound_by"] = decode_bound_tok_s(
                        row["io_ceiling_tok_s"], resident
                    )
                out.append(row)
        return out

    def ratios(self) -> list[dict]:
        """sdq / peer for decode (and prefill) tok/s per condition; sdq / I/O ceiling and sdq /
        bound (the I/O ceiling or sdq's resident decode speed, whichever is lower)."""
        med = {(m["mode"], m["cap_mb"], m["system"]): m for m in self.medians()}
        resident = med.get(("resident", None, "sdq"), {}).get("decode_tok_s")
        out = []
        for mode, cap in sorted({(k[0], k[1]) for k in med}, key=_cond_key):
            s = med.get((mode, cap, "sdq"), {})
            peers = ("llama",) if mode == "resident" else ("llama-mmap", "llama-lazy")
            for peer in peers:
                p = med.get((mode, cap, peer))
                if p is None:
                    continue
                out.append(
                    {
                        "mode": mode,
                        "cap_mb": cap,
                        "vs": peer,
                        "decode_ratio": _ratio(s.get("decode_tok_s"), p.get("decode_tok_s")),
                        "prefill_ratio": _ratio(s.get("prefill_tok_s"), p.get("prefill_tok_s")),
                        "read_ratio": _ratio(
                            s.get("device_mb_per_token"), p.get("device_mb_per_token")
                        ),
                    }
                )
            if mode != "resident" and s:
                ceiling = io_ceiling_tok_s(s.get("sdq_ssd_mb_per_token"), self.bandwidth_mb_s)
                bound, _ = decode_bound_tok_s(ceiling, resident)
                for vs, limit in (("io-ceiling", ceiling), ("bound", bound)):
                    out.append(
                        {
                            "mode": mode,
                            "cap_mb": cap,
                            "vs": vs,
                            "decode_ratio": _ratio(s.get("decode_tok_s"), limit),
                            "prefill_ratio": None,
                            "read_ratio": None,
                        }
                    )
        return out

    def pairs(
        self, mode: str, cap_mb: float | None, peer: str, key: str = "decode_tok_s"
    ) -> list[tuple[float, float]]:
        """(peer, sdq) values of `key` from the same repeat (adjacent runs, the order
        rotating per repeat) wherever both finished: the pairs of the lab's verdict rule."""
        by: dict[tuple[str, int], float] = {}
        for r in self.rows:
            if (r["mode"], r["cap_mb"]) == (mode, cap_mb) and r.get("status") == "ok":
                v = r.get(key)
                if isinstance(v, (int, float)) and v == v and v > 0:
                    by[(r["system"], r["repeat"])] = float(v)
        repeats = sorted({k[1] for k in by})
        return [
            (by[(peer, i)], by[("sdq", i)]) for i in repeats if (peer, i) in by and ("sdq", i) in by
        ]

    def to_dict(self) -> dict:
        return {
            "settings": self.settings,
            "limit_method": self.limit_method,
            "limit_note": self.limit_note,
            "bandwidth_mb_s": self.bandwidth_mb_s,
            "bandwidth_note": self.bandwidth_note,
            "summary": self.summary(),
            "ratios": self.ratios(),
            "runs": self.rows,
            "provenance": self.provenance,
        }


def _cond_key(c: tuple) -> tuple:
    mode, cap = c
    return ({"resident": 0, "capped": 1}.get(mode, 2), cap or 0.0)


def _ratio(a, b):
    if a is None or b is None or not b or a != a or b != b:
        return None
    return a / b


def run_peers(
    settings: PeerSettings,
    caps_mb: Sequence[float],
    repeat: int = 1,
    *,
    resident: bool = True,
    capped_systems: Sequence[str] = CAPPED_SYSTEMS,
    method: str | None = None,
    bandwidth: tuple[float, str] | None = None,
    copy_model: bool = True,
    retry_failed: bool = False,
    systems_at: Mapping[float, Sequence[str]] | None = None,
    warm_systems: Sequence[str] = (),
    progress: Callable[[str], None] | None = None,
) -> PeersResult:
    """Resident comparison (when `resident`), then every cap; `repeat` rounds of each, the
    systems' order rotating per round; every run a fresh child. Capped runs read a private
    copy of the model (`copy_model`), dropped from the page cache before each run. A system
    that failed under a cap (a refused budget, an OOM kill) is not run there again unless
    `retry_failed`: its row then has one run, the failed one. `systems_at` names other capped
    systems for some caps (e.g. llama-lazy too at one cap), run in the same rotation. With
    `warm_too`, each cap is also run warm (mode "warm"): the child first generates once,
    unmeasured, under the same cap, then the measured generation follows."""
    settings.validate()
    if repeat < 1:
        raise ParamsError(f"--repeat {repeat} must be >= 1")
    systems_at = {float(c): tuple(v) for c, v in (systems_at or {}).items()}
    for s in [*capped_systems, *warm_systems, *(x for v in systems_at.values() for x in v)]:
        if s not in CAPPED_SYSTEMS:
            raise ParamsError(f"capped system {s!r}: expected some of {CAPPED_SYSTEMS}")
    for cap in caps_mb:
        if not cap > 0:
            raise ParamsError(f"--ram-cap-mb {cap}: a cap must be > 0 MB")
    say = progress or (lambda msg: None)
    if method is None:
        method, note = limit_method()
    else:
        note = {"cgroup": "cgroup v1 memory limit (page cache charged)"}.get(
            method, "RLIMIT_DATA: anonymous memory only, page cache and file mappings not capped"
        )
    res = PeersResult(settings=asdict(settings), limit_method=method, limit_note=note)
    if bandwidth is not None:
        res.bandwidth_mb_s, res.bandwidth_note = bandwidth
    res.provenance = _provenance(settings)
    load0 = os.getloadavg()
    if resident:
        say("warming the page cache with the model file")
        warm_file(settings.model)
        cond = Condition()
        for r in range(repeat):
            for system in run_order(RESIDENT_SYSTEMS, r):
                say(f"resident, repeat {r + 1}/{repeat}: {system}")
                res.rows.append(run_one(system, settings, cond, r))
                say(f"  -> {_brief(res.rows[-1])}")
    if caps_mb:
        with contextlib.ExitStack() as stack:
            capped = settings
            if copy_model:
                say("copying the model to a private file (for a cold page cache)")
                copy = stack.enter_context(private_copy(settings.model))
                capped = replace(settings, model=str(copy))
            res.provenance["capped_file"] = "private copy" if copy_model else "the model file"
            conds = [
                Condition(float(cap), method, warm)
                for cap in caps_mb
                for warm in ((False, True) if warm_systems else (False,))
            ]
            for cond in conds:
                cap = cond.cap_mb
                failed: set[str] = set()
                for r in range(repeat):
                    systems = systems_at.get(float(cap), tuple(capped_systems))
                    if cond.warm:
                        systems = tuple(s for s in systems if s in warm_systems)
                    for system in run_order(list(systems), r):
                        if system in failed and not retry_failed:
                            continue
                        say(f"{cond.label}, repeat {r + 1}/{repeat}: {system}")
                        res.rows.append(run_one(system, capped, cond, r))
                        say(f"  -> {_brief(res.rows[-1])}")
                        if res.rows[-1]["status"] != "ok":
                            failed.add(system)
    res.provenance["loadavg_1min"] = [load0[0], os.getloadavg()[0]]
    mark_same_tokens(res.rows)
    return res


def mark_same_tokens(rows: list[dict]) -> None:
    """same_tokens = 1 when a run generated the same greedy tokens as the first llama.cpp run,
    else 0; agree_tokens = how many leading tokens agree with it (on a synthetic model's nearly
    flat logits, a last-bit difference can flip a near tie and the texts part from there).
    Absent when there is no llama.cpp run."""
    ref = next(
        (r["generated_ids"] for r in rows if r["status"] == "ok" and r["system"] != "sdq"), None
    )
    if ref is None:
        return
    for r in rows:
        if r["status"] == "ok":
            ids = r["generated_ids"]
            r["same_tokens"] = int(ids == ref)
            r["agree_tokens"] = next(
                (i for i, (a, b) in enumerate(zip(ids, ref, strict=False)) if a != b),
                min(len(ids), len(ref)),
            )


def _brief(row: dict) -> str:
    if row["status"] != "ok":
        return row["status"]
    return (
        f"decode {row['decode_tok_s']:.2f} tok/s, prefill {row['prefill_tok_s']:.1f} tok/s, "
        f"{row['device_mb_per_token']:.1f} MB/token from the device, "
        f"peak RSS {row['peak_rss_mb']:.0f} MiB"
    )


def _provenance(settings: PeerSettings) -> dict:
    from importlib import metadata

    try:
        llama_version = metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        llama_version = None
    from sdq.measure.llama_ref import LLAMA_SETTINGS_NOTE

    return {
        "model_bytes": os.path.getsize(settings.model),
        "llama_cpp_python": llama_version,
        "llama_settings": LLAMA_SETTINGS_NOTE,
        "cpus": os.cpu_count(),
        "python": sys.executable,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# -- child -----------------------------------------------------------------------------------


def child_main(job: dict) -> dict:
    """Run one system once (after a warm-up when resident) and return its figures."""
    system = job["system"]
    st = job["settings"]
    st["prompt_ids"] = tuple(st["prompt_ids"])
    settings = PeerSettings(**st)
    t0 = time.perf_counter()
    io_start = read_proc_io()
    if system == "sdq":
        runner = _SdqChild(settings, job["resident"], job.get("ram_budget_mb"))
    else:
        runner = _LlamaChild(
            settings,
            lazy=system == "llama-lazy",
            mmap=not job["resident"],
            repack=system != "llama-mmap-norepack",
        )
    load_s = time.perf_counter() - t0
    io_loaded = read_proc_io()
    if job.get("warmup", job["resident"]):
        runner.generate(min(WARMUP_TOKENS, settings.tokens))
    fig = runner.generate(settings.tokens)
    n_decode = fig["n_decode"]
    decode_bytes = fig["io_end"]["read_bytes"] - fig["io_decode"]["read_bytes"]
    prefill_bytes = fig["io_decode"]["read_bytes"] - fig["io_begin"]["read_bytes"]
    out = {
        "load_s": load_s,
        "load_device_mb": (io_loaded["read_bytes"] - io_start["read_bytes"]) / MB,
        "prefill_device_mb": prefill_bytes / MB,
        "device_mb_per_token": decode_bytes / MB / n_decode,
        "n_prompt": len(settings.prompt_ids),
        "peak_rss_mb": memory_figures()["peak_rss_mb"],  # MiB
        **{k: v for k, v in fig.items() if not k.startswith("io_")},
    }
    runner.close()
    return out


class _SdqChild:
    def __init__(self, s: PeerSettings, resident: bool, budget_mib: float | None):
        from sdq.run.session import Session

        self.settings = s
        self.run_settings = s.run_settings(resident, budget_mib)
        self.session = Session(self.run_settings)

    def generate(self, n: int) -> dict:
        from sdq.run.generate import GenerateSettings, generate

        engine = self.session.engine
        marks: dict = {}
        forward = engine.forward

        def timed_forward(*a, **kw):  # the first decode step: prefill's reads are over
            if engine.phase == "decode" and "io_decode" not in marks:
                marks["io_decode"] = read_proc_io()
            return forward(*a, **kw)

        engine.forward = timed_forward
        routes = None
        if not self.run_settings.resident:  # decode routing kept for the optimum
            from sdq.measure.optimum import DecodeRoutes

            routes = engine.route_log = DecodeRoutes(self.session.experts, engine.route_log)
        gs = GenerateSettings(n_predict=n, sampler=self.run_settings.sampler, stop_at_eos=False)
        io_begin = read_proc_io()
        try:
            g = generate(engine, self.session.tokenizer, list(self.settings.prompt_ids), gs)
        finally:
            engine.forward = forward
            if routes is not None:
                engine.route_log = routes.inner
        io_end = read_proc_io()
        f = self.session.figures(g)
        return {
            **_limits_figures(f, g, routes),
            "io_begin": io_begin,
            "io_decode": marks.get("io_decode", io_end),
            "io_end": io_end,
            "n_decode": f["n_decode"],
            "decode_tok_s": f["decode_tok_s"],
            "prefill_tok_s": f["prefill_tok_s"],
            "hit_rate": f.get("hit_rate"),
            "reads_avoided": f.get("reads_avoided"),
            "pager_ms_per_token": f.get("pager_ms_per_token"),
            "sdq_ssd_mb_per_token": f.get("ssd_mb_per_token"),
            "expert_io_ms_per_token": f.get("expert_io_ms_per_token"),
            "expert_compute_ms_per_token": f.get("expert_compute_ms_per_token"),
            "slots": f.get("slots"),
            "cache_policy": f.get("expert_cache", {}).get("policy"),
            "prefetches": f.get("expert_cache", {}).get("prefetches"),
            "prefetch_hits": f.get("expert_cache", {}).get("prefetch_hits"),
            "slot_bytes": f.get("slot_bytes"),
            # under an emulated device: reads held, and those whose bytes came after their end
            "emulated_reads": f.get("emulated_reads"),
            "late_reads": f.get("late_reads"),
            "generated_ids": list(g.generated_ids),
        }

    def close(self) -> None:
        self.session.close()


def _limits_figures(figures: dict, g, routes) -> dict:
    """A paged run's pager against the best cache on its decode, and its token time split
    (sdq.measure.optimum), as flat numbers for the rows; {} for a resident run."""
    if routes is None or not figures.get("n_decode"):
        return {}
    from sdq.measure.optimum import optimum_report, token_time

    opt = optimum_report(routes)
    tt = token_time(figures, g.profile["decode"])
    keep = ("cache_slots", "pager_misses", "optimum_misses", "misses_vs_optimum")
    out = {k: v for k, v in asdict(opt).items() if k in keep}
    out["pager_expert_mb"] = opt.pager_expert_bytes / MB
    out["optimum_expert_mb"] = opt.optimum_expert_bytes / MB
    out["bytes_vs_optimum"] = opt.bytes_vs_optimum
    out["bytes_optimum_exact"] = int(opt.bytes_optimum_exact)
    # "time_" keys: the child drops keys starting "io_" from what it reports
    out["time_total_ms"] = tt.total_ms
    out.update({f"time_{k}": v for k, v in tt.parts.items()})
    return out


class _LlamaChild:
    def __init__(self, s: PeerSettings, *, lazy: bool, mmap: bool, repack: bool = True):
        import llama_cpp

        from sdq.measure.llama_ref import open_llama

        self.settings = s
        self.lib = llama_cpp
        lib = llama_cpp.llama_cpp
        default = lib.llama_model_default_params
        if lazy and not hasattr(lib, "LLAMA_LAZY_MODE_ON"):
            raise ParamsError("this llama-cpp-python has no lazy_mode (llama_lazy_mode)")
        if lazy or not repack:

            def params():
                p = default()
                if lazy:
                    p.lazy_mode = lib.LLAMA_LAZY_MODE_ON
                if not repack:  # no repacked copies in anonymous memory: every weight mapped
                    p.use_extra_bufts = False
                return p

            lib.llama_model_default_params = params
        try:
            self.llm = open_llama(
                s.model, n_ctx=s.ctx, n_ubatch=s.ubatch, threads=s.threads, use_mmap=mmap
            )
        finally:
            lib.llama_model_default_params = default
        self.n_vocab = self.llm.n_vocab()

    def _argmax_last(self) -> int:
        import numpy as np

        ptr = self.lib.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))))

    def generate(self, n: int) -> dict:
        llm, ids = self.llm, list(self.settings.prompt_ids)
        llm.reset()
        io_begin = read_proc_io()
        t0 = time.perf_counter()
        llm.eval(ids)
        tok = self._argmax_last()
        t1 = time.perf_counter()
        io_decode = read_proc_io()
        generated = [tok]
        for _ in range(n - 1):  # as sdq: the first token comes from prefill, n - 1 steps
            llm.eval([tok])
            tok = self._argmax_last()
            generated.append(tok)
        t2 = time.perf_counter()
        return {
            "io_begin": io_begin,
            "io_decode": io_decode,
            "io_end": read_proc_io(),
            "n_decode": n - 1,
            "decode_tok_s": (n - 1) / (t2 - t1),
            "prefill_tok_s": len(ids) / (t1 - t0),
            "generated_ids": generated,
        }

    def close(self) -> None:
        self.llm.close()


# -- teacher forcing: the same tokens into both engines --------------------------------------


def teacher_forced(
    settings: PeerSettings, positions: int, progress: Callable[[str], None] | None = None
) -> dict:
    """Top-1 agreement of sdq with llama.cpp when both read the same token sequence.

    Free-running greedy decoding cannot measure agreement: on a synthetic model's nearly flat
    logits the two best tokens often nearly tie, a last-bit difference between the engines
    picks the other one, and from there each engine reads its own text. Here llama.cpp (a
    fresh child, weights in RAM) reads the prompt and continues it greedily to `positions`
    tokens; then it, sdq (another child, every expert resident) and llama.cpp with its default
    KV cache read exactly those tokens in ubatches of the same size (ggml's float order for a
    product depends on how many tokens it takes, and sdq follows it). At every position each
    gives its logits for the next token.

    Two llama.cpp settings: `llama` keeps its KV cache in F32, as sdq does (so a difference is
    one of the engines' arithmetic, as in tests/test_llama_parity); `llama_f16kv` keeps
    llama.cpp's default F16 cache, the setting of the speed runs, which rounds keys and values.

    Returns `status` ("ok" or why not), `positions`, `n_prompt`, `tokens` [N] and, for each
    reference R in ("llama", "llama_f16kv"), per position: `R_top` (argmax), `R_margin` (its
    best minus its second logit), `R_max_diff` (max |sdq - R| over the vocabulary), `R_rel_err`
    (that / max |R logit|), and `R_agree` (positions where sdq's argmax is R's); `sdq_top`.
    """
    import tempfile

    import numpy as np

    settings.validate()
    if not len(settings.prompt_ids) < positions <= settings.ctx:
        raise ParamsError(
            f"teacher forcing over {positions} positions: needs more than the prompt's "
            f"{len(settings.prompt_ids)} tokens and at most -c {settings.ctx}"
        )
    say = progress or (lambda msg: None)
    logits: dict[str, np.ndarray] = {}
    tokens: list[int] = []
    with tempfile.TemporaryDirectory(prefix="sdq-teacher-") as tmp:
        for system in ("llama", "llama_f16kv", "sdq"):  # the first makes the sequence
            path = str(Path(tmp) / f"{system}.npy")
            job = {
                "task": "logits",
                "system": system,
                "settings": asdict(settings),
                "positions": positions,
                "tokens": tokens,
                "out": path,
            }
            say(f"teacher forcing: {system} over {positions} positions")
            cmd = [sys.executable, "-m", "sdq.measure.peers", json.dumps(job)]
            rc, out, err = _spawn(cmd, None, settings)
            result = _result_line(out)
            if rc != 0 or result is None or "error" in result:
                return {"status": f"{system}: {_failure(rc, err, result, 0)}"}
            tokens = result["tokens"]
            logits[system] = np.load(path)  # [N, V] float32
    a = logits["sdq"]
    found = {
        "status": "ok",
        "positions": positions,
        "n_prompt": len(settings.prompt_ids),
        "tokens": tokens,
        "sdq_top": a.argmax(axis=1).tolist(),
    }
    for ref in ("llama", "llama_f16kv"):
        b = logits[ref]
        best2 = np.sort(np.partition(b, -2, axis=1)[:, -2:], axis=1)  # [N, 2] ascending
        diff = np.abs(a - b).max(axis=1)  # [N]
        found[f"{ref}_top"] = b.argmax(axis=1).tolist()
        found[f"{ref}_agree"] = int((a.argmax(axis=1) == b.argmax(axis=1)).sum())
        found[f"{ref}_margin"] = (best2[:, 1] - best2[:, 0]).tolist()
        found[f"{ref}_max_diff"] = diff.tolist()
        found[f"{ref}_rel_err"] = (diff / np.abs(b).max(axis=1)).tolist()
    return found


def logits_child(job: dict) -> dict:
    """One engine's logits at every position of the teacher-forced sequence (saved to
    job["out"] as float32 [N, V]). The first llama.cpp child makes the sequence (the prompt and
    its greedy continuation); the others read job["tokens"]."""
    import numpy as np

    st = dict(job["settings"], prompt_ids=tuple(job["settings"]["prompt_ids"]))
    s = PeerSettings(**st)
    n = int(job["positions"])
    tokens = [int(t) for t in job["tokens"]]
    if job["system"] in ("llama", "llama_f16kv"):
        from sdq.measure.llama_ref import open_llama

        f32 = 0  # GGML_TYPE_F32
        kv = {"type_k": f32, "type_v": f32} if job["system"] == "llama" else {}
        llm = open_llama(
            s.model, n_ctx=s.ctx, n_ubatch=s.ubatch, threads=s.threads, logits_all=True, **kv
        )
        if not tokens:
            tokens = [int(t) for t in s.prompt_ids]
            llm.eval(tokens)
            while len(tokens) < n:  # greedy, one token at a time, as generation does
                tokens.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
                llm.eval(tokens[-1:])
            # then read the whole sequence again, in ubatches as the other children do:
            # ggml's product orders depend on how many tokens a product takes
            llm.reset()
        llm.eval(tokens)
        logits = np.array(llm.scores[:n], dtype=np.float32)  # [N, V]
        llm.close()
    else:
        from sdq.run.session import Session

        session = Session(s.run_settings(resident=True, budget_mib=None))
        try:
            engine = session.engine
            engine.reset()
            ub = s.ubatch
            parts = [engine.forward(tokens[i : i + ub], "all") for i in range(0, n, ub)]
            logits = np.concatenate(parts).astype(np.float32)  # [N, V]
        finally:
            session.close()
    np.save(job["out"], logits)
    return {"tokens": tokens}


def _child_entry(argv: list[str]) -> int:
    job = json.loads(argv[0])
    try:
        result = logits_child(job) if job.get("task") == "logits" else child_main(job)
    except Exception as exc:  # reported to the parent as this run's status
        from sdq.errors import SdqError

        if not isinstance(exc, (SdqError, MemoryError, OSError)):
            raise
        result = {"error": f"{type(exc).__name__}: {exc}"}
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 3
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child_entry(sys.argv[1:]))
