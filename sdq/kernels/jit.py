"""The one place for Numba JIT flags.

Every kernel in sdq.kernels is compiled with ``cache=True`` (a second process loads the
machine code from ``__pycache__`` instead of recompiling) and ``nogil=True`` (the pager's
I/O threads and the caller's Python threads keep running while a kernel computes).

fastmath policy:
- Dequantization and activation quantization: **off**. They must be bit-exact with
  gguf-py / ggml, and fused multiply-add or reassociation would change the last bit.
- Integer dot products (Q8_0, Q4_0, K-quants against 8-bit activations): off. The inner
  sums are integers, so LLVM vectorizes them without any permission; the few float
  operations per block stay in source order.
- Float dot products, norms, softmax and attention: ``FLOAT_MATH`` (reassociation and
  contraction only). Reassociation lets LLVM vectorize float reductions, as ggml's SIMD
  code also sums in a different order than a scalar loop. NaN/Inf semantics are kept.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

# Numba's OpenMP threading layer: idle worker threads block instead of spinning. With
# spinning (the GNU OpenMP default) a kernel call on a machine with more runnable threads
# than cores often waits a whole scheduler time slice for a descheduled worker; measured
# here with 2 threads: 1450 ms vs 220 ms for one mini-model decode token's kernel calls.
# Set OMP_WAIT_POLICY=ACTIVE in the environment to get spinning back on an idle machine.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from numba import njit  # noqa: E402

# Flags that allow a float reduction to be vectorized (sum order changes; NaN/Inf kept).
FLOAT_MATH = {"reassoc", "contract"}


def kernel(fn=None, *, parallel: bool = False, fastmath=False):
    """Compile ``fn`` with the project's flags: cached, GIL released."""

    def wrap(f):
        flags = set(fastmath) if isinstance(fastmath, set) else fastmath
        return njit(cache=True, nogil=True, parallel=parallel, fastmath=flags)(f)

    return wrap(fn) if fn is not None else wrap


def inline(fn):
    """A helper inlined into the kernels that call it (compiled with them, never alone)."""
    return njit(inline="always", cache=True, nogil=True)(fn)


# Numba keys a cached kernel on the contents of the kernel's own file only, but kernels
# inline helpers and LLVM IR intrinsics from other modules of this folder (ops.dot_f32 in
# dot.py, simd_mm's tiles in expert.py, ...), so after a change to any of them a kernel
# cached earlier would be loaded unchanged: the stamp covers every module here.
_STAMP = "sdq-intrinsics.sha256"


def _cache_marker() -> int:  # never called: only its cache folder is asked for
    return 0


def kernel_cache_dir() -> Path | None:
    """The folder where Numba keeps this package's kernels (None when Numba does not say)."""
    try:
        return Path(kernel(_cache_marker)._cache._cache_path)  # Numba internals
    except AttributeError:
        return None


@functools.cache
def sources_sha256(*folders: str) -> str:
    """SHA-256 of the bytes of every module in these folders of sdq (names relative to the
    package, e.g. "kernels"), sorted by name within each folder; computed once per process."""
    root = Path(__file__).resolve().parents[1]  # sdq/
    h = hashlib.sha256()
    for folder in folders:
        for f in sorted((root / folder).glob("*.py")):
            h.update(f.read_bytes())
    return h.hexdigest()


def drop_stale_cache(cache_dir: Path | None = None) -> bool:
    """Remove this package's cached kernels when a module of sdq.kernels changed since they
    were cached (a hash of the modules is kept beside the cache); returns True if it did.
    Kernels then compile again on first use, those of the sibling packages too (sdq.run
    inlines these helpers): with the default cache folder, every ``sdq/*/__pycache__``.
    Errors (e.g. a read-only install) are ignored.

    Called by `make test` and `make reproduce` before any kernel compiles (`make
    kernel-cache`), never at import time.

    cache_dir: where Numba keeps this package's kernels (default: asked of Numba for a
    function defined in this folder, which shares the kernels' cache folder)."""
    if cache_dir is None:
        cache_dir = kernel_cache_dir()
        if cache_dir is None:
            return False
    here = Path(__file__).parent
    digest = sources_sha256("kernels")
    stamp = cache_dir / _STAMP
    try:
        if stamp.read_text() == digest:
            return False
    except OSError:
        pass
    dirs = [cache_dir]
    if cache_dir.name == "__pycache__" and cache_dir.parent == here:
        dirs += [d for d in here.parent.glob("*/__pycache__") if d != cache_dir]
    try:
        for f in (f for d in dirs for f in d.glob("*.nb[ic]")):
            f.unlink(missing_ok=True)
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cache_dir / f"{_STAMP}.{os.getpid()}.tmp"
        tmp.write_text(digest)
        os.replace(tmp, stamp)
    except OSError:
        return False
    return True
