"""`sdq synth`: build (or find in the cache) a synthetic GGUF model (qwen3moe, qwen35moe, llama
with experts, granitemoe...) and print its path."""

from __future__ import annotations

import argparse
import json
import time

from sdq.units import MB

# flag -> SynthConfig field
_DIM_FLAGS = {
    "n_embd": "n_embd",
    "layers": "n_layer",
    "experts": "n_expert",
    "experts_used": "n_expert_used",
    "expert_ffn": "expert_ffn",
    "heads": "n_head",
    "kv_heads": "n_head_kv",
    "head_dim": "head_dim",
}


# architecture -> its test preset (--arch without --preset)
_ARCH_PRESETS = {
    "qwen3moe": "tiny",
    "qwen35moe": "tiny35",
    "llama": "tiny-mixtral",
    "granitemoe": "tiny-granitemoe",
    "qwen2moe": "tiny-qwen2moe",
    "olmoe": "tiny-olmoe",
    "deepseek2": "tiny-deepseek2",
    "glm4moe": "tiny-glm4moe",
    "gpt-oss": "tiny-gptoss",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset",
        default=None,
        help="qwen3moe: tiny (tests, the default), mini (reproduce); qwen35moe: tiny35 (tests), "
        "seed (shaped like Qwen3.6-35B-A3B, 4 blocks), seed-full (all 40 blocks, 21 GB); "
        "llama (Mixtral): tiny-mixtral, "
        "tiny-mixtral-legacy (one tensor per expert); granitemoe: tiny-granitemoe; "
        "qwen2moe: tiny-qwen2moe; olmoe: tiny-olmoe; glm4moe: tiny-glm4moe; "
        "gpt-oss: tiny-gptoss (--qtype MXFP4_MOE for MXFP4 experts)",
    )
    parser.add_argument(
        "--arch",
        choices=sorted(_ARCH_PRESETS),
        help="architecture; without --preset its test preset, with one it must be the preset's",
    )
    parser.add_argument(
        "--router",
        choices=["random", "calibrated"],
        help="routing construction: calibrated (qwen35moe; the default of seed and seed-full) "
        "routes with a trained model's temporal locality, random (every other preset's) mostly "
        "by the token itself; default: the preset's",
    )
    parser.add_argument("--qtype", default="Q4_K_M", help="Q4_K_M, Q8_0, F16, F32 (or Q4_0...)")
    parser.add_argument("--seed", type=int, default=0)
    dims = parser.add_argument_group("custom dimensions (override the preset)")
    dims.add_argument("--n-embd", type=int)
    dims.add_argument("--layers", type=int)
    dims.add_argument("--experts", type=int)
    dims.add_argument("--experts-used", type=int)
    dims.add_argument("--expert-ffn", type=int)
    dims.add_argument("--heads", type=int)
    dims.add_argument("--kv-heads", type=int)
    dims.add_argument("--head-dim", type=int)
    dims.add_argument(
        "--tied", action="store_true", default=None, help="share token_embd as the output head"
    )
    parser.add_argument("--out", help="also place the model at this path (hard link or copy)")
    parser.add_argument(
        "--remove",
        action="store_true",
        help="delete this model from the cache instead of building it (seed-full: 21 GB)",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON summary")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    from sdq.errors import ParamsError
    from sdq.synth.build import build_model, model_path, resolve_config

    overrides = {field: getattr(args, flag) for flag, field in _DIM_FLAGS.items()}
    overrides["tied_embeddings"] = args.tied
    preset = args.preset or _ARCH_PRESETS[args.arch or "qwen3moe"]
    cfg = resolve_config(preset, router=args.router, **overrides)
    if args.arch is not None and cfg.arch != args.arch:
        raise ParamsError(f"preset {preset!r} is a {cfg.arch} model, not {args.arch}")
    if args.remove:
        return _remove(model_path(cfg, args.qtype, args.seed))
    cached = model_path(cfg, args.qtype, args.seed).is_file()
    t0 = time.perf_counter()
    path = build_model(
        cfg, args.qtype, args.seed, out=args.out, progress=not (args.no_progress or args.json)
    )
    seconds = time.perf_counter() - t0
    summary = _summary(path, cfg, args.qtype.upper(), args.seed, cached, seconds)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        how = "cached" if cached else f"built in {seconds:.1f} s"
        seg = summary["expert_segment_bytes"]
        types = ", ".join(f"{k} {v}" for k, v in summary["tensor_types"].items())
        print(path)
        print(
            f"  {summary['bytes'] / MB:.1f} MB ({how}); tensors: {types};"
            f" expert segments gate/up/down {seg['gate']:,}/{seg['up']:,}/{seg['down']:,} B"
        )
    return 0


def _remove(path) -> int:
    """Delete a cached model file (and its build lock); a model not in the cache is no error."""
    if not path.is_file():
        print(f"{path}: not in the cache")
        return 0
    size = path.stat().st_size
    path.unlink()
    path.with_name(f".{path.name}.lock").unlink(missing_ok=True)
    print(f"{path}: removed ({size / MB:.0f} MB)")
    return 0


def _summary(path, cfg, qtype: str, seed: int, cached: bool, seconds: float) -> dict:
    from collections import Counter

    from sdq.format.model import open_model

    model = open_model(path)
    experts = model.require_experts()
    layer = experts.layers[0]
    return {
        "path": str(path),
        "bytes": path.stat().st_size,
        "preset": cfg.name,
        "qtype": qtype,
        "seed": seed,
        "cached": cached,
        "build_s": None if cached else round(seconds, 2),
        "router": cfg.router,
        "config": cfg.params(),
        "tensor_types": dict(sorted(Counter(t.qtype.name for t in model.tensors.values()).items())),
        # layer 0, expert 0 (Q4_K_M mixes types across layers for ffn_down)
        "expert_segment_bytes": {
            part: experts.segment(layer, 0, part).nbytes for part in ("gate", "up", "down")
        },
        "expert_bytes_total": experts.total_bytes,
    }
