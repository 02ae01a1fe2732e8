"""`sdq chat`: generate text with the routed experts paged from disk under a RAM budget.

Order of allocation (the seed's §5.1 lesson): the memory plan counts the dense weights, the KV
cache and every ubatch compute buffer first; the workspace and the dense weights are allocated
from it; only then is the expert arena created with the slots that are left.
"""

from __future__ import annotations

import argparse
import json
import sys

from sdq.commands.run_flags import add_run_arguments, checked_settings
from sdq.errors import ParamsError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", required=True, help="GGUF model file")
    p.add_argument("-p", "--prompt", default="", help="prompt text")
    p.add_argument("-f", "--file", help="read the prompt from this file")
    p.add_argument(
        "--system",
        help="system message: the prompt becomes a chat turn in the model's chat template",
    )
    p.add_argument(
        "-cnv",
        "--conversation",
        action="store_true",
        help="interactive chat in the model's chat template (the prompt, if any, is the first "
        "turn); the KV cache keeps earlier turns; Ctrl-C stops a reply, /exit or EOF quits",
    )
    add_run_arguments(p)
    p.add_argument("--profile", action="store_true", help="time per op category (table T11)")
    p.add_argument("--json", action="store_true", help="print one JSON object, no streaming")


def run(args) -> int:
    from sdq.run.runtime import Model
    from sdq.run.settings import RunSettings

    prompt = _prompt(args)
    if args.conversation and args.json:
        raise ParamsError("-cnv is interactive: it prints no --json")
    settings = checked_settings(RunSettings.from_args(args))
    with Model(settings) as m:
        if args.conversation:
            return _converse(m, args, prompt)
        s = m.session
        routes = _keep_decode_routes(s) if args.json else None
        if args.system is not None:
            _no_template_notice(m)
            events = m.chat(system=args.system).send(prompt, stream=True)
        else:
            events = m.generate(prompt, stream=True)
        for event in events:
            if not args.json:
                sys.stdout.write(event.text)
                sys.stdout.flush()
        g = m.last_generation
        if args.json:
            obj = {
                "text": g.text,
                "prompt": prompt,
                "prompt_ids": g.prompt_ids,
                "generated_ids": g.generated_ids,
                "settings": s.settings_dict(),
                "io_profile": settings.io_profile,  # the saved I/O profile applied, or None
                **s.figures(g),
                "token_ms": [round(ms, 3) for ms in g.token_ms],
            }
            if routes is not None:
                obj.update(_against_limits(s, settings, g, routes))
            if args.profile:
                obj["profile_ms_per_token"] = g.profile
            print(json.dumps(obj))
        else:
            print(flush=True)
            print(_format_figures(s.figures(g)))
            if args.profile:
                print(_format_profile(g.profile))
    return 0


def _keep_decode_routes(session):
    """A paged run's decode routing, kept in memory for the optimum (sdq.measure.ceiling):
    O(decode tokens x layers x K) ids; None for a resident run."""
    if session.settings.resident:
        return None
    from sdq.measure.optimum import DecodeRoutes

    routes = DecodeRoutes(session.experts, session.engine.route_log)
    session.engine.route_log = routes
    return routes


def _against_limits(session, settings, g, routes) -> dict:
    """--json of a paged run: the pager against the best cache on the same decode
    (`optimum`), and the decode against the I/O ceiling with its token time split (`ceiling`;
    io_ceiling_tok_s and io_ceiling_fraction also at the top, as DESIGN names them)."""
    from sdq.measure.ceiling import run_report, saved_bandwidth

    report = run_report(
        session.figures(g), g.profile.get("decode", {}), routes, saved_bandwidth(settings)
    )
    if report:
        c = report["ceiling"]
        report["io_ceiling_tok_s"] = c["io_ceiling_tok_s"]
        report["io_ceiling_fraction"] = c["io_ceiling_fraction"]
    return report


MAX_PROMPT_BYTES = 16 * 2**20  # far more text than any context holds


def _prompt(args) -> str:
    """The prompt text, from -f FILE (UTF-8) or -p; ParamsError if it is not valid Unicode
    text (bytes of -p that are not UTF-8 reach Python as lone surrogates, PEP 383)."""
    if not args.file:
        text, where = args.prompt, "-p"
    else:
        where = f"-f {args.file}"
        try:
            with open(args.file, "rb") as f:
                data = f.read(MAX_PROMPT_BYTES + 1)  # not all of /dev/zero
        except OSError as exc:
            raise ParamsError(f"{where}: cannot read ({exc.strerror})") from None
        if len(data) > MAX_PROMPT_BYTES:
            raise ParamsError(f"{where}: longer than {MAX_PROMPT_BYTES} bytes")
        text = data.decode("utf-8", "surrogateescape")
    bad = next((i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF), None)
    if bad is not None:
        code = ord(text[bad])
        what = f"byte {code - 0xDC00:#04x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise ParamsError(f"{where}: the prompt is not UTF-8 text ({what} at character {bad})")
    return text


def _no_template_notice(m) -> None:
    if m.chat_template is None:
        print(
            f"sdq chat: {m.settings.model} has no chat template (tokenizer.chat_template): "
            "messages are fed as raw text",
            file=sys.stderr,
        )


def _converse(m, args, first: str) -> int:
    """The interactive loop: read a turn, stream the reply; Ctrl-C stops the reply (between two
    tokens), /exit or end of input quits. A turn the model refuses (context full) is reported
    in one line and the conversation goes on."""
    import signal

    from sdq.errors import SdqError

    _no_template_notice(m)
    chat = m.chat(system=args.system)
    stop = []
    text = first or None
    while True:
        if text is None:
            try:
                text = input("> ")
            except (EOFError, KeyboardInterrupt, OSError):  # OSError: no readable input
                print()
                return 0
        if text.strip() == "/exit":
            return 0
        previous = signal.signal(signal.SIGINT, lambda *_: stop.append(True))
        try:
            stop.clear()
            events = chat.send(text, stream=True)
            for event in events:
                sys.stdout.write(event.text)
                sys.stdout.flush()
                if stop:
                    events.close()
                    break
        except SdqError as exc:
            print(f"sdq chat: error: {exc}", file=sys.stderr)
        finally:
            signal.signal(signal.SIGINT, previous)
        print(flush=True)
        text = None


FIGURE_ORDER = (
    ("decode_tok_s", "{:.2f}"),
    ("prefill_tok_s", "{:.2f}"),
    ("ttft_ms", "{:.1f}"),
    ("hit_rate", "{:.4f}"),
    ("prefetch_hit_rate", "{:.4f}"),
    ("prefetch_accuracy", "{:.4f}"),
    ("guess_accuracy_d1", "{:.4f}"),
    ("guess_accuracy_d2", "{:.4f}"),
    ("reads_avoided", "{:.4f}"),
    ("ssd_mb_per_token", "{:.2f}"),
    ("prefetch_mb_per_token", "{:.2f}"),
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
    cats = ("attention", "router", "expert_compute", "io_wait", "barrier", "other", "total")
    for c in cats:
        row = [profile.get(ph, {}).get(c) for ph in ("prefill", "decode")]
        cells = [f"{v:9.3f}" if v is not None else f"{'-':>9s}" for v in row]
        lines.append(f"{c:16s} {cells[0]} {cells[1]}")
    return "\n".join(lines)
