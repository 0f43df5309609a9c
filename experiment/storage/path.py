"""``BucketPath``: a location in a bucket that answers the part of ``pathlib.Path`` the recipes use.

Code that builds names (``/``, ``name``, ``parent``, ``with_suffix``), asks what exists (``exists``,
``is_file``, ``is_dir``, ``iterdir``, ``glob``), reads (``read_bytes``, ``read_text``, ``open("rb")``) and
writes whole files (``write_bytes``, ``write_text``) works on a ``BucketPath`` as on a local ``Path``. What
differs is said here once:

- a write is an object put: the object appears whole or not at all (no temporary name, no rename);
  ``open("wb")`` streams an upload that is published only when the file closes without error, and is
  discarded when the ``with`` block raises;
- folders are prefixes: ``mkdir`` does nothing, ``is_dir`` is true when an object lies under the prefix;
- ``rename`` copies, then deletes (a bucket has no atomic rename: callers use it only to set data aside);
- there are no links, and no ``__fspath__``: handing a ``BucketPath`` to ``open()``, ``os.*`` or a library
  that only reads local files fails at once with a TypeError instead of writing a local folder named ``gs:``.
"""

from __future__ import annotations

import fnmatch
import io
import os
import posixpath
import stat as stat_module
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import IO, Any

from experiment.storage.backends import ObjectStat, filesystem, stat, stat_of
from experiment.storage.urls import ObjectUrl, parse_url


class _Upload(io.RawIOBase):
    """A binary upload published by ``close`` and dropped by ``discard`` (or by a ``with`` block that raises)."""

    def __init__(self, handle: Any, url: ObjectUrl) -> None:
        super().__init__()
        self._handle, self.name = handle, str(url)
        self._done = False

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:  # type: ignore[override]
        return self._handle.write(data)

    def tell(self) -> int:
        return self._handle.tell()

    def flush(self) -> None:  # an object is published whole: nothing becomes visible before close
        pass

    def discard(self) -> None:
        if not self._done:
            self._done = True
            self._handle.discard()
            self._handle.closed = True  # fsspec's __del__ would otherwise flush what was discarded
        super().close()

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._handle.close()
        super().close()

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        if kind is not None:
            self.discard()
        else:
            self.close()


class _TextUpload:
    """Text written to an ``_Upload`` (encoded as it comes; newlines as written)."""

    def __init__(self, upload: _Upload, encoding: str, errors: str | None) -> None:
        self.raw, self.encoding, self.errors = upload, encoding, errors or "strict"
        self.name = upload.name

    def write(self, text: str) -> int:
        self.raw.write(text.encode(self.encoding, self.errors))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass

    @property
    def closed(self) -> bool:
        return self.raw.closed

    def close(self) -> None:
        self.raw.close()

    def discard(self) -> None:
        self.raw.discard()

    def __enter__(self) -> _TextUpload:
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        self.raw.__exit__(kind, value, traceback)


