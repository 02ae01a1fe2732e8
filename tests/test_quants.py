import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from sdq.errors import GGUFError
from sdq.format.quants import QUANTS, SUPPORTED_COMPUTE, is_plain, qtype_of, row_bytes, tensor_bytes

Q = GGMLQuantizationType


def test_table_is_gguf_constants():
    assert set(QUANTS) == set(GGML_QUANT_SIZES)
    for qtype, (block, size) in GGML_QUANT_SIZES.items():
        assert QUANTS[qtype] == (block, size)
        assert QUANTS[qtype].block_size == block and QUANTS[qtype].type_size == size


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
    assert qtype_of(Q.F16) is Q.F16
    with pytest.raises(GGUFError, match="unknown GGML quant type 4"):
        qtype_of(4)  # Q4_2, removed from GGML
    with pytest.raises(GGUFError):
        qtype_of("Q9_X")


def test_supported_compute_and_plain():
    assert SUPPORTED_COMPUTE == {Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_K, Q.Q5_K, Q.Q6_K}
    assert is_plain(Q.F32) and is_plain(Q.BF16) and not is_plain(Q.Q8_0)
