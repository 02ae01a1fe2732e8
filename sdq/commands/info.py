"""`sdq info MODEL [--json] [--check]`: a GGUF model's anatomy (spec, tensors, experts, T2)."""

from __future__ import annotations

import argparse
import json

from sdq.units import KIB, MIB


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="path to a .gguf file")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--layer", type=int, default=None, help="MoE layer of the T2 table (default: the first)"
    )
    parser.add_argument("--expert", type=int, default=0, help="expert of the T2 table")
    parser.add_argument(
        "--check",
        action="store_true",
        help="also fail (exit 2) unless sdq can run the model: routed experts present and "
        "every tensor type computable",
    )


def run(args: argparse.Namespace) -> int:
    from sdq.errors import UnsupportedError
    from sdq.format.header import read_header
    from sdq.format.model import ARCH_NORM_TOPK, anatomy, open_model

    header = read_header(args.model)
    arch = header.metadata.get("general.architecture")
    if isinstance(arch, str) and arch and arch not in ARCH_NORM_TOPK:
        reason = f"sdq does not know architecture {arch!r}"
        if args.check:
            known = ", ".join(sorted(ARCH_NORM_TOPK))
            raise UnsupportedError(f"{header.path}: {reason} (known: {known})")
        info = header_anatomy(header)
        info["cannot_run"] = f"{reason} (the anatomy above is the header's alone)"
    else:
        model = open_model(args.model)
        if args.check:
            model.require_experts()
            model.require_compute()
        info = anatomy(model, layer=args.layer, expert=args.expert)
        info["cannot_run"] = cannot_run(model)
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        print(render(info))
    return 0


def cannot_run(model) -> str | None:
    """Why `sdq chat` (plan, serve) would refuse the model, or None when it can run it."""
    from sdq.format.quants import SUPPORTED_COMPUTE
    from sdq.run.engine import SUPPORTED_ARCHS

    arch = model.spec.arch
    if not model.has_experts:
        return "it has no routed experts (a dense model); sdq runs Mixture-of-Experts models"
    if arch not in SUPPORTED_ARCHS:
        return f"sdq cannot run architecture {arch} yet (it runs {', '.join(SUPPORTED_ARCHS)})"
    bad = sorted({t.qtype.name for t in model.tensors.values() if t.qtype not in SUPPORTED_COMPUTE})
    if bad:
        return f"tensor types without an sdq kernel: {', '.join(bad)}"
    return None


def header_anatomy(header) -> dict:
    """What `sdq info` shows of a file whose architecture sdq does not know: the tensors by
    type and role and the bytes, from the header alone (the keys `anatomy` gives, with the
    architecture and block count as the spec)."""
    from collections import Counter

    from sdq.format.model import TENSOR_CLASSES, is_routed, tensor_class
    from sdq.format.quants import SUPPORTED_COMPUTE, qtype_of, tensor_bytes

    meta = header.metadata
    arch = meta["general.architecture"]
    n_layer = meta.get(f"{arch}.block_count")
    n_layer = n_layer if isinstance(n_layer, int) else 1 << 30  # no block counts as MTP
    count: Counter[str] = Counter()
    nbytes: Counter[str] = Counter()
    classes: Counter[str] = Counter()
    class_bytes: Counter[str] = Counter()
    routed = total = 0
    unsupported = set()
    for raw in header.tensors:
        q = qtype_of(raw.type_value, f"{header.path}: tensor {raw.name}")
        size = tensor_bytes(q, raw.dims, what=f"{header.path}: tensor {raw.name}")
        count[q.name] += 1
        nbytes[q.name] += size
        c = tensor_class(raw.name, n_layer)
        classes[c] += 1
        class_bytes[c] += size
        total += size
        routed += size if is_routed(raw.name) else 0
        if q not in SUPPORTED_COMPUTE:
            unsupported.add(q.name)
    spec = {"arch": arch}
    if n_layer != 1 << 30:
        spec["n_layer"] = n_layer
    name = meta.get("general.name")
    return {
        "path": str(header.path),
        "file_bytes": header.file_size,
        "gguf_version": header.version,
        "alignment": header.alignment,
        "data_offset": header.data_offset,
        "name": name if isinstance(name, str) else None,
        "file_type": meta.get("general.file_type"),
        "spec": spec,
        "n_tensors": len(header.tensors),
        "tensor_types": {k: {"count": count[k], "bytes": nbytes[k]} for k in sorted(count)},
        "tensor_classes": {
            c: {"count": classes[c], "bytes": class_bytes[c]} for c in TENSOR_CLASSES if classes[c]
        },
        "total_bytes": total,
        "dense_bytes": total - routed,
        "routed_expert_bytes": routed,
        "mtp": {"present": False},
        "unsupported_compute": sorted(unsupported),
        "experts": None,
    }


def _layers(layers) -> str:
    from sdq.format.model import _ranges

    return _ranges(layers)


