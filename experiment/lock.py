"""Run-folder locks: one writer per stage of a run folder, and no rewrite of data a running stage reads.

Each stage that runs holds ``<run folder>/.locks/<stage>.lock`` exclusively, with its holder written in it as
JSON (host, pid, since, renewed, stage). A stage that reads an earlier stage's output (``Stage.reads``) holds
that stage's lock *shared*, in the run folder that owns the output (through a link: a branch's or a variant's
shards are locked in the parent's folder). So a second recipe 04 of one run, a recipe 03 rewriting the shards
a recipe 04 trains on, or a recipe 04 starting while recipe 03 writes them, each stop at once with one line.
Readers of finished outputs that are no stage (the loaders, the tests) take no lock. A multi-host job locks
once, in its process 0 (the harness passes ``primary``).

The holder renews its lease every ``RENEW_S`` seconds while it holds the lock. A lock whose lease was not
renewed for ``LEASE_S`` seconds is taken over, with a warning naming the holder that left it. *Not renewed*
is measured by the storage's own clock (the lock's modification time against that of a file written just
now beside it), never by comparing the holder's clock with ours: two hosts whose clocks disagree by minutes
neither break a live lease nor keep a dead one.

- **On a disk** the lock is an OS lock (``fcntl.flock``) on the file, and the record in it. The kernel
  releases an flock when its holder dies, so a holder on this host that is gone is known at once (its pid).
  A record naming another host is trusted until its lease lapses, whether or not the flock was free: on a
  shared filesystem an flock may hold only within one host.
- **In a bucket** the lock is an object created only if none exists (``ifGenerationMatch=0`` /
  ``If-None-Match: *``) and renewed by a conditional replace (generation / ETag match); a lapsed lease is
  taken over by a conditional replace of the version read, so of two processes taking over one wins. A
  shared hold is an object of its own under ``<stage>.readers/``: a writer refuses while a live reader's is
  there, a reader while a writer's lock is. A holder whose renewal finds another holder in its place has
  lost the lock (its lease lapsed: a storage outage longer than the lease): ``lost_lease()`` says so, and the
  trainer stops rather than write another checkpoint (``trainer.checkpoint``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import logging
import os
import socket
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from experiment.errors import RecipeError, WriteError
from experiment.jsontext import parse_json
from experiment.runfolder import RunFolder, linked_run
from experiment.stages import Stage, stage_named
from experiment.storage import BucketPath, RunPath, backends
from experiment.storage.retry import create_checked, replace_if_checked, unique_token

log = logging.getLogger("experiment.lock")
LOCKS_DIR = ".locks"
LEASE_S = 600.0  # a holder that has not renewed its lease for this long (by the storage's clock) is gone
RENEW_S = 60.0
SWEEP = "sweep"  # recipe 08's lock in the sweep's folder: its stages, each in a process of its own, lock their own
OTHER_LOCKS = {SWEEP: "recipes/08_sweep.py"}  # locks that are no stage's, and the recipe that takes them
READERS = ".readers"  # <stage>.lock.readers/: a bucket's shared holds of that lock, one object each


class BusyError(RecipeError):
    """A run folder's stage is held by another running process (names it)."""


class LeaseLost(RecipeError):
    """This process's lease on a lock lapsed and another process holds the lock now."""


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    since: str  # ISO time, UTC
    renewed: float  # Unix time of the last renewal, by the holder's clock (shown, never compared with ours)
    stage: str
    # unique to this hold: a bucket write whose answer was lost is told apart from another holder's by it
    # (experiment.storage.retry)
    token: str = ""

    def describe(self) -> str:
        return f"host {self.host}, pid {self.pid}, since {self.since}"

    def on_this_host(self) -> bool:
        return self.host == socket.gethostname()

    def encode(self) -> bytes:
        return json.dumps(self.__dict__).encode()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def lock_path(folder: RunFolder, name: str) -> RunPath:
    return folder.root / LOCKS_DIR / f"{name}.lock"


def _decode(body: bytes | str) -> Holder | None:
    """The holder in a lock's record (None: released cleanly, or unreadable while being rewritten)."""
    try:
        data = parse_json(body or "null")
        return Holder(str(data["host"]), int(data["pid"]), str(data["since"]), float(data["renewed"]),
                      str(data["stage"]), str(data.get("token", "")))
    except (ValueError, TypeError, KeyError):
        return None


