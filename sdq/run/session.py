"""Everything one generation run holds, set up in the order the memory plan demands.

    model header -> tokenizer -> memory plan (dense + KV + compute buffers + reserve -> slots)
    -> workspace (KV cache, ubatch buffers) -> dense weights -> expert arena -> engine

The arena is created last, with the slots the plan left after counting every other buffer,
so no buffer grows after the arena is sized (the seed's §5.1 crash).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import asdict

from sdq.errors import ParamsError
from sdq.run.settings import MAX_PREFETCH_DEPTH, RunSettings
from sdq.units import MIB


@dataclasses.dataclass
class PagedSetup:
    """What a paged run decided before allocating anything: the plan and the pager's settings."""

    plan: object  # sdq.run.plan.MemoryPlan
    cache: object  # sdq.paging.cache.CacheSettings
    io: object  # sdq.paging.reads.IOSettings
    prefetch_next: int  # experts guessed per layer in decode
    prefetch_depth: int  # layers guessed ahead in decode


def open_for_run(settings: RunSettings):
    """(model, tokenizer): the model file opened and checked, the compute threads set and the
    tokenizer built: everything a run holds before the memory plan measures the process."""
    from sdq.format.model import open_model
    from sdq.format.tokenizer import Tokenizer

    s = settings
    if s.prefetch_next is not None and s.prefetch_next < 0:
        raise ParamsError(f"--prefetch-next {s.prefetch_next}: expected >= 0 experts")
    if not 1 <= s.prefetch_depth <= MAX_PREFETCH_DEPTH:
        raise ParamsError(
            f"--prefetch-depth {s.prefetch_depth}: expected 1..{MAX_PREFETCH_DEPTH} layers"
        )
    model = open_model(s.model)
    model.require_experts()
    model.require_compute()
    if not s.resident:
        from sdq.paging.pack import find_pack

        model.pack = find_pack(model, s.pack, warn=_note)
    _set_threads(s.threads)
    tokenizer = Tokenizer.from_metadata(model.metadata, source=str(model.path))
    return model, tokenizer


def plan_paged(model, settings: RunSettings) -> PagedSetup:
    """The memory plan of a paged run, made exactly as `Session` makes it (`sdq plan` calls this
    after `open_for_run`, so a budget it accepts is one `sdq chat` accepts)."""
    import psutil

    from sdq.paging import device_model
    from sdq.paging.cache import CacheSettings
    from sdq.paging.prefetch import prefetch_width
    from sdq.paging.reads import IOSettings
    from sdq.run.plan import plan_memory

    s = settings
    budget = s.ram_budget_mb
    if budget is None:
        budget = psutil.virtual_memory().available / MIB
    io_threads = s.io_threads or 3 * s.threads
    kw = {} if s.reserve_mb is None else {"reserve_mb": s.reserve_mb}
    prefetch = prefetch_width(model.spec.n_expert_used, s.prefetch_next)
    depth = min(s.prefetch_depth, max(len(model.experts.layers) - 1, 1))  # layers there are
    # every guessed layer's prefetches wait in slots of their own until their layer runs
    cache = CacheSettings(policy=s.cache_policy, prefetch_slots=prefetch * depth)
    plan = plan_memory(
        model,
        budget,
        s.n_ctx,
        s.n_ubatch,
        cache_mode=s.cache_mode,
        io_threads=io_threads,
        compute_threads=s.threads,
        cache=cache,
        sizing=s.sizing,
        **kw,
    )
    if s.max_slots is not None and plan.slots > s.max_slots:
        plan = dataclasses.replace(plan, slots=s.max_slots)
    io = IOSettings(
        threads=io_threads,
        mode=s.io_mode,
        split=s.io_split,
        cache_mode=s.cache_mode,
        verify=s.verify,
        device=device_model.resolve(s.device_model),
    )
    return PagedSetup(plan, cache, io, prefetch, depth if prefetch else 1)


def check_resident_fits(model, s: RunSettings) -> None:
    """A resident run has no budget, but it still counts what it will allocate (dense weights,
    every routed expert, the KV cache and compute buffers) against the memory this machine has
    available now, and refuses in one line before allocating what cannot fit."""
    import psutil

    from sdq.errors import PlanError
    from sdq.run.workspace import workspace_bytes

    ws = sum(workspace_bytes(model.spec, s.n_ctx, s.n_ubatch, s.threads).values())
    need = model.dense_bytes + model.routed_bytes + ws
    available = psutil.virtual_memory().available
    if need > available:
        raise PlanError(
            f"--resident needs {need / MIB:.1f} MB (dense {model.dense_bytes / MIB:.1f}, experts "
            f"{model.routed_bytes / MIB:.1f}, KV cache and compute {ws / MIB:.1f} at -c "
            f"{s.n_ctx} -b {s.n_ubatch}) but {available / MIB:.1f} MB are available"
        )


