"""`sdq bench peers MODEL --ram-cap-mb MB --tokens N --repeat R`: sdq vs llama.cpp (T12).

Resident (everything in RAM, warm page cache) and under each memory cap (a cgroup v1 memory
limit that charges the page cache too, cold cache): sdq with its expert arena, llama.cpp with
its default mmap, and llama.cpp with `lazy_mode` on. Each run is a fresh child process; the
systems' order rotates per repeat; medians of the repeats. How each figure is taken is in
sdq.measure.peers.
"""

from __future__ import annotations

import argparse
import json
import sys

from sdq.commands import finite_float
from sdq.commands.run_flags import add_run_arguments, checked_settings
from sdq.measure.resident import DEFAULT_PROMPT


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="GGUF model file")
    p.add_argument(
        "--ram-cap-mb",
        required=True,
        help="memory cap in MB (10**6 bytes); a comma list runs each cap",
    )
    p.add_argument("--repeat", type=int, default=3, help="runs per system and condition")
    p.add_argument("-p", "--prompt", default=DEFAULT_PROMPT)
    add_run_arguments(
        p,
        (
            "n_predict",
            "threads",
            "n_ctx",
            "n_ubatch",
            "reserve_mb",
            "cache_mode",
            "cache_policy",
            "prefetch_next",
            "io_threads",
        ),
        defaults={
            "n_predict": 16,
            "threads": 2,
            "n_ctx": 512,
            "reserve_mb": 100.0,
            "cache_mode": "direct",
        },
        flags={
            "n_predict": ("--tokens",),
            "cache_mode": ("--sdq-cache-mode",),
            "cache_policy": ("--sdq-cache-policy",),
            "prefetch_next": ("--sdq-prefetch-next",),
        },
        helps={
            "n_predict": "tokens to generate per run",
            "reserve_mb": "sdq's head room (MiB)",
            "cache_mode": "how sdq's pager reads experts (sdq chat --cache-mode)",
            "cache_policy": "sdq's expert replacement policy (sdq chat --cache-policy)",
            "prefetch_next": "sdq reads the N most probable guessed experts of the next layer "
            "early (sdq chat --prefetch-next; default: sdq's, 3K/4)",
            "io_threads": "sdq's expert read threads",
        },
    )
    p.add_argument(
        "--systems",
        default="sdq,llama-mmap,llama-lazy",
        help="capped systems to run (comma list of sdq, llama-mmap, llama-lazy, "
        "llama-mmap-norepack)",
    )
    p.add_argument("--no-resident", action="store_true", help="skip the resident comparison")
    p.add_argument(  # not the run flag --io-profile: sdq's own I/O settings stay as given
        "--io-profile",
        dest="bandwidth_profile",
        metavar="IO_PROFILE",
        help="a device probe's I/O profile (JSON): bandwidth for the I/O ceiling",
    )
    p.add_argument(
        "--omp-wait-policy",
        choices=("PASSIVE", "ACTIVE"),
        default="PASSIVE",
        help="OpenMP idle workers of both engines: block (PASSIVE, sdq's default) or spin",
    )
    p.add_argument("--timeout-s", type=finite_float, default=900.0, help="limit per child run")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    from sdq.errors import ParamsError
    from sdq.measure.llama_ref import require_llama_cpp
    from sdq.measure.peers import PeerSettings, probe_bandwidth, run_peers
    from sdq.run.settings import RunSettings

    require_llama_cpp("sdq bench peers")
    caps = _caps(args.ram_cap_mb)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if args.repeat < 1:
        raise ParamsError(f"--repeat {args.repeat} must be >= 1")
    settings = PeerSettings.from_run(
        checked_settings(RunSettings.from_args(args)),
        args.prompt,
        omp_wait_policy=args.omp_wait_policy,
        timeout_s=args.timeout_s,
    )
    bandwidth = probe_bandwidth(args.bandwidth_profile) if args.bandwidth_profile else None
    progress = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    res = run_peers(
        settings,
        caps,
        args.repeat,
        resident=not args.no_resident,
        capped_systems=systems,
        bandwidth=bandwidth,
        progress=progress,
    )
    if args.json:
        print(json.dumps(res.to_dict()))
    else:
        print(format_result(res))
    return 0


def _caps(text: str) -> list[float]:
    from sdq.errors import ParamsError

    try:
        caps = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ParamsError(f"--ram-cap-mb {text!r}: expected MB numbers, comma separated") from None
    if not caps or any(not c > 0 for c in caps):
        raise ParamsError(f"--ram-cap-mb {text!r}: every cap must be > 0 MB")
    return caps


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def format_result(res) -> str:
    s = res.settings
    lines = [
        f"{s['model']}: prompt {len(s['prompt_ids'])} tokens, {s['tokens']} generated, "
        f"-t {s['threads']}, OMP_WAIT_POLICY={s['omp_wait_policy']}, median of runs per row; "
        f"caps by {res.limit_method} ({res.limit_note}); {res.provenance['llama_settings']}",
        f"{'condition':22s} {'system':11s} {'decode tok/s':>12s} {'prefill tok/s':>13s} "
        f"{'dev MB/tok':>10s} {'peak RSS MiB':>12s} {'cgroup MB':>9s} {'ceiling':>8s} "
        f"{'bound':>14s}  status",
    ]
    for r in res.summary():
        cond = "resident (warm)" if r["mode"] == "resident" else f"cap {r['cap_mb']:.0f} MB cold"
        lines.append(
            f"{cond:22s} {r['system']:11s} {_f(r.get('decode_tok_s'), '12.2f')} "
            f"{_f(r.get('prefill_tok_s'), '13.1f')} {_f(r.get('device_mb_per_token'), '10.1f')} "
            f"{_f(r.get('peak_rss_mb'), '12.0f')} {_f(r.get('cgroup_peak_mb'), '9.0f')} "
            f"{_f(r.get('io_ceiling_tok_s'), '8.2f')} {_bound(r):>14s}  "
            f"{r['status']} ({r['ok_runs']}/{r['runs']})"
        )
    lines.append("ratios (sdq / other)")
    for q in res.ratios():
        cond = "resident" if q["mode"] == "resident" else f"cap {q['cap_mb']:.0f} MB"
        lines.append(
            f"  {cond:14s} vs {q['vs']:11s} decode {_f(q['decode_ratio'], '.3f')}"
            f"  prefill {_f(q['prefill_ratio'], '.3f')}  device bytes {_f(q['read_ratio'], '.3f')}"
        )
    if res.bandwidth_note:
        lines.append(f"I/O ceiling: {res.bandwidth_note}")
    lines.append(
        "bound: the lower of the I/O ceiling and sdq's resident decode speed (compute), "
        "when the resident comparison ran"
    )
    return "\n".join(lines)


def _bound(r: dict) -> str:
    if r.get("bound_tok_s") is None:
        return "-"
    return f"{r['bound_tok_s']:.2f} ({r['bound_by']})"
