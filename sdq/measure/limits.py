"""RAM limits for a child process, and dropping a file's pages from the page cache.

A small machine is modelled two ways (the experiments record which one each run used):

  rlimit_data  setrlimit(RLIMIT_DATA) in the child, between fork and exec (the seed's method).
               The kernel counts the process's private writable memory (heap, anonymous mmaps,
               thread stacks) as *virtual* size, so a malloc / mmap past the limit fails with
               ENOMEM: Python raises MemoryError, C code sees NULL. Page cache and the model's
               read-only file mapping are not counted: a process can stay under the limit while
               the machine's page cache holds the whole model.
  cgroup       a cgroup v1 memory group with memory.limit_in_bytes, the child moved into it
               before exec. The kernel counts *resident* memory, anonymous pages and the page
               cache the group's reads bring in alike; page cache is reclaimed first, and when
               anonymous memory alone passes the limit the kernel's OOM killer sends SIGKILL.
               This is the honest model of a small machine: the page cache shares the budget.
               Needs the memory controller mounted at /sys/fs/cgroup/memory and write access
               (root); `cgroup_status()` says whether and why not.

Cache dropping: `drop_file_cache(path)` writes nothing and needs no privilege (posix_fadvise
DONTNEED on the whole file; pages mapped by a live process stay); `drop_system_cache()` also
empties the whole page cache (`echo 1 > /proc/sys/vm/drop_caches`, root only), which slows every
other process on the machine for a while, so callers ask for it explicitly.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import resource
from dataclasses import dataclass
from pathlib import Path

from sdq.errors import ParamsError
from sdq.units import MIB

METHODS = ("none", "rlimit_data", "cgroup")
CGROUP_V1_MEMORY = Path("/sys/fs/cgroup/memory")
DROP_CACHES = Path("/proc/sys/vm/drop_caches")
_counter = itertools.count()


@dataclass(frozen=True)
class MemoryLimit:
    """How a child's RAM is capped: method in METHODS, limit in bytes (None for "none")."""

    method: str = "none"
    limit_bytes: int | None = None

    def __post_init__(self):
        if self.method not in METHODS:
            raise ParamsError(f"memory limit method {self.method!r}: expected one of {METHODS}")
        if self.method != "none" and (self.limit_bytes is None or self.limit_bytes < MIB):
            raise ParamsError(
                f"memory limit {self.method}: limit {self.limit_bytes} bytes must be >= 1 MiB"
            )

    @classmethod
    def mb(cls, method: str, limit_mb: float | None) -> MemoryLimit:
        return cls(method, None if limit_mb is None else int(limit_mb * MIB))

    @property
    def limit_mb(self) -> float | None:
        return None if self.limit_bytes is None else self.limit_bytes / MIB


# -- RLIMIT_DATA ---------------------------------------------------------------------------------


def rlimit_data_preexec(limit_bytes: int):
    """A preexec_fn for subprocess.Popen: caps the child's data segment (soft and hard)."""

    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (limit_bytes, limit_bytes))

    return preexec


# -- cgroup v1 memory ----------------------------------------------------------------------------


def _own_memory_cgroup(proc_cgroup: str = "/proc/self/cgroup") -> str:
    """This process's path in the v1 memory hierarchy ("/" when at its root)."""
    with open(proc_cgroup) as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                return path
    return "/"


def cgroup_status(root: Path = CGROUP_V1_MEMORY) -> tuple[bool, str]:
    """(usable, reason): can this process create a v1 memory cgroup for a child?"""
    if not (root / "memory.limit_in_bytes").is_file():
        return False, f"no cgroup v1 memory controller at {root} (cgroup v2 only, or not mounted)"
    try:
        parent = root / _own_memory_cgroup().lstrip("/")
    except OSError as exc:
        return False, f"cannot read /proc/self/cgroup ({exc.strerror})"
    if not parent.is_dir():
        return False, f"this process's memory cgroup {parent} is not visible"
    if not os.access(parent, os.W_OK):
        return False, f"{parent} is not writable (needs root)"
    return True, f"cgroup v1 memory controller, groups created under {parent}"


