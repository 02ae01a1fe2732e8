"""The GGUF header: key/value metadata and the tensor directory, read without touching tensor data.

Layout (GGUF v2/v3, little-endian): magic "GGUF", u32 version, u64 tensor count, u64 KV count,
the KVs (string key, u32 value type, value), one entry per tensor (string name, u32 n_dims,
u64 dims[n_dims] in ggml order, u32 GGML type, u64 offset relative to the data section), then
padding to `general.alignment` (default 32) and the data section.

Why not `gguf.GGUFReader`: it builds one NumPy view per array element of the metadata, which
takes tens of seconds for a 151,936-token vocabulary (tokens, token types and merges). This
reader walks the same bytes with `struct` on a read-only mmap and decodes numeric arrays in one
NumPy call, so opening a model costs well under a second. Tests check that both readers agree.

Every read is bounds-checked: a short or corrupt header raises GGUFError naming the offset,
what was being read and the file size; nothing here raises anything else.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUFValueType

from sdq.errors import GGUFError, UnsupportedError

V = GGUFValueType

# value type -> (struct format, size) for scalars; numpy dtype for arrays
_SCALARS: dict[GGUFValueType, tuple[str, int]] = {
    V.UINT8: ("<B", 1),
    V.INT8: ("<b", 1),
    V.UINT16: ("<H", 2),
    V.INT16: ("<h", 2),
    V.UINT32: ("<I", 4),
    V.INT32: ("<i", 4),
    V.FLOAT32: ("<f", 4),
    V.BOOL: ("<?", 1),
    V.UINT64: ("<Q", 8),
    V.INT64: ("<q", 8),
    V.FLOAT64: ("<d", 8),
}
_ARRAY_DTYPES: dict[GGUFValueType, str] = {
    V.UINT8: "<u1",
    V.INT8: "<i1",
    V.UINT16: "<u2",
    V.INT16: "<i2",
    V.UINT32: "<u4",
    V.INT32: "<i4",
    V.FLOAT32: "<f4",
    V.BOOL: "<u1",
    V.UINT64: "<u8",
    V.INT64: "<i8",
    V.FLOAT64: "<f8",
}
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_NESTING = 4
# Bounds on what a header may ask this reader to build, checked before building it, so that a
# damaged or hostile file costs little memory whatever its counts and lengths say (a sparse
# file can be terabytes long). Real headers are far inside them: the largest vocabularies have
# a few hundred thousand tokens, and a whole header with its vocabulary is some tens of MB.
MAX_HEADER_BYTES = 64 * 2**20  # metadata and tensor directory together
MAX_ARRAY_ITEMS = 2**22  # items of one metadata array
MAX_TENSORS = 2**20
MAX_KV = 2**20
SUPPORTED_VERSIONS = (2, 3)


@dataclass(frozen=True)
class RawTensor:
    """One tensor directory entry, as stored."""

    name: str
    dims: tuple[int, ...]  # ggml order: dims[0] = row length
    type_value: int  # GGML type number (validated by the caller against the quant table)
    rel_offset: int  # from the start of the data section


@dataclass(frozen=True)
class Header:
    path: Path
    version: int
    file_size: int
    metadata: dict[str, Any]
    value_types: dict[str, GGUFValueType]  # type of each metadata value (ARRAY for lists)
    tensors: list[RawTensor]
    alignment: int
    data_offset: int  # absolute offset of the data section


class _Short(Exception):
    """Internal: a read ran past the end of the file."""

    def __init__(self, offset: int, need: int, what: str):
        self.offset, self.need, self.what = offset, need, what


class _TooLarge(_Short):
    """Internal: a read would take the header past MAX_HEADER_BYTES."""


class _Cursor:
    """Bounds-checked little-endian reads from a buffer."""

    def __init__(self, path: Path, buf, size: int):
        self.path, self.buf, self.size, self.pos = path, buf, size, 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise _Short(self.pos, n, what)
        if self.pos + n > MAX_HEADER_BYTES:
            raise _TooLarge(self.pos, n, what)

    def scalar(self, vtype: GGUFValueType, what: str):
        fmt, n = _SCALARS[vtype]
        self.need(n, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def u32(self, what: str) -> int:
        return self.scalar(V.UINT32, what)

    def u64(self, what: str) -> int:
        return self.scalar(V.UINT64, what)

    def raw_string(self, what: str) -> bytes:
        n = self.u64(f"length of {what}")
        self.need(n, what)
        data = self.buf[self.pos : self.pos + n]
        self.pos += n
        return data

    def text(self, what: str) -> str:
        data = self.raw_string(what)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            at = self.pos - len(data)
            raise GGUFError(f"{self.path}: {what} at offset {at} is not UTF-8") from None


def _value_type(cur: _Cursor, raw: int, key: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise GGUFError(f"{cur.path}: metadata {key}: unknown value type {raw}") from None


def _read_value(cur: _Cursor, vtype: GGUFValueType, key: str, depth: int = 0) -> Any:
    if vtype == V.STRING:
        # metadata strings are UTF-8 by the spec; keep odd bytes recoverable instead of failing
        return cur.raw_string(f"value of {key}").decode("utf-8", "surrogateescape")
    if vtype != V.ARRAY:
        return cur.scalar(vtype, f"value of {key}")
    if depth >= MAX_ARRAY_NESTING:
        raise GGUFError(
            f"{cur.path}: metadata {key}: arrays nested deeper than {MAX_ARRAY_NESTING}"
        )
    item_type = _value_type(cur, cur.u32(f"array type of {key}"), key)
    count = cur.u64(f"array length of {key}")
    if count > MAX_ARRAY_ITEMS:
        raise GGUFError(
            f"{cur.path}: metadata {key}: array of {count} items (this reader takes up to "
            f"{MAX_ARRAY_ITEMS})"
        )
    if item_type in _ARRAY_DTYPES:
        dtype = np.dtype(_ARRAY_DTYPES[item_type])
        cur.need(count * dtype.itemsize, f"{count} array items of {key}")
        start = cur.pos
        cur.pos += count * dtype.itemsize
        values = np.frombuffer(cur.buf[start : cur.pos], dtype=dtype).tolist()
        return [v != 0 for v in values] if item_type == V.BOOL else values
    # strings need at least 8 bytes each, nested arrays 12: refuse absurd counts before looping
    cur.need(count * (8 if item_type == V.STRING else 12), f"{count} array items of {key}")
    if item_type == V.STRING:
        buf, pos, size, out = cur.buf, cur.pos, cur.size, []
        unpack, append = struct.Struct("<Q").unpack_from, out.append
        for _ in range(count):
            if pos + 8 > size:
                raise _Short(pos, 8, f"string length in {key}")
            (n,) = unpack(buf, pos)
            pos += 8
            if pos + n > size:
                raise _Short(pos, n, f"string in {key}")
            if pos + n > MAX_HEADER_BYTES:
                raise _TooLarge(pos, n, f"string in {key}")
            append(buf[pos : pos + n].decode("utf-8", "surrogateescape"))
            pos += n
        cur.pos = pos
        return out
    return [_read_value(cur, item_type, key, depth + 1) for _ in range(count)]


def read_header(path: str | os.PathLike) -> Header:
    """Parse a GGUF file's header. GGUFError (or UnsupportedError) with a one-line message."""
    path = Path(path)
    try:
        with open(path, "rb", opener=_open_nonblocking) as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):  # a FIFO, a device: never wait on one
                raise GGUFError(f"{path}: not a regular file")
            size = st.st_size
            if size < 4:
                raise GGUFError(f"{path}: not a GGUF file (only {size} bytes)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(path, buf, size)
    except IsADirectoryError:
        raise GGUFError(f"{path}: is a directory, not a GGUF file") from None
    except FileNotFoundError:
        raise GGUFError(f"{path}: no such file") from None
    except PermissionError:
        raise GGUFError(f"{path}: permission denied") from None
    except OSError as exc:
        raise GGUFError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except _TooLarge as s:
        raise GGUFError(
            f"{path}: GGUF header larger than {MAX_HEADER_BYTES} bytes: {s.what} needs {s.need}"
            f" bytes at offset {s.offset}"
        ) from None
    except _Short as s:
        raise GGUFError(
            f"{path}: truncated GGUF header: {s.what} needs {s.need} bytes at offset {s.offset},"
            f" file is {size} bytes"
        ) from None


def _open_nonblocking(path, flags: int) -> int:
    """os.open that returns at once for a FIFO with no writer (a plain open waits for one)."""
    return os.open(path, flags | os.O_NONBLOCK)


def _parse(path: Path, buf, size: int) -> Header:
    cur = _Cursor(path, buf, size)
    magic = cur.scalar(V.UINT32, "magic")
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (magic {bytes(buf[:4])!r}, expected b'GGUF')")
    version = cur.u32("version")
    if version & 0xFFFF == 0 and version:
        raise UnsupportedError(f"{path}: big-endian GGUF files are not supported")
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedError(f"{path}: GGUF version {version} is not supported (2 or 3)")
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata count")
    for what, count, most in (("tensors", n_tensors, MAX_TENSORS), ("metadata", n_kv, MAX_KV)):
        if count > most:
            raise GGUFError(f"{path}: {count} {what} entries (this reader takes up to {most})")
    # each KV needs >= 13 bytes (key length, type, 1-byte value); each tensor entry >= 28
    cur.need(n_kv * 13 + n_tensors * 28, f"{n_kv} metadata entries and {n_tensors} tensor entries")

    metadata: dict[str, Any] = {}
    value_types: dict[str, GGUFValueType] = {}
    for i in range(n_kv):
        key = cur.text(f"metadata key #{i}")
        vtype = _value_type(cur, cur.u32(f"value type of {key}"), key)
        if key in metadata:
            raise GGUFError(f"{path}: metadata key {key!r} appears twice")
        metadata[key] = _read_value(cur, vtype, key)
        value_types[key] = vtype

    tensors: list[RawTensor] = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = cur.text(f"name of tensor #{i}")
        if name in names:
            raise GGUFError(f"{path}: tensor {name!r} appears twice")
        names.add(name)
        n_dims = cur.u32(f"dimension count of {name}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise GGUFError(f"{path}: tensor {name} has {n_dims} dimensions (1..{MAX_DIMS})")
        cur.need(8 * n_dims, f"dimensions of {name}")
        dims = struct.unpack_from(f"<{n_dims}Q", buf, cur.pos)
        cur.pos += 8 * n_dims
        n_elements = 1
        for d in dims:
            n_elements *= d
        if n_elements == 0 or n_elements >= 1 << 62:
            raise GGUFError(f"{path}: tensor {name} has shape {list(dims)}")
        type_value = cur.u32(f"type of {name}")
        rel_offset = cur.u64(f"offset of {name}")
        tensors.append(RawTensor(name, tuple(int(d) for d in dims), type_value, rel_offset))

    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if (
        value_types.get("general.alignment", V.UINT32) != V.UINT32
        or alignment <= 0
        or alignment & (alignment - 1)
    ):
        raise GGUFError(f"{path}: general.alignment {alignment!r} is not a power of two (u32)")
    data_offset = -(-cur.pos // alignment) * alignment
    return Header(path, version, size, metadata, value_types, tensors, alignment, data_offset)
