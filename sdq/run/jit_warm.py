"""Compile a model's kernels in a helper process before a paged run plans its memory.

Numba compiles a kernel the first time it is called with new argument types, and LLVM's
working memory for those compilations stays in the process's heap afterwards. A paged run
whose kernel cache is cold would then end above the budget its plan was made for (measured on
the seed-shaped model at a 1733 MB budget, reserve 64 MB: peak RSS 1864 MB with a cold cache,
1611 MB with a warm one), because the plan measures the process before any kernel has run.

So before a paged run plans, `ensure_warm` looks for a stamp in the kernel cache folder whose
name hashes what decides which machine code exists there: this machine's CPU, Numba's version,
the sources of sdq's kernels and of the engines that call them, the model's architecture and
tensor types, the compute threads (one thread and several take different prefill paths) and
the ubatch (some kernels choose a serial or parallel variant by the work's size). Without the
stamp it runs a short generation of the same model in a child process: a prompt of one full
ubatch and a few more tokens, two decode steps, the smallest arena. Every kernel a run of this
model calls is compiled and cached there, the stamp is written, and the parent's plan then
measures a process that loads cached machine code and compiles nothing. The child holds the
model's dense weights, a few expert slots and the compiler's memory (seed-shaped model: 1.10
GB peak RSS cold, 0.86 GB with the kernels cached) while the parent, not yet planned, holds
what it has imported and the tokenizer (about 0.25 GB): the budget bounds each process's
peak, and a limit on both together (a cgroup) must leave room for that first compilation.

When the cache folder cannot be written (Numba cannot cache there either) nothing is done.
A child that fails leaves no stamp; the run goes on and compiles in its own process, as before,
after a one-line note.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

CHILD_ENV = "SDQ_JIT_WARM_CHILD"  # set in the child: it must not start another one
EXTRA_TOKENS = 3  # prompt tokens past one full ubatch: a short ubatch is compiled too
DECODE_TOKENS = 3  # tokens generated: two decode steps, with the prefetch


def kernel_cache_dir() -> Path | None:
    """The folder where Numba keeps sdq's kernels (None when Numba does not say)."""
    from sdq.kernels.jit import _cache_marker, kernel

    try:
        return Path(kernel(_cache_marker)._cache._cache_path)  # Numba internals
    except AttributeError:
        return None


def warm_key(model, threads: int, n_ubatch: int) -> str:
    """The hash of everything that decides which kernels a run compiles (module docstring)."""
    import llvmlite.binding as llvm
    import numba

    root = Path(__file__).resolve().parents[1]  # sdq/
    h = hashlib.sha256()
    for folder in ("kernels", "run"):
        for f in sorted((root / folder).glob("*.py")):
            h.update(f.name.encode() + f.read_bytes())
    types = sorted({int(t.qtype) for t in model.tensors.values()})
    h.update(
        repr(
            (
                llvm.get_host_cpu_name(),
                llvm.get_host_cpu_features().flatten(),
                numba.__version__,
                os.environ.get("NUMBA_CPU_NAME", ""),
                model.spec.arch,
                types,
                threads > 1,
                n_ubatch,
            )
        ).encode()
    )
    return h.hexdigest()[:32]


def ensure_warm(model, threads: int, n_ubatch: int, note) -> bool:
    """Compiles the kernels a paged run of `model` needs in a child process unless the stamp
    says they are cached; -> True when a child ran and succeeded. `note(text)` says that a
    child starts, and why it failed if it does."""
    if os.environ.get(CHILD_ENV):
        return False
    cache = kernel_cache_dir()
    if cache is None:
        return False
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    if not os.access(cache, os.W_OK):
        return False
    stamp = cache / f"sdq-warm-{warm_key(model, threads, n_ubatch)}.ok"
    if stamp.exists():
        return False
    cmd = [
        sys.executable,
        "-m",
        "sdq.run.jit_warm",
        str(model.path),
        str(threads),
        str(n_ubatch),
    ]
    env = {**os.environ, CHILD_ENV: "1"}
    note("compiling this model's kernels in a helper process (once per machine and version)")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        note(f"compiling the kernels in a helper process failed ({tail}); compiling here")
        return False
    try:
        tmp = stamp.with_name(f"{stamp.name}.{os.getpid()}.tmp")
        tmp.write_text(f"{model.path}\n")
        os.replace(tmp, stamp)
    except OSError:
        pass
    return True


def _warm(model_path: str, threads: int, n_ubatch: int) -> None:
    """The child: a prompt of n_ubatch + EXTRA_TOKENS tokens and DECODE_TOKENS generated, the
    smallest arena, the context just large enough."""
    from sdq.format.model import open_model
    from sdq.paging.policies import min_slots
    from sdq.paging.prefetch import prefetch_width
    from sdq.run.sampler import SamplerSettings
    from sdq.run.session import RunSettings, Session

    spec = open_model(model_path).spec
    K = spec.n_expert_used
    n_prompt = n_ubatch + EXTRA_TOKENS
    settings = RunSettings(
        model=model_path,
        n_ctx=n_prompt + DECODE_TOKENS + 1,
        n_ubatch=n_ubatch,
        threads=threads,
        n_predict=DECODE_TOKENS,
        sampler=SamplerSettings(temp=0.0),
        stop_at_eos=False,
        max_slots=min_slots("lrfu_bypass", K, prefetch_width(K)),
        pack="none",
    )
    session = Session(settings)
    try:
        prompt = [(7 + 13 * i) % spec.n_vocab for i in range(n_prompt)]
        session.generate(prompt)
    finally:
        session.close()


if __name__ == "__main__":
    _warm(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