class Session:
    def __init__(self, settings: RunSettings):
        from sdq.run.engine import ResidentExperts
        from sdq.run.engines import load_weights, make_engine
        from sdq.run.workspace import Workspace

        s = self.settings = settings
        model, tokenizer = open_for_run(s)
        self.model, self.tokenizer = model, tokenizer
        self.plan = None
        self.route_log = None
        self.prefetch_next, self.prefetch_depth = 0, 1
        if s.resident:
            check_resident_fits(model, s)
            ws = Workspace.allocate(model.spec, s.n_ctx, s.n_ubatch, s.threads)
            weights = load_weights(model)
            experts = ResidentExperts(model)
        else:
            from sdq.paging.cache import ExpertCache
            from sdq.run.jit_warm import ensure_warm

            # a cold kernel cache would compile after the plan measured the process
            ensure_warm(model, s.threads, note=_note)
            setup = plan_paged(model, s)
            self.plan, self.prefetch_next = setup.plan, setup.prefetch_next
            self.prefetch_depth = setup.prefetch_depth
            ws = Workspace.allocate(model.spec, s.n_ctx, s.n_ubatch, s.threads)
            weights = load_weights(model)
            experts = ExpertCache(model, self.plan, io=setup.io, settings=setup.cache)
        self.experts = experts
        self.workspace_grown = dict(ws.grown)  # bytes the data segment grew, KV and compute
        self.engine = make_engine(model, experts, ws, s.n_ctx, s.n_ubatch, weights=weights)
        self.engine.prefetch_next = self.prefetch_next
        self.engine.prefetch_depth = self.prefetch_depth
        if s.route_log:
            from sdq.paging.route_log import RouteLog

            self.route_log = RouteLog(s.route_log)
            self.engine.route_log = self.route_log

    def generate(self, prompt_ids, on_text=None):
        from sdq.run.generate import GenerateSettings, generate

        gs = GenerateSettings(
            n_predict=self.settings.n_predict,
            sampler=self.settings.sampler,
            stop_at_eos=self.settings.stop_at_eos,
        )
        return generate(self.engine, self.tokenizer, prompt_ids, gs, on_text=on_text)

    def figures(self, g) -> dict:
        fig = dict(g.figures)
        plan = self.plan
        fig["slots"] = getattr(plan, "slots", None) if plan is not None else None
        fig["slot_bytes"] = getattr(plan, "slot_bytes", None) if plan is not None else None
        fig["cache_mode"] = "resident" if self.settings.resident else self.settings.cache_mode
        reader = getattr(self.experts, "reader", None)
        device = getattr(getattr(reader, "io", None), "device", None)
        fig["device"] = "native" if device is None else device.label
        if device is not None:  # reads run, and those whose bytes came after their emulated end
            fig["emulated_reads"], fig["late_reads"] = reader.emulated()[:2]
        fig["prefetch_next"] = self.prefetch_next
        fig["prefetch_depth"] = self.prefetch_depth
        pack = getattr(self.model, "pack", None)
        fig["expert_file"] = "gguf" if pack is None else "pack"
        fig["io_mode"] = self.settings.io_mode
        fig["expert_cache"] = dict(getattr(self.experts, "stats", {}) or {})
        # measured: how far allocating the KV cache and the ubatch compute buffers grew the
        # data segment (sdq.run.workspace.Workspace.grown), MiB; None without /proc
        grown = getattr(self, "workspace_grown", {})
        for name in ("kv", "compute"):
            fig[f"{name}_data_mb"] = grown[name] / MIB if name in grown else None
        return fig

    def settings_dict(self) -> dict:
        d = asdict(self.settings)
        d["sampler"] = asdict(self.settings.sampler)
        if self.plan is not None:
            d["plan"] = self.plan.to_dict()
        return d

    def close(self, completed: bool = True) -> None:
        """Release the run; the route log is kept only if the run `completed`. A paged run that
        completed a decode step has its kernels cached: their stamp is written
        (sdq.run.jit_warm)."""
        if completed and self.plan is not None and self.engine.phase == "decode":
            from sdq.run.jit_warm import mark_warm

            mark_warm(self.model, self.settings.threads)
        if self.route_log is not None:
            self.route_log.close(keep=completed)
            self.route_log = None
        with contextlib.suppress(AttributeError):
            self.experts.close()
        self.engine.close()


def _note(message: str) -> None:
    import sys

    print(f"sdq: {message}", file=sys.stderr)


def _set_threads(n: int) -> None:
    import numba

    if n < 1:
        raise ParamsError(f"-t {n} must be >= 1")
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
