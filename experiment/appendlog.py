"""Append-only logs (the cost ledger, ``train_log.jsonl``) on a disk and in a bucket, with one promise:
what a sync made durable is never torn or rewritten by anyone.

- **On a disk** a log is one file opened for appending; ``sync`` flushes and fsyncs it. A kill mid-write can
  leave a torn last line, which readers drop (``experiment.jsonl``) and the next writer cuts off.
- **In a bucket** an object cannot be appended to, and rewriting one object at each flush would let a
  preempted host lose what it had (its rewrite dies with it) and a slow one overwrite a newer one. So a log
  ``<name>`` is a prefix ``<name>.segments/`` of immutable numbered objects: each ``sync`` publishes what
  was written since the last one as the next segment, created only if no segment of that number exists
  (``experiment.storage.create_exclusive``). A killed host loses at most what it had not synced, never a
  segment; two writers of one log (which the run's lock prevents) could not overwrite each other's segments
  either: the second finds its number taken and stops with one line.
- **Cutting a log back** (a resumed run drops what it will retrace) is ``rewrite``: on a disk the file is
  replaced atomically; in a bucket a *base* segment holding the whole kept log is published after the last
  segment, and readers start from the latest base.

``read_text`` gives the log's text either way (the segments concatenated from the latest base).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import IO

from experiment.errors import DataError, WriteError
from experiment.files import atomic_write_text, mount_point, write_error
from experiment.storage import BucketPath, RunPath
from experiment.storage.retry import create_exclusive_checked

SEGMENTS = ".segments"
PUBLISH_S = 30.0  # a bucket log's ``flush`` publishes a segment at most this often (``sync`` always does)
_SEGMENT = re.compile(r"^(\d{10})(\.base)?\.jsonl$")


def segments_folder(path: BucketPath) -> BucketPath:
    return path.with_name(path.name + SEGMENTS)


def _segments(path: BucketPath) -> list[tuple[int, bool, BucketPath]]:
    """``(number, is_base, object)`` of the log's segments, in order."""
    folder = segments_folder(path)
    found = []
    for name in folder.list_objects():
        match = _SEGMENT.match(name)
        if match:
            found.append((int(match.group(1)), bool(match.group(2)), folder / name))
    return sorted(found, key=lambda item: item[0])


def exists(path: RunPath) -> bool:
    if isinstance(path, BucketPath):
        return path.is_file() or bool(_segments(path))
    return path.is_file()


def read_bytes(path: RunPath) -> bytes:
    """The log's bytes (FileNotFoundError: no log). In a bucket: its segments from the latest base on (an
    object of the log's own name, as an older version or a user copied it, comes first)."""
    if not isinstance(path, BucketPath):
        return path.read_bytes()
    segments = _segments(path)
    if not segments:
        return path.read_bytes()  # a plain object (FileNotFoundError: neither)
    bases = [i for i, (_, base, _) in enumerate(segments) if base]
    start = bases[-1] if bases else 0
    head = path.read_bytes() if not bases and path.is_file() else b""
    return head + b"".join(obj.read_bytes() for _, _, obj in segments[start:])


def read_text(path: RunPath) -> str:
    return read_bytes(path).decode("utf-8")


def rewrite(path: RunPath, text: str) -> None:
    """Replace the whole log with ``text`` (whole or not at all)."""
    if not isinstance(path, BucketPath):
        atomic_write_text(path, text)
        return
    segments = _segments(path)
    number = segments[-1][0] + 1 if segments else 0
    _publish(path, number, text.encode("utf-8"), base=True)


def _publish(path: BucketPath, number: int, data: bytes, base: bool = False) -> None:
    name = f"{number:010d}{'.base' if base else ''}.jsonl"
    try:
        create_exclusive_checked(segments_folder(path) / name, data)  # a lost answer is no second writer
    except FileExistsError:
        raise DataError(f"{path}: segment {number} was written by another process: two writers append to this "
                        "log (one run folder, two runs?): stop the other one") from None


class LogWriter:
    """Appends text to a log; ``sync`` makes what was appended durable (a disk: flush + fsync; a bucket:
    the next segment)."""

    def __init__(self, path: RunPath) -> None:
        self.path = path
        self._handle: IO[str] | None = None
        self._pending: list[str] = []
        self._next = 0
        self._published = time.monotonic()
        if isinstance(path, BucketPath):
            segments = _segments(path)
            self._next = segments[-1][0] + 1 if segments else 0
        else:
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                self._handle = Path(path).open("a", encoding="utf-8")  # noqa: SIM115 - held open until close()
            except OSError as exc:
                raise self._disk_error(exc) from exc

    def _disk_error(self, exc: OSError) -> WriteError:
        """A failed append on a disk (full, read-only, failing) as one line naming the log, its disk and the space
        left there: the log's own disk, which need not be the checkpoints'."""
        return write_error(exc, self.path, f"free space on the disk mounted at {mount_point(self.path)} and rerun "
                                           "the same command (the run resumes from its last checkpoint)")

    def write(self, text: str) -> None:
        if self._handle is not None:
            try:
                self._handle.write(text)
            except OSError as exc:  # a full buffer is written out here
                raise self._disk_error(exc) from exc
        else:
            self._pending.append(text)

    def flush(self) -> None:
        """Hand what was written to the OS (a disk); in a bucket, publish it as a segment when the last one is
        ``PUBLISH_S`` old (what a kill loses before a ``sync`` is what a resume retraces anyway)."""
        if self._handle is not None:
            try:
                self._handle.flush()
            except OSError as exc:
                raise self._disk_error(exc) from exc
        elif time.monotonic() - self._published >= PUBLISH_S:
            self.sync()

    def sync(self) -> None:
        if self._handle is not None:
            try:
                self._handle.flush()
                os.fsync(self._handle.fileno())
            except OSError as exc:
                raise self._disk_error(exc) from exc
            return
        if not self._pending:
            return
        data = "".join(self._pending).encode("utf-8")
        assert isinstance(self.path, BucketPath)
        _publish(self.path, self._next, data)
        self._pending.clear()
        self._next += 1
        self._published = time.monotonic()

    def close(self, publish: bool = True) -> None:
        """Close the log; in a bucket, what was written since the last segment is published (``publish=False``:
        dropped, when the storage is failing and it is work a resume retraces)."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            try:
                handle.close()  # writes out the buffer first: the fd is closed even when that fails
            except OSError as exc:
                if publish:
                    raise self._disk_error(exc) from exc
        elif publish:
            self.sync()
        else:
            self._pending.clear()
