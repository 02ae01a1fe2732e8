"""The flags that set a generation run, declared once for every command that starts one.

`sdq chat` takes them all; `sdq bench resident` and `sdq bench peers` take the ones they vary,
with their own defaults and, where a peer is compared, their own names (`--tokens`,
`--sdq-cache-mode`, ...). A flag's argparse destination is the `sdq.run.settings.RunSettings`
field it sets (the sampler's fields and `io_profile` besides), so that
`RunSettings.from_args(args)` reads the flags of any parser built here. The choices come from the
modules that implement them: I/O and page-cache modes from sdq.paging.reads, expert cache
policies from sdq.paging.cache.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Iterable, Mapping

from sdq.commands import finite_float
from sdq.errors import ParamsError
from sdq.paging.cache import POLICIES
from sdq.paging.reads import CACHE_MODES, MODES

# destination -> (option strings, argparse keywords); the defaults are `sdq chat`'s. A default
# of None means "not given": RunSettings' default then, or what --io-profile says.
RUN_FLAGS: dict[str, tuple[tuple[str, ...], dict]] = {
    "n_predict": (
        ("-n", "--n-predict"),
        {"type": int, "default": 64, "help": "tokens to generate"},
    ),
    "n_ctx": (
        ("-c", "--ctx-size"),
        {"type": int, "default": 4096, "help": "context length (KV cache)"},
    ),
    "threads": (
        ("-t", "--threads"),
        {"type": int, "default": os.cpu_count() or 1, "help": "threads"},
    ),
    "n_ubatch": (
        ("-b", "--ubatch"),
        {"type": int, "default": 128, "help": "prompt tokens per forward pass (ubatch)"},
    ),
    "temp": (
        ("--temp",),
        {"type": finite_float, "default": 0.8, "help": "temperature; 0 = greedy"},
    ),
    "top_k": (("--top-k",), {"type": int, "default": 40}),
    "top_p": (("--top-p",), {"type": finite_float, "default": 0.95}),
    "seed": (("--seed",), {"type": int, "default": 0}),
    "stop_at_eos": (("--ignore-eos",), {"action": "store_false", "help": "generate all -n tokens"}),
    "ram_budget_mb": (
        ("--ram-budget-mb",),
        {"type": finite_float, "help": "RAM the whole process may use (default: available)"},
    ),
    "reserve_mb": (
        ("--reserve-mb",),
        {"type": finite_float, "help": "RAM kept free inside the budget"},
    ),
    "sizing": (
        ("--sizing",),
        {
            "choices": ("plan", "seed"),
            "help": "how the expert arena is sized: plan (default) counts every buffer first; "
            "seed: seed 000's 'budget - RSS now - reserve', which does not count the KV cache "
            "and compute buffers (they may then pass the budget: for reproducing that)",
        },
    ),
    "max_slots": (
        ("--max-slots",),
        {"type": int, "help": "cap the expert arena at this many slots"},
    ),
    "io_threads": (
        ("--io-threads",),
        {"type": int, "help": "expert read threads (default 3 x threads)"},
    ),
    "io_mode": (
        ("--io-mode",),
        {"choices": MODES, "help": "how an expert is read (default parallel)"},
    ),
    "io_split": (
        ("--io-split",),
        {"type": int, "help": "pieces per segment (--io-mode split; default 1)"},
    ),
    "io_profile": (
        ("--io-profile",),
        {
            "help": "I/O settings saved by `sdq probe --profile-out` (explicit flags win); "
            "default: the saved profile of the model file's device, when there is one and no "
            "--io-threads/--io-split/--io-mode is given; none: no profile"
        },
    ),
    "cache_mode": (("--cache-mode",), {"choices": CACHE_MODES, "default": "pagecache"}),
    "cache_policy": (
        ("--cache-policy",),
        {
            "choices": POLICIES,
            "default": "auto",
            "help": "expert replacement: lrfu_bypass keeps frequently routed experts and streams "
            "the rest, layer_lrfu evicts from the layer visited farthest ahead; auto (default): "
            "lrfu_bypass when the arena holds fewer than one token's experts, else layer_lrfu",
        },
    ),
    "prefetch_next": (
        ("--prefetch-next",),
        {
            "type": int,
            "metavar": "N",
            "help": "decode: guess the next layer's experts with its router and start reading "
            "the N most probable (default: 3/4 of the experts a token uses; 0: off)",
        },
    ),
    "prefetch_depth": (
        ("--prefetch-depth",),
        {
            "type": int,
            "metavar": "N",
            "help": "decode: guess the experts of each of the next N layers (default 1: the "
            "next layer only); each guessed layer takes --prefetch-next slots of its own",
        },
    ),
    "pack": (
        ("--pack",),
        {
            "metavar": "PATH",
            "help": "read experts from this pack (sdq pack: one read per expert); default: "
            "MODEL.sdqpack beside the model when it is there and fits the model; none: the GGUF",
        },
    ),
    "resident": (
        ("--resident",),
        {"action": "store_true", "help": "copy every expert into RAM (no pager, no budget)"},
    ),
    "route_log": (("--route-log",), {"help": "write each token's experts per layer (JSON lines)"}),
    "device_model": (
        ("--device-model",),
        {
            "metavar": "PATH",
            "help": "replay every expert read against this device model (sdq device, "
            "data/devices/): bytes from the warmed page cache (--cache-mode pagecache), each "
            "read held until the modelled device would finish it; 'native': this machine's",
        },
    ),
    "verify": (
        ("--verify",),
        {
            "action": "store_true",
            "help": "check every expert read against a checksum of the file's bytes (xxh3, "
            "computed once per expert); a mismatch stops the run",
        },
    ),
}


def add_run_arguments(
    parser: argparse.ArgumentParser,
    names: Iterable[str] = tuple(RUN_FLAGS),
    *,
    defaults: Mapping[str, object] | None = None,
    flags: Mapping[str, tuple[str, ...]] | None = None,
    helps: Mapping[str, str] | None = None,
) -> None:
    """Add the run flags `names` (keys of RUN_FLAGS), in that order, to `parser`; `defaults`,
    `flags` and `helps` replace a flag's default, option strings or help for this command."""
    defaults, flags, helps = defaults or {}, flags or {}, helps or {}
    unknown = sorted({*names, *defaults, *flags, *helps} - set(RUN_FLAGS))
    if unknown:
        raise KeyError(f"not a run flag: {', '.join(unknown)} (see RUN_FLAGS)")
    for name in names:
        option_strings, keywords = RUN_FLAGS[name]
        kw = dict(keywords, dest=name)
        if name in defaults:
            kw["default"] = defaults[name]
        if name in helps:
            kw["help"] = helps[name]
        option_strings = flags.get(name, option_strings)
        if "action" not in kw and "choices" not in kw:  # help shows the flag's name, not dest
            kw.setdefault("metavar", option_strings[-1].lstrip("-").replace("-", "_").upper())
        parser.add_argument(*option_strings, **kw)


