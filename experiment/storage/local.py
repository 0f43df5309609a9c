"""Local-disk halves of the storage guarantees: fsync of a folder, the umask, publishing a file exclusively."""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from pathlib import Path


@functools.cache
def umask() -> int:
    """The process's umask, read on first use rather than at import (importing changes no process state).

    Linux reports it in /proc; elsewhere it can only be read by setting it, for the shortest moment."""
    with contextlib.suppress(OSError, ValueError, StopIteration), open("/proc/self/status", encoding="ascii") as status:
        return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems cannot fsync a directory
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_open_exclusive(path: Path, data: bytes) -> None:
    """Publish ``data`` at the local ``path`` only if no file is there (FileExistsError otherwise): written
    and fsynced under a temporary name, then hard-linked to ``path``, which fails if it exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp_name, 0o666 & ~umask())
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.link(tmp_name, path)
        fsync_dir(path.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