def _n(x: int) -> str:
    return f"{x:,}"


def _mib(x: int) -> str:
    return f"{x / MIB:,.1f} MiB" if x >= MIB else f"{x / KIB:,.1f} KiB"


def _table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]

    def line(cells):
        out = [
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  " + "  ".join(out).rstrip()

    return [line(header), *(line(r) for r in rows)]


def render(info: dict) -> str:
    """Human-readable anatomy, aligned columns, one section per topic."""
    spec = info["spec"]
    out = [
        f"model    {info['path']}",
        f"file     {_n(info['file_bytes'])} bytes ({_mib(info['file_bytes'])}), GGUF "
        f"v{info['gguf_version']}, {info['n_tensors']} tensors, data at byte "
        f"{_n(info['data_offset'])}, alignment {info['alignment']}",
    ]
    if info.get("name"):
        out.append(f"name     {info['name']}")
    out += ["", "spec"]
    width = max(len(k) for k in spec)
    for key, value in spec.items():
        if key == "moe_layers":
            value = info["experts"]["layers"] if info["experts"] else "none"
        if key == "hybrid" and value:
            value = (
                f"delta-net blocks {_layers(value['recurrent_layers'])} (every "
                f"{value['full_attention_interval']}th full attention); state "
                f"{value['state']}, {value['k_heads']} key / {value['v_heads']} value heads, "
                f"conv {value['conv_kernel']}; RoPE {value['rope_dim']} dims, sections "
                f"{list(value['rope_sections'])}"
            )
        out.append(f"  {key.ljust(width)}  {value}")

    out += ["", "tensors by type"]
    types = info["tensor_types"]
    out += _table(
        ["type", "count", "bytes", "size"],
        [[k, _n(v["count"]), _n(v["bytes"]), _mib(v["bytes"])] for k, v in types.items()],
        right={1, 2, 3},
    )
    out += ["", "tensors by role"]
    classes = info["tensor_classes"]
    out += _table(
        ["role", "count", "bytes", "share"],
        [
            [k, _n(v["count"]), _n(v["bytes"]), f"{100 * v['bytes'] / info['total_bytes']:.1f} %"]
            for k, v in classes.items()
        ],
        right={1, 2, 3},
    )

    out += ["", "bytes"]
    sizes = [
        ("all tensors", info["total_bytes"]),
        ("dense (resident)", info["dense_bytes"]),
        ("routed experts (paged)", info["routed_expert_bytes"]),
    ]
    ex = info["experts"]
    if ex:
        sizes += [
            ("one MoE layer's experts", ex["layer_bytes"]),
            ("one expert (gate+up+down)", ex["expert_bytes"]),
            ("largest expert", ex["max_expert_bytes"]),
        ]
    out += _table(["", "bytes", "size"], [[k, _n(v), _mib(v)] for k, v in sizes], right={1, 2})

    out.append("")
    if ex:
        seg0 = ex["segments"][0]
        fused = ", gate and up fused in ffn_gate_up_exps" if ex["fused_gate_up"] else ""
        out.append(
            f"experts  {ex['n_expert']} per layer, {ex['n_expert_used']} used per token, "
            f"{ex['moe_layers']} MoE layers ({ex['layers']}){fused}"
        )
        for part, by_type in ex["part_qtypes"].items():
            kinds = "; ".join(
                f"{q} in layer{'s' if set(layers) & set(',-') else ''} {layers}"
                for q, layers in by_type.items()
            )
            out.append(f"  {part:<5} {kinds}")
        out.append(f"T2: layer {seg0['layer']}, expert {seg0['expert']} on disk")
        out += _table(
            ["part", "offset", "bytes", "qtype", "rows x cols"],
            [
                [
                    s["part"],
                    _n(s["offset"]),
                    _n(s["nbytes"]),
                    s["qtype"],
                    f"{s['rows']} x {s['cols']}",
                ]
                for s in ex["segments"]
            ],
            right={1, 2},
        )
    else:
        out.append("experts  none (no routed-expert tensors)")

    mtp = info["mtp"]
    if mtp["present"]:
        out.append(
            f"MTP      present: {mtp['tensors']} nextn/mtp tensors ({_n(mtp['bytes'])} bytes), "
            f"nextn_predict_layers {mtp['nextn_predict_layers']}"
        )
        out.append(
            f"         MTP layers in all: {mtp['role_tensors']} tensors, "
            f"{_n(mtp['role_bytes'])} bytes (not run by sdq)"
        )
    else:
        out.append("MTP      none (no nextn/mtp tensors)")
    bad = info["unsupported_compute"]
    if bad:
        out.append(f"compute  types without an sdq kernel: {', '.join(bad)}")
    else:
        out.append("compute  every tensor type has an sdq kernel")
    why = info.get("cannot_run")
    out.append(f"run      sdq cannot run it: {why}" if why else "run      sdq can run it")
    return "\n".join(out)
