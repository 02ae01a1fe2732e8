"""A stand-in model for the pager tests: random bytes on disk and an expert table over them.

Segments start at odd offsets with odd gaps between them (GGUF only guarantees 32-byte
alignment; odd offsets are harder), part sizes differ between layers, and the last segment of
the last expert ends exactly at the end of an odd-sized file.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from sdq.errors import GGUFError

ROWS = (4, 4, 6)  # rows of one expert's gate, up, down matrix
PAGE = 4096


def resident_pages(address: int, nbytes: int) -> np.ndarray:
    """mincore(2) of this process's memory: 1 per resident page of [address, address + nbytes)."""
    libc = ctypes.CDLL(None, use_errno=True)
    vec = (ctypes.c_ubyte * (-(-nbytes // PAGE)))()
    rc = libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(nbytes), vec)
    assert rc == 0, os.strerror(ctypes.get_errno())
    return np.frombuffer(vec, np.uint8) & 1  # [pages]


@dataclass
class FakeTable:
    layers: tuple[int, ...]
    n_expert: int
    offsets: np.ndarray  # int64 [L, E, 3]
    nbytes: np.ndarray  # int64 [L, E, 3]
    qtypes: np.ndarray  # int32 [L, 3]
    shapes: tuple[tuple[int, int], ...]

    def row(self, layer: int) -> int:
        if layer not in self.layers:
            raise GGUFError(f"layer {layer} has no routed experts")
        return self.layers.index(layer)

    @property
    def max_expert_bytes(self) -> int:
        return int(self.nbytes.sum(axis=2).max())


@dataclass
class FakeModel:
    path: Path
    spec: SimpleNamespace
    experts: FakeTable
    dense_bytes: int
    data: np.ndarray  # the file's bytes

    def require_experts(self) -> FakeTable:
        return self.experts

    def expert_bytes(self, layer: int, expert: int) -> list[bytes]:
        r = self.experts.row(layer)
        return [
            self.data[o : o + n].tobytes()
            for o, n in zip(
                self.experts.offsets[r, expert], self.experts.nbytes[r, expert], strict=True
            )
        ]


def make_model(
    path: Path,
    n_layers: int = 3,
    n_expert: int = 8,
    k: int = 2,
    seed: int = 0,
    row_bytes=(34, 66, 18),
    layers=None,
) -> FakeModel:
    rng = np.random.default_rng(seed)
    layers = tuple(layers if layers is not None else range(1, n_layers + 1))
    L = len(layers)
    nbytes = np.zeros((L, n_expert, 3), dtype=np.int64)
    for r in range(L):
        for p in range(3):
            nbytes[r, :, p] = ROWS[p] * (row_bytes[p] + 2 * r * (p + 1))
    offsets = np.zeros_like(nbytes)
    pos = 1 + int(rng.integers(0, 50)) * 2  # odd start
    # part-major like GGUF: each (layer, part) tensor holds its E experts back to back
    for r in range(L):
        for p in (2, 0, 1):  # down, gate, up: tensors are not in part order on disk
            pos += int(rng.integers(0, 40)) * 2 + 1  # odd gap
            for e in range(n_expert):
                offsets[r, e, p] = pos
                pos += int(nbytes[r, e, p])
    size = pos  # the last segment ends the file, mid-page
    assert size % 4096 != 0
    data = rng.integers(0, 256, size, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    shapes = tuple((ROWS[p], 0) for p in range(3))
    table = FakeTable(layers, n_expert, offsets, nbytes, np.zeros((L, 3), np.int32), shapes)
    spec = SimpleNamespace(
        n_layer=max(layers) + 1,
        n_embd=16,
        n_head=2,
        n_head_kv=1,
        head_dim=8,
        n_expert=n_expert,
        n_expert_used=k,
        expert_ffn=8,
        n_vocab=32,
    )
    return FakeModel(path, spec, table, dense_bytes=12345, data=data)


def last_expert(model: FakeModel) -> tuple[int, int]:
    """(layer, expert) whose last segment ends the file."""
    t = model.experts
    end = t.offsets + t.nbytes
    r, e, _ = np.unravel_index(int(end.argmax()), end.shape)
    assert int(end.max()) == len(model.data)
    return t.layers[int(r)], int(e)


def plans_match_the_loop(reader, layout, modes, rounds: int, seed: int):
    """Random requests (mode, split, row, experts, slot addresses) through `reader.plan`, each
    checked against the plain loop `plan_reads_ref`; yields (mode, row, experts, reads)."""
    from sdq.paging.reads import IOSettings, plan_reads_ref

    t = reader.table
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        mode = modes[int(rng.integers(len(modes)))]
        io = IOSettings(
            threads=2, mode=mode, split=int(rng.integers(1, 9)), cache_mode=reader.io.cache_mode
        )
        reader.set_io(io)  # a new split must drop the templates built for the old one
        row = int(rng.integers(len(t.layers)))
        k = int(rng.integers(1, t.n_expert + 1))
        experts = [int(e) for e in rng.choice(t.n_expert, k, replace=False)]
        addrs = [(1 << 32) + 4096 * int(s) * layout.slot_bytes for s in rng.permutation(k)]
        reads, meta = reader.plan(row, experts, addrs)
        args = (t.offsets[row], t.nbytes[row], experts, addrs, reader.fd, layout)
        want, want_meta = plan_reads_ref(*args, mode, io.chunks, t.layers[row])
        assert np.array_equal(reads, want)
        assert np.array_equal(meta, want_meta)
        yield mode, row, experts, reads
