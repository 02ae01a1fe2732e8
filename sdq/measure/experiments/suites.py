"""The suites: which configurations each one runs, and how the RAM budget of a run is chosen.

    layer-miss  T3   one layer, 1, 2, 4 ... of its experts missing: `sdq bench layer-miss --json`
    io          T4   the seed's final A/B (000 §0): serial vs parallel segment reads, with the
                     next-layer prefetch off (as in the seed) and on (the engine's default)
    threads     T4   the io suite's runs, and parallel at each I/O thread count (000 §3)
    split       T5   split 1, 2, 4, 8 x I/O thread counts x page cache cold / warm (000 §4.1, 003)
    profile     T11  `sdq chat --profile`: ms per token per op category, serial and parallel
    memory      T9   ubatch sweep under a RAM limit, plan-based vs the seed's sizing (000 §5.1)
    reserve     T10  reserve sweep at a fixed budget: slots, peak RSS vs budget, tok/s (000 §5.2)

Every chat run generates the same tokens from the same prompt (greedy, --ignore-eos), with the
same threads and seed. The I/O suites (`ROTATED_SUITES`) rotate and reverse their order from
repeat to repeat (sdq.measure.experiments.runner: A B, B A, B A, A B for two), so no
configuration always runs first after a page-cache drop. Their prefetch state is part of every
label: "prefetch off" passes `--prefetch-next 0` (the seed had no prefetch), "prefetch on"
leaves the engine's default (the next layer's likeliest experts read ahead during decode). Page
cache: "cold" reads with `cache_mode` (dontneed or direct) after the file's pages are dropped;
"warm" (seed 003's condition) reads with cache mode pagecache after the whole file is read once.

The arena holds `arena_fraction` of all routed experts: in the I/O suites set with
`--max-slots`; in the memory suites through the budget, the one for which the memory
plan leaves that many slots, computed with the RSS a chat process has when it plans (measured
once per model by a calibration run).

The seed's sizing (000 §5): the arena was "budget - RSS now - reserve", taken before the KV cache
and the compute buffer existed, which then grew past the budget. sdq's plan counts both first.
The seed's sizing with reserve R is the plan with reserve R - KV - compute (the arithmetic is
identical), so the memory and reserve suites run it through `sdq chat --reserve-mb` with that
value: no special engine mode is needed to reproduce it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, fields
from pathlib import Path

from sdq.errors import ParamsError
from sdq.measure.experiments.config import FILE_CACHE, RunConfig
from sdq.measure.limits import METHODS, MemoryLimit
from sdq.paging.reads import CACHE_MODES, MODES
from sdq.units import MIB

SUITES = ("layer-miss", "io", "threads", "split", "profile", "memory", "reserve")
ROTATED_SUITES = ("io", "threads", "split", "profile")  # order rotated by one each repeat
PREFETCH = ("off", "on")  # off: --prefetch-next 0; on: the engine's default
PAGE_CACHE = ("cold", "warm")  # the split suite's page-cache conditions (see the docstring)
SIZINGS = ("plan", "seed")
# the I/O modes the profile suite compares: split needs a piece count and has its own suite
PROFILE_IO_MODES = tuple(m for m in MODES if m != "split")
DEFAULT_PROMPT = "Explain in three sentences how SSD, RAM and CPU caches form a memory hierarchy."


@dataclass(frozen=True)
class Settings:
    """Everything a suite needs besides the model. Lists are tuples; see the module docstring."""

    # the generation of every chat run
    prompt: str = DEFAULT_PROMPT
    n_predict: int = 32
    threads: int = 2
    ctx: int = 1024
    ubatch: int = 128
    seed: int = 0
    repeat: int = 3
    timeout_s: float = 900.0
    # arena and reads
    arena_fraction: float = 0.25  # arena slots / all routed experts of the model
    reserve_mb: float = 64.0  # the plan's head room in the I/O suites (and the budget's)
    cache_mode: str = "dontneed"  # how the pager reads (`sdq chat --cache-mode`)
    file_cache: str = "dropped"  # the model file's pages before each run: dropped or warm
    cold_wait_s: float = 30.0  # keep dropping the file's pages this long if another process holds
    profile_all: bool = True  # every I/O-suite chat also reports its op profile (--profile)
    # io, threads (T4)
    serial_io_threads: int = 8
    ab_io_threads: int = 8
    ab_prefetch: tuple[str, ...] = PREFETCH  # the A/B's prefetch states (io suite)
    io_threads: tuple[int, ...] = (2, 8, 24)
    prefetch: str = "off"  # the prefetch of the thread sweep, the split and profile suites
    # split (T5)
    splits: tuple[int, ...] = (1, 2, 4, 8)
    split_io_threads: tuple[int, ...] = (8,)
    split_cache: tuple[str, ...] = PAGE_CACHE
    # layer-miss (T3)
    layer_miss_misses: tuple[int, ...] = (1, 2, 4, 8)  # experts of the layer missing
    layer_miss_modes: tuple[str, ...] = ("serial", "parallel")
    layer_miss_io_threads: tuple[int, ...] = (8, 16, 24)
    layer_miss_repeat: int = 31  # the benchmark's own repetitions per run
    # profile (T11)
    profile_io_modes: tuple[str, ...] = PROFILE_IO_MODES
    # memory (T9) and reserve (T10)
    limits: tuple[str, ...] = ("rlimit_data",)  # RAM limit methods of memory runs (each a row)
    reserve_limit: str = "rlimit_data"  # RAM limit method of reserve runs
    sizings: tuple[str, ...] = SIZINGS
    memory_ctx: int = 4096  # context of memory and reserve runs (the seed's)
    ubatches: tuple[int, ...] = (32, 128, 512, 2048)
    long_prompt_repeat: int = 24  # the memory suite's prompt: `prompt` this many times
    memory_n_predict: int = 4
    reserves_mb: tuple[int, ...] = (0, 32, 64, 128, 256)

    @classmethod
    def from_mapping(cls, m: dict, strict: bool = True) -> Settings:
        """Settings from a params section; unknown keys are an error when strict."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(m) - set(known))
        if unknown and strict:
            raise ParamsError(f"experiment settings: unknown key {unknown[0]!r}")
        kw = {}
        for k, v in m.items():
            if k not in known:
                continue
            default = known[k].default
            if isinstance(default, tuple):
                if not isinstance(v, list | tuple):
                    raise ParamsError(f"experiment settings: {k} must be a list, got {v!r}")
                v = tuple(v)
            elif isinstance(default, float) and isinstance(v, int) and not isinstance(v, bool):
                v = float(v)
            elif not isinstance(v, type(default)):
                raise ParamsError(
                    f"experiment settings: {k} must be {type(default).__name__}, got {v!r}"
                )
            kw[k] = v
        return cls(**kw).validate()

    def validate(self) -> Settings:
        checks = (
            (self.cache_mode in CACHE_MODES, f"cache_mode {self.cache_mode!r}"),
            (self.file_cache in FILE_CACHE, f"file_cache {self.file_cache!r}"),
            (set(self.limits) <= set(METHODS), f"limits {self.limits}: expected {METHODS}"),
            (self.reserve_limit in METHODS, f"reserve_limit {self.reserve_limit!r}: {METHODS}"),
            (set(self.sizings) <= set(SIZINGS), f"sizings {self.sizings}: plan, seed"),
            (0 < self.arena_fraction <= 1, f"arena_fraction {self.arena_fraction}: in (0, 1]"),
            (self.repeat >= 1, f"repeat {self.repeat}: >= 1"),
            (self.n_predict >= 2, f"n_predict {self.n_predict}: >= 2 (one decode step)"),
            (
                set(self.profile_io_modes) <= set(PROFILE_IO_MODES),
                f"profile_io_modes {self.profile_io_modes}",
            ),
            (
                set(self.ab_prefetch) <= set(PREFETCH) and self.prefetch in PREFETCH,
                f"ab_prefetch {self.ab_prefetch}, prefetch {self.prefetch!r}: {PREFETCH}",
            ),
            (set(self.split_cache) <= set(PAGE_CACHE), f"split_cache {self.split_cache}"),
            (
                bool(self.layer_miss_misses) and min(self.layer_miss_misses) >= 1,
                f"layer_miss_misses {self.layer_miss_misses}: counts >= 1",
            ),
        )
        for ok, what in checks:
            if not ok:
                raise ParamsError(f"experiment settings: {what}")
        return self

    def replace(self, **kw) -> Settings:
        return dataclasses.replace(self, **kw).validate()


