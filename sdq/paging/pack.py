"""One read per expert: the pack, a sidecar file that stores each routed expert in one piece.

Dimension key: L MoE layers (ExpertTable rows), E experts per layer, P = 3 parts (gate, up,
down).

A GGUF stores a layer's experts as three tensors, so one expert is three ranges far apart in
the file and the pager reads it with three requests. `sdq pack MODEL` copies every routed
expert into `MODEL.sdqpack` (beside the model, or `-o PATH`):

    [0, data_offset)   header: b"SDQPACK\\0", a little-endian uint32 n, n bytes of JSON (below),
                       zeros up to data_offset (a multiple of 4096)
    data               row after row (MoE layer), one record per expert, in the row's order:
                       the expert at position j of row r starts at
                       data_offset + row_start[r] + j * record_bytes[r]

A record is gate | up | down, each part starting on a 4096-byte boundary (zeros between), and
record_bytes[r] = the down part's start + its bytes rounded up to 4096. So one aligned read of
record_bytes[r] fills a slot with the expert, O_DIRECT included, and the records of experts
next to each other in the order continue each other in the file: the pager's mode `merged`
reads several with one preadv.

The order. By default a row's experts are in id order; `write_pack(order=...)` takes any
permutation per row. `sdq pack --route-log` passes the co-activation chain of a route log
(sdq.analysis.coactivation), so experts one token uses together tend to sit side by side.

JSON: format, version, source (file name, size, SHA-256 of its header bytes and of a sample of
its expert bytes: the first 4 KiB of each expert tensor), layers, n_expert, nbytes [L][P],
starts [L][P] (a part's offset in a record), record_bytes [L], row_start [L], data_offset,
data_bytes, order [L][E] (the expert at each position) and order_from (what ordered it).

A pack belongs to one GGUF: `open_pack` refuses (PackError, one line) a pack whose source
fingerprint, layers or part sizes differ from the model's, or whose file is shorter than its
header says. `find_pack` is what a run uses: an explicit path must be a valid pack; the pack
found beside the model is used when valid and otherwise skipped with a one-line note.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sdq.errors import PackError, ParamsError

MAGIC = b"SDQPACK\0"
VERSION = 1
ALIGN = 4096
SUFFIX = ".sdqpack"
SAMPLE_BYTES = 4096
MAX_HEADER_BYTES = 64 << 20


def align_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def default_path(model_path) -> Path:
    """Where a model's pack lives unless told otherwise: beside it, `.sdqpack` appended."""
    return Path(str(model_path) + SUFFIX)


@dataclass(frozen=True)
class Pack:
    """An open, checked pack: where each expert's record lies, and the model's expert table
    re-pointed at them (`table`: offsets [L, E, P] into the pack file)."""

    path: Path
    table: object  # sdq.format.model.ExpertTable with offsets into the pack
    starts: tuple[tuple[int, int, int], ...]  # [L][P] a part's offset inside a record
    record_bytes: tuple[int, ...]  # [L]
    order: np.ndarray  # int64 [L, E]: the expert at each position
    order_from: str

    @property
    def position(self) -> np.ndarray:
        """int64 [L, E]: the position of each expert in its row (the inverse of `order`)."""
        return np.argsort(self.order, axis=1)

    @property
    def slot_bytes(self) -> int:
        return max(self.record_bytes)


# ------------------------------------------------------------------ the source's fingerprint


def source_fingerprint(model) -> dict:
    """Name, size and SHA-256 of the header and of a sample of the expert bytes of a GGUF."""
    table = model.require_experts()
    with open(model.path, "rb") as f:
        head = f.read(model.header.data_offset)
        sample = hashlib.sha256()
        for row in range(len(table.layers)):
            for p in range(3):
                n = min(SAMPLE_BYTES, int(table.nbytes[row, 0, p]))
                f.seek(int(table.offsets[row, 0, p]))
                sample.update(f.read(n))
    return {
        "name": Path(model.path).name,
        "size": int(os.stat(model.path).st_size),
        "header_sha256": hashlib.sha256(head).hexdigest(),
        "sample_sha256": sample.hexdigest(),
    }


# ------------------------------------------------------------------ layout


def record_layout(table) -> tuple[list[tuple[int, int, int]], list[int]]:
    """Per row: each part's offset in a record, and the record's bytes (module docstring)."""
    starts, records = [], []
    for row in range(len(table.layers)):
        n = [int(table.nbytes[row, :, p].max()) for p in range(3)]
        s = (0, align_up(n[0]), align_up(n[0]) + align_up(n[1]))
        starts.append(s)
        records.append(s[2] + align_up(n[2]))
    return starts, records


