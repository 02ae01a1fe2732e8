"""Typed errors. Each carries the numbers that explain it; the CLI prints one line and exits 2."""


class SdqError(Exception):
    """A user-facing error: bad input, impossible setting, resource limit. Never a bug.

    The message is kept to one printable line: names read from a file (a tensor name in a
    damaged GGUF, say) may hold newlines or control characters, shown escaped instead."""

    exit_code = 2

    def __init__(self, *args):
        if len(args) == 1 and isinstance(args[0], str) and not args[0].isprintable():
            args = ("".join(c if c.isprintable() else repr(c)[1:-1] for c in args[0]),)
        super().__init__(*args)


class GGUFError(SdqError):
    """The file is not a usable GGUF (not GGUF, truncated, inconsistent, unsupported)."""


class UnsupportedError(SdqError):
    """Valid input that sdq does not handle (architecture, quant type)."""


class TokenizerError(SdqError):
    """The file's tokenizer metadata cannot be used (unknown kind, inconsistent vocabulary)."""


class PlanError(SdqError):
    """The RAM budget cannot hold what the run needs; the message states the minimum."""


class ReadError(SdqError):
    """An expert or probe read failed (I/O error, short read, past end of file)."""


class ModelChangedError(ReadError):
    """The model file was truncated, rewritten or replaced while a run read from it."""


class ParamsError(SdqError):
    """A parameter file or command-line setting is invalid."""


class TraceError(SdqError):
    """A routing trace or route log is malformed or of an unknown format (names file and line)."""


class LabError(SdqError):
    """A lab run or docs build failed: names the notebook, cell, table or marker at fault."""


class PackError(SdqError):
    """A pack sidecar (sdq.paging.pack) is unusable: not a pack, damaged, of another model."""
