"""The suites: which configurations each one runs, and how the RAM budget of a run is chosen.

    layer-miss  T3   one layer, 1, 2, 4 ... of its experts missing: `sdq bench layer-miss --json`
    io          T4   the seed's final A/B (000 §0): serial vs parallel segment reads, with the
                     next-layer prefetch off (as in the seed) and on (the engine's default)
    threads     T4   the io suite's runs, and parallel at each I/O thread count (000 §3)
    split       T5   split 1, 2, 4, 8 x I/O thread counts x page cache cold / warm (000 §4.1, 003)
    pack        T4_pack  three reads per expert from the GGUF vs one from its pack
                     (`pack_path`, sdq pack) vs each record cut into `pack_split` chunks vs
                     the pack's neighbours merged into one preadv
    depth       T4_depth  decode prefetch guessing the next layer (the default) vs the next
                     `prefetch_depth` layers (--prefetch-depth)
    profile     T11  `sdq chat --profile`: ms per token per op category, serial and parallel
    memory      T9   ubatch sweep under a RAM limit, plan-based vs the seed's sizing (000 §5.1)
    reserve     T10  the seed's three reserves at a fixed budget: slots, peak RSS vs budget,
                     tok/s (000 §5.2, §6), and the seed's sizing at its 700 and 900 MB
                     reserves, scaled (000 §5.2's overshoot)
    budgets     T10  the plan's sizing at budgets from the plan's minimum to the model file's
                     size, each run in a cgroup capped at its budget (does the budget hold?)
Notebook 04 also runs, through `run_sweep`, the paired runs its verdicts need:
`memory_need` (the data segment the seed's sizing reaches with no limit), `ubatch_pairs`
(prefill at two ubatches) and `arena_arms` (the three reserves of T10, repeated).

Every chat run generates the same tokens from the same prompt (greedy, --ignore-eos), with the
same threads and seed. The I/O suites (`ROTATED_SUITES`) rotate and reverse their order from
repeat to repeat (sdq.measure.experiments.runner: A B, B A, B A, A B for two), so no
configuration always runs first after a page-cache drop. Their prefetch state is part of every
label: "prefetch off" passes `--prefetch-next 0` (the seed had no prefetch), "prefetch on"
leaves the engine's default (the next layer's likeliest experts read ahead during decode),
"prefetch depthN" passes `--prefetch-depth N` (the next N layers' guesses read ahead). Page
cache: "cold" reads with `cache_mode` (dontneed or direct) after the file's pages are dropped;
"warm" (seed 003's condition) reads with cache mode pagecache after the whole file is read once.

The arena holds `arena_fraction` of all routed experts: in the I/O suites set with
`--max-slots`; in the memory suites through the budget, the one for which the memory
plan leaves that many slots, computed with the RSS a chat process has when it plans (measured
once per model by a calibration run).

The seed's sizing (000 §5): the arena was "budget - RSS now - reserve", taken before the KV cache
and the compute buffer existed, which then grew past the budget. sdq's plan counts both first,
and the transient arrays, the pager's stacks and the data segment besides (sdq.run.plan). The
memory and reserve suites run the seed's arithmetic itself: `sdq chat --sizing seed
--reserve-mb R` sizes the arena as budget - RSS at sizing time - dense - R (sdq.run.plan,
sizing "seed"), so the run measures its own RSS at sizing time, as the seed's did.

The seed's reserve, scaled to this model (`SuiteBuilder.seed_reserve_mb`): a reserve is there to
hold what the arithmetic leaves out, so it is scaled by that. At ubatch 128 the seed's left out
739 MB (000 §5.2: its 700 MB reserve plus the 39 MB its peak RSS passed the 8192 MB budget by,
`SEED_LEFT_OUT_MB`); here it leaves out U = KV cache + compute buffers + transient arrays + the
pager's stacks (+ the plan's process figure less the resident set) at `fit_ubatch` (128, the
seed's), by the plan's count (`Sizing.left_out_mb`). The seed's reserve R_s becomes
R_s x U / 739: 700 MB -> 0.947 U (5 % short, as the seed's was), 900 -> 1.218 U, 1150 -> 1.556 U.

T9's reserve is the seed's 700 MB so scaled (the reserve of the seed's §5.1 runs, its default
then): by the plan's count it holds the buffers of ubatch 128 in the data segment and not those
of 256 (`Sizing.data_fit_mb`), as in the seed's table; the plan's sizing gets the same reserve as
head room, and T9's budget is the one at which the plan leaves `arena_fraction` of the experts
as slots at the largest ubatch. T10's arms are the seed's three reserves turned into this
model's slots with the plan's sizing: reserve 0 leaves 2039/1936 x S slots, the other two S and
1808/1936 x S, S being `operating_fraction` of the experts (where the hit rate is ~70 %, the
seed's operating point); beside them the seed's sizing at the 700 and 900 MB reserves, scaled.
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
from sdq.paging.reads import CACHE_MODES
from sdq.run.settings import MAX_PREFETCH_DEPTH
from sdq.units import MIB

SUITES = (
    "layer-miss",
    "io",
    "threads",
    "split",
    "pack",
    "depth",
    "profile",
    "memory",
    "reserve",
    "budgets",
)
ROTATED_SUITES = ("io", "threads", "split", "pack", "depth", "profile")  # rotated each repeat
PREFETCH = ("off", "on")  # off: --prefetch-next 0; on: the engine's default; also "depthN"
PAGE_CACHE = ("cold", "warm")  # the split suite's page-cache conditions (see the docstring)
SIZINGS = ("plan", "seed")
# seed 000 §5.2: arena slots at reserve 700, 900 and 1150 MB under the 8 GB budget
SEED_RESERVE_SLOTS = ((700, 2039), (900, 1936), (1150, 1808))
# seed 000 §5.2: what "budget - RSS now - reserve" left out at ubatch 128, in peak RSS (MB): the
# 700 MB reserve plus the 39 MB the peak (8231 MB) passed the 8192 MB budget by
SEED_LEFT_OUT_MB = 700.0 + (8231 - 8192)
# the I/O modes the profile suite compares: split needs a piece count and has its own suite
PROFILE_IO_MODES = ("serial", "parallel")
DEFAULT_PROMPT = "Explain in three sentences how SSD, RAM and CPU caches form a memory hierarchy."


PREFETCH_STATES = f"off, on or depthN (N layers guessed ahead, 2..{MAX_PREFETCH_DEPTH})"


def is_prefetch_state(state: str) -> bool:
    """off, on, or depthN with N in 2..MAX_PREFETCH_DEPTH."""
    if state in PREFETCH:
        return True
    n = state.removeprefix("depth")
    return state.startswith("depth") and n.isdigit() and 2 <= int(n) <= MAX_PREFETCH_DEPTH


def prefetch_args(state: str) -> tuple[str, ...]:
    """The chat flags of a prefetch state (see the module docstring)."""
    if state == "off":
        return ("--prefetch-next", "0")
    if state.startswith("depth"):
        return ("--prefetch-depth", state.removeprefix("depth"))
    return ()


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
    # a device model file (sdq.paging.device_model): the "cold" runs read through it instead
    # (`sdq chat --device-model`: the file warm in the page cache, every expert read held until
    # the modelled device would finish it); "": this machine's device
    device_model: str = ""
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
    # pack (T4_pack): the pack to compare with the GGUF (sdq pack); "": the suite cannot run
    pack_path: str = ""
    pack_io_threads: int = 8
    pack_prefetch: str = "off"
    pack_split: int = 3  # the arm "pack splitN": each record cut into N chunks (1: no such arm)
    # depth (T4_depth): the deeper arm's layers guessed ahead, against the default's one
    prefetch_depth: int = 2
    # layer-miss (T3)
    layer_miss_misses: tuple[int, ...] = (1, 2, 4, 8)  # experts of the layer missing
    layer_miss_modes: tuple[str, ...] = ("serial", "parallel")
    layer_miss_io_threads: tuple[int, ...] = (8, 16, 24)
    layer_miss_repeat: int = 31  # the benchmark's own repetitions per run
    # fio beside every configuration (when fio is installed and cache_mode is direct)
    layer_miss_fio: bool = True
    # profile (T11)
    profile_io_modes: tuple[str, ...] = PROFILE_IO_MODES
    # memory (T9) and reserve (T10)
    limits: tuple[str, ...] = ("rlimit_data",)  # RAM limit methods of memory runs (each a row)
    reserve_limit: str = "rlimit_data"  # RAM limit method of reserve runs
    sizings: tuple[str, ...] = SIZINGS
    memory_ctx: int = 4096  # context of memory and reserve runs (the seed's)
    ubatches: tuple[int, ...] = (128, 256, 512)
    fit_ubatch: int = 128  # the seed's ubatch that ran: its reserve is scaled to this model here
    pair_ubatches: tuple[int, ...] = (128, 512)  # prefill A/B (ubatch_pairs)
    long_prompt_repeat: int = 24  # the memory suite's prompt: `prompt` this many times
    memory_n_predict: int = 4
    operating_fraction: float = 0.5  # T10: arena slots / all experts at the 900 MB analog
    # budgets: budget_steps budgets from the plan's minimum (+1 MiB) to the file's size, at
    # each reserve of budget_reserves, under budget_limit
    budget_steps: int = 8
    budget_n_predict: int = 8  # generated tokens per run of the budget sweep
    budget_reserves: tuple[float, ...] = (0.0, 10.0)
    budget_limit: str = "cgroup"

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
                item = type(default[0]) if default else int | float | str
                if item is float:
                    item = int | float
                if not all(isinstance(x, item) and not isinstance(x, bool) for x in v):
                    raise ParamsError(
                        f"experiment settings: {k} must be a list like {list(default)}, got {v!r}"
                    )
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
            (
                0 < self.operating_fraction <= 1,
                f"operating_fraction {self.operating_fraction}: in (0, 1]",
            ),
            (len(self.pair_ubatches) == 2, f"pair_ubatches {self.pair_ubatches}: two ubatches"),
            (self.repeat >= 1, f"repeat {self.repeat}: >= 1"),
            (0 <= self.budget_steps <= 200, f"budget_steps {self.budget_steps}: 0..200"),
            (
                all(0 <= r <= 1e6 for r in self.budget_reserves),
                f"budget_reserves {self.budget_reserves}: MB in 0..1e6",
            ),
            (self.budget_limit in METHODS, f"budget_limit {self.budget_limit!r}: {METHODS}"),
            (self.n_predict >= 2, f"n_predict {self.n_predict}: >= 2 (one decode step)"),
            (
                set(self.profile_io_modes) <= set(PROFILE_IO_MODES),
                f"profile_io_modes {self.profile_io_modes}",
            ),
            (
                all(map(is_prefetch_state, (*self.ab_prefetch, self.prefetch))),
                f"ab_prefetch {self.ab_prefetch}, prefetch {self.prefetch!r}: {PREFETCH_STATES}",
            ),
            (set(self.split_cache) <= set(PAGE_CACHE), f"split_cache {self.split_cache}"),
            (
                is_prefetch_state(self.pack_prefetch),
                f"pack_prefetch {self.pack_prefetch!r}: {PREFETCH_STATES}",
            ),
            (
                is_prefetch_state(f"depth{self.prefetch_depth}"),
                f"prefetch_depth {self.prefetch_depth}: 2..{MAX_PREFETCH_DEPTH}",
            ),
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
    """What a chat process is when it plans (its resident set and data segment then, runtime
    started: sdq.run.plan), and the model's fixed terms."""

    rss_bytes: int
    model_bytes: int
    n_experts: int  # routed experts in all layers (L x E)
    n_expert_used: int
    data_bytes: int = 0  # 0: not measured, taken as rss_bytes

    @property
    def process(self):
        """The figures as sdq.run.plan.ProcessSize, for plan_memory(rss_now=...)."""
        from sdq.run.plan import ProcessSize

        return ProcessSize(self.rss_bytes, self.data_bytes or self.rss_bytes)


