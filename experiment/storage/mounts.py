"""FUSE mounts of buckets (gcsfuse, s3fs, geesefs, rclone, goofys, mountpoint-s3): told apart from real disks.

A run folder on such a mount would look like a disk and break what a disk guarantees (gcsfuse's
docs/semantics.md): a folder rename is a copy of every object (refused past ``rename-dir-limit``), file
locks hold only within one mount, so two hosts can both "hold" a run's lock, and with streaming writes an
fsync does not finalize an object. Reading inputs through a mount is fine; the run folder goes in the bucket
by its URL instead (``experiment.run_root=gs://...``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# the FUSE filesystems that put an object store behind a folder, as /proc/self/mountinfo names them
BUCKET_FUSE_TYPES = ("fuse.gcsfuse", "fuse.s3fs", "fuse.geesefs", "fuse.rclone", "fuse.goofys",
                     "fuse.mountpoint-s3", "fuse.blobfuse2", "fuse.ossfs", "fuse.obsfs", "fuse.juicefs")
MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    source: str


def _unescape(text: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    return text.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def read_mounts(mountinfo: str | None = None) -> list[Mount]:
    try:
        lines = Path(mountinfo or MOUNTINFO).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    mounts = []
    for line in lines:
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if len(fields) < dash + 3 or len(fields) < 5:
            continue
        mounts.append(Mount(_unescape(fields[4]), fields[dash + 1], _unescape(fields[dash + 2])))
    return mounts


def mount_of(path: str | os.PathLike[str], mountinfo: str | None = None) -> Mount | None:
    """The mount that holds ``path`` (or its nearest existing parent): the longest mount point above it."""
    where = Path(path).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    resolved = str(where.resolve())
    best: Mount | None = None
    for mount in read_mounts(mountinfo):
        point = mount.point.rstrip("/") or "/"
        if (resolved == point or resolved.startswith(point + "/") or point == "/") and (
                best is None or len(point) >= len(best.point.rstrip("/") or "/")):
            best = mount
    return best


def bucket_mount_of(path: str | os.PathLike[str], mountinfo: str | None = None) -> Mount | None:
    """The FUSE mount of an object store that holds ``path``, or None (a disk, NFS, tmpfs...)."""
    mount = mount_of(path, mountinfo)
    return mount if mount is not None and mount.fstype in BUCKET_FUSE_TYPES else None
