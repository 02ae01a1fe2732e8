"""What one generation run is set to (`RunSettings`), and the one way command-line flags become it.

`sdq chat`, `sdq bench resident` and `sdq bench peers` declare their run flags through
`sdq.commands.run_flags.add_run_arguments`, whose argparse destinations are the names of this
class's fields (and of `SamplerSettings`' fields, and `io_profile`), so `RunSettings.from_args`
reads the parsed flags of any of them. A flag a command does not declare keeps the default below.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from sdq.run.sampler import SamplerSettings

SAMPLER_FIELDS = tuple(f.name for f in dataclasses.fields(SamplerSettings))
MAX_PREFETCH_DEPTH = 4  # layers a decode step may guess ahead (--prefetch-depth)


@dataclass(frozen=True)
class RunSettings:
    model: str
    n_ctx: int = 4096
    n_ubatch: int = 128
    threads: int = 2
    n_predict: int = 64
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    stop_at_eos: bool = True
    resident: bool = False  # every expert copied into RAM; no plan, no pager
    ram_budget_mb: float | None = None  # MiB; None: memory available now
    reserve_mb: float | None = None  # MiB; None: the plan's default
    # sdq.run.plan.SIZINGS: "plan" counts every buffer first; "seed" is seed 000's "budget -
    # RSS now - reserve" (notebook 04 reproduces what it did)
    sizing: str = "plan"
    max_slots: int | None = None  # cap the arena below what the budget allows
    io_threads: int | None = None  # None: 3 x threads
    io_mode: str = "parallel"  # sdq.paging.reads.MODES
    io_split: int = 1
    cache_mode: str = "pagecache"  # sdq.paging.reads.CACHE_MODES (the OS page cache)
    cache_policy: str = "auto"  # sdq.paging.cache.POLICIES
    # decode: read this many guessed experts of the next layer early; None: 3/4 of the K a
    # token uses (paged runs only)
    prefetch_next: int | None = None
    prefetch_depth: int = 1  # decode: guess and read ahead that many layers (1: the next one)
    route_log: str | None = None
    verify: bool = False  # every expert read checked against a checksum (sdq.paging.checksums)
    # a device model file (sdq.paging.device_model) every expert read is replayed against,
    # the bytes coming from the warmed page cache; None, "" or "native": this machine's device
    device_model: str | None = None
    io_profile: str | None = None  # the I/O profile whose settings were applied (its path)
    # the pack experts are read from (sdq.paging.pack): None or "auto": the one beside the
    # model when valid; "none": the GGUF; else a path
    pack: str | None = None

    @classmethod
    def from_args(cls, args, **overrides) -> RunSettings:
        """Settings from parsed flags, then `overrides` (field=value) on top.

        A field is taken from the flag whose destination is its name, when the parser has that
        flag and it was given a value (None means not given: the field's default); the sampler
        from `temp`, `top_k`, `top_p`, `seed` likewise. An I/O profile (`sdq probe
        --profile-out`) fills `io_threads` and `io_split` where no flag gave them, and sets
        `io_mode` to split when its split is > 1 and no flag gave a mode: explicit flags win.
        Which profile (`profile_path`): the parser's `--io-profile PATH`; `--io-profile none`:
        none; not given: the saved profile of the model file's device, when one exists and no
        I/O flag (`--io-threads`, `--io-split`, `--io-mode`) was given. `io_profile` records
        the path applied.
        """
        given = {k: v for k, v in vars(args).items() if v is not None}
        kw = {f.name: given[f.name] for f in dataclasses.fields(cls) if f.name in given}
        sampler = {k: given[k] for k in SAMPLER_FIELDS if k in given}
        if sampler:
            kw["sampler"] = SamplerSettings(**sampler)
        kw.pop("io_profile", None)
        path = profile_path(args, kw)
        if path is not None:
            from sdq.paging.io_profile import load_io_profile

            profile = load_io_profile(path)
            kw.setdefault("io_threads", profile.io_threads)
            kw.setdefault("io_split", profile.io_split)
            if "io_mode" not in kw and kw["io_split"] > 1:
                kw["io_mode"] = "split"
            kw["io_profile"] = str(path)
        kw.update(overrides)
        return cls(**kw)


IO_FLAGS = ("io_threads", "io_split", "io_mode")  # any of them given: no saved profile


def profile_path(args, given: dict) -> str | None:
    """The I/O profile a run takes (see `RunSettings.from_args`): a path, or None.

    `args` are the parsed flags; `given` the settings fields the flags gave. Only a parser that
    declares `--io-profile` (sdq chat) takes a profile; a resident run reads no experts.
    """
    if not hasattr(args, "io_profile") or given.get("resident"):
        return None
    flag = args.io_profile
    if flag is not None:
        return None if str(flag).strip().lower() == "none" else str(flag)
    if any(name in given for name in IO_FLAGS) or not given.get("model"):
        return None
    from sdq.paging.io_profile import find_profile

    found = find_profile(given["model"])
    return None if found is None else str(found)