def calibrate(model: str, s: Settings, cache_dir: Path, progress: bool = True) -> Calibration:
    """Runs a short chat twice and keeps the second's process figures when planning (resident
    set, data segment; cached per model and threads)."""
    from sdq import files as atomic
    from sdq.format.model import open_model

    m = open_model(model)
    table = m.require_experts()
    size = os.path.getsize(model)
    path = Path(cache_dir) / "calibration.json"
    tag = f"{Path(model).name}:{size}:t{s.threads}:v2"  # v2: resident and data segment
    cached = json.loads(path.read_text()) if path.exists() else {}
    if tag not in cached:
        if progress:
            print(f"calibrating: a short chat, twice, on {Path(model).name} ...", flush=True)
        cached[tag] = _calibration_run(model, s, m)
        atomic.write_json(path, cached)
    return Calibration(
        rss_bytes=int(cached[tag]["rss_bytes"]),
        model_bytes=size,
        n_experts=len(table.layers) * table.n_expert,
        n_expert_used=int(m.spec.n_expert_used),
        data_bytes=int(cached[tag]["data_bytes"]),
    )


def _calibration_run(model: str, s: Settings, m) -> dict:
    import subprocess
    import sys

    from sdq.run.workspace import workspace_bytes

    ws = sum(workspace_bytes(m.spec, s.ctx, s.ubatch, s.threads).values())
    # a budget that leaves ~600 MiB beyond the model's fixed terms, whatever the RSS: the
    # machine's RAM (chat refuses a budget above it), the reserve taking the rest
    fixed_mb = (m.dense_bytes + ws) / MIB
    budget = float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // MIB)
    reserve = budget - fixed_mb - 600
    cmd = [sys.executable, "-m", "sdq", *_chat_common(model, s, n_predict=2, ubatch=s.ubatch)]
    cmd += [f"--ram-budget-mb={budget}", f"--reserve-mb={reserve:.3f}"]
    figures = []
    for _ in range(2):  # the first may compile kernels not yet in Numba's cache: a larger process
        p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            last = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise ParamsError(f"calibration chat on {model} failed: {last}")
        plan = json.loads(p.stdout)["settings"]["plan"]
        figures.append((int(plan["rss_bytes"]), int(plan["data_bytes"])))
    rss, data = figures[-1]
    return {"rss_bytes": rss, "data_bytes": data}


