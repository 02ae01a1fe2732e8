"""What the OS says about a process: `/proc/<pid>/status` fields and peak RSS."""

from __future__ import annotations

import resource


def proc_status_kib(path: str, keys) -> dict[str, int]:
    """The `kB` fields `keys` of a /proc/<pid>/status file; {} when it cannot be read (a
    process exiting, a zombie, no /proc)."""
    found = {}
    try:
        with open(path) as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in keys:
                    found[name] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return found


def memory_figures() -> dict:
    """peak_rss_mb and swap_mb (MiB) of this process, from VmHWM and VmSwap.

    VmHWM, not getrusage's ru_maxrss: a process started by fork + exec inherits its parent's
    high-water mark in ru_maxrss, so a small `sdq chat` launched from a large notebook kernel
    would report the kernel's peak."""
    status = proc_status_kib("/proc/self/status", ("VmHWM", "VmSwap"))
    peak = status.get("VmHWM")
    if peak is None:  # no /proc: fall back to ru_maxrss (KiB on Linux)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_rss_mb": peak / 1024, "swap_mb": status.get("VmSwap", 0) / 1024}
