"""`sdq bench resident MODEL`: sdq against llama.cpp with every weight in RAM; how it is
measured is in sdq.measure.resident."""

from __future__ import annotations

import argparse
import json

from sdq.commands.run_flags import add_run_arguments, checked_settings
from sdq.measure.resident import DEFAULT_PROMPT


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="GGUF model file")
    p.add_argument("-p", "--prompt", default=DEFAULT_PROMPT)
    add_run_arguments(
        p,
        ("n_predict", "threads", "n_ubatch", "n_ctx"),
        defaults={"n_predict": 32, "threads": 2, "n_ctx": 1024},
    )
    p.add_argument("-r", "--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    from sdq.measure.llama_ref import require_llama_cpp
    from sdq.measure.resident import compare_resident
    from sdq.run.settings import RunSettings

    require_llama_cpp("sdq bench resident")
    result = compare_resident(
        checked_settings(RunSettings.from_args(args)), args.prompt, repeats=args.repeats
    )
    print(json.dumps(result) if args.json else _table(result))
    return 0


def _table(r: dict) -> str:
    lines = [
        f"{r['model']}: prompt {r['n_prompt']} tokens, {r['n_predict']} generated, "
        f"-t {r['threads']} -b {r['ubatch']}, median of {r['repeats']} alternating runs; "
        f"{r['llama_settings']}",
        f"{'engine':10s} {'prefill tok/s':>14s} {'decode tok/s':>13s}",
    ]
    for name in ("sdq", "llama.cpp"):
        lines.append(
            f"{name:10s} {r[f'{name}_prefill_tok_s']:14.2f} {r[f'{name}_decode_tok_s']:13.2f}"
        )
    lines.append(
        f"{'sdq/llama':10s} {r['ratio_prefill_tok_s']:14.3f} {r['ratio_decode_tok_s']:13.3f}"
    )
    return "\n".join(lines)
