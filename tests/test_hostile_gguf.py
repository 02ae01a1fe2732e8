"""Hostile GGUF headers: counts, lengths, dimensions, offsets and alignments chosen to exhaust
memory or overflow are refused with a one-line GGUFError before any large allocation.

Some files are sparse and terabytes long, so that a count or a length passes the check against
the file size and only the reader's own bounds stand between it and a huge allocation. All the
files are opened in one child process whose peak resident set is measured (getrusage): it must
stay within a few MB of what the process held before the first file.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap

import pytest
from gguf import GGUFValueType
from gguf_builders import Layout, write_model

from sdq.cli import main

V = GGUFValueType
TB = 2**40


def s(text: bytes) -> bytes:
    """A GGUF string: u64 length, bytes."""
    return struct.pack("<Q", len(text)) + text


def kv(key: bytes, vtype: V, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def header(n_tensors: int, n_kv: int, body: bytes = b"") -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + body


def tensor(name: bytes, dims: list[int], ggml_type: int = 0, offset: int = 0) -> bytes:
    return s(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, ggml_type, offset)


def arch_kv() -> bytes:
    return kv(b"general.architecture", V.STRING, s(b"qwen3moe"))


# name -> (file bytes, sparse length or 0, words the one-line message must hold)
CASES = {
    "2^40 tensors": (header(2**40, 0), 0, "1099511627776 tensors entries"),
    "2^40 tensors, sparse 2 TB": (header(2**40, 0), 2 * TB, "up to 1048576"),
    "2^40 metadata entries": (header(0, 2**40), 0, "1099511627776 metadata entries"),
    "2^62-byte key": (header(0, 1, struct.pack("<Q", 2**62)), 0, "truncated GGUF header"),
    "2^62-byte string, sparse 2 TB": (
        header(0, 1, s(b"k") + struct.pack("<IQ", V.STRING, 2**62)),
        2 * TB,
        "truncated GGUF header",
    ),
    "2^40-byte string, sparse 2 TB": (
        header(0, 1, s(b"k") + struct.pack("<IQ", V.STRING, 2**40)),
        2 * TB,
        "header larger than",
    ),
    "2^50-item u8 array": (
        header(0, 1, s(b"k") + struct.pack("<IIQ", V.ARRAY, V.UINT8, 2**50)),
        0,
        "array of 1125899906842624 items",
    ),
    "2^30-item u64 array, sparse 2 TB": (
        header(0, 1, s(b"k") + struct.pack("<IIQ", V.ARRAY, V.UINT64, 2**30)),
        2 * TB,
        "array of 1073741824 items",
    ),
    "2^22 strings of 2^30 bytes, sparse 2 TB": (
        header(0, 1, s(b"k") + struct.pack("<IIQQ", V.ARRAY, V.STRING, 2**22, 2**30)),
        2 * TB,
        "header larger than",
    ),
    "arrays nested 5 deep": (
        header(0, 1, s(b"k") + struct.pack("<I", V.ARRAY) + struct.pack("<IQ", V.ARRAY, 1) * 5),
        0,
        "nested deeper than 4",
    ),
    "dimensions whose product overflows int64": (
        header(1, 1, arch_kv() + tensor(b"t", [2**32, 2**32, 2**32, 2])),
        0,
        "tensor t has shape",
    ),
    "a dimension of 2^64-1": (
        header(1, 1, arch_kv() + tensor(b"t", [2**64 - 1])),
        0,
        "tensor t has shape",
    ),
    "alignment 0": (
        header(0, 1, kv(b"general.alignment", V.UINT32, struct.pack("<I", 0))),
        0,
        "general.alignment 0 is not a power of two",
    ),
    "alignment 48": (
        header(0, 1, kv(b"general.alignment", V.UINT32, struct.pack("<I", 48))),
        0,
        "general.alignment 48 is not a power of two",
    ),
    "alignment as a string": (
        header(0, 1, kv(b"general.alignment", V.STRING, s(b"32"))),
        0,
        "general.alignment '32' is not a power of two",
    ),
    "unknown value type": (header(0, 1, s(b"k") + struct.pack("<I", 99)), 0, "value type 99"),
}

CHILD = textwrap.dedent(
    """
    import json, os, resource, sys
    from sdq.errors import SdqError
    from sdq.format.model import open_model

    def peak_kb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    open_model(sys.argv[1]).close()  # a valid file first: every import and cache warmed
    before, results = peak_kb(), {}
    for path in sys.argv[2:]:
        try:
            open_model(path).close()
            results[path] = ["opened", ""]
        except SdqError as exc:
            results[path] = [type(exc).__name__, str(exc)]
    print(json.dumps({"before_kb": before, "after_kb": peak_kb(), "results": results}))
    """
)


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path, _ = write_model(tmp_path_factory.mktemp("good") / "good.gguf", Layout())
    return path


def tensor_entry(data: bytearray, name: str) -> int:
    """Offset of the n_dims field of a tensor's directory entry."""
    key = struct.pack("<Q", len(name)) + name.encode()
    return data.index(key) + len(key)