def _read_holder(path: RunPath) -> Holder | None:
    try:
        return _decode(path.read_bytes())
    except OSError:
        return None


def _new_holder(stage: str) -> Holder:
    now = dt.datetime.now(dt.UTC)
    return Holder(socket.gethostname(), os.getpid(), now.isoformat(timespec="seconds"), now.timestamp(), stage,
                  unique_token())


def _recipe(name: str) -> str:
    try:
        return stage_named(name).recipe
    except ValueError:
        return OTHER_LOCKS.get(name, name)


def _busy(path: RunPath, holder: Holder | None, name: str, shared: bool) -> BusyError:
    folder = path.parent.parent
    if holder is None:  # readers hold it shared and write nothing
        return BusyError(f"{folder}: a running stage reads its {name} output: wait for it to finish before running "
                         f"{_recipe(name)} there")
    doing = "reading" if shared else "writing"
    return BusyError(f"{folder} is already running {_recipe(holder.stage)} ({holder.describe()}): wait for it to "
                     f"finish or stop it before {doing} its {holder.stage} output")


# ---------------------------------------------------------------------------------------------
# The storage's clock


def _disk_now(folder: Path) -> float:
    """Now by the clock of the filesystem that holds ``folder`` (an NFS server's, say): the modification
    time of a file written just now."""
    probe = folder / f".clock.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    try:
        probe.write_bytes(b"")
        return probe.stat().st_mtime
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


def _bucket_now(folder: BucketPath) -> float:
    """Now by the bucket's clock: the update time of an object written just now."""
    probe = folder / f".clock.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    written = create_checked(probe.url, unique_token().encode())
    with contextlib.suppress(OSError):
        probe.unlink(missing_ok=True)
    return written.updated


def _lapsed(updated: float, now: float) -> bool:
    return now - updated > LEASE_S


# ---------------------------------------------------------------------------------------------
# Leases: one renewal thread per held lock


_lost: list[str] = []  # the locks this process held and lost (their leases lapsed and others took them)


def lost_lease() -> str | None:
    """Why this process no longer holds a lock it took (None: every lock it holds is still its own)."""
    return _lost[0] if _lost else None


def check_lease() -> None:
    """Raise LeaseLost when this process lost a lock it held: it must stop before writing anything more."""
    reason = lost_lease()
    if reason is not None:
        raise LeaseLost(reason)


class _Lease:
    """Calls ``renew`` every ``RENEW_S`` seconds in a daemon thread until released."""

    def __init__(self, renew: object) -> None:
        self._renew = renew
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="lock-lease", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(RENEW_S):
            try:
                if self._renew() is False:  # type: ignore[operator]
                    return
            except Exception as exc:  # a storage outage: retried at the next renewal, within the lease
                log.warning("could not renew a lock's lease (%s); trying again in %.0f s", exc, RENEW_S)

    def release(self, wait: bool = True) -> None:
        self.stop.set()
        if wait:  # else a renewal in flight finishes (or gives up) on its own: a daemon thread
            self.thread.join()


# ---------------------------------------------------------------------------------------------
# On a disk


def _break(path: Path) -> None:
    """Put a fresh lock file in place of one whose holder is gone but whose OS lock still stands
    (a child it forked, an NFS lock of a dead host): the next flock is on the new file."""
    fresh = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fresh.write_bytes(b"")
    os.replace(fresh, path)


def _gone_on_disk(path: Path, holder: Holder) -> bool:
    """Whether the holder recorded in ``path`` is known dead: its pid is gone on this host, or, on another
    host, its lease lapsed by the filesystem's clock."""
    if holder.on_this_host():
        return not _pid_alive(holder.pid)
    try:
        return _lapsed(path.stat().st_mtime, _disk_now(path.parent))
    except OSError:
        return False


def _write_record(fd: int, holder: Holder) -> None:
    data = holder.encode()
    os.pwrite(fd, data, 0)  # over the old record, then cut: a reader never sees an empty file meanwhile
    os.ftruncate(fd, len(data))
    os.fsync(fd)


def _unwritable(path: Path, exc: OSError) -> WriteError:
    """The lock's folder refuses the lock file (read-only, another user's, a full disk): one line naming it."""
    return WriteError(f"cannot take the lock {path}: {exc.strerror or exc}: every stage writes its lock in "
                      f"{path.parent}; make that folder writable (or set experiment.run_root to one that is) and "
                      "rerun the same command")