def _packed_table(table, data_offset, starts, records, position):
    """The expert table with each part's offset in the pack."""
    L = len(table.layers)
    row_start = np.zeros(L, dtype=np.int64)  # [L]
    row_start[1:] = np.cumsum(np.asarray(records[:-1], dtype=np.int64) * table.n_expert)
    rec = np.asarray(records, dtype=np.int64)  # [L]
    base = data_offset + row_start[:, None] + position * rec[:, None]  # [L, E]
    offsets = base[:, :, None] + np.asarray(starts, dtype=np.int64)[:, None, :]  # [L, E, P]
    return dataclasses.replace(table, offsets=offsets)


# ------------------------------------------------------------------ writing


def write_pack(model, out=None, order=None, order_from="expert id", progress=None) -> Path:
    """Writes the pack of `model` to `out` (default: beside the model) and returns its path.

    order: int [L, E], the expert at each position of each row (None: id order); order_from:
    what it came from, kept in the header. Written to `out`.tmp, flushed to disk and renamed,
    so no half pack is ever found. `progress(done_bytes, total_bytes)` is called after each
    row."""
    table = model.require_experts()
    out = Path(out) if out is not None else default_path(model.path)
    shape = (len(table.layers), table.n_expert)
    if order is None:
        order = np.tile(np.arange(table.n_expert, dtype=np.int64), (shape[0], 1))
    order = np.asarray(order, dtype=np.int64)  # [L, E]
    if order.shape != shape or not (np.sort(order, axis=1) == np.arange(shape[1])).all():
        raise PackError(f"pack order: expected a permutation of {shape[1]} experts per row")
    starts, records = record_layout(table)
    data_bytes = sum(r * table.n_expert for r in records)
    header = {
        "format": "sdq-pack",
        "version": VERSION,
        "source": source_fingerprint(model),
        "layers": list(table.layers),
        "n_expert": int(table.n_expert),
        "nbytes": table.nbytes.max(axis=1).tolist(),  # [L][P] (a row's experts are equal)
        "starts": [list(s) for s in starts],
        "record_bytes": records,
        "order": order.tolist(),
        "order_from": order_from,
        "data_bytes": int(data_bytes),
    }
    if not (table.nbytes == table.nbytes[:, :1, :]).all():
        raise PackError(f"{model.path}: experts of one layer differ in size; cannot pack")
    # the data starts at the first page boundary after the header, data_offset included
    data_offset = 0
    while True:
        blob = json.dumps({**header, "data_offset": data_offset}, separators=(",", ":")).encode()
        if data_offset >= len(MAGIC) + 4 + len(blob):
            break
        data_offset = align_up(len(MAGIC) + 4 + len(blob))
    total = data_offset + data_bytes
    out.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out.parent).free
    if free < total:
        raise PackError(
            f"{out}: the pack needs {total / 1e9:.2f} GB but {out.parent} has "
            f"{free / 1e9:.2f} GB free"
        )
    tmp = out.with_name(out.name + ".tmp")
    src = os.open(model.path, os.O_RDONLY)
    dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        head = MAGIC + struct.pack("<I", len(blob)) + blob
        _write_all(dst, head + bytes(data_offset - len(head)), tmp)
        done = 0
        for row in range(len(table.layers)):
            rec = bytearray(records[row])
            for e in order[row]:
                rec[:] = bytes(len(rec))
                for p in range(3):
                    off, n = int(table.offsets[row, e, p]), int(table.nbytes[row, e, p])
                    chunk = os.pread(src, n, off)
                    if len(chunk) != n:
                        raise PackError(
                            f"{model.path}: short read of layer {table.layers[row]} expert "
                            f"{e} part {p} at offset {off} ({len(chunk)} of {n} bytes)"
                        )
                    rec[starts[row][p] : starts[row][p] + n] = chunk
                _write_all(dst, rec, tmp)
            done += records[row] * table.n_expert
            if progress is not None:
                progress(done, data_bytes)
        os.fsync(dst)
    except BaseException:
        os.close(dst)
        os.close(src)
        tmp.unlink(missing_ok=True)
        raise
    os.close(dst)
    os.close(src)
    os.replace(tmp, out)
    return out


def _write_all(fd: int, data, path) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except OSError as exc:
            raise PackError(f"{path}: cannot write: {exc.strerror}") from None
        view = view[n:]


# ------------------------------------------------------------------ reading


