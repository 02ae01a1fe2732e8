"""Bad input to `sdq info`: one line on stderr, exit code 2, never a traceback."""

import json
import struct
import subprocess
import sys

import gguf
import pytest
from gguf_builders import Layout, Q, write_model

from sdq.cli import main


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path, _ = write_model(tmp_path_factory.mktemp("good") / "good.gguf", Layout())
    return path


def fails(capsys, *argv):
    """Run `sdq info ...`; assert exit 2 and a single-line error; return the message."""
    rc = main(["info", *map(str, argv)])
    captured = capsys.readouterr()
    assert rc == 2, captured
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("sdq info: error: ")
    assert "Traceback" not in captured.err and captured.out == ""
    return lines[0]


def patched(good, tmp_path, edit):
    data = bytearray(good.read_bytes())
    edit(data)
    out = tmp_path / "bad.gguf"
    out.write_bytes(bytes(data))
    return out


def tensor_entry(data: bytearray, name: str) -> int:
    """Offset of the n_dims field of a tensor's directory entry."""
    key = struct.pack("<Q", len(name)) + name.encode()
    return data.index(key) + len(key)


def test_not_a_gguf(capsys, tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("hello, this is not a model\n")
    assert "not a GGUF file (magic b'hell'" in fails(capsys, text)


def test_directory_missing_and_empty(capsys, tmp_path):
    assert "is a directory" in fails(capsys, tmp_path)
    assert "no such file" in fails(capsys, tmp_path / "absent.gguf")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    assert "not a GGUF file (only 0 bytes)" in fails(capsys, empty)


def test_truncated_header(capsys, good, tmp_path):
    short = tmp_path / "short.gguf"
    short.write_bytes(good.read_bytes()[:700])
    msg = fails(capsys, short)
    assert "truncated GGUF header" in msg and "file is 700 bytes" in msg


def test_tensor_data_beyond_end_of_file(capsys, good, tmp_path):
    data = good.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 5000])
    msg = fails(capsys, cut)
    assert "data ends at byte" in msg and "beyond the end of the file" in msg
    assert f"({len(data) - 5000} bytes)" in msg and "tensor output.weight" in msg


def test_dense_model_asked_for_experts(capsys, tmp_path):
    path, _ = write_model(tmp_path / "dense.gguf", Layout(arch="llama", n_expert=0))
    assert main(["info", str(path)]) == 0  # the anatomy of a dense model is fine
    capsys.readouterr()
    msg = fails(capsys, path, "--check")
    assert msg.endswith("dense.gguf has no routed experts (arch llama, 0 *_exps tensors)")


def test_unknown_architecture(capsys, tmp_path):
    path, _ = write_model(tmp_path / "bert.gguf", Layout(arch="bert"))
    msg = fails(capsys, path, "--check")  # without --check: the header's anatomy, exit 0
    assert "architecture 'bert'" in msg and "qwen3moe" in msg


def test_unsupported_quant_type(capsys, tmp_path):
    path, _ = write_model(
        tmp_path / "q2k.gguf",
        Layout(n_embd=256, expert_ffn=256, expert_qtypes=(Q.Q2_K, Q.Q2_K, Q.Q3_K)),
    )
    assert main(["info", str(path), "--json"]) == 0  # anatomy lists it
    info = json.loads(capsys.readouterr().out)
    assert info["unsupported_compute"] == ["Q2_K", "Q3_K"]
    assert info["experts"]["segments"][0]["qtype"] == "Q2_K"
    msg = fails(capsys, path, "--check")
    assert "ffn_gate_exps.weight is Q2_K, which sdq cannot compute" in msg


def test_misaligned_row_length(capsys, good, tmp_path):
    def edit(data):
        at = tensor_entry(data, "blk.0.ffn_up_exps.weight")
        n_dims, ne0 = struct.unpack_from("<IQ", data, at)
        assert (n_dims, ne0) == (3, 64)
        struct.pack_into("<Q", data, at + 4, 48)

    msg = fails(capsys, patched(good, tmp_path, edit))
    assert "tensor blk.0.ffn_up_exps.weight: row length 48" in msg and "block size 32" in msg


def test_unknown_ggml_type(capsys, good, tmp_path):
    def edit(data):
        at = tensor_entry(data, "blk.0.ffn_down_exps.weight")
        (n_dims,) = struct.unpack_from("<I", data, at)
        struct.pack_into("<I", data, at + 4 + 8 * n_dims, 99)

    msg = fails(capsys, patched(good, tmp_path, edit))
    assert "unknown GGML quant type 99 of" in msg and "tensor blk.0.ffn_down_exps.weight" in msg


def test_unsupported_version_and_missing_key(capsys, good, tmp_path):
    msg = fails(capsys, patched(good, tmp_path, lambda d: struct.pack_into("<I", d, 4, 7)))
    assert "GGUF version 7 is not supported" in msg

    def rename_key(data):
        at = data.index(b"qwen3moe.block_count")
        data[at : at + 20] = b"qwen3moe.block_cOunt"

    msg = fails(capsys, patched(good, tmp_path, rename_key))
    assert "metadata key qwen3moe.block_count is missing" in msg


def test_split_shard(capsys, tmp_path):
    vt = gguf.GGUFValueType
    layout = Layout(extra_kv={"split.count": (3, vt.UINT16), "split.no": (0, vt.UINT16)})
    path, _ = write_model(tmp_path / "model-00001-of-00003.gguf", layout)
    assert "one shard of a split GGUF (split.count 3)" in fails(capsys, path)


def test_process_exit_code_and_stderr(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    proc = subprocess.run(
        [sys.executable, "-m", "sdq", "info", str(bad)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("sdq info: error: ")
