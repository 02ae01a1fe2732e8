"""Quant facts: the one table of GGML block sizes and bytes per block.

Built from `gguf.constants.GGML_QUANT_SIZES` (the gguf package is the source of truth; no
number is retyped here). A quantized row of `cols` values is `cols / block_size` blocks of
`type_size` bytes each; a row length that is not a whole number of blocks is an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from sdq.errors import GGUFError

Q = GGMLQuantizationType


class QuantFacts(NamedTuple):
    block_size: int  # values per block
    type_size: int  # bytes per block


QUANTS: dict[GGMLQuantizationType, QuantFacts] = {
    qtype: QuantFacts(int(block), int(size)) for qtype, (block, size) in GGML_QUANT_SIZES.items()
}

# Types the sdq kernels compute with (sdq.kernels). Anatomy lists every type in QUANTS.
SUPPORTED_COMPUTE: frozenset[GGMLQuantizationType] = frozenset(
    {Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_K, Q.Q5_K, Q.Q6_K}
)


def qtype_of(value: int | str | GGMLQuantizationType) -> GGMLQuantizationType:
    """A quant type from its GGML value or name ("Q4_K"); GGUFError if unknown."""
    if isinstance(value, GGMLQuantizationType):
        return value
    try:
        if isinstance(value, str):
            return GGMLQuantizationType[value.upper()]
        return GGMLQuantizationType(int(value))
    except (KeyError, ValueError):
        raise GGUFError(f"unknown GGML quant type {value!r}") from None


def facts(qtype: GGMLQuantizationType, what: str = "tensor") -> QuantFacts:
    try:
        return QUANTS[qtype]
    except KeyError:
        raise GGUFError(f"{what}: quant type {qtype!r} has no block size") from None


def row_bytes(qtype: GGMLQuantizationType, cols: int, what: str = "tensor") -> int:
    """Bytes of one row of `cols` values; GGUFError when cols is not whole blocks."""
    block, size = facts(qtype, what)
    if cols < 0 or cols % block:
        raise GGUFError(
            f"{what}: row length {cols} is not a multiple of the {qtype.name} block size {block}"
        )
    return cols // block * size


def tensor_bytes(qtype: GGMLQuantizationType, shape: Sequence[int], what: str = "tensor") -> int:
    """Bytes of a tensor of ggml shape (ne0 = row length, ne1, ne2, ...)."""
    if not shape:
        raise GGUFError(f"{what}: tensor has no dimensions")
    n_rows = 1
    for n in shape[1:]:
        n_rows *= int(n)
    return row_bytes(qtype, int(shape[0]), what) * n_rows


def is_plain(qtype: GGMLQuantizationType) -> bool:
    """Types stored one value per element (F32, F16, BF16, integers), not in blocks."""
    return QUANTS[qtype].block_size == 1
