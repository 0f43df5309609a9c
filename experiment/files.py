"""Atomic file writes and hashing: a crash never leaves a half-written file under its final name."""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from experiment.errors import DataError, WriteError


@functools.cache
def _umask() -> int:
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


# errors of writing (not of the data or the code): reported as one line, the run can be repeated
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})
_ERRNO_IN_TEXT = re.compile(r"os_error_code='(\d+)'|\[Errno (\d+)\]")


def write_errno(exc: BaseException | str) -> int | None:
    """The errno of a write error, also when tensorstore reports it inside a ValueError's text."""
    if isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS:
        return exc.errno
    match = _ERRNO_IN_TEXT.search(str(exc))
    code = int(match.group(1) or match.group(2)) if match else None
    return code if code in WRITE_ERRNOS else None


def format_bytes(size: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Free bytes on the disk that holds ``path`` (or its nearest existing parent)."""
    where = Path(path).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        return shutil.disk_usage(where).free
    except OSError:
        return None


def free_space(path: str | os.PathLike[str]) -> str:
    """Free space on the disk that holds ``path``, e.g. '1.3 MiB'."""
    free = free_bytes(path)
    return "unknown space" if free is None else format_bytes(free)


def write_error(exc: OSError, path: str | os.PathLike[str], advice: str = "free some space and rerun the same "
                "command") -> WriteError:
    """One line for a failed write: the file (or ``path``), the reason and the space left on that disk."""
    where = exc.filename2 or exc.filename or path  # a failed copy names its source, then its destination
    return WriteError(f"cannot write {where}: {exc.strerror or exc} ({free_space(where)} free on that disk): {advice}")


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO[Any]]:
    """Write to a temporary file beside ``path``; rename it over ``path`` only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.chmod(tmp_name, 0o666 & ~_umask())  # mkstemp makes 0600 files; give them the usual permissions
    binary = "b" in mode
    try:
        with os.fdopen(fd, mode, encoding=None if binary else encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
        fsync_dir(path.parent)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
            # write() and fsync() errors carry no file name: name the file being written
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_open(path, "w") as handle:
        handle.write(text)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_open(path, "wb") as handle:
        handle.write(data)


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=False) + "\n")


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def read_json_object(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A JSON object from a file someone else wrote (a model's config.json); anything else is one DataError naming it."""
    try:
        body = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"{path} is not readable JSON ({exc})") from exc
    if not isinstance(body, dict):
        raise DataError(f"{path} is not a JSON object")
    return body


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Build a folder under a hidden temporary name beside ``path``; it replaces ``path`` only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    os.chmod(staging, 0o777 & ~_umask())
    try:
        yield staging
        if path.exists():
            shutil.rmtree(path)
        staging.rename(path)
        fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