def budget_mb(
    model_obj,
    cal: Calibration,
    s: Settings,
    slots: int,
    reserve_mb: float,
    io_threads: int,
    ctx: int | None = None,
    ubatch: int | None = None,
) -> float:
    """The budget (MiB) for which the plan of a chat process leaves `slots` slots."""
    from sdq.run.plan import plan_memory

    plan = plan_memory(
        model_obj,
        1e7,
        ctx or s.ctx,
        ubatch or s.ubatch,
        reserve_mb=reserve_mb,
        rss_now=cal.process,
        cache_mode=s.cache_mode,
        io_threads=io_threads,
        compute_threads=s.threads,
    )
    return (plan.budget_for_slots(slots) + plan.per_slot_bytes // 2) / MIB


@dataclass(frozen=True)
class Sizing:
    """The plan's terms at one ubatch for a calibrated process, in MiB (sdq.run.plan)."""

    kv_mb: float
    compute_mb: float
    transient_mb: float
    pager_mb: float
    rss_mb: float  # resident set when planning
    data_mb: float  # data segment when planning
    thread_mb: float  # stacks of the threads still to start
    process_mb: float  # what the plan counts for the process: max(rss, data + threads)
    per_slot_mb: float

    @classmethod
    def of(cls, plan) -> Sizing:
        return cls(
            kv_mb=plan.kv_bytes / MIB,
            compute_mb=plan.compute_bytes / MIB,
            transient_mb=plan.transient_bytes / MIB,
            pager_mb=plan.pager_bytes / MIB,
            rss_mb=plan.rss_bytes / MIB,
            data_mb=plan.data_bytes / MIB,
            thread_mb=plan.thread_bytes / MIB,
            process_mb=plan.process_bytes / MIB,
            per_slot_mb=plan.per_slot_bytes / MIB,
        )

    @property
    def left_out_mb(self) -> float:
        """What the seed's "budget - RSS now - reserve" does not count and the plan does."""
        return (
            self.kv_mb
            + self.compute_mb
            + self.transient_mb
            + self.pager_mb
            + self.process_mb
            - self.rss_mb
        )

    @property
    def data_fit_mb(self) -> float:
        """The reserve with which the seed's sizing keeps the data segment inside the budget
        (RLIMIT_DATA's count): what it leaves out there, less the resident pages (file
        mappings) that RSS counts and the data segment does not."""
        return (
            self.kv_mb
            + self.compute_mb
            + self.transient_mb
            + self.pager_mb
            + self.data_mb
            + self.thread_mb
            - self.rss_mb
        )


def target_slots(cal: Calibration, s: Settings) -> int:
    return max(round(s.arena_fraction * cal.n_experts), 2 * cal.n_expert_used)


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
        device = ()
        if s.device_model and cache == "cold":  # the emulated device's source: the page cache
            cache_mode, file_cache = "pagecache", "warm"
            device = ("--device-model", s.device_model)
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
            *prefetch_args(prefetch),
            *device,
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

    def pack(self) -> list[RunConfig]:
        """Three reads per expert (the GGUF, mode parallel) vs one (its pack) vs its records
        cut into pack_split chunks vs the pack with neighbouring records merged (mode merged),
        at pack_io_threads."""
        s = self.s
        if not s.pack_path:
            raise ParamsError("suite pack: set pack_path to a pack of the model (sdq pack)")
        from sdq.paging.pack import open_pack

        open_pack(self.m, s.pack_path)  # a pack of another model fails here, in one line
        n, pf, k = s.pack_io_threads, s.pack_prefetch, s.pack_split
        out = [
            self._io_config(
                "pack", f"gguf x{n}", "parallel", n, prefetch=pf, extra=("--pack", "none")
            )
        ]
        arms = [("pack", "parallel", 1), ("pack merged", "merged", 1)]
        if k > 1:
            arms.insert(1, (f"pack split{k}", "split", k))
        for label, mode, split in arms:
            c = self._io_config(
                "pack",
                f"{label} x{n}",
                mode,
                n,
                split=split,
                prefetch=pf,
                extra=("--pack", s.pack_path),
            )
            out.append(dataclasses.replace(c, pack=s.pack_path))
        return [
            dataclasses.replace(c, meta=(*c.meta, ("source", "gguf" if i == 0 else "pack")))
            for i, c in enumerate(out)
        ]

    def depth(self) -> list[RunConfig]:
        """Decode prefetch one layer ahead (on, the default) vs `prefetch_depth` layers ahead,
        parallel reads at ab_io_threads."""
        n = self.s.ab_io_threads
        return [
            self._io_config("depth", f"parallel x{n}", "parallel", n, prefetch=pf)
            for pf in ("on", f"depth{self.s.prefetch_depth}")
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
        if s.layer_miss_fio and s.cache_mode == "direct":
            from sdq.measure.fio import fio_binary

            if fio_binary() is not None:  # without fio the table has no fio column
                args += ("--fio",)
        # the benchmark drops (or warms) the experts' pages itself before every timed read
        return [RunConfig("layer-miss", "layer-miss", args, self.model, MemoryLimit(), "untouched")]

    # memory suites ------------------------------------------------------------------------

    def sizing(self, ubatch: int) -> Sizing:
        """What the plan counts at `ubatch` (memory_ctx, the calibrated process)."""
        from sdq.run.plan import plan_memory

        s = self.s
        plan = plan_memory(
            self.m,
            1e7,
            s.memory_ctx,
            ubatch,
            reserve_mb=0.0,
            rss_now=self.cal.process,
            cache_mode=s.cache_mode,
            io_threads=3 * s.threads,
            compute_threads=s.threads,
        )
        return Sizing.of(plan)

    def seed_reserve_mb(self, seed_mb: float) -> float:
        """The seed's reserve `seed_mb` (MB at its 8192 MB budget) scaled to this model: by what
        the seed's arithmetic leaves out here at `fit_ubatch` over what it left out there
        (SEED_LEFT_OUT_MB; module doc)."""
        return seed_mb * self.sizing(self.s.fit_ubatch).left_out_mb / SEED_LEFT_OUT_MB

    def t9_reserve_mb(self) -> float:
        """T9's reserve: the seed's 700 MB (its §5.1 runs' reserve), scaled."""
        return self.seed_reserve_mb(700.0)

    def memory_budget_mb(self) -> float:
        """T9's budget: the plan's sizing at T9's largest ubatch, with T9's reserve, leaves
        `arena_fraction` of the experts as slots (smaller ubatches leave more)."""
        s = self.s
        slots = target_slots(self.cal, s)
        largest = max([u for u in s.ubatches if u <= s.memory_ctx] or [s.fit_ubatch])
        return budget_mb(
            self.m,
            self.cal,
            s,
            slots,
            self.t9_reserve_mb(),
            3 * s.threads,
            s.memory_ctx,
            ubatch=largest,
        )

    def operating_slots(self) -> dict[int, int]:
        """T10's arms: the seed's reserve (700, 900, 1150 MB) -> this model's slots, 900 MB
        being `operating_fraction` of the experts."""
        s = self.s
        base = max(round(s.operating_fraction * self.cal.n_experts), self.cal.n_expert_used)
        mid = dict(SEED_RESERVE_SLOTS)[900]
        return {
            r: max(round(base * n / mid), self.cal.n_expert_used) for r, n in SEED_RESERVE_SLOTS
        }

    def reserve_budget_mb(self) -> float:
        """T10's budget: the plan at reserve 0 leaves the 700 MB arm's slots."""
        s = self.s
        slots = max(self.operating_slots().values())
        return budget_mb(self.m, self.cal, s, slots, 0.0, 3 * s.threads, s.memory_ctx)

    def _memory_config(
        self, suite, label, sizing, ubatch, reserve_mb, budget, n_predict, prompt, method, meta=()
    ):
        s = self.s
        terms = self.sizing(ubatch)
        common = _chat_common(self.model, s, n_predict=n_predict, ubatch=ubatch, prompt=prompt)
        common[common.index("-c") + 1] = str(s.memory_ctx)
        args = common + [
            f"--ram-budget-mb={budget:.3f}",
            f"--reserve-mb={reserve_mb:.3f}",
            "--cache-mode",
            s.cache_mode,
        ]
        if sizing == "seed":  # the seed's "budget - RSS now - reserve" (sdq.run.plan)
            args += ["--sizing", "seed"]
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
                ("compute_buffer_mb", terms.compute_mb),
                ("kv_cache_mb", terms.kv_mb),
                *meta,
            ),
        )

    def long_prompt(self) -> str:
        return " ".join([self.s.prompt] * self.s.long_prompt_repeat)

    def memory(self) -> list[RunConfig]:
        """T9: every sizing x ubatch under each limit, at T9's budget and reserve."""
        s = self.s
        budget, reserve = self.memory_budget_mb(), self.t9_reserve_mb()
        out = []
        for method in s.limits:
            for sizing in s.sizings:
                for ub in s.ubatches:
                    if ub <= s.memory_ctx:
                        out.append(self._t9_config("memory", sizing, ub, method, budget, reserve))
        return out

    def _t9_config(self, suite, sizing, ub, method, budget, reserve):
        s = self.s
        return self._memory_config(
            suite,
            f"{sizing} ub{ub} {method}",
            sizing,
            ub,
            reserve,
            budget,
            s.memory_n_predict,
            self.long_prompt(),
            method,
        )

    def memory_need(self) -> list[RunConfig]:
        """000 §5.1: the seed's sizing at T9's largest ubatch with no limit, so that the run
        finishes and its largest data segment is the whole of what RLIMIT_DATA refused (a
        cgroup could kill it on the way, counting resident pages only)."""
        budget, reserve = self.memory_budget_mb(), self.t9_reserve_mb()
        ub = max(u for u in self.s.ubatches if u <= self.s.memory_ctx)
        return [self._t9_config("memory", "seed", ub, "none", budget, reserve)]

    def ubatch_pairs(self) -> list[RunConfig]:
        """000 §5.1: prefill with the plan's sizing at two ubatches, T9's budget, first limit."""
        budget, reserve = self.memory_budget_mb(), self.t9_reserve_mb()
        method = self.s.limits[0] if self.s.limits else "none"
        return [
            self._t9_config("memory", "plan", ub, method, budget, reserve)
            for ub in self.s.pair_ubatches
        ]

    def arena_arms(self) -> list[RunConfig]:
        """T10's arms (000 §5.2, §6): the plan's sizing at T10's budget with the reserves that
        leave the seed's three slot counts, scaled (reserve 0 = the seed's 700 MB)."""
        s = self.s
        budget = self.reserve_budget_mb()
        per_slot = self.sizing(s.ubatch).per_slot_mb
        arms = self.operating_slots()
        most = max(arms.values())
        return [
            self._memory_config(
                "reserve",
                f"plan r{(most - n) * per_slot:.1f} ({seed_mb} MB)",
                "plan",
                s.ubatch,
                (most - n) * per_slot,
                budget,
                None,
                None,
                s.reserve_limit,
                (("seed_reserve_mb", seed_mb), ("target_slots", n)),
            )
            for seed_mb, n in arms.items()
        ]

    def seed_reserve_rows(self) -> list[RunConfig]:
        """000 §5.2's overshoot: the seed's sizing at its 700 and 900 MB reserves, scaled
        (`seed_reserve_mb`), at T10's budget under the reserve limit (the seed's RLIMIT_DATA)."""
        s = self.s
        budget = self.reserve_budget_mb()
        out = []
        for seed_mb in (700, 900):
            r = self.seed_reserve_mb(seed_mb)
            out.append(
                self._memory_config(
                    "reserve",
                    f"seed r{r:.1f} ({seed_mb} MB) {s.reserve_limit}",
                    "seed",
                    s.ubatch,
                    r,
                    budget,
                    None,
                    None,
                    s.reserve_limit,
                    (("seed_reserve_mb", seed_mb),),
                )
            )
        return out

    def budget_points(self, reserve_mb: float) -> list[float]:
        """The budgets (MiB) of the budget sweep at one reserve: `budget_steps` of them, evenly
        from the plan's minimum + 1 MiB (the smallest budget chat accepts) to the model file's
        size (when the file is smaller than the process: to the minimum plus a slot for every
        routed expert)."""
        from sdq.run.plan import plan_memory

        s = self.s
        plan = plan_memory(
            self.m,
            1e7,
            s.memory_ctx,
            s.ubatch,
            reserve_mb=reserve_mb,
            rss_now=self.cal.process,
            cache_mode=s.cache_mode,
            io_threads=3 * s.threads,
            compute_threads=s.threads,
        )
        low = plan.min_budget_bytes / MIB + 1.0
        high = self.cal.model_bytes / MIB
        if high <= low:  # a file smaller than the process: up to every expert in the arena
            high = low + self.cal.n_experts * plan.per_slot_bytes / MIB
        n = s.budget_steps
        if n <= 1 or high <= low:
            return [low] * min(n, 1)
        return [low + (high - low) * i / (n - 1) for i in range(n)]

    def budgets(self) -> list[RunConfig]:
        """The budget sweep: the plan's sizing at each budget of `budget_points`, each run
        capped at its budget by `budget_limit`, generating `n_predict` tokens."""
        s = self.s
        out = []
        for reserve in s.budget_reserves:
            for budget in self.budget_points(reserve):
                out.append(
                    self._memory_config(
                        "budgets",
                        f"budget {budget:.1f} r{reserve:g}",
                        "plan",
                        s.ubatch,
                        reserve,
                        budget,
                        s.budget_n_predict,
                        None,
                        s.budget_limit,
                    )
                )
        return out

    def reserve(self) -> list[RunConfig]:
        """T10: the three arms, then the seed's sizing at its 700 and 900 MB reserves, scaled."""
        return self.arena_arms() + self.seed_reserve_rows()