def _open_locked(path: Path, shared: bool) -> tuple[int | None, Holder | None]:
    """``(fd, previous holder)`` with the flock taken, or ``(None, holder)`` when a live process holds it."""
    for _ in range(5):  # another process may replace the file between our open and our flock
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise _unwritable(path, exc) from exc
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                raise
            holder = _read_holder(path)
            if holder is None or not _gone_on_disk(path, holder):
                return None, holder
            log.warning("taking over the lock %s of %s (%s): that process is gone", path, holder.stage,
                        holder.describe())
            try:
                _break(path)
            except OSError as exc:
                raise _unwritable(path, exc) from exc
            continue
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        previous = _read_holder(path)
        # the flock is ours, but on a shared filesystem another host's holder may not show in it: its record does
        if previous is not None and not previous.on_this_host() and not _gone_on_disk(path, previous):
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            return None, previous
        return fd, previous
    raise BusyError(f"{path} keeps being replaced by other processes: rerun the same command")


@contextlib.contextmanager
def _hold_on_disk(path: Path, name: str, shared: bool) -> Iterator[None]:
    fd, previous = _open_locked(path, shared)
    if fd is None:
        raise _busy(path, previous, name, shared)
    lease = None
    try:
        if shared and previous is not None:
            os.ftruncate(fd, 0)  # no writer can hold it while we do: the record is a dead writer's
        elif not shared:
            if previous is not None:
                log.warning("taking over the lock %s left by %s (%s): that process is gone", path, previous.stage,
                            previous.describe())
            holder = _new_holder(name)
            try:
                _write_record(fd, holder)
            except OSError as exc:
                raise _unwritable(path, exc) from exc
            state = {"holder": holder}

            def renew() -> None:
                state["holder"] = Holder(**{**state["holder"].__dict__, "renewed": dt.datetime.now(dt.UTC).timestamp()})
                with contextlib.suppress(OSError):
                    _write_record(fd, state["holder"])

            lease = _Lease(renew)
        yield
    finally:
        if lease is not None:
            lease.release()
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # an empty file: released cleanly, nobody to warn about
        fcntl.flock(fd, fcntl.LOCK_UN)  # explicitly: a process this one forked shares the lock otherwise
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# In a bucket


def _bucket_holder(path: BucketPath) -> tuple[backends.ObjectStat, Holder | None] | None:
    """The lock object's stat and holder (None: no lock object)."""
    found = path.object_stat()
    if found is None:
        return None
    try:
        body = path.read_bytes()
    except FileNotFoundError:
        return None
    return found, _decode(body)


def _gone_in_bucket(path: BucketPath, found: backends.ObjectStat, holder: Holder | None) -> bool:
    """Whether the lock object's holder is known gone: none is named (an object is never seen half-written, so an
    empty or unreadable one is a released lock, e.g. a disk's lock file copied into the bucket with its run
    folder), its pid is gone on this host, or its lease lapsed by the bucket's clock."""
    if holder is None:
        return True
    if holder.on_this_host() and not _pid_alive(holder.pid):
        return True
    return _lapsed(found.updated, _bucket_now(path.parent))


def _live_readers(path: BucketPath) -> list[Holder]:
    """The shared holders of the lock ``path`` whose leases have not lapsed (lapsed ones are removed)."""
    folder = path.with_name(path.name + READERS)
    objects = folder.list_objects()
    if not objects:
        return []
    now = _bucket_now(path.parent)
    live = []
    for name, found in objects.items():
        holder = _read_holder(folder / name)
        if (holder is not None and holder.on_this_host() and not _pid_alive(holder.pid)) or _lapsed(found.updated, now):
            backends.delete_if((folder / name).url, found.generation)
            continue
        live.append(holder or Holder("?", 0, "?", 0.0, path.stem))
    return live


