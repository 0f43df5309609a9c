"""Run-folder locks: one writer per stage of a run folder, and no rewrite of data a running stage reads.

Each stage that runs holds ``<run folder>/.locks/<stage>.lock`` exclusively (an OS lock,
``fcntl.flock``), with its holder written in it as JSON (host, pid, since, renewed, stage). A
stage that reads an earlier stage's output (``Stage.reads``) holds that stage's lock *shared*, in
the run folder that owns the output (through a link: a branch's or a variant's shards are locked
in the parent's folder). So a second recipe 04 of one run, a recipe 03 rewriting the shards a
recipe 04 trains on, or a recipe 04 starting while recipe 03 writes them, each stop at once with
one line. Readers of finished outputs that are no stage (the loaders, the tests) take no lock.

A lock outlives no process on its host: the kernel releases an flock when its holder dies, and
the next writer takes the file over with a warning naming the holder that left it. Where the lock
cannot tell (a holder on another host, over NFS), the holder renews ``renewed`` every ``RENEW_S``
seconds, and one not renewed for ``LEASE_S`` seconds is taken to be gone. A multi-host job locks
once, in its process 0 (the harness passes ``primary``).
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
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from experiment.errors import RecipeError
from experiment.runfolder import RunFolder
from experiment.stages import Stage, stage_named

log = logging.getLogger("experiment.lock")
LOCKS_DIR = ".locks"
LEASE_S = 600.0  # a holder on another host that has not renewed its lease for this long is gone
RENEW_S = 60.0
SWEEP = "sweep"  # recipe 08's lock in the sweep's folder: its stages, each in a process of its own, lock their own
OTHER_LOCKS = {SWEEP: "recipes/08_sweep.py"}  # locks that are no stage's, and the recipe that takes them


class BusyError(RecipeError):
    """A run folder's stage is held by another running process (names it)."""


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    since: str  # ISO time, UTC
    renewed: float  # Unix time of the last renewal
    stage: str

    def describe(self) -> str:
        return f"host {self.host}, pid {self.pid}, since {self.since}"

    def gone(self, now: float) -> bool:
        """Whether the holder is known dead: its pid is gone on this host, or its lease ran out on another."""
        if self.host == socket.gethostname():
            return not _pid_alive(self.pid)
        return now - self.renewed > LEASE_S


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def lock_path(folder: RunFolder, name: str) -> Path:
    return folder.root / LOCKS_DIR / f"{name}.lock"


def _read_holder(path: Path) -> Holder | None:
    """The holder written in a lock file (None: released cleanly, or unreadable while being rewritten)."""
    try:
        body = json.loads(path.read_text(encoding="utf-8") or "null")
        return Holder(str(body["host"]), int(body["pid"]), str(body["since"]), float(body["renewed"]),
                      str(body["stage"]))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _write_holder(fd: int, holder: Holder) -> None:
    data = json.dumps(holder.__dict__).encode()
    os.pwrite(fd, data, 0)  # over the old record, then cut: a reader never sees an empty file meanwhile
    os.ftruncate(fd, len(data))
    os.fsync(fd)


def _break(path: Path) -> None:
    """Put a fresh lock file in place of one whose holder is gone but whose OS lock still stands
    (a child it forked, an NFS lock of a dead host): the next flock is on the new file."""
    fresh = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fresh.write_bytes(b"")
    os.replace(fresh, path)


def _open_locked(path: Path, shared: bool) -> tuple[int | None, Holder | None]:
    """``(fd, previous holder)`` with the flock taken, or ``(None, holder)`` when a live process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(5):  # another process may replace the file between our open and our flock
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                raise
            holder = _read_holder(path)
            if holder is None or not holder.gone(dt.datetime.now(dt.UTC).timestamp()):
                return None, holder
            log.warning("taking over the lock %s of %s (%s): that process is gone", path, holder.stage,
                        holder.describe())
            _break(path)
            continue
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd, _read_holder(path)
        os.close(fd)
    raise BusyError(f"{path} keeps being replaced by other processes: rerun the same command")


class _Lease:
    """Renews a held lock's ``renewed`` time in a daemon thread until released."""

    def __init__(self, fd: int, holder: Holder) -> None:
        self.fd, self.holder = fd, holder
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._renew, name="lock-lease", daemon=True)
        self.thread.start()

    def _renew(self) -> None:
        while not self.stop.wait(RENEW_S):
            self.holder = Holder(**{**self.holder.__dict__, "renewed": dt.datetime.now(dt.UTC).timestamp()})
            with contextlib.suppress(OSError):
                _write_holder(self.fd, self.holder)

    def release(self) -> None:
        self.stop.set()
        self.thread.join()
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)  # an empty file: released cleanly, nobody to warn about


def _new_holder(stage: str) -> Holder:
    now = dt.datetime.now(dt.UTC)
    return Holder(socket.gethostname(), os.getpid(), now.isoformat(timespec="seconds"), now.timestamp(), stage)


def _recipe(name: str) -> str:
    try:
        return stage_named(name).recipe
    except ValueError:
        return OTHER_LOCKS.get(name, name)


@contextlib.contextmanager
def hold(path: Path, name: str, shared: bool = False) -> Iterator[None]:
    """Hold the lock file ``path`` for ``name`` (a stage's name), exclusively or shared; BusyError names the holder."""
    fd, previous = _open_locked(path, shared)
    if fd is None:
        if previous is None:  # readers hold it shared and write nothing
            raise BusyError(f"{path.parent.parent}: a running stage reads its {name} output: wait for it to "
                            f"finish before running {_recipe(name)} there")
        doing = "reading" if shared else "writing"
        raise BusyError(f"{path.parent.parent} is already running {_recipe(previous.stage)} ({previous.describe()}): "
                        f"wait for it to finish or stop it before {doing} its {previous.stage} output")
    lease = None
    try:
        if shared and previous is not None:
            os.ftruncate(fd, 0)  # no writer can hold it while we do: the record is a dead writer's
        elif not shared:
            if previous is not None:
                log.warning("taking over the lock %s left by %s (%s): that process is gone", path, previous.stage,
                            previous.describe())
            holder = _new_holder(name)
            _write_holder(fd, holder)
            lease = _Lease(fd, holder)
        yield
    finally:
        if lease is not None:
            lease.release()
        fcntl.flock(fd, fcntl.LOCK_UN)  # explicitly: a process this one forked shares the lock otherwise
        os.close(fd)


def owner_folder(folder: Path) -> RunFolder:
    """The run folder that owns a stage's output folder: its own, or the one a link points into."""
    return RunFolder(folder.resolve().parent if folder.is_symlink() else folder.parent)


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