# -- sizing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """What a chat process is when it plans: RSS then, and the model's fixed terms."""

    rss_bytes: int
    model_bytes: int
    n_experts: int  # routed experts in all layers (L x E)
    n_expert_used: int


def calibrate(model: str, s: Settings, cache_dir: Path, progress: bool = True) -> Calibration:
    """Runs one short chat to measure the RSS at planning time (cached per model and threads)."""
    from sdq import files as atomic
    from sdq.format.model import open_model

    m = open_model(model)
    table = m.require_experts()
    size = os.path.getsize(model)
    path = Path(cache_dir) / "calibration.json"
    tag = f"{Path(model).name}:{size}:t{s.threads}"
    cached = json.loads(path.read_text()) if path.exists() else {}
    if tag not in cached:
        if progress:
            print(f"calibrating: one short chat on {Path(model).name} ...", flush=True)
        cached[tag] = _calibration_run(model, s, m)
        atomic.write_json(path, cached)
    return Calibration(
        rss_bytes=int(cached[tag]),
        model_bytes=size,
        n_experts=len(table.layers) * table.n_expert,
        n_expert_used=int(m.spec.n_expert_used),
    )


def _calibration_run(model: str, s: Settings, m) -> int:
    import subprocess
    import sys

    from sdq.run.workspace import workspace_bytes

    ws = sum(workspace_bytes(m.spec, s.ctx, s.ubatch, s.threads).values())
    # a budget that leaves ~600 MiB beyond the model's fixed terms, whatever the RSS
    fixed_mb = (m.dense_bytes + ws) / MIB
    budget = 100_000.0
    reserve = budget - fixed_mb - 600
    cmd = [sys.executable, "-m", "sdq", *_chat_common(model, s, n_predict=2, ubatch=s.ubatch)]
    cmd += [f"--ram-budget-mb={budget}", f"--reserve-mb={reserve:.3f}"]
    p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ParamsError(f"calibration chat on {model} failed: {last}")
    return int(json.loads(p.stdout)["settings"]["plan"]["rss_bytes"])