MAX_COUNT = 2**31 - 1  # a count that sizes an array fits an int32


def checked_settings(settings):
    """`settings` (a RunSettings) if every count is in range (ParamsError naming the flag if
    not), with the ubatch cut to the context: a ubatch never exceeds the context."""
    s = settings
    for flag, value in (
        ("-n", s.n_predict),
        ("-c", s.n_ctx),
        ("-t", s.threads),
        ("-b", s.n_ubatch),
        ("--io-split", s.io_split),
    ):
        _check_count(flag, value)
    for flag, value in (("--io-threads", s.io_threads), ("--max-slots", s.max_slots)):
        if value is not None:
            _check_count(flag, value)
    ram_mib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**20
    if s.ram_budget_mb is not None and s.ram_budget_mb > ram_mib:
        raise ParamsError(
            f"--ram-budget-mb {s.ram_budget_mb:g} is more than this machine's RAM ({ram_mib:.0f})"
        )
    if s.reserve_mb is not None and s.reserve_mb < 0:
        raise ParamsError(f"--reserve-mb {s.reserve_mb:g} must be >= 0")
    return dataclasses.replace(s, n_ubatch=min(s.n_ubatch, s.n_ctx))


def _check_count(flag: str, value: int) -> None:
    if value < 1:
        raise ParamsError(f"{flag} {value} must be >= 1")
    if value > MAX_COUNT:
        raise ParamsError(f"{flag} {value} must be <= {MAX_COUNT}")
