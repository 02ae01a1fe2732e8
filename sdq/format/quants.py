"""Quant facts: the one table of GGML quant types, their block sizes and bytes per block.

Built from `gguf.constants.GGML_QUANT_SIZES` (the gguf package is the source of truth; no
number is retyped here). A quantized row of `cols` values is `cols / block_size` blocks of
`type_size` bytes each; a row length that is not a whole number of blocks is an error.

Two sets of types, for two uses:

- every type in ``QUANTS`` (all that gguf knows) can be sized and read: the tensor
  directory, the anatomy, the RAM plan and the pager work with any of them;
- ``SUPPORTED_COMPUTE`` is the subset the kernels (sdq.kernels) compute with;
  ``qtype_of(..., compute=True)`` rejects the others.

Which activation format each weight type is multiplied with is ggml's CPU backend's choice
(its ``vec_dot_type``), not a file-format fact: it lives in sdq.kernels.act_quant.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from sdq.errors import GGUFError, UnsupportedError

Q = GGMLQuantizationType


class QuantFacts(NamedTuple):
    """One quant type's block, with gguf's field names."""

    block_size: int  # values per block (1 for plain types: F32, F16, BF16, integers)
    type_size: int  # bytes per block


QUANTS: dict[GGMLQuantizationType, QuantFacts] = {
    qtype: QuantFacts(int(block), int(size)) for qtype, (block, size) in GGML_QUANT_SIZES.items()
}

# Types the sdq kernels compute with (a subset of QUANTS).
SUPPORTED_COMPUTE: frozenset[GGMLQuantizationType] = frozenset(
    {Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.MXFP4}
)  # MXFP4: gpt-oss experts only (sdq.kernels.mxfp4)

# GGML value -> type, for the common case (an enum member or int): one dict lookup, as the
# kernels normalise a type once per matrix product. IntEnum members hash as their values.
_BY_VALUE: dict[int, GGMLQuantizationType] = {int(qtype): qtype for qtype in QUANTS}


def _of_tensor(what: str | None) -> str:
    return f" of {what}" if what else ""


def qtype_of(
    value: int | str | GGMLQuantizationType, what: str | None = None, *, compute: bool = False
) -> GGMLQuantizationType:
    """A quant type from its GGML value, enum member or name ("Q4_K", "q4_k").

    GGUFError if gguf knows no such type. ``compute=True``: also UnsupportedError unless the
    kernels compute with it (SUPPORTED_COMPUTE). ``what`` names the tensor in the errors
    (e.g. "tensor blk.0.ffn_down_exps.weight")."""
    try:
        qtype = None if isinstance(value, str) else _BY_VALUE.get(value)
    except TypeError:  # unhashable: not a type value
        qtype = None
    if qtype is None:
        try:
            qtype = Q[value.upper()] if isinstance(value, str) else Q(int(value))
        except (KeyError, ValueError, TypeError):
            raise GGUFError(f"unknown GGML quant type {value!r}{_of_tensor(what)}") from None
    if compute and qtype not in SUPPORTED_COMPUTE:
        names = ", ".join(sorted(q.name for q in SUPPORTED_COMPUTE))
        raise UnsupportedError(
            f"quant type {qtype.name}{_of_tensor(what)} is not supported by the kernels "
            f"(supported: {names})"
        )
    return qtype


def block_facts(qtype: GGMLQuantizationType, what: str = "tensor") -> QuantFacts:
    """(values per block, bytes per block) of a quant type; GGUFError if it has none."""
    try:
        return QUANTS[qtype]
    except KeyError:
        raise GGUFError(f"{what}: quant type {qtype!r} has no block size") from None


def row_bytes(qtype: GGMLQuantizationType, cols: int, what: str = "tensor") -> int:
    """Bytes of one row of `cols` values; GGUFError when cols is not whole blocks."""
    block, size = block_facts(qtype, what)
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