def budget_mb(
    model_obj,
    cal: Calibration,
    s: Settings,
    slots: int,
    reserve_mb: float,
    io_threads: int,
    ctx: int | None = None,
) -> float:
    """The budget (MiB) for which the plan of a chat process leaves `slots` slots."""
    from sdq.run.plan import plan_memory

    plan = plan_memory(
        model_obj,
        1e7,
        ctx or s.ctx,
        s.ubatch,
        reserve_mb=reserve_mb,
        rss_now=cal.rss_bytes,
        cache_mode=s.cache_mode,
        io_threads=io_threads,
        compute_threads=s.threads,
    )
    return (plan.budget_for_slots(slots) + plan.per_slot_bytes // 2) / MIB


def target_slots(cal: Calibration, s: Settings) -> int:
    return max(round(s.arena_fraction * cal.n_experts), 2 * cal.n_expert_used)


def workspace_mb(model_obj, ctx: int, ubatch: int, threads: int = 1) -> tuple[float, float]:
    """(KV cache MiB, compute buffers MiB) the plan counts for ctx, ubatch and compute threads."""
    from sdq.run.workspace import workspace_bytes

    ws = workspace_bytes(model_obj.spec, ctx, ubatch, threads)
    kv = sum(b for name, b in ws.items() if name.endswith("cache"))
    return kv / MIB, (sum(ws.values()) - kv) / MIB


# -- configurations -------------------------------------------------------------------------


def _chat_common(model: str, s: Settings, n_predict: int | None = None, ubatch=None, prompt=None):
    return [
        "chat",
        "-m",
        model,
        "-p",
        s.prompt if prompt is None else prompt,
        "-n",
        str(n_predict or s.n_predict),
        "-t",
        str(s.threads),
        "-c",
        str(s.ctx),
        "-b",
        str(ubatch or s.ubatch),
        "--temp",
        "0",
        "--seed",
        str(s.seed),
        "--ignore-eos",
        "--json",
    ]


class SuiteBuilder:
    """Builds a suite's configurations for one model (opens it once, calibrates once)."""

    def __init__(self, model: str, s: Settings, cache_dir: Path, progress: bool = True):
        from sdq.format.model import open_model

        self.model = str(model)
        self.s = s
        self.cache_dir = Path(cache_dir)
        self.progress = progress
        self.m = open_model(self.model)
        self.m.require_experts()
        self._cal: Calibration | None = None

    @property
    def cal(self) -> Calibration:
        if self._cal is None:
            self._cal = calibrate(self.model, self.s, self.cache_dir, self.progress)
        return self._cal

    def build(self, suite: str) -> list[RunConfig]:
        if suite not in SUITES:
            raise ParamsError(f"suite {suite!r}: expected one of {', '.join(SUITES)} or all")
        return getattr(self, suite.replace("-", "_"))()

    # I/O suites ---------------------------------------------------------------------------

    def _io_config(
        self, suite, label, mode, io_threads, split=1, prefetch="off", cache="cold", extra=()
    ):
        """One chat configuration of an I/O suite; `prefetch` and `cache` (PAGE_CACHE) are
        named at the end of the label."""
        s = self.s
        slots = self.io_slots()
        cache_mode, file_cache = (
            (s.cache_mode, s.file_cache) if cache == "cold" else ("pagecache", "warm")
        )
        args = _chat_common(self.model, s) + [
            "--max-slots",
            str(slots),
            "--io-mode",
            mode,
            "--io-threads",
            str(io_threads),
            "--io-split",
            str(split),
            "--cache-mode",
            cache_mode,
            *(("--prefetch-next", "0") if prefetch == "off" else ()),
            *extra,
        ]
        if s.profile_all and "--profile" not in args:
            args.append("--profile")
        label = f"{label} prefetch {prefetch}" + (f" {cache}" if suite == "split" else "")
        return RunConfig(
            suite,
            label,
            tuple(args),
            self.model,
            MemoryLimit(),
            file_cache,
            (
                ("io_mode", mode),
                ("io_threads", io_threads),
                ("split", split),
                ("prefetch", prefetch),
                ("page_cache", cache),
                ("target_slots", slots),
            ),
        )

    def io_slots(self) -> int:
        """The arena of the I/O suites: `arena_fraction` of all experts, set with --max-slots
        (the budget is the memory available, so every configuration gets exactly these slots)."""
        table = self.m.experts
        k = int(self.m.spec.n_expert_used)
        return max(round(self.s.arena_fraction * len(table.layers) * table.n_expert), 2 * k)

    def io(self, suite: str = "io") -> list[RunConfig]:
        """The seed's A/B: serial vs parallel, for each prefetch state of `ab_prefetch`."""
        s = self.s
        out = []
        for pf in s.ab_prefetch:
            ser, par = s.serial_io_threads, s.ab_io_threads
            out.append(self._io_config(suite, f"serial x{ser}", "serial", ser, prefetch=pf))
            out.append(self._io_config(suite, f"parallel x{par}", "parallel", par, prefetch=pf))
        return out

    def threads(self) -> list[RunConfig]:
        """The io suite's runs, then parallel at each I/O thread count (prefetch `prefetch`)
        that the io suite does not run already."""
        s = self.s
        out = self.io("threads")
        have = {c.label for c in out}
        for n in s.io_threads:
            c = self._io_config("threads", f"parallel x{n}", "parallel", n, prefetch=s.prefetch)
            if c.label not in have:
                out.append(c)
        return out

    def split(self) -> list[RunConfig]:
        s = self.s
        return [
            self._io_config(
                "split", f"split{k} x{n}", "split", n, split=k, prefetch=s.prefetch, cache=cache
            )
            for cache in s.split_cache
            for n in s.split_io_threads
            for k in s.splits
        ]

    def profile(self) -> list[RunConfig]:
        s = self.s
        n = {"serial": s.serial_io_threads, "parallel": s.ab_io_threads}
        return [
            self._io_config(
                "profile",
                f"{mode} x{n[mode]}",
                mode,
                n[mode],
                prefetch=s.prefetch,
                extra=("--profile",),
            )
            for mode in s.profile_io_modes
        ]

    def layer_miss(self) -> list[RunConfig]:
        s = self.s
        args = (
            "bench",
            "layer-miss",
            self.model,
            "--json",
            "--misses",
            ",".join(str(m) for m in s.layer_miss_misses),
            "--mode",
            ",".join(s.layer_miss_modes),
            "--io-threads",
            ",".join(str(n) for n in s.layer_miss_io_threads),
            "--repeat",
            str(s.layer_miss_repeat),
            "--cache-mode",
            s.cache_mode,
            "--seed",
            str(s.seed),
        )
        # the benchmark drops (or warms) the experts' pages itself before every timed read
        return [RunConfig("layer-miss", "layer-miss", args, self.model, MemoryLimit(), "untouched")]

    # memory suites ------------------------------------------------------------------------

    def memory_budget_mb(self) -> float:
        """The budget of the memory and reserve suites: `arena_fraction` of the experts as slots
        with plan-based sizing at the default ubatch and reserve (the parallel default I/O)."""
        s = self.s
        slots = target_slots(self.cal, s)
        return budget_mb(self.m, self.cal, s, slots, s.reserve_mb, 3 * s.threads, s.memory_ctx)

    def _memory_config(
        self, suite, label, sizing, ubatch, reserve_mb, budget, n_predict, prompt, method
    ):
        s = self.s
        kv, compute = workspace_mb(self.m, s.memory_ctx, ubatch, s.threads)
        plan_reserve = reserve_mb if sizing == "plan" else reserve_mb - kv - compute
        common = _chat_common(self.model, s, n_predict=n_predict, ubatch=ubatch, prompt=prompt)
        common[common.index("-c") + 1] = str(s.memory_ctx)
        args = common + [
            f"--ram-budget-mb={budget:.3f}",
            f"--reserve-mb={plan_reserve:.3f}",
            "--cache-mode",
            s.cache_mode,
        ]
        limit = MemoryLimit.mb(method, budget if method != "none" else None)
        return RunConfig(
            suite,
            label,
            tuple(args),
            self.model,
            limit,
            s.file_cache,
            (
                ("sizing", sizing),
                ("ubatch", ubatch),
                ("reserve_mb", reserve_mb),
                ("budget_mb", budget),
                ("compute_buffer_mb", compute),
                ("kv_cache_mb", kv),
            ),
        )

    def memory(self) -> list[RunConfig]:
        s = self.s
        budget = self.memory_budget_mb()
        prompt = " ".join([s.prompt] * s.long_prompt_repeat)
        out = []
        for method in s.limits:
            tag = f" {method}" if len(s.limits) > 1 else ""
            for sizing in s.sizings:
                for ub in s.ubatches:
                    if ub > s.memory_ctx:
                        continue
                    out.append(
                        self._memory_config(
                            "memory",
                            f"{sizing} ub{ub}{tag}",
                            sizing,
                            ub,
                            s.reserve_mb,
                            budget,
                            s.memory_n_predict,
                            prompt,
                            method,
                        )
                    )
        return out

    def reserve(self) -> list[RunConfig]:
        s = self.s
        budget = self.memory_budget_mb()
        return [
            self._memory_config(
                "reserve",
                f"{sizing} r{r:g}",
                sizing,
                s.ubatch,
                float(r),
                budget,
                None,
                None,
                s.reserve_limit,
            )
            for sizing in s.sizings
            for r in s.reserves_mb
        ]