class BucketPath:
    """``scheme://bucket/key``; immutable, hashable, ordered by its URL."""

    __slots__ = ("url",)

    def __init__(self, url: ObjectUrl | str) -> None:
        object.__setattr__(self, "url", url if isinstance(url, ObjectUrl) else parse_url(url))

    # ------------------------------------------------------------------------------------ names
    def __str__(self) -> str:
        return str(self.url)

    def __repr__(self) -> str:
        return f"BucketPath({str(self.url)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BucketPath) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __lt__(self, other: BucketPath) -> bool:
        return str(self) < str(other)

    def __truediv__(self, name: str | os.PathLike[str]) -> BucketPath:
        text = os.fspath(name) if not isinstance(name, str) else name
        if text.startswith("/") or "://" in text:
            raise ValueError(f"cannot join {text!r} under {self}")
        parts = [p for p in text.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise ValueError(f"'..' in {text!r} would leave {self}")
        return BucketPath(self.url.child(*parts))

    def joinpath(self, *names: str) -> BucketPath:
        path = self
        for name in names:
            path = path / name
        return path

    @property
    def scheme(self) -> str:
        return self.url.scheme

    @property
    def bucket(self) -> str:
        return self.url.bucket

    @property
    def key(self) -> str:
        return self.url.key

    @property
    def fs_path(self) -> str:
        return self.url.fs_path

    @property
    def _pure(self) -> PurePosixPath:
        return PurePosixPath("/" + self.url.key)

    @property
    def name(self) -> str:
        return self._pure.name

    @property
    def stem(self) -> str:
        return self._pure.stem

    @property
    def suffix(self) -> str:
        return self._pure.suffix

    @property
    def suffixes(self) -> list[str]:
        return self._pure.suffixes

    @property
    def parts(self) -> tuple[str, ...]:
        return (f"{self.scheme}://{self.bucket}", *[p for p in self.key.split("/") if p])

    @property
    def parent(self) -> BucketPath:
        if not self.key:
            return self
        return BucketPath(ObjectUrl(self.scheme, self.bucket, posixpath.dirname(self.key)))

    @property
    def parents(self) -> list[BucketPath]:
        out, path = [], self
        while path.key:
            path = path.parent
            out.append(path)
        return out

    def with_name(self, name: str) -> BucketPath:
        return self.parent / name

    def with_suffix(self, suffix: str) -> BucketPath:
        return self.parent / self._pure.with_suffix(suffix).name

    def relative_to(self, other: BucketPath | str) -> PurePosixPath:
        other = other if isinstance(other, BucketPath) else BucketPath(str(other))
        if (other.scheme, other.bucket) != (self.scheme, self.bucket):
            raise ValueError(f"{self} is not under {other}")
        return self._pure.relative_to(other._pure)

    def is_relative_to(self, other: BucketPath | str) -> bool:
        try:
            self.relative_to(other)
        except ValueError:
            return False
        return True

    def as_posix(self) -> str:
        return str(self)

    def as_uri(self) -> str:
        return str(self)

    def resolve(self, strict: bool = False) -> BucketPath:  # no links in a bucket: a URL is already canonical
        return self

    def absolute(self) -> BucketPath:
        return self

    def expanduser(self) -> BucketPath:
        return self

    def is_absolute(self) -> bool:
        return True

    def is_symlink(self) -> bool:
        return False

    def match(self, pattern: str) -> bool:
        return self._pure.match(pattern)

    # ------------------------------------------------------------------------------------ queries
    @property
    def fs(self) -> Any:
        return filesystem(self.scheme)

    def object_stat(self) -> ObjectStat | None:
        """The object's size, generation, update time and checksum (None: no such object)."""
        return stat(self.url)

    def exists(self) -> bool:
        return self.fs.exists(self.fs_path)

    def is_file(self) -> bool:
        return self.object_stat() is not None

    def is_dir(self) -> bool:
        if not self.key:
            return self.fs.exists(self.bucket)
        if self.object_stat() is not None:
            return False
        try:
            return bool(self.fs.ls(self.fs_path + "/", detail=False))
        except FileNotFoundError:  # gcsfs and s3fs raise for a prefix no object has; pathlib says False
            return False

    def stat(self) -> os.stat_result:
        found = self.object_stat()
        if found is not None:
            return os.stat_result((stat_module.S_IFREG | 0o644, 0, 0, 1, 0, 0, found.size, found.updated,
                                   found.updated, found.updated))
        if self.is_dir():
            return os.stat_result((stat_module.S_IFDIR | 0o755, 0, 0, 1, 0, 0, 0, 0, 0, 0))
        raise FileNotFoundError(str(self))

    def _child(self, fs_path: str) -> BucketPath:
        bucket, _, key = fs_path.rstrip("/").partition("/")
        return BucketPath(ObjectUrl(self.scheme, bucket, key))

    def iterdir(self) -> Iterator[BucketPath]:
        try:
            entries = self.fs.ls(self.fs_path + "/", detail=False)
        except FileNotFoundError:
            entries = []
        if not entries and not self.is_dir():
            raise FileNotFoundError(f"{self} is no folder")
        own = self.fs_path.rstrip("/")
        for entry in sorted(entries):
            if entry.rstrip("/") != own:
                yield self._child(entry)

    def list_objects(self) -> dict[str, ObjectStat]:
        """Every object under this prefix, by its name relative to it, with its stat: one listing."""
        prefix = self.fs_path.rstrip("/") + "/"
        try:
            found = self.fs.find(prefix, detail=True)
        except FileNotFoundError:
            return {}
        return {name[len(prefix):]: stat_of(self.scheme, info) for name, info in sorted(found.items())
                if name.startswith(prefix) and info.get("type") == "file"}

    def rglob(self, pattern: str) -> Iterator[BucketPath]:
        """Objects under this prefix whose name relative to it matches ``pattern``'s last part (pathlib's rglob
        also yields folders; a bucket has none but the prefixes of objects, which are yielded too)."""
        names = self.list_objects()
        seen: set[str] = set()
        for name in names:
            parts = name.split("/")
            for depth in range(1, len(parts) + 1):
                rel = "/".join(parts[:depth])
                if rel not in seen and fnmatch.fnmatchcase(parts[depth - 1], pattern):
                    seen.add(rel)
                    yield self / rel

    def glob(self, pattern: str) -> Iterator[BucketPath]:
        """pathlib's ``glob`` for patterns of one or more parts without ``**``."""
        if "**" in pattern:
            if pattern.startswith("**/"):
                yield from self.rglob(pattern[3:])
                return
            raise ValueError(f"glob pattern {pattern!r}: only a leading '**/' is supported on a bucket")
        parts = pattern.split("/")
        level = [self]
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            nxt: list[BucketPath] = []
            for folder in level:
                try:
                    children = list(folder.iterdir())
                except FileNotFoundError:
                    continue
                nxt.extend(c for c in children if fnmatch.fnmatchcase(c.name, part) and (last or c.is_dir()))
            level = nxt
        yield from sorted(level)

    # ------------------------------------------------------------------------------------ reading
    def read_bytes(self) -> bytes:
        if not self.key:
            raise IsADirectoryError(str(self))
        return self.fs.cat_file(self.fs_path)

    def read_text(self, encoding: str | None = "utf-8", errors: str | None = None) -> str:
        return self.read_bytes().decode(encoding or "utf-8", errors or "strict")

    def read_range(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object, in one ranged request."""
        return self.fs.cat_file(self.fs_path, start=start, end=end)

    def open(self, mode: str = "r", buffering: int = -1, encoding: str | None = None, errors: str | None = None,
             newline: str | None = None) -> IO[Any]:
        binary = "b" in mode
        kind = mode.replace("b", "").replace("t", "")
        if kind == "r":
            handle = self.fs.open(self.fs_path, "rb", cache_type="readahead")
            return handle if binary else io.TextIOWrapper(handle, encoding=encoding or "utf-8", errors=errors,
                                                          newline=newline)
        if kind in ("w", "x"):
            if kind == "x" and self.exists():
                raise FileExistsError(str(self))
            upload = _Upload(self.fs.open(self.fs_path, "wb"), self.url)  # fsspec buffers the upload's parts
            if binary:
                return upload  # type: ignore[return-value]
            return _TextUpload(upload, encoding or "utf-8", errors)  # type: ignore[return-value]
        raise ValueError(f"mode {mode!r}: a bucket object is read or written whole (no append or update)")

    # ------------------------------------------------------------------------------------ writing
    def write_bytes(self, data: bytes | bytearray | memoryview) -> int:
        self.fs.pipe_file(self.fs_path, bytes(data))
        return len(data)

    def write_text(self, text: str, encoding: str | None = "utf-8", errors: str | None = None,
                   newline: str | None = None) -> int:
        if newline not in (None, "", "\n"):
            text = text.replace("\n", newline)
        return self.write_bytes(text.encode(encoding or "utf-8", errors or "strict"))

    def touch(self, exist_ok: bool = True) -> None:
        if self.is_file():
            if not exist_ok:
                raise FileExistsError(str(self))
            return
        self.write_bytes(b"")

    def mkdir(self, mode: int = 0o777, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to make: a prefix exists once an object lies under it."""

    def rmdir(self) -> None:
        if self.is_dir():
            raise OSError(f"{self} is not empty")

    def unlink(self, missing_ok: bool = False) -> None:
        if not missing_ok and not self.is_file():
            raise FileNotFoundError(str(self))
        try:
            self.fs.rm_file(self.fs_path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def rmtree(self) -> None:
        """Delete every object under this prefix (and the object of this name, if any)."""
        found = self.list_objects()
        if found:
            self.fs.rm([f"{self.fs_path}/{name}" for name in found])
        if self.is_file():
            self.fs.rm_file(self.fs_path)

    def rename(self, target: BucketPath | str) -> BucketPath:
        """Copy, then delete: an object, or every object under a prefix (not atomic: a bucket has no rename)."""
        target = target if isinstance(target, BucketPath) else BucketPath(str(target))
        if self.is_file():
            self.fs.copy(self.fs_path, target.fs_path)
            self.fs.rm_file(self.fs_path)
            return target
        names = self.list_objects()
        if not names:
            raise FileNotFoundError(str(self))
        for name in names:
            self.fs.copy(f"{self.fs_path}/{name}", f"{target.fs_path}/{name}")
        self.fs.rm([f"{self.fs_path}/{name}" for name in names])
        return target

    replace = rename
