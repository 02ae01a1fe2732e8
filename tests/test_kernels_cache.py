"""Cached kernels are dropped when a module of sdq.kernels (whose helpers they inline) changes."""

from __future__ import annotations

from sdq.kernels import jit


def test_drop_stale_cache(tmp_path):
    for name in ("dot._mm_q4_k_simd-1.py311.nbi", "dot._mm_q4_k_simd-1.py311.1.nbc"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "dot.cpython-311.pyc").write_bytes(b"x")  # not Numba's: kept
    assert jit.drop_stale_cache(tmp_path)  # no stamp yet: unknown sources, dropped
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dot.cpython-311.pyc",
        "sdq-intrinsics.sha256",
    ]
    (tmp_path / "dot.ops-1.py311.nbi").write_bytes(b"x")
    assert not jit.drop_stale_cache(tmp_path)  # same sources: cache kept
    assert (tmp_path / "dot.ops-1.py311.nbi").exists()
    (tmp_path / "sdq-intrinsics.sha256").write_text("0" * 64)  # sources changed since
    assert jit.drop_stale_cache(tmp_path)
    assert not (tmp_path / "dot.ops-1.py311.nbi").exists()
