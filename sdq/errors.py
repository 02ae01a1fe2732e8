"""Typed errors. Each carries the numbers that explain it; the CLI prints one line and exits 2."""


class SdqError(Exception):
    """A user-facing error: bad input, impossible setting, resource limit. Never a bug."""

    exit_code = 2


class GGUFError(SdqError):
    """The file is not a usable GGUF (not GGUF, truncated, inconsistent, unsupported)."""


class UnsupportedError(SdqError):
    """Valid input that sdq does not handle (architecture, quant type)."""


class PlanError(SdqError):
    """The RAM budget cannot hold what the run needs; the message states the minimum."""


class ReadError(SdqError):
    """An expert or probe read failed (I/O error, short read, past end of file)."""


class ParamsError(SdqError):
    """A parameter file or command-line setting is invalid."""


class TraceError(SdqError):
    """A routing trace or route log is malformed or of an unknown format (names file and line)."""


class LabError(SdqError):
    """A lab run or docs build failed: names the notebook, cell, table or marker at fault."""