class _BucketLease:
    """A held lock object (or a reader's object): renewed by a conditional replace of the version written last."""

    def __init__(self, path: BucketPath, holder: Holder, written: backends.ObjectStat) -> None:
        self.path, self.holder, self.generation = path, holder, written.generation
        self.lease = _Lease(self.renew)

    def renew(self) -> bool:
        holder = Holder(**{**self.holder.__dict__, "renewed": dt.datetime.now(dt.UTC).timestamp()})
        try:
            written = replace_if_checked(self.path.url, holder.encode(), self.generation)
        except backends.PreconditionFailed:
            now = _read_holder(self.path)
            reason = (f"this process's lock {self.path} was taken over by "
                      f"{now.describe() if now else 'another process'}: its lease lapsed (no renewal for "
                      f"{LEASE_S:.0f} s, e.g. a storage outage); this process stops without writing more")
            _lost.append(reason)
            log.error("%s", reason)
            return False
        self.holder, self.generation = holder, written.generation
        return True

    def release(self) -> None:
        failing = sys.exc_info()[1]
        storage_failed = failing is not None and backends.storage_failure_reason(failing) is not None
        self.lease.release(wait=not storage_failed)
        if storage_failed:
            # the storage just failed this process: a delete would wait out the client's retries again. The lock
            # stays; a rerun on this host takes it over at once (this pid is gone), another host after the lease
            log.warning("leaving the lock %s in place: the storage is failing", self.path)
            return
        if not any(self.path.name in reason for reason in _lost):
            with contextlib.suppress(Exception):  # a release that fails leaves a lease that lapses
                backends.delete_if(self.path.url, self.generation)


def _take_bucket_lock(path: BucketPath, name: str) -> tuple[_BucketLease, Holder | None]:
    """Create the lock object, or take it over from a holder that is gone; BusyError when one is live."""
    for _ in range(5):
        holder = _new_holder(name)
        try:
            return _BucketLease(path, holder, create_checked(path.url, holder.encode())), None
        except FileExistsError:
            pass
        current = _bucket_holder(path)
        if current is None:
            continue  # released between our create and our read: try again
        found, previous = current
        if not _gone_in_bucket(path, found, previous):
            raise _busy(path, previous, name, shared=False)
        try:
            written = replace_if_checked(path.url, holder.encode(), found.generation)
        except backends.PreconditionFailed:
            continue  # another process took it over (or renewed it) first: look again
        return _BucketLease(path, holder, written), previous
    raise BusyError(f"{path} keeps changing hands between other processes: rerun the same command")


@contextlib.contextmanager
def _hold_in_bucket(path: BucketPath, name: str, shared: bool) -> Iterator[None]:
    if shared:
        reader = path.with_name(path.name + READERS) / f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        holder = _new_holder(name)
        lease = _BucketLease(reader, holder, create_checked(reader.url, holder.encode()))
        try:
            current = _bucket_holder(path)  # a writer that started before our reader object appeared
            if current is not None and not _gone_in_bucket(path, *current):
                raise _busy(path, current[1], name, shared=True)
            yield
        finally:
            lease.release()
        return
    lease, previous = _take_bucket_lock(path, name)
    try:
        readers = _live_readers(path)  # readers that came before our lock object
        if readers:
            raise _busy(path, None, name, shared=False)
        if previous is not None:
            log.warning("taking over the lock %s left by %s (%s): that process is gone", path, previous.stage,
                        previous.describe())
        yield
    finally:
        lease.release()


# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def hold(path: RunPath, name: str, shared: bool = False) -> Iterator[None]:
    """Hold the lock ``path`` for ``name`` (a stage's name), exclusively or shared; BusyError names the holder."""
    if isinstance(path, BucketPath):
        with _hold_in_bucket(path, name, shared):
            yield
    else:
        with _hold_on_disk(path, name, shared):
            yield


def owner_folder(folder: RunPath) -> RunFolder:
    """The run folder that owns a stage's output folder: its own, or the one a link points into."""
    owner = linked_run(folder)
    return RunFolder(owner if owner is not None else folder.parent)


@contextlib.contextmanager
def stage_lock(run_folder: RunFolder, stage: Stage, primary: bool = True) -> Iterator[None]:
    """``stage``'s own lock (exclusive) and those of the stages it reads (shared, where their outputs
    live); a no-op in the processes of a multi-host job other than process 0."""
    if not primary:
        yield
        return
    with contextlib.ExitStack() as stack:
        stack.enter_context(hold(lock_path(run_folder, stage.name), stage.name))
        for name in stage.reads:
            source = stage_named(name)
            stack.enter_context(hold(lock_path(owner_folder(source.dir(run_folder)), name), name, shared=True))
        yield