class MemoryCgroup:
    """A temporary cgroup v1 memory group for one child process.

        with MemoryCgroup(limit_bytes) as cg:
            p = subprocess.Popen(cmd, preexec_fn=cg.preexec)
            ...
            cg.peak_bytes(), cg.oom_kills(), cg.failcnt()

    The group is created under this process's own memory cgroup (so an outer limit still
    applies), and removed on exit once its processes are gone.
    """

    def __init__(self, limit_bytes: int, root: Path = CGROUP_V1_MEMORY, name: str | None = None):
        ok, why = cgroup_status(root)
        if not ok:
            raise ParamsError(f"memory limit cgroup: {why}")
        parent = root / _own_memory_cgroup().lstrip("/")
        self.limit_bytes = int(limit_bytes)
        self.path = parent / (name or f"sdq-{os.getpid()}-{next(_counter)}")
        self.path.mkdir()
        try:
            self._write("memory.limit_in_bytes", self.limit_bytes)
            # without swap accounting memsw is absent; with it, cap RAM + swap alike
            if (self.path / "memory.memsw.limit_in_bytes").exists():
                self._write("memory.memsw.limit_in_bytes", self.limit_bytes)
        except OSError:
            self.path.rmdir()
            raise
        procs = str(self.path / "cgroup.procs")
        self.preexec = _cgroup_preexec(procs)

    def _write(self, name: str, value) -> None:
        (self.path / name).write_text(f"{value}\n")

    def _read_int(self, name: str) -> int:
        return int((self.path / name).read_text().split()[0])

    def peak_bytes(self) -> int:
        """Largest usage seen: resident anonymous memory plus page cache charged to the group."""
        return self._read_int("memory.max_usage_in_bytes")

    def failcnt(self) -> int:
        """How often usage hit the limit (reclaim ran; not necessarily a kill)."""
        return self._read_int("memory.failcnt")

    def oom_kills(self) -> int:
        """Processes of this group the OOM killer killed (0 on kernels without the counter)."""
        for line in (self.path / "memory.oom_control").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def tasks(self) -> list[int]:
        return [int(t) for t in (self.path / "cgroup.procs").read_text().split()]

    def close(self) -> None:
        if not self.path.exists():
            return
        with contextlib.suppress(OSError):
            self._write("memory.force_empty", 0)  # hand charged page cache back to the parent
        self.path.rmdir()  # EBUSY while a process is left: the caller must have reaped it

    def __enter__(self) -> MemoryCgroup:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _cgroup_preexec(procs_path: str):
    def preexec() -> None:
        fd = os.open(procs_path, os.O_WRONLY)
        try:
            os.write(fd, b"0\n")  # "0" = the writing process itself
        finally:
            os.close(fd)

    return preexec


# -- page cache ----------------------------------------------------------------------------------


def file_resident_fraction(path: str | os.PathLike, ranges=None) -> float:
    """Share of the file's pages in the page cache now (mincore over a read-only mapping);
    with `ranges` [(offset, length), ...], of those byte ranges only (weighted by length)."""
    from sdq import _io

    size = os.path.getsize(path)
    ranges = [(0, size)] if ranges is None else [(o, n) for o, n in ranges if n > 0]
    total = sum(n for _, n in ranges)
    if total == 0:
        return 0.0
    fd = os.open(path, os.O_RDONLY)
    try:
        return sum(float(_io.resident_fraction(fd, o, n)) * n for o, n in ranges) / total
    finally:
        os.close(fd)


def drop_file_cache(path: str | os.PathLike) -> float:
    """Drops the file's pages from the page cache; returns the share still cached afterwards
    (pages another process has mapped, or dirty pages not yet written, may stay)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):
            os.fdatasync(fd)  # DONTNEED skips dirty pages
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return file_resident_fraction(path)


def drop_system_cache() -> bool:
    """Empties the whole page cache (root only): sync, then `1 > /proc/sys/vm/drop_caches`.
    Returns False when not permitted."""
    if os.geteuid() != 0:
        return False
    os.sync()
    try:
        DROP_CACHES.write_text("1\n")
    except OSError:
        return False
    return True
