"""`sdq probe`: read latency and bandwidth of the storage device vs concurrency and chunking."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict
from pathlib import Path

from sdq.commands import finite_float
from sdq.errors import ParamsError
from sdq.units import GIB, KIB, MIB

_SUFFIX = {"k": KIB, "m": MIB, "g": GIB}
SAVED = Path("<saved profile of the device>")  # --profile-out without a PATH
DEFAULT_FIO_SECONDS = 0.5


def parse_bytes(text: str) -> int:
    """'1900544', '4k', '64M', '1G' (binary multiples) -> bytes."""
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    scale = _SUFFIX.get(t[-1:], 1)
    if scale != 1:
        t = t[:-1]
    try:
        value = float(t) * scale
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a byte count like 1900544 or 4k, got {text!r}")
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of bytes")
    return int(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--file", type=Path, help="read this file (default: a scratch file)")
    src.add_argument(
        "--model", type=Path, help="read this GGUF model; --size defaults to its expert segment"
    )
    parser.add_argument(
        "--size",
        type=parse_bytes,
        help="bytes per read (default: the model's largest expert segment, else 1900544 = 1.9 MB)",
    )
    parser.add_argument(
        "--threads", default="1,2,4,6,8,12,16", help="concurrency levels (1,2,4,6,8,12,16)"
    )
    parser.add_argument(
        "--reads",
        type=int,
        default=64,
        help="reads per level, rounded up to a multiple of its thread count (default 64)",
    )
    parser.add_argument(
        "--cache-mode",
        default="direct",
        help="direct (O_DIRECT, default) or dontneed (posix_fadvise DONTNEED after each read)",
    )
    parser.add_argument("--split", default="1,2,4,8", help="chunks per segment (1,2,4,8)")
    parser.add_argument(
        "--split-threads",
        type=int,
        help="I/O threads for the chunking sweep (default: the recommended thread count)",
    )
    parser.add_argument(
        "--split-batch",
        type=int,
        help="segments submitted together in the chunking sweep "
        "(default: the model's experts-used x 3, else 24); batch 1 is always measured too",
    )
    parser.add_argument("--repeat", type=int, default=1, help="repeat each cell; medians")
    parser.add_argument(
        "--scratch-dir", type=Path, default=Path("."), help="where the scratch file goes (.)"
    )
    parser.add_argument(
        "--scratch-size", type=parse_bytes, default=GIB, help="scratch file size (1G)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random offsets")
    parser.add_argument(
        "--fio",
        action="store_true",
        help="also run each concurrency level with fio (same pattern, interleaved) when "
        "installed, into huge-page buffers where they can be reserved",
    )
    parser.add_argument(
        "--fio-seconds",
        type=finite_float,
        default=DEFAULT_FIO_SECONDS,
        help=f"length of each fio run (default {DEFAULT_FIO_SECONDS}; fio times runs in whole ms); "
        "0: the same number of reads as sdq",
    )
    parser.add_argument(
        "--engine",
        action="store_true",
        help="also time the pager's own expert reads of --model (O_DIRECT, into a K-slot arena) "
        "at each --threads level, beside the same reads into one slot and (with --fio) fio, and "
        "in mode split for each --split; the recommendation then comes from these reads",
    )
    parser.add_argument(
        "--engine-layers", type=int, default=9, help="decode layers per engine run (default 9)"
    )
    parser.add_argument(
        "--device-model",
        type=Path,
        metavar="PATH",
        help="replay the reads against this device model (sdq device, data/devices/): bytes "
        "from the page cache, each read held until the modelled device would finish it; "
        "everything is labelled 'emulated: NAME'",
    )
    parser.add_argument(
        "--fit-out",
        type=Path,
        metavar="PATH",
        help="fit a device model to the measured levels and 4 KiB reads and write it to PATH",
    )
    parser.add_argument("--json", action="store_true", help="print the full result as JSON")
    parser.add_argument(
        "--profile-out",
        nargs="?",
        const=SAVED,
        type=Path,
        metavar="PATH",
        help="write the I/O profile to PATH; without PATH, to the saved profile of the probed "
        "file's device, which `sdq chat` then uses by default for models on that device",
    )


def profile_destination(args, settings) -> Path | None:
    """Where the profile goes: --profile-out PATH, or the saved profile of the device holding
    the probed file (the scratch directory for a scratch file); None without --profile-out."""
    if args.profile_out is None:
        return None
    if args.profile_out != SAVED:
        _check_out_dir(args.profile_out)
        return args.profile_out
    from sdq.paging.io_profile import default_profile_path

    probed = settings.path if settings.path is not None else settings.scratch_dir
    try:
        path = default_profile_path(probed)
    except OSError as exc:
        raise ParamsError(f"--profile-out: cannot locate {probed}: {exc.strerror}") from None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ParamsError(f"--profile-out: cannot create {path.parent}: {exc.strerror}") from None
    return path


def _check_out_dir(path: Path, flag: str = "--profile-out") -> None:
    parent = path.resolve().parent
    if not parent.is_dir():
        raise ParamsError(f"{flag} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ParamsError(f"{flag} {path}: directory {parent} is not writable")


def settings_from_args(args):
    from sdq.measure.probe import ProbeSettings, parse_int_list, settings_for_model

    fields = dict(
        threads=parse_int_list(args.threads, "--threads"),
        reads=args.reads,
        cache_mode=args.cache_mode,
        splits=parse_int_list(args.split, "--split"),
        split_threads=args.split_threads,
        repeat=args.repeat,
        scratch_dir=args.scratch_dir,
        scratch_bytes=args.scratch_size,
        seed=args.seed,
        fio=args.fio,
        fio_seconds=args.fio_seconds,
    )
    if args.device_model is not None:
        if args.cache_mode not in ("direct", "pagecache"):  # direct: the default
            raise ParamsError(
                "--device-model reads from the page cache: --cache-mode does not apply"
            )
        fields.update(device_model=args.device_model, cache_mode="pagecache")
    if args.size is not None:
        fields.update(size=args.size, size_source="--size")
    if args.split_batch is not None:
        fields["split_batch"] = args.split_batch
    if args.model is not None:
        if not args.model.is_file():
            raise ParamsError(f"--model {args.model}: no such file")
        settings = settings_for_model(args.model, **fields)
    else:
        settings = ProbeSettings(path=args.file, **fields)
    settings.validate()
    return settings


def format_report(result, rec) -> str:
    from sdq.measure.probe import percentile

    s = result.settings
    src = "scratch file (removed)" if result.scratch else s["path"]
    lines = [
        f"file: {src}; {result.storage_label}",
        *(
            [f"{result.emulated}: every read held until the modelled device would finish it"]
            if result.emulated
            else []
        ),
        f"cache mode: {result.cache_mode}; reads issued by {result.reader}, "
        f"{result.arena_huge_share:.0%} of it on huge pages",
        f"read size: {s['size']} B ({s['size_source']}); {s['reads']} reads per level, "
        f"repeat {s['repeat']}; MB = 10^6 B",
        "",
        f"{'threads':>7} {'size B':>9} {'median ms':>10} {'mean ms':>9} {'p90 ms':>8} "
        f"{'MB/s':>8} {'IOPS':>8}",
    ]
    for r in result.levels + result.small:
        lines.append(
            f"{r.threads:>7} {r.size:>9} {r.median_ms:>10.3f} {r.mean_ms:>9.3f} {r.p90_ms:>8.3f} "
            f"{r.mb_s:>8.0f} {r.iops:>8.0f}"
        )
    if result.fio:
        runtime = percentile([f["runtime_ms"] for f in result.fio], 50)
        lines += [
            "",
            f"fio, same pattern, interleaved with the rows above ({result.fio_note}; "
            f"sdq/fio = ratio of the median MB/s, {result.cache_mode}); buffers: "
            f"{result.fio_memory}; runs of {runtime:.0f} ms (median):",
            f"{'threads':>7} {'size B':>9} {'median ms':>10} {'mean ms':>9} {'p90 ms':>8} "
            f"{'MB/s':>8} {'IOPS':>8} {'sdq/fio':>8}",
        ]
        for f in result.fio:
            lines.append(
                f"{f['threads']:>7} {f['size']:>9} {f['median_ms']:>10.3f} {f['mean_ms']:>9.3f} "
                f"{f['p90_ms']:>8.3f} {f['mb_s']:>8.0f} {f['iops']:>8.0f} "
                f"{f['sdq_over_fio']:>8.2f}"
            )
        lines.append(f"  e.g. {result.fio[-1]['command']}")
    elif result.fio_note:
        lines += ["", f"fio: {result.fio_note}"]
    lines += [
        "",
        f"chunking at {result.split_threads} I/O threads (segment latency: batch submit to "
        "its last chunk)",
        f"{'batch':>7} {'split':>5} {'median ms':>10} {'mean ms':>9} {'p90 ms':>8} {'MB/s':>8}",
    ]
    for r in result.split:
        lines.append(
            f"{r.batch:>7} {r.split:>5} {r.median_ms:>10.3f} {r.mean_ms:>9.3f} {r.p90_ms:>8.3f} "
            f"{r.mb_s:>8.0f}"
        )
    cached = max(r.cached for r in result.levels + result.small + result.split)
    if result.emulated:
        e = result.emulation
        verdict = (
            f" (the emulation's source, {e['source_mb_s']:.0f} MB/s one stream; "
            f"{e['late_reads']} of {e['reads']} reads arrived after their emulated end, the "
            f"others ended {e['mean_lag_us']:.0f} µs after it on average)"
        )
    elif result.cache_mode == "direct":
        verdict = " (O_DIRECT reads bypass it)"
    elif cached < 0.01:
        verdict = ""
    else:
        verdict = " -- WARNING: part of these figures is memory, not device"
    lines += [
        "",
        f"page cache before the reads: up to {100 * cached:.1f}% of the pages to read were cached"
        + verdict,
        f"recommendation: io_threads={rec.io_threads} io_split={rec.io_split} ({rec.why})",
        f"took {result.seconds:.1f} s; {result.conditions()} (a busy machine inflates latency)",
    ]
    return "\n".join(lines)


def format_engine(eng) -> str:
    lines = [
        "",
        f"the pager's own expert reads (direct): {eng.layers} layers per run, K = {eng.k} "
        f"experts of a random layer each ({eng.reads_per_layer} segment reads at once), "
        f"medians of {eng.repeat} runs; read lengths {eng.bssplit}",
        f"{'threads':>7} {'engine MB/s':>11} {'4 KiB pages':>11} {'one slot':>9} {'fio':>7} "
        f"{'fio 4K pg':>9} {'eng/fio':>8} {'one/fio':>8} {'eng read ms':>11} {'4K read ms':>10}",
    ]
    for c in eng.cells:
        lines.append(
            f"{c.threads:>7} {c.arena_mb_s:>11.0f} {c.small_pages_mb_s:>11.0f} "
            f"{c.one_slot_mb_s:>9.0f} {c.fio_mb_s:>7.0f} {c.fio_small_pages_mb_s:>9.0f} "
            f"{c.arena_over_fio:>8.2f} {c.one_slot_over_fio:>8.2f} {c.arena_read_ms:>11.3f} "
            f"{c.small_pages_read_ms:>10.3f}"
        )
    lines.append(
        "  engine: ExpertReader into a pre-faulted arena of K slots "
        f"({eng.huge_share:.0%} of it on huge pages); 4 KiB pages: the same into an arena kept "
        "on 4 KiB pages; one slot: the same reads, every expert into one slot"
    )
    if eng.fio_memory:
        run = f"{eng.fio_seconds:g} s" if eng.fio_seconds else "as many reads as one engine run"
        lines.append(f"  fio's buffers: {eng.fio_memory}; each fio run: {run}")
    if eng.fio_note:
        lines.append(f"  {eng.fio_note}")
    if eng.splits:
        lines += [
            f"  mode split at {eng.splits[0].threads} threads (split 1 = mode parallel):",
            f"  {'split':>5} {'MB/s':>8} {'min':>8} {'max':>8} {'read ms':>8}",
        ]
        for c in eng.splits:
            lines.append(
                f"  {c.split:>5} {c.mb_s:>8.0f} {c.mb_s_min:>8.0f} {c.mb_s_max:>8.0f} "
                f"{c.read_ms:>8.3f}"
            )
    lines.append(f"  {eng.conditions()}")
    return "\n".join(lines)


def engine_dict(eng) -> dict:
    from dataclasses import asdict

    from sdq.measure.probe import finite

    d = asdict(eng)
    for cell, c in zip(d["cells"], eng.cells, strict=True):
        cell.update(arena_over_fio=c.arena_over_fio, one_slot_over_fio=c.one_slot_over_fio)
    return finite(d)


def run(args) -> int:
    from sdq.measure.probe import finite, profile_from, recommend, run_probe
    from sdq.paging.io_profile import write_io_profile

    settings = settings_from_args(args)
    if args.engine and args.model is None:
        raise ParamsError("--engine reads a model's experts: give --model")
    if args.engine_layers < 1:
        raise ParamsError(f"--engine-layers must be >= 1, got {args.engine_layers}")
    if args.device_model is not None and args.profile_out == SAVED:
        raise ParamsError(
            "--profile-out without PATH saves this device's profile; under --device-model give "
            "a PATH"
        )
    if args.fit_out is not None:
        from sdq.paging.device_model import check_destination

        check_destination(args.fit_out, "--fit-out")
    profile_out = profile_destination(args, settings)

    def progress(msg: str) -> None:
        if not args.json and sys.stderr.isatty():
            print(f"  {msg}", file=sys.stderr)

    result = run_probe(settings, progress=progress)
    eng = None
    if args.engine:
        from sdq.measure.probe_engine import engine_vs_fio

        eng = engine_vs_fio(args.model, settings.threads, layers=args.engine_layers,
                            repeat=settings.repeat, seed=settings.seed, fio=settings.fio,
                            fio_seconds=settings.fio_seconds, splits=settings.splits,
                            split_threads=settings.split_threads,
                            progress=progress)  # fmt: skip
    rec = recommend(result, eng)
    fitted = fit_out(args, result)
    if profile_out is not None:
        write_io_profile(profile_out, profile_from(result, eng))
    if args.json:
        out = finite(result.to_dict(eng))
        if eng is not None:
            out["engine"] = engine_dict(eng)
        if profile_out is not None:
            out["profile_out"] = str(profile_out)
        if fitted is not None:
            out["fit_out"] = str(args.fit_out)
            out["fitted_model"] = asdict(fitted)
        print(json.dumps(out, indent=2))
    else:
        print(format_report(result, rec))
        if eng is not None:
            print(format_engine(eng))
        if profile_out is not None:
            print(f"I/O profile written to {profile_out}")
        if fitted is not None:
            from sdq.commands.device import format_fit

            print(format_fit(fitted))
            print(f"device model written to {args.fit_out}")
    return 0


def fit_out(args, result):
    """The device model fitted to the probe (None without --fit-out), written to --fit-out."""
    if args.fit_out is None:
        return None
    from sdq.paging import device_model

    name = args.fit_out.stem
    what = result.storage_label
    source = f"sdq probe, cache mode {result.cache_mode}, {what}"
    model = device_model.fit(
        device_model.cells_from_probe(result.levels, result.small), name=name, source=source
    )
    device_model.save(model, args.fit_out)
    return model
