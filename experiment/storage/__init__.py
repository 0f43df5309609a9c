"""Where a run's files live: a local folder or a bucket (``gs://``, ``s3://``), behind one path type.

``location(text)`` turns a config value into a ``RunPath``: a ``pathlib.Path`` for a local path, a
``BucketPath`` for a bucket URL (``experiment.storage.path``). Code that joins names, reads and writes
whole files works on both. The few operations whose guarantee differs by backend are functions here, each
with the same promise on every backend:

- ``create_exclusive``: write a file only if none exists (``O_EXCL`` locally; GCS ``ifGenerationMatch=0``,
  S3 ``If-None-Match: *``), the base of the ledger's segments and the run's locks;
- ``read_range``: bytes ``[start, end)`` of a file without reading the rest;
- ``remove_tree``: a folder and everything in it.

Atomic publishing (a file appears whole or not at all) is ``experiment.files``; locks are
``experiment.lock``; the append-only logs are ``experiment.appendlog``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from experiment.storage.backends import ObjectStat, PreconditionFailed, endpoint
from experiment.storage.path import BucketPath
from experiment.storage.urls import SCHEMES, ObjectUrl, check_location, is_bucket_url, parse_url

RunPath = Path | BucketPath

__all__ = ["SCHEMES", "BucketPath", "ObjectStat", "ObjectUrl", "PreconditionFailed", "RunPath", "as_local",
           "check_location", "create_exclusive", "describe", "endpoint", "host_local_root", "is_bucket",
           "is_bucket_url", "local_folder", "location", "parse_url", "read_range", "remove_tree"]


def host_local_root() -> Path:
    """Where a run whose folder is in a bucket keeps what must stay on this host's disk (W&B's offline files,
    caches, local copies of model folders): ``RU_PRETRAIN_LOCAL``, or ``~/.cache/ru-pretrain/local``. A
    recreated VM starts with it empty, and nothing there is needed to resume."""
    return Path(os.environ.get("RU_PRETRAIN_LOCAL") or Path.home() / ".cache" / "ru-pretrain" / "local")


def location(text: str | os.PathLike[str] | BucketPath, key: str = "") -> RunPath:
    """A config value or path as a ``RunPath``: a bucket URL becomes a ``BucketPath`` (checked: a malformed
    one is a ConfigError naming ``key``), anything else a ``pathlib.Path``."""
    if isinstance(text, BucketPath | Path):
        return text
    raw = os.fspath(text)
    if is_bucket_url(raw):
        return BucketPath(parse_url(raw, key))
    check_location(raw, key)
    return Path(raw)


def local_folder(path: RunPath, what: str) -> Path:
    """A folder that a library must open as local files: ``path`` itself, or a bucket prefix copied to this
    host (``experiment.storage.download``: only what changed since the last copy is fetched)."""
    if isinstance(path, Path):
        return path
    from experiment.storage.download import local_copy

    return local_copy(path, what, host_local_root() / "downloads")


def is_bucket(path: object) -> bool:
    return isinstance(path, BucketPath)


def as_local(path: RunPath, what: str) -> Path:
    """``path`` where only a local file will do (a library that opens files by name); a bucket location is
    a ValueError naming ``what``: callers copy the object to a local file first."""
    if isinstance(path, BucketPath):
        raise ValueError(f"{what} must be a local file here, not {path}")
    return path


def describe(path: RunPath) -> str:
    """``path`` and, for a bucket behind a custom endpoint (an emulator, an S3-compatible provider), where."""
    if isinstance(path, BucketPath):
        where = endpoint(path.scheme)
        return f"{path} (at {where})" if where else str(path)
    return str(path)


def create_exclusive(path: RunPath, data: bytes) -> None:
    """Write ``path`` with ``data`` only if it does not exist; FileExistsError otherwise. The file appears
    whole or not at all."""
    if isinstance(path, BucketPath):
        from experiment.storage.backends import create

        create(path.url, data)
        return
    from experiment.storage.local import atomic_open_exclusive

    atomic_open_exclusive(path, data)


def read_range(path: RunPath, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of a file (fewer at its end)."""
    if isinstance(path, BucketPath):
        return path.read_range(start, end)
    with open(path, "rb") as handle:
        handle.seek(start)
        return handle.read(max(0, end - start))


def remove_tree(path: RunPath) -> None:
    """Delete a folder (or a bucket prefix) and everything under it; nothing to delete is no error."""
    if isinstance(path, BucketPath):
        path.rmtree()
        return
    with contextlib.suppress(FileNotFoundError):
        if path.is_symlink() or path.is_file():
            path.unlink()
        else:
            shutil.rmtree(path)
