"""Mutated and truncated GGUF files: the anatomy either works or raises SdqError, nothing else."""

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

from gguf_builders import Layout, write_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdq.commands.info import render
from sdq.errors import SdqError
from sdq.format.header import read_header
from sdq.format.model import anatomy, open_model

_DIR = Path(tempfile.mkdtemp(prefix="sdq-fuzz-"))
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)
SEED_FILE, _ = write_model(
    _DIR / "seed.gguf",
    Layout(
        n_layer=1,
        n_embd=32,
        n_head=2,
        n_head_kv=1,
        head_dim=16,
        n_expert=2,
        n_used=1,
        expert_ffn=32,
        dense_ffn=32,
        n_vocab=6,
    ),
)
SEED = SEED_FILE.read_bytes()
HEADER_END = read_header(SEED_FILE).data_offset


def exercise(data: bytes) -> None:
    path = _DIR / f"case-{os.getpid()}.gguf"
    path.write_bytes(data)
    try:
        model = open_model(path)
        info = anatomy(model)
        json.dumps(info)
        render(info)
        for name, t in model.tensors.items():
            assert t.offset + t.nbytes <= len(data)
            assert model.tensor_data(name).nbytes == t.nbytes
        if model.has_experts:
            ex = model.experts
            assert ((ex.offsets + ex.nbytes) <= len(data)).all()
        model.close()
    except SdqError as exc:
        assert "\n" not in str(exc)


# A byte position biased towards the header, where a flip changes structure, not weights.
positions = st.one_of(st.integers(0, HEADER_END - 1), st.integers(0, len(SEED) - 1))
mutations = st.lists(st.tuples(positions, st.integers(0, 255)), min_size=1, max_size=6)
wide_values = st.sampled_from([0, 1, 0x7F, 0x80, 0xFF])


@settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(mutations)
def test_byte_mutations(muts):
    data = bytearray(SEED)
    for pos, value in muts:
        data[pos] = value
    exercise(bytes(data))


@settings(max_examples=120, deadline=None, derandomize=True, database=None)
@given(st.integers(0, len(SEED) - 1))
def test_truncations(length):
    exercise(SEED[:length])


@settings(max_examples=120, deadline=None, derandomize=True, database=None)
@given(st.integers(0, HEADER_END - 8), wide_values)
def test_eight_byte_fields_set_to_extremes(pos, fill):
    # counts, lengths and offsets are u64: make one of them huge, tiny or negative-looking
    data = bytearray(SEED)
    data[pos : pos + 8] = bytes([fill]) * 8
    exercise(bytes(data))


def test_seed_file_is_valid():
    model = open_model(SEED_FILE)
    assert model.has_experts and model.spec.n_vocab == 6


def section_boundaries() -> list[int]:
    """Where each part of the seed file starts: the fixed fields, every metadata entry, every
    tensor directory entry, the data section and every tensor's data (from gguf's own reader)."""
    from gguf import GGUFReader

    reader = GGUFReader(SEED_FILE)
    starts = {0, 4, len(SEED), reader.data_offset}
    starts |= {f.offset for f in reader.fields.values()}
    starts |= {t.field.offset for t in reader.tensors}
    starts |= {int(t.data_offset) for t in reader.tensors}
    return sorted(starts)


def test_truncation_at_every_section_boundary():
    """Cut at each boundary, one byte before and one after: never anything but SdqError, and
    never a model that opens when a tensor's bytes are missing."""
    for start in section_boundaries():
        for length in {max(0, start - 1), start, min(len(SEED), start + 1)}:
            exercise(SEED[:length])
    assert len(section_boundaries()) > 30


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.integers(0, HEADER_END - 1), st.integers(0, 7))
def test_single_bit_flips_in_the_header(pos, bit):
    data = bytearray(SEED)
    data[pos] ^= 1 << bit
    exercise(bytes(data))
