"""The quant table: gguf's numbers, one qtype_of, row and tensor sizes, and the kernels'
block constants taken from it."""

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from sdq.errors import GGUFError, UnsupportedError
from sdq.format.quants import (
    QUANTS,
    SUPPORTED_COMPUTE,
    block_facts,
    qtype_of,
    row_bytes,
    tensor_bytes,
)

Q = GGMLQuantizationType


def test_table_is_gguf_constants():
    assert set(QUANTS) == set(GGML_QUANT_SIZES)
    for qtype, (block, size) in GGML_QUANT_SIZES.items():
        assert QUANTS[qtype] == (block, size)
        assert QUANTS[qtype].block_size == block and QUANTS[qtype].type_size == size


def test_supported_types_agree_with_gguf():
    assert SUPPORTED_COMPUTE <= set(QUANTS)
    for qtype in SUPPORTED_COMPUTE:
        block, size = GGML_QUANT_SIZES[qtype]
        assert block_facts(qtype) == (block, size), qtype.name
        assert row_bytes(qtype, 3 * block) == 3 * size


def test_kernel_block_constants_come_from_the_table():
    from sdq.kernels import quant

    assert (quant.QK8_0, quant.Q8_0_BYTES) == block_facts(Q.Q8_0) == (32, 34)
    assert (quant.QK4_0, quant.Q4_0_BYTES) == block_facts(Q.Q4_0) == (32, 18)
    assert (quant.QK_K, quant.Q4_K_BYTES) == block_facts(Q.Q4_K) == (256, 144)
    assert (quant.QK_K, quant.Q5_K_BYTES) == block_facts(Q.Q5_K) == (256, 176)
    assert (quant.QK_K, quant.Q6_K_BYTES) == block_facts(Q.Q6_K) == (256, 210)
    assert quant.QK_K == block_facts(Q.Q8_K).block_size  # the K-quants' activation blocks
    constants = ("QK_K", "QK8_0", "QK4_0", "Q8_0_BYTES", "Q4_0_BYTES", "Q4_K_BYTES", "Q5_K_BYTES")
    for name in (*constants, "Q6_K_BYTES"):  # plain ints: Numba compiles them as constants
        assert type(getattr(quant, name)) is int


def test_kernels_keep_no_copy_of_the_quant_facts():
    """No kernel module defines its own quant helpers or types a block's byte size."""
    import ast
    import importlib
    from pathlib import Path

    import sdq.format.quants as table
    import sdq.kernels

    block_bytes = {
        block_facts(q).type_size for q in SUPPORTED_COMPUTE if block_facts(q).block_size > 1
    }
    for path in sorted(Path(sdq.kernels.__file__).parent.glob("*.py")):
        module = importlib.import_module(f"sdq.kernels.{path.stem}")
        for name in ("qtype_of", "block_facts", "row_bytes", "tensor_bytes", "SUPPORTED_COMPUTE"):
            assert getattr(module, name, getattr(table, name)) is getattr(table, name), name
        assert not hasattr(module, "SUPPORTED") and not hasattr(module, "row_nbytes")
        literals = [
            (node.lineno, node.value)
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant)
            and type(node.value) is int
            and node.value in block_bytes
        ]
        assert not literals, f"{path.name}: block byte sizes typed as literals at {literals}"


def test_seed_segment_sizes():
    # seed 000 section 2: n_embd 2048, expert FFN 512; gate/up Q4_K, down Q5_K
    assert row_bytes(Q.Q4_K, 2048) == 1152
    assert tensor_bytes(Q.Q4_K, (2048, 512)) == 589_824
    assert tensor_bytes(Q.Q5_K, (512, 2048)) == 720_896


def test_row_and_tensor_bytes():
    assert row_bytes(Q.F32, 7) == 28
    assert row_bytes(Q.F16, 7) == 14
    assert row_bytes(Q.Q8_0, 64) == 68
    assert tensor_bytes(Q.Q8_0, (64, 3, 5)) == 68 * 15
    assert tensor_bytes(Q.Q6_K, (256,)) == 210


def test_misaligned_row_names_tensor_and_numbers():
    with pytest.raises(GGUFError) as err:
        tensor_bytes(Q.Q4_K, (100, 4), what="tensor blk.0.ffn_up_exps.weight")
    msg = str(err.value)
    assert "blk.0.ffn_up_exps.weight" in msg and "100" in msg and "256" in msg and "Q4_K" in msg


def test_qtype_of():
    assert qtype_of("q4_k") is Q.Q4_K
    assert qtype_of(8) is Q.Q8_0
    assert qtype_of(np.int32(12)) is Q.Q4_K
    assert qtype_of(Q.F16) is Q.F16
    assert qtype_of(Q.Q2_K) is Q.Q2_K  # sized and read, though not computed with
    with pytest.raises(GGUFError, match="unknown GGML quant type 4"):
        qtype_of(4)  # Q4_2, removed from GGML
    with pytest.raises(GGUFError):
        qtype_of("Q9_X")
    with pytest.raises(GGUFError, match=r"unknown GGML quant type 99 of tensor blk\.3\.x"):
        qtype_of(99, "tensor blk.3.x", compute=True)


def test_qtype_of_compute_names_type_tensor_and_supported():
    for qtype in SUPPORTED_COMPUTE:
        assert qtype_of(int(qtype), compute=True) is qtype
        assert qtype_of(qtype.name.lower(), compute=True) is qtype
    with pytest.raises(UnsupportedError) as err:
        qtype_of(Q.Q3_K, "tensor blk.0.ffn_down_exps.weight", compute=True)
    msg = str(err.value)
    assert "Q3_K of tensor blk.0.ffn_down_exps.weight" in msg
    assert all(q.name in msg for q in SUPPORTED_COMPUTE)


def test_supported_compute_and_plain():
    assert SUPPORTED_COMPUTE == {
        Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.MXFP4
    }  # fmt: skip
    assert block_facts(Q.F32).block_size == block_facts(Q.BF16).block_size == 1
    assert block_facts(Q.Q8_0).block_size == 32
