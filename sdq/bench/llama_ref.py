"""llama.cpp (llama-cpp-python) as the reference engine, opened the same way everywhere.

Extra buffer types are turned off (`use_extra_bufts = False`). With them on, ggml-cpu built with
GGML_NATIVE detects AMX from CPUID and multiplies quantized weights with AMX tiles; on virtual
machines that advertise AMX in CPUID without enabling its register state (XCR0), the first
`tilezero` kills the process with SIGILL (seen here: Xeon with amx_int8 in /proc/cpuinfo,
arch_prctl(ARCH_REQ_XCOMP_PERM) granted, still SIGILL). The same switch also turns off ggml's
run-time weight repacking, so llama.cpp runs its plain per-type AVX2/AVX-512 dot products.
Benchmarks that report llama.cpp's speed say so.
"""

from __future__ import annotations

import contextlib

LLAMA_SETTINGS_NOTE = "llama.cpp with extra buffer types off (no AMX, no weight repacking)"


def open_llama(path, *, n_ctx: int, n_ubatch: int, threads: int, **kwargs):
    """A llama_cpp.Llama on `path` (quiet, extra buffer types off); kwargs go to Llama."""
    try:
        import llama_cpp
    except ImportError as exc:  # a pinned dependency: missing only in a broken install
        from sdq.errors import UnsupportedError

        raise UnsupportedError(f"llama-cpp-python is not installed ({exc})") from None
    with _without_extra_buffer_types(llama_cpp.llama_cpp):
        return llama_cpp.Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_batch=n_ubatch,
            n_ubatch=n_ubatch,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
            **kwargs,
        )


@contextlib.contextmanager
def _without_extra_buffer_types(lib):
    """Llama() takes its model parameters from llama_model_default_params(); wrap that."""
    default = lib.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    lib.llama_model_default_params = params
    try:
        yield
    finally:
        lib.llama_model_default_params = default
