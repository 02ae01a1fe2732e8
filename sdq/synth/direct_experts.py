"""Routed experts written directly as quantized blocks, for models too large to quantize.

A 35B-A3B-shaped model holds 19.5 GB of routed experts; drawing them as floats and running
llama.cpp's quantizer over them would take over an hour on two cores. With `direct_experts`
the build writes every other tensor the usual way (F16 source, llama.cpp's quantizer, so the
dense weights and routers keep their types, values and token- and context-dependent routing)
and then writes each routed expert tensor straight into the final file as random blocks of
its quantized type:

  Q4_K  (144 B per 256 weights): f16 d, f16 dmin, 8 six-bit sub-block scales and mins, 4-bit q
  Q5_K  (176 B per 256 weights): as Q4_K with a fifth bit per weight (qh)
  Q8_0  ( 34 B per  32 weights): f16 d, 32 int8 q

Every quant is uniform random; each sub-block's min equals its scale and dmin = d * (q_max / 2),
so a weight is d * scale * (q - q_max / 2): zero mean, with d drawn per block from
[0.5, 1.5] x d0 and d0 chosen so that the weights' standard deviation is the one the float
experts of `sdq.synth.weights.SynthWeights.expert` have (1 / sqrt(D) for gate and up,
moe_gain / sqrt(F) for down). Every scale is finite and bounded; the bytes are reproducible from
(seed, layer, part, expert chunk).

The build (`assemble`) streams: the dense file is read tensor by tensor with `gguf.GGUFReader`
(a memory map) and the experts are drawn and written a chunk of experts at a time, so no step
holds more than one chunk in memory.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from sdq.errors import ParamsError

PARTS = ("gate", "up", "down")
# quantized type -> (weights per block, bytes per block)
BLOCKS = {"Q4_K": (256, 144), "Q5_K": (256, 176), "Q8_0": (32, 34)}
# the type llama.cpp's quantizer gives expert matrices for each file type (before overrides)
BASE_TYPE = {"Q4_K_M": "Q4_K", "Q4_K_S": "Q4_K", "Q5_K_M": "Q5_K", "Q8_0": "Q8_0"}
CHUNK_EXPERTS = 16  # experts drawn and written at a time
_SCALE_MIN = 32  # six-bit sub-block scales are drawn from 32..63


def expert_type(cfg, qtype: str, part: str) -> str:
    """The quantized type of routed expert tensor `part` (gate/up/down): the file type's base
    type, or the config's `tensor_types` override whose pattern matches the tensor's name."""
    name = f"blk.0.ffn_{part}_exps.weight"
    for pattern, type_name in cfg.tensor_types:
        if re.search(pattern, name):
            chosen = type_name
            break
    else:
        if qtype not in BASE_TYPE:
            raise ParamsError(
                f"synthetic model {cfg.name!r}: directly written experts need --qtype one of "
                f"{', '.join(BASE_TYPE)}, not {qtype}"
            )
        chosen = BASE_TYPE[qtype]
    if chosen not in BLOCKS:
        raise ParamsError(
            f"synthetic model {cfg.name!r}: expert type {chosen} for ffn_{part}_exps cannot be "
            f"written directly (known: {', '.join(BLOCKS)})"
        )
    return chosen


def part_shape(cfg, part: str) -> tuple[int, int, int]:
    """NumPy shape [E, rows, cols] of routed expert tensor `part`."""
    D, F, E = cfg.n_embd, cfg.expert_ffn, cfg.n_expert
    return (E, D, F) if part == "down" else (E, F, D)


def part_std(cfg, part: str) -> float:
    """The standard deviation of the float experts this part stands in for."""
    return cfg.moe_gain / np.sqrt(cfg.expert_ffn) if part == "down" else 1 / np.sqrt(cfg.n_embd)


def expert_bytes(cfg, type_name: str, part: str) -> int:
    """Bytes of one expert's matrix of `part` in `type_name`."""
    _, rows, cols = part_shape(cfg, part)
    per_block, block_bytes = BLOCKS[type_name]
    if cols % per_block:
        raise ParamsError(
            f"synthetic model {cfg.name!r}: ffn_{part}_exps rows of {cols} weights are not whole "
            f"{type_name} blocks of {per_block}"
        )
    return rows * (cols // per_block) * block_bytes


def random_bytes(n: int, seed_words) -> np.ndarray:
    """[n] uint8 from SFC64 seeded by `seed_words` (its raw output: the fastest NumPy draw)."""
    words = np.random.SFC64(list(seed_words)).random_raw(-(-n // 8))  # [ceil(n / 8)] uint64
    return words.view(np.uint8)[:n]


def random_blocks(type_name: str, n_blocks: int, std: float, seed_words) -> np.ndarray:
    """[n_blocks, block bytes] uint8: random valid blocks of `type_name` whose weights have
    mean 0 and standard deviation `std` (module docstring). Every random choice is a byte of
    one draw: the quants as drawn, a block's d spread u = 0.5 + byte / 255, and a sub-block
    scale (= its min) 32 + (byte & 31)."""
    per_block, block_bytes = BLOCKS[type_name]
    out = random_bytes(n_blocks * block_bytes, seed_words).reshape(n_blocks, block_bytes).copy()
    u_levels = 0.5 + np.arange(256) / 255  # the values u takes, equally likely
    u = (0.5 + out[:, 0] / np.float32(255)).astype(np.float32)  # [n] drawn before d overwrites it
    mean_u2 = float(np.mean(u_levels**2))
    if type_name == "Q8_0":
        q = out[:, 2:].view(np.int8)  # [n, 32]
        q[q == -128] = -127  # llama.cpp's quantizer never writes -128
        var_q = (255**2 - 1) / 12  # uniform on -127..127 (-128 folded onto -127: near enough)
        d = u * np.float32(std / np.sqrt(var_q * mean_u2))  # [n]
        out[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
        return out
    q_max = 15 if type_name == "Q4_K" else 31
    var_q = ((q_max + 1) ** 2 - 1) / 12  # uniform on 0..q_max
    sc = _SCALE_MIN + (out[:, 4:12] & 31)  # [n, 8] scale = min, from bytes about to be packed
    mean_sc2 = float(np.mean(np.arange(_SCALE_MIN, _SCALE_MIN + 32, dtype=np.float64) ** 2))
    d = u * np.float32(std / np.sqrt(var_q * mean_sc2 * mean_u2))  # [n]
    out[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    out[:, 2:4] = (d * q_max / 2).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    out[:, 4:16] = pack_k_scales(sc, sc)
    return out


def pack_k_scales(scales: np.ndarray, mins: np.ndarray) -> np.ndarray:
    """[n, 12] uint8: eight six-bit scales and mins [n, 8] packed as Q4_K / Q5_K store them
    (sub-blocks 0-3 in the low six bits of bytes 0-7, sub-blocks 4-7 split between the low
    and high nibbles of bytes 8-11 and the top two bits of bytes 0-7)."""
    sc = scales.astype(np.uint8) & 63  # [n, 8]
    m = mins.astype(np.uint8) & 63  # [n, 8]
    out = np.empty((len(sc), 12), np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    return out


def expert_chunk(cfg, seed: int, layer: int, part: str, type_name: str, e0: int, e1: int):
    """[e1 - e0, expert bytes] uint8: experts e0..e1-1 of one layer and part."""
    n = e1 - e0
    nbytes = expert_bytes(cfg, type_name, part)
    block_bytes = BLOCKS[type_name][1]
    words = (seed, layer, PARTS.index(part), e0)
    blocks = random_blocks(type_name, n * nbytes // block_bytes, part_std(cfg, part), words)
    return blocks.reshape(n, nbytes)


def is_routed_expert(name: str) -> bool:
    return re.fullmatch(r"blk\.\d+\.ffn_(gate|up|down)_exps\.weight", name) is not None


def assemble(cfg, seed: int, qtype: str, dense: Path, out: Path, *, progress=False) -> None:
    """Write `out`: the quantized `dense` file's metadata and tensors, its one-expert
    placeholders of the routed expert tensors replaced by every expert, drawn directly."""
    import gguf
    from gguf.constants import GGMLQuantizationType, GGUFValueType
    from tqdm import tqdm

    reader = gguf.GGUFReader(str(dense))
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(str(out), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        main = field.types[0]
        sub = field.types[-1] if main == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), main, sub_type=sub)
    plan = []  # (the reader's tensor, (layer, part, type) of a routed expert tensor or None, bytes)
    for t in reader.tensors:
        if is_routed_expert(t.name):
            layer, part = int(t.name.split(".")[1]), t.name.split(".")[2][4:-5]
            type_name = expert_type(cfg, qtype, part)
            E, rows, cols = part_shape(cfg, part)
            nbytes = E * expert_bytes(cfg, type_name, part)
            ggml_type = GGMLQuantizationType[type_name]
            writer.add_tensor_info(t.name, (E, rows, cols), np.float32, nbytes, raw_dtype=ggml_type)
            plan.append((t, (layer, part, type_name), nbytes))
        else:
            shape = tuple(int(s) for s in reversed(t.shape))  # GGUF lists dims fastest first
            writer.add_tensor_info(
                t.name, shape, np.float32, int(t.n_bytes), raw_dtype=t.tensor_type
            )
            plan.append((t, None, int(t.n_bytes)))
    writer.write_header_to_file(out)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    fout = writer.fout[0]
    total = sum(n for *_, n in plan)
    with tqdm(total=total, unit="B", unit_scale=True, desc="experts", disable=not progress) as bar:
        for t, expert, nbytes in plan:
            writer.write_padding(fout, fout.tell())
            if expert is not None:
                layer, part, type_name = expert
                for e0 in range(0, cfg.n_expert, CHUNK_EXPERTS):
                    e1 = min(e0 + CHUNK_EXPERTS, cfg.n_expert)
                    fout.write(expert_chunk(cfg, seed, layer, part, type_name, e0, e1).data)
            else:
                fout.write(np.ascontiguousarray(t.data).data)
            writer.write_padding(fout, nbytes)
            bar.update(nbytes)
    fout.flush()
    writer.close()
