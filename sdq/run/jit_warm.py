"""Compile a model's kernels in a helper process before a paged run plans its memory.

Numba compiles a kernel the first time it is called with new argument types, and LLVM's
working memory for those compilations stays in the process's heap afterwards. A paged run
whose kernel cache is cold would then end above the budget its plan was made for (measured on
the seed-shaped model at a 1733 MB budget, reserve 64 MB: peak RSS 1864 MB with a cold cache,
1611 MB with a warm one), because the plan measures the process before any kernel has run.

So before a paged run plans, `ensure_warm` looks for a stamp in the kernel cache folder whose
name hashes what decides which machine code exists there: this machine's CPU, Numba's version,
the sources of sdq's kernels and of the engines that call them, the model's architecture and
tensor types, and whether the prefill runs a worker pool (several compute threads). Without
the stamp it runs a short generation of the same model in a child process
(sdq.run.jit_warm_child: a prompt of one ubatch of 128 tokens and a few more, two decode steps,
the smallest arena, so both the serial and the parallel variant of every size-dependent kernel
are compiled). Every kernel a run of this model calls is compiled and cached there, the stamp
is written, and the parent's plan then measures a process that loads cached machine code and
compiles nothing. A paged generation that finishes writes the stamp too (its kernels are
cached by then), so a cache that was warm before the stamps existed costs one child at most.

The child holds the model's dense weights, a few expert slots and the compiler's memory
(seed-shaped model: 1.10 GB peak RSS cold, 0.86 GB with the kernels cached) while the parent,
not yet planned, holds what it has imported and the tokenizer (about 0.25 GB): the budget
bounds each process's peak, and a limit on both together (a cgroup) must leave room for that
first compilation.

When the cache folder cannot be written (Numba cannot cache there either) nothing is done. A
child that refuses the model (an SdqError: the parent will refuse it in the same words) says
nothing; one that fails otherwise leaves no stamp and a one-line note, and the run goes on and
compiles in its own process.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from sdq.kernels.jit import kernel_cache_dir, sources_sha256

CHILD_ENV = "SDQ_JIT_WARM_CHILD"  # set in the child: it must not start another one
REFUSED = 3  # the child's exit status when the model is refused (an SdqError)


def warm_key(model, threads: int) -> str:
    """The hash of everything that decides which kernels a run compiles (module docstring)."""
    import llvmlite.binding as llvm
    import numba

    types = sorted({int(t.qtype) for t in model.tensors.values()})
    h = hashlib.sha256(
        repr(
            (
                sources_sha256("kernels", "run"),
                llvm.get_host_cpu_name(),
                llvm.get_host_cpu_features().flatten(),
                numba.__version__,
                os.environ.get("NUMBA_CPU_NAME", ""),
                model.spec.arch,
                types,
                threads > 1,
            )
        ).encode()
    )
    return h.hexdigest()[:32]


def stamp_path(model, threads: int) -> Path | None:
    """Where the stamp of `model`'s kernels at `threads` lives; None: no writable cache folder
    (or this is the child)."""
    if os.environ.get(CHILD_ENV):
        return None
    cache = kernel_cache_dir()
    if cache is None:
        return None
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if not os.access(cache, os.W_OK):
        return None
    return cache / f"sdq-warm-{warm_key(model, threads)}.ok"


def mark_warm(model, threads: int) -> None:
    """Writes the stamp: the kernels a run of `model` calls are cached (errors are ignored)."""
    stamp = stamp_path(model, threads)
    if stamp is not None and not stamp.exists():
        _write_stamp(stamp, model)


def _write_stamp(stamp: Path, model) -> None:
    try:
        tmp = stamp.with_name(f"{stamp.name}.{os.getpid()}.tmp")
        tmp.write_text(f"{model.path}\n")
        os.replace(tmp, stamp)
    except OSError:
        pass


def ensure_warm(model, threads: int, note) -> bool:
    """Compiles the kernels a paged run of `model` needs in a child process unless the stamp
    says they are cached; -> True when a child ran and succeeded. `note(text)` says why a
    child failed (not when it refused the model: the caller will)."""
    stamp = stamp_path(model, threads)
    if stamp is None or stamp.exists():
        return False
    cmd = [sys.executable, "-m", "sdq.run.jit_warm_child", str(model.path), str(threads)]
    env = {**os.environ, CHILD_ENV: "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode == REFUSED:
        return False
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        note(f"compiling the kernels in a helper process failed ({tail}); compiling here")
        return False
    _write_stamp(stamp, model)
    return True
