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
    from sdq.format.model import anatomy, open_model

    model = open_model(args.model)
    if args.check:
        model.require_experts()
        model.require_compute()
    info = anatomy(model, layer=args.layer, expert=args.expert)
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        print(render(info))
    return 0


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
    return "\n".join(out)