def set_offset(data: bytearray, name: str, rel_offset: int) -> None:
    at = tensor_entry(data, name)
    (n_dims,) = struct.unpack_from("<I", data, at)
    struct.pack_into("<Q", data, at + 4 + 8 * n_dims + 4, rel_offset)


def offset_of(data: bytes, name: str) -> int:
    at = tensor_entry(bytearray(data), name)
    (n_dims,) = struct.unpack_from("<I", data, at)
    return struct.unpack_from("<Q", data, at + 4 + 8 * n_dims + 4)[0]


def model_cases(good) -> dict:
    """Damaged copies of a valid model: offsets past the end, overlapping, unaligned."""
    data = good.read_bytes()
    out = {}
    for label, name, value, words in (
        ("offset 2^63", "output.weight", 2**63, "beyond the end of the file"),
        ("offset 2^64-32", "output.weight", 2**64 - 32, "beyond the end of the file"),
        ("offset just past the end", "output.weight", len(data), "beyond the end of the file"),
        ("offset not aligned", "output.weight", 8, "is not a multiple of the alignment 32"),
        (
            "overlapping tensors",
            "blk.0.ffn_up_exps.weight",
            offset_of(data, "blk.0.ffn_gate_exps.weight"),
            "overlap",
        ),
    ):
        edited = bytearray(data)
        set_offset(edited, name, value)
        out[label] = (bytes(edited), 0, words)
    return out


def test_hostile_headers_are_refused_in_little_memory(good, tmp_path):
    cases = {**CASES, **model_cases(good)}
    paths = {}
    for i, (label, (data, sparse, _)) in enumerate(cases.items()):
        path = tmp_path / f"case{i}.gguf"
        with open(path, "wb") as f:
            f.write(data)
            if sparse:
                f.truncate(sparse)  # a hole: no disk used
        paths[str(path)] = label
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(good), *paths],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    for path, (kind, message) in report["results"].items():
        label = paths[path]
        words = cases[label][2]
        assert kind == "GGUFError", (label, kind, message)
        assert words in message and "\n" not in message, (label, message)
    grown_mb = (report["after_kb"] - report["before_kb"]) / 1024
    assert grown_mb < 16, f"opening the hostile files grew the peak RSS by {grown_mb:.1f} MB"


def test_a_hostile_file_through_the_cli_is_one_line(tmp_path, capsys):
    path = tmp_path / "huge-array.gguf"
    with open(path, "wb") as f:
        f.write(header(0, 1, s(b"k") + struct.pack("<IIQ", V.ARRAY, V.UINT64, 2**30)))
        f.truncate(2 * TB)
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sdq info: error: ")
    assert "array of 1073741824 items (this reader takes up to 4194304)" in err
