"""Atomic file writes and hashing: a crash never leaves a half-written file under its final name.

Every function takes a local path or a bucket location (``experiment.storage``). Locally a file is
written under a temporary name beside its final one, fsynced and renamed over it; in a bucket it is one
object put (or a streamed upload published when it closes): either way a reader sees the old file or
the whole new one, never a part.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from experiment.errors import DataError, WriteError
from experiment.jsontext import parse_json
from experiment.storage import BucketPath, RunPath, location
from experiment.storage.local import fsync_dir, umask

# errors of writing (not of the data or the code): reported as one line, the run can be repeated
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})
# tensorstore: os_error_code='28'; Python: [Errno 28]; Rust's io::Error (safetensors, tokenizers): Os { code: 28, ...
# or (os error 28)
_ERRNO_IN_TEXT = re.compile(r"os_error_code='(\d+)'|\[Errno (\d+)\]|Os \{ code: (\d+)|\(os error (\d+)\)")


def write_errno(exc: BaseException | str) -> int | None:
    """The errno of a write error, also when tensorstore (a ValueError) or safetensors (a SafetensorError) reports it
    inside its text."""
    if isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS:
        return exc.errno
    match = _ERRNO_IN_TEXT.search(str(exc))
    code = int(next(group for group in match.groups() if group)) if match else None
    return code if code in WRITE_ERRNOS else None


def format_bytes(size: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def free_bytes(path: str | os.PathLike[str] | BucketPath) -> int | None:
    """Free bytes on the disk that holds ``path`` (or its nearest existing parent); None for a bucket (no
    such limit) or where the disk cannot tell."""
    if isinstance(path, BucketPath):
        return None
    where = Path(path).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        return shutil.disk_usage(where).free
    except OSError:
        return None


def mount_point(path: str | os.PathLike[str]) -> Path:
    """The mount point of the disk that holds ``path`` (or its nearest existing parent)."""
    where = Path(path).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    while not os.path.ismount(where) and where != where.parent:
        where = where.parent
    return where


def free_space(path: str | os.PathLike[str] | BucketPath) -> str:
    """Free space on the disk that holds ``path``, e.g. '1.3 MiB'."""
    free = free_bytes(path)
    return "unknown space" if free is None else format_bytes(free)


def write_error(exc: OSError, path: str | os.PathLike[str] | BucketPath, advice: str = "free some space and "
                "rerun the same command") -> WriteError:
    """One line for a failed write: the file (or ``path``), the reason and the space left on that disk."""
    where = exc.filename2 or exc.filename or path  # a failed copy names its source, then its destination
    if isinstance(path, BucketPath) and not exc.filename:
        return WriteError(f"cannot write {path}: {exc.strerror or exc}: rerun the same command once the storage "
                          "takes writes again")
    return WriteError(f"cannot write {where}: {exc.strerror or exc} ({free_space(where)} free on that disk): {advice}")


# the file every stage writes first into its run folder (``experiment.runfolder.RESOLVED_CONFIG``): the
# guard below finds a path's run folder by it
RUN_FOLDER_MARKER = "config.resolved.yaml"


def check_removable(path: str | os.PathLike[str] | BucketPath) -> None:
    """Refuse (one DataError line naming the link) to delete or replace ``path`` through a symlinked folder
    between it and its run folder (the nearest folder above it holding ``RUN_FOLDER_MARKER``): a link planted
    there (or left by a user) would make a stage delete another folder's files. ``path`` itself may be a link
    (removing or replacing a link touches nothing else); the run folder, or a folder above it, may be one
    (where the user keeps runs). A bucket has no links; a path in no run folder has no boundary to keep."""
    if isinstance(path, BucketPath):
        return
    folder = Path(os.path.abspath(path)).parent  # lexical, so that the links on the way are seen
    for above in (folder, *folder.parents):
        # the link first: a link to another run's folder has that run's marker behind it, and would pass for
        # this path's own run folder
        if above.is_symlink():
            run_folder = next((p for p in above.parents if (p / RUN_FOLDER_MARKER).is_file()), None)
            if run_folder is None:
                return  # the run folder itself, or a folder above it: where the user keeps runs
            raise DataError(f"{above} is a link to {above.resolve()}, out of the run folder {run_folder}: a stage "
                            f"never deletes or replaces files through a link (here {Path(path).name}); remove the "
                            "link and rerun (to keep runs on another disk, point experiment.run_root there)")
        if (above / RUN_FOLDER_MARKER).is_file():
            return  # the run folder: what is above it is the user's


def remove_file(path: str | os.PathLike[str] | BucketPath, missing_ok: bool = True) -> None:
    """Delete the file ``path`` (a local one only where ``check_removable`` allows it)."""
    check_removable(path)
    location(path).unlink(missing_ok=missing_ok)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str] | BucketPath, mode: str = "w",
                encoding: str | None = "utf-8") -> Iterator[IO[Any]]:
    """Write to a temporary file beside ``path``; rename it over ``path`` only on success. In a bucket: an
    upload published when the block ends without error, discarded when it raises."""
    path = location(path)
    if isinstance(path, BucketPath):
        with path.open("wb" if "b" in mode else "w", encoding=None if "b" in mode else encoding) as handle:
            yield handle
        return
    check_removable(path)  # the rename replaces what is there
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.chmod(tmp_name, 0o666 & ~umask())  # mkstemp makes 0600 files; give them the usual permissions
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


def atomic_write_text(path: str | os.PathLike[str] | BucketPath, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike[str] | BucketPath, data: bytes) -> None:
    path = location(path)
    if isinstance(path, BucketPath):
        path.write_bytes(data)  # one object put: whole or nothing
        return
    with atomic_open(path, "wb") as handle:
        handle.write(data)


def atomic_write_json(path: str | os.PathLike[str] | BucketPath, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=False) + "\n")


def sha256_file(path: str | os.PathLike[str] | BucketPath, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with location(path).open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def read_json_object(path: str | os.PathLike[str] | BucketPath) -> dict[str, Any]:
    """A JSON object from a file someone else wrote (a model's config.json); anything else is one DataError
    naming it."""
    try:
        body = parse_json(location(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"{path} is not readable JSON ({exc})") from exc
    if not isinstance(body, dict):
        raise DataError(f"{path} is not a JSON object")
    return body


# the files of a folder that its readers open first: published last, removed first (a Hugging Face folder's
# config.json, a stage's manifest)
COMMIT_FILES = ("config.json", "manifest.json")


# the names atomic_dir gives its folders beside ``path``: a folder being built, and the old one being replaced
STAGING_TAG, RETIRED_TAG = "staging-", "retired-"
_RENAME_EXCHANGE = 2  # linux/fs.h: renameat2 swaps the two names in one step


def _exchange(first: Path, second: Path) -> bool:
    """Swap two folders' names atomically (Linux renameat2 RENAME_EXCHANGE); False where the C library, the kernel or
    the filesystem cannot."""
    import ctypes

    try:  # the C library the interpreter runs on (no search for it: find_library would start ldconfig)
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # not Linux, or a C library without renameat2 (glibc before 2.28)
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(code, os.strerror(code), str(second))


def _sibling_folders(path: Path, tag: str) -> list[Path]:
    return sorted(p for p in path.parent.glob(f".{glob.escape(path.name)}.{tag}*") if p.is_dir() and not p.is_symlink())


def recover_staging(path: Path) -> None:
    """What a killed ``atomic_dir`` on ``path`` left: an old folder moved aside while its replacement was not yet in
    (put back: the old stays until a new one is in) and staging folders (removed: each is rebuilt from the start).
    The stage lock keeps a second writer of ``path`` away, so no staging folder here is in use."""
    retired = _sibling_folders(path, RETIRED_TAG)
    if retired and not path.exists():
        retired[-1].rename(path)
        fsync_dir(path.parent)
    # staging folders named before the tag (mkdtemp's 8 random characters alone) are a killed build's too
    legacy = [p for p in _sibling_folders(path, "") if re.fullmatch(r"[a-z0-9_]{8}", p.name[len(path.name) + 2:])]
    for stale in [*_sibling_folders(path, RETIRED_TAG), *_sibling_folders(path, STAGING_TAG), *legacy]:
        if stale.exists():
            shutil.rmtree(stale, ignore_errors=True)


def replace_dir(new: Path, path: Path) -> None:
    """Put the complete folder ``new`` at ``path``, keeping the old one there until the new is in: one atomic swap of
    the two names where the filesystem has it, else the old renamed aside first (``recover_staging`` puts it back
    if a kill comes between the two renames); the old is removed last, never followed if it is a link."""
    if not path.exists() and not path.is_symlink():
        new.rename(path)
        fsync_dir(path.parent)
        return
    if path.is_dir() and not path.is_symlink() and _exchange(new, path):
        fsync_dir(path.parent)
        shutil.rmtree(new)  # the old folder, now under the staging name
        return
    retired = path.parent / f".{path.name}.{RETIRED_TAG}{os.getpid()}-{time.time_ns()}"
    path.rename(retired)
    new.rename(path)
    fsync_dir(path.parent)
    if retired.is_dir() and not retired.is_symlink():
        shutil.rmtree(retired)
    else:
        retired.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str] | BucketPath) -> Iterator[Path]:
    """Build a folder under a hidden temporary name beside ``path``; it replaces ``path`` only on success
    (``replace_dir``: the old one stays until the new one is in), and what a killed earlier build left beside
    ``path`` is recovered or removed first (``recover_staging``).

    In a bucket the folder is built in a local temporary folder and uploaded on success: a bucket has no
    atomic rename of a prefix, so the files its readers open first (``COMMIT_FILES``) are removed before
    anything else and published after everything else: a reader never finds them beside a partial folder."""
    path = location(path)
    if isinstance(path, BucketPath):
        with tempfile.TemporaryDirectory(prefix="ru-pretrain-upload-") as staging:
            yield Path(staging)
            publish_dir(Path(staging), path)
        return
    check_removable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover_staging(path)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.{STAGING_TAG}", dir=path.parent))
    os.chmod(staging, 0o777 & ~umask())
    try:
        yield staging
        replace_dir(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def publish_dir(source: Path, target: RunPath) -> None:
    """Copy the local folder ``source`` to ``target`` (a bucket prefix or a local folder), replacing what
    is there, the ``COMMIT_FILES`` last (see ``atomic_dir``)."""
    files = sorted(p for p in source.rglob("*") if p.is_file())
    names = {p.relative_to(source).as_posix() for p in files}
    if isinstance(target, BucketPath):
        old = target.list_objects()
        for name in sorted(old, key=lambda n: n.rsplit("/", 1)[-1] not in COMMIT_FILES):
            if name not in names or name.rsplit("/", 1)[-1] in COMMIT_FILES:
                (target / name).unlink(missing_ok=True)
    last = [p for p in files if p.name in COMMIT_FILES]
    for file in [p for p in files if p.name not in COMMIT_FILES] + last:
        dest = target / file.relative_to(source).as_posix()
        if isinstance(dest, BucketPath):
            dest.fs.put_file(str(file), dest.fs_path)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, dest)