def read_header(path) -> dict:
    """The pack's JSON header; PackError (naming the file) when it is not a pack."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            lead = f.read(len(MAGIC) + 4)
            if len(lead) < len(MAGIC) + 4 or lead[: len(MAGIC)] != MAGIC:
                raise PackError(f"{path}: not an sdq pack (no {MAGIC[:7].decode()} magic)")
            (n,) = struct.unpack("<I", lead[len(MAGIC) :])
            if n > MAX_HEADER_BYTES:
                raise PackError(f"{path}: header length {n} bytes exceeds {MAX_HEADER_BYTES}")
            blob = f.read(n)
    except OSError as exc:
        raise PackError(f"{path}: cannot read: {exc.strerror}") from None
    if len(blob) != n:
        raise PackError(f"{path}: header cut short ({len(blob)} of {n} bytes)")
    try:
        header = json.loads(blob)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PackError(f"{path}: header is not JSON ({exc})") from None
    if not isinstance(header, dict) or header.get("format") != "sdq-pack":
        raise PackError(f"{path}: header is not an sdq pack header")
    if header.get("version") != VERSION:
        raise PackError(f"{path}: pack version {header.get('version')!r}, expected {VERSION}")
    return header


def open_pack(model, path=None, fingerprint: dict | None = None) -> Pack:
    """The pack at `path` (default: beside the model), checked against `model`."""
    table = model.require_experts()
    path = Path(path) if path is not None else default_path(model.path)
    h = read_header(path)
    try:
        source = h["source"]
        layers, n_expert = [int(v) for v in h["layers"]], int(h["n_expert"])
        nbytes = np.asarray(h["nbytes"], dtype=np.int64)  # [L, P]
        starts = [tuple(int(v) for v in s) for s in h["starts"]]
        records = [int(v) for v in h["record_bytes"]]
        order = np.asarray(h["order"], dtype=np.int64)  # [L, E]
        data_offset, data_bytes = int(h["data_offset"]), int(h["data_bytes"])
    except (KeyError, TypeError, ValueError) as exc:
        raise PackError(f"{path}: header field missing or malformed ({exc})") from None
    want = fingerprint if fingerprint is not None else source_fingerprint(model)
    for key in ("size", "header_sha256", "sample_sha256"):
        if source.get(key) != want[key]:
            raise PackError(
                f"{path}: packed from another file ({source.get('name')!r}, {key} "
                f"{source.get(key)!r}; {model.path} has {want[key]!r}): run sdq pack again"
            )
    if layers != list(table.layers) or n_expert != table.n_expert:
        raise PackError(
            f"{path}: packs {len(layers)} layers x {n_expert} experts, the model has "
            f"{len(table.layers)} x {table.n_expert}"
        )
    if nbytes.shape != (len(layers), 3) or not (nbytes[:, None, :] == table.nbytes).all():
        raise PackError(f"{path}: part sizes differ from the model's")
    if (
        order.shape != (len(layers), n_expert)
        or not (np.sort(order, axis=1) == np.arange(n_expert)).all()
    ):
        raise PackError(f"{path}: order is not a permutation of each layer's {n_expert} experts")
    want_starts, want_records = record_layout(table)
    if starts != want_starts or records != want_records:
        raise PackError(f"{path}: record layout differs from this version's")
    if data_offset % ALIGN or data_bytes != sum(r * n_expert for r in records):
        raise PackError(f"{path}: data offset {data_offset} or size {data_bytes} inconsistent")
    size = path.stat().st_size
    if size < data_offset + data_bytes:
        raise PackError(
            f"{path}: file is {size} bytes, its header says {data_offset + data_bytes}: truncated"
        )
    packed = _packed_table(table, data_offset, starts, records, np.argsort(order, axis=1))
    return Pack(path, packed, tuple(starts), tuple(records), order, h["order_from"])


def find_pack(model, choice: str | None, warn=None) -> Pack | None:
    """The pack a run uses. choice: None or "auto": the one beside the model when it exists
    and is valid (else None, after warn(message)); "none": no pack; a path: that pack, which
    must be valid."""
    if choice is not None and choice.strip().lower() == "none":
        return None
    if choice is None or choice.strip().lower() == "auto":
        path = default_path(model.path)
        if not path.exists():
            return None
        try:
            return open_pack(model, path)
        except PackError as exc:
            if warn is not None:
                warn(f"not using the pack: {exc}")
            return None
    if not Path(choice).exists():
        raise ParamsError(f"--pack {choice}: no such file")
    return open_pack(model, choice)
