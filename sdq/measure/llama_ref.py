"""llama.cpp (llama-cpp-python) as the reference engine, opened the same way everywhere.

llama.cpp runs with its defaults, weight repacking included. The project's `make setup`
builds llama-cpp-python without AMX (see the Makefile): a -march=native build multiplies
quantized weights with AMX tiles whenever CPUID reports AMX, and on virtual machines that
report it without enabling its register state the first `tilezero` kills the process with
SIGILL. `open_llama` refuses an AMX build with a clear error instead of letting it crash.
"""

from __future__ import annotations

from sdq.errors import UnsupportedError

LLAMA_SETTINGS_NOTE = "llama.cpp defaults (weight repacking on), built without AMX"


def require_llama_cpp(what: str = "this"):
    """The llama_cpp module; UnsupportedError in one line when the optional reference (the
    `reference` extra) is not installed."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise UnsupportedError(
            f"{what} needs llama.cpp as the reference, and llama-cpp-python is not installed "
            f"({exc}): pip install 'sdq[reference]' (make setup builds it for this CPU)"
        ) from None
    return llama_cpp


def open_llama(path, *, n_ctx: int, n_ubatch: int, threads: int, **kwargs):
    """A quiet llama_cpp.Llama on `path`; kwargs go to Llama."""
    llama_cpp = require_llama_cpp("comparing with llama.cpp")
    if _amx_compiled_but_unusable(llama_cpp):
        raise UnsupportedError(
            "llama-cpp-python was built with AMX, which virtual machines often report but "
            "trap (SIGILL); reinstall it with `make setup`, which builds it without AMX"
        )
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


def _amx_compiled_but_unusable(llama_cpp) -> bool:
    """An AMX build: on the virtual machines this project runs on it dies with SIGILL, and a
    CPU's report of AMX cannot tell whether the host enabled it, so such a build is refused."""
    return "AMX_INT8 = 1" in llama_cpp.llama_print_system_info().decode()
