"""`sdq chat`: generate text with the routed experts paged from disk under a RAM budget.

Order of allocation (the seed's §5.1 lesson): the memory plan counts the dense weights, the KV
cache and every ubatch compute buffer first; the workspace and the dense weights are allocated
from it; only then is the expert arena created with the slots that are left.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from sdq.errors import ParamsError

CACHE_MODES = ("direct", "dontneed", "pagecache")
IO_MODES = ("serial", "parallel", "split")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", required=True, help="GGUF model file")
    p.add_argument("-p", "--prompt", default="", help="prompt text")
    p.add_argument("-f", "--file", help="read the prompt from this file")
    p.add_argument("-n", "--n-predict", type=int, default=64, help="tokens to generate")
    p.add_argument("-c", "--ctx-size", type=int, default=4096, help="context length (KV cache)")
    p.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1, help="threads")
    p.add_argument(
        "-b", "--ubatch", type=int, default=128, help="prompt tokens per forward pass (ubatch)"
    )
    p.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ignore-eos", action="store_true", help="generate all -n tokens")
    p.add_argument(
        "--ram-budget-mb", type=float, help="RAM the whole process may use (default: available)"
    )
    p.add_argument("--reserve-mb", type=float, help="RAM kept free inside the budget")
    p.add_argument("--max-slots", type=int, help="cap the expert arena at this many slots")
    p.add_argument("--io-threads", type=int, help="expert read threads (default 3 x threads)")
    p.add_argument("--io-mode", choices=IO_MODES, help="how an expert is read (default parallel)")
    p.add_argument("--io-split", type=int, help="pieces per segment (--io-mode split; default 1)")
    p.add_argument(
        "--io-profile",
        help="I/O settings recommended by `sdq probe --profile-out` (explicit flags win)",
    )
    p.add_argument("--cache-mode", choices=CACHE_MODES, default="pagecache")
    p.add_argument(
        "--cache-policy",
        choices=("auto", "lru", "lrfu_bypass", "layer_lrfu"),
        default="auto",
        help="expert replacement: lrfu_bypass keeps frequently routed experts and streams the "
        "rest, layer_lrfu evicts from the layer visited farthest ahead; auto (default): "
        "lrfu_bypass when the arena holds fewer than one token's experts, else layer_lrfu",
    )
    p.add_argument(
        "--prefetch-next",
        type=int,
        metavar="N",
        help="decode: guess the next layer's experts with its router and start reading the N "
        "most probable (default: 3/4 of the experts a token uses; 0: off)",
    )
    p.add_argument(
        "--resident", action="store_true", help="copy every expert into RAM (no pager, no budget)"
    )
    p.add_argument("--route-log", help="write each token's experts per layer (JSON lines)")
    p.add_argument("--profile", action="store_true", help="time per op category (table T11)")
    p.add_argument("--json", action="store_true", help="print one JSON object, no streaming")


def run(args) -> int:
    from sdq.run.session import open_session

    prompt = _prompt(args)
    _check_args(args)
    with open_session(args) as s:
        prompt_ids = s.tokenizer.encode(prompt)
        on_text = None if args.json else _printer()
        g = s.generate(prompt_ids, on_text=on_text)
        if args.json:
            obj = {
                "text": g.text,
                "prompt": prompt,
                "prompt_ids": g.prompt_ids,
                "generated_ids": g.generated_ids,
                "settings": s.settings_dict(),
                **s.figures(g),
                "token_ms": [round(ms, 3) for ms in g.token_ms],
            }
            if args.profile:
                obj["profile_ms_per_token"] = g.profile
            print(json.dumps(obj))
        else:
            print(flush=True)
            print(_format_figures(s.figures(g)))
            if args.profile:
                print(_format_profile(g.profile))
    return 0


def _prompt(args) -> str:
    if args.file:
        try:
            with open(args.file, encoding="utf-8") as f:
                return f.read()
        except OSError as exc:
            raise ParamsError(f"-f {args.file}: cannot read ({exc.strerror})") from None
    return args.prompt


def _check_args(args) -> None:
    _apply_io_profile(args)
    for flag, value, low in (
        ("-n", args.n_predict, 1),
        ("-c", args.ctx_size, 1),
        ("-t", args.threads, 1),
        ("-b", args.ubatch, 1),
        ("--io-split", args.io_split, 1),
    ):
        if value < low:
            raise ParamsError(f"{flag} {value} must be >= {low}")
    for flag, value in (("--io-threads", args.io_threads), ("--max-slots", args.max_slots)):
        if value is not None and value < 1:
            raise ParamsError(f"{flag} {value} must be >= 1")
    args.ubatch = min(args.ubatch, args.ctx_size)  # a ubatch never exceeds the context


def _apply_io_profile(args) -> None:
    """Fill --io-threads / --io-split / --io-mode from --io-profile where not given."""
    if getattr(args, "io_profile", None):
        from sdq.paging.io_profile import load_io_profile

        profile = load_io_profile(args.io_profile)
        if args.io_threads is None:
            args.io_threads = profile.io_threads
        if args.io_split is None:
            args.io_split = profile.io_split
        if args.io_mode is None and args.io_split > 1:
            args.io_mode = "split"
    if args.io_split is None:
        args.io_split = 1
    if args.io_mode is None:
        args.io_mode = "parallel"


def _printer():
    def on_text(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    return on_text


FIGURE_ORDER = (
    ("decode_tok_s", "{:.2f}"),
    ("prefill_tok_s", "{:.2f}"),
    ("ttft_ms", "{:.1f}"),
    ("hit_rate", "{:.4f}"),
    ("ssd_mb_per_token", "{:.2f}"),
    ("expert_io_ms_per_token", "{:.2f}"),
    ("expert_compute_ms_per_token", "{:.2f}"),
    ("total_ms_per_token", "{:.2f}"),
    ("peak_rss_mb", "{:.0f}"),
    ("swap_mb", "{:.0f}"),
    ("slots", "{}"),
    ("slot_bytes", "{}"),
    ("n_prompt", "{}"),
    ("n_decode", "{}"),
    ("cache_mode", "{}"),
)


def _format_figures(fig: dict) -> str:
    lines = []
    for name, fmt in FIGURE_ORDER:
        if name in fig and fig[name] is not None:
            lines.append(f"{name:28s} {fmt.format(fig[name])}")
    return "\n".join(lines)


def _format_profile(profile: dict) -> str:
    lines = [
        "",
        "time per op category (ms per token)",
        f"{'category':16s} {'prefill':>9s} {'decode':>9s}",
    ]
    cats = ("attention", "router", "expert_compute", "io_wait", "other", "total")
    for c in cats:
        row = [profile.get(ph, {}).get(c) for ph in ("prefill", "decode")]
        cells = [f"{v:9.3f}" if v is not None else f"{'-':>9s}" for v in row]
        lines.append(f"{c:16s} {cells[0]} {cells[1]}")
    return "\n".join(lines)
