"""Where a file lives: filesystem, block device and RAM, for honest labels on read measurements.

`describe_storage(path)` maps the file's st_dev (major:minor) to its mount in
/proc/self/mountinfo and to its disk in /sys/dev/block, e.g. ext4 on /dev/vda (virtio_blk).
Anything the kernel does not expose is None, never guessed. `device_id` is the name saved I/O
profiles are filed under (sdq.paging.io_profile).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from sdq.paging.io_profile import device_id, disk_of
from sdq.units import GIB

MOUNTINFO = Path("/proc/self/mountinfo")
SYS_DEV_BLOCK = Path("/sys/dev/block")


@dataclass(frozen=True)
class StorageInfo:
    path: str
    file_bytes: int
    ram_bytes: int
    dev: str  # "major:minor" of the filesystem holding the file
    mount_point: str | None
    fstype: str | None
    source: str | None  # what is mounted, e.g. /dev/vda
    disk: str | None  # whole-disk name under /sys/block, e.g. vda
    model: str | None  # device model, or the driver when no model is exposed
    rotational: bool | None
    scheduler: str | None
    disk_bytes: int | None
    device_id: str = ""  # sdq.paging.io_profile.device_id: where its I/O profile is filed

    @property
    def file_vs_ram(self) -> float:
        return self.file_bytes / self.ram_bytes if self.ram_bytes else float("nan")

    def label(self) -> str:
        """One line, e.g.
        `ext4 on /dev/vda (vda, virtio_blk, rotational=1), file 1.00 GiB = 4.3% of RAM 23.5 GiB`.
        """
        where = f"{self.fstype or '?'} on {self.source or '?'}"
        parts = [p for p in (self.disk, self.model) if p]
        if self.rotational is not None:
            parts.append(f"rotational={int(self.rotational)}")  # the kernel's flag, as reported
        if parts:
            where += f" ({', '.join(parts)})"
        return (
            f"{where}, file {self.file_bytes / GIB:.2f} GiB = "
            f"{100 * self.file_vs_ram:.1f}% of RAM {self.ram_bytes / GIB:.1f} GiB"
        )

    def to_dict(self) -> dict:
        return asdict(self)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _mount_of(major: int, minor: int, path: Path) -> tuple[str, str, str] | None:
    """(mount point, fstype, source) of this device's mount holding `path` (longest match)."""
    text = _read(MOUNTINFO)
    if text is None:
        return None
    best = None
    want = f"{major}:{minor}"
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 2 or fields[2] != want:
            continue
        mount_point = fields[4].replace("\\040", " ")
        if not (str(path) == mount_point or str(path).startswith(mount_point.rstrip("/") + "/")):
            continue
        if best is None or len(mount_point) > len(best[0]):
            best = (mount_point, tail[0], tail[1])
    return best


def _model_of(disk: Path) -> str | None:
    model = _read(disk / "device" / "model")
    if model:
        return model
    driver = disk / "device" / "driver"
    if driver.exists():
        return driver.resolve().name  # e.g. virtio_blk: a virtual disk, no model string
    return None


def total_ram_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


def describe_storage(path: str | os.PathLike) -> StorageInfo:
    path = Path(path).resolve()
    st = os.stat(path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    mount = _mount_of(major, minor, path)
    disk = disk_of(major, minor, SYS_DEV_BLOCK)
    rotational = scheduler = disk_bytes = None
    if disk is not None:
        rot = _read(disk / "queue" / "rotational")
        rotational = None if rot is None else rot == "1"
        sched = _read(disk / "queue" / "scheduler")
        if sched and "[" in sched:
            scheduler = sched.split("[", 1)[1].split("]", 1)[0]
        sectors = _read(disk / "size")
        disk_bytes = int(sectors) * 512 if sectors and sectors.isdigit() else None
    return StorageInfo(
        path=str(path),
        file_bytes=st.st_size,
        ram_bytes=total_ram_bytes(),
        dev=f"{major}:{minor}",
        mount_point=mount[0] if mount else None,
        fstype=mount[1] if mount else None,
        source=mount[2] if mount else None,
        disk=disk.name if disk else None,
        model=_model_of(disk) if disk else None,
        rotational=rotational,
        scheduler=scheduler,
        disk_bytes=disk_bytes,
        device_id=device_id(path, SYS_DEV_BLOCK),
    )
