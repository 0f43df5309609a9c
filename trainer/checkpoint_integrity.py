"""Checkpoint integrity: the checksums of each committed step, and restoring the newest step that passes them.

Once Orbax has committed a step (for async saves: in the background, when the renamed folder
appears), ``<step>/checksums.json`` records the size and CRC32C of every file of the step, written
atomically. Resume and eval verify it before Orbax reads anything: a step without it (a kill
between the commit and the checksums) or with a changed, missing or truncated file is damaged,
and the latest step that passes is what resume and eval see (``restore_verified``); damaged steps
are moved aside (``set_aside``). Checking first also keeps Orbax from failing half-way through a
restore, which leaves tensorstore callbacks printing ``Event loop is closed`` tracebacks.

In a bucket the checksums are the storage's own, read from one listing of the step, never by
reading the step back (a 70B step is most of a terabyte): each object's size and the checksum the
storage computed when it was written (GCS ``crc32c``, S3 ``ETag``). An object replaced, truncated,
missing or flipped at rest (rewritten through the API) no longer matches. There a step is committed
when Orbax's marker ``commit_success.txt`` appears in it (Orbax writes a bucket step in place, not
into a folder it renames), and only then are its checksums written.

This module knows Orbax only as a manager it is handed (``directory``, ``all_steps``, ``reload``);
the Orbax wrapper (``trainer.checkpoint``) writes the checksums through ``ChecksumWriter``.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import google_crc32c
import jax

# which steps are committed and finished lives below tracking/, whose sweep checks an anneal parent with it
from experiment.checkpoint_steps import CHECKSUMMED, CHECKSUMS, committed, uses_checksums
from experiment.errors import DataError
from experiment.files import atomic_write_json, atomic_write_text
from experiment.jsontext import parse_json
from experiment.storage import BucketPath, RunPath, location
from trainer.checkpoint_pins import pinned

if TYPE_CHECKING:  # a manager is handed in: this module itself never calls Orbax
    import orbax.checkpoint as ocp

log = logging.getLogger("trainer.checkpoint")  # one log channel for everything about checkpoints
STORAGE_ALGORITHM = "storage"  # checksums.json in a bucket: each object's size and the storage's own checksum
DAMAGED_DIR = "damaged"  # not a step name for Orbax (digits, or ending in _digits)
_CHUNK = 4 << 20


class CheckpointDamaged(DataError):
    """A checkpoint step fails its checksums or cannot be read (names the step folder and file)."""


class CheckpointRotated(DataError):
    """The step a reader asked for was deleted by its training run's rotation (names the steps left)."""


class StepRotated(Exception):
    """Inside ``restore_verified``: the step being read is gone (rotated away), not damaged."""


def file_crc32c(path: RunPath) -> str:
    crc = 0
    with path.open("rb") as handle:
        while block := handle.read(_CHUNK):
            crc = google_crc32c.extend(crc, block)
    return f"{crc:08x}"


def step_files(step_dir: Path) -> Iterator[Path]:
    for path in sorted(step_dir.rglob("*")):
        if path.is_file() and path.name != CHECKSUMS:
            yield path


def storage_checksums(step_dir: BucketPath) -> dict[str, dict[str, Any]]:
    """Size and storage checksum of every object of a bucket step, from one listing."""
    return {name: {"bytes": found.size, "checksum": found.checksum or found.generation}
            for name, found in step_dir.list_objects().items() if name != CHECKSUMS}


def write_checksums(step_dir: RunPath) -> None:
    """Record size and checksum of every file of a committed step in ``<step>/checksums.json``: CRC32C read
    from a disk; the storage's own checksums in a bucket."""
    started = time.perf_counter()
    if isinstance(step_dir, BucketPath):
        atomic_write_json(step_dir / CHECKSUMS, {"algorithm": STORAGE_ALGORITHM, "files": storage_checksums(step_dir)})
        mark_checksummed(step_dir.parent)
        log.debug("storage checksums of %s in %.3f s", step_dir, time.perf_counter() - started)
        return
    files = {p.relative_to(step_dir).as_posix(): {"bytes": p.stat().st_size, "crc32c": file_crc32c(p)}
             for p in step_files(step_dir)}
    atomic_write_json(step_dir / CHECKSUMS, {"algorithm": "crc32c", "files": files})
    mark_checksummed(step_dir.parent)
    log.debug("checksums of %d files of %s in %.3f s", len(files), step_dir, time.perf_counter() - started)


def mark_checksummed(directory: RunPath) -> None:
    if not (directory / CHECKSUMMED).exists():
        atomic_write_text(directory / CHECKSUMMED, "every step of this folder has checksums.json\n")


def verify_checksums(step_dir: RunPath, item: str | None = None) -> None:
    """Raise CheckpointDamaged naming the first file of ``step_dir`` (of its ``item`` folder alone when
    given, e.g. ``meta``) that differs from its checksum."""
    path = step_dir / CHECKSUMS
    try:
        body = parse_json(path.read_text(encoding="utf-8"))
        recorded, algorithm = body["files"], body.get("algorithm", "crc32c")
        if not isinstance(recorded, dict) or not recorded:
            raise ValueError("no files listed")
    except FileNotFoundError:
        raise CheckpointDamaged(f"{path} is missing (the run stopped before the checksums of the step were "
                                "written)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointDamaged(f"{path} is unreadable ({exc})") from exc
    if algorithm == STORAGE_ALGORITHM:
        _verify_storage_checksums(step_dir, recorded, item, path)
        return
    for name, expected in recorded.items():
        if item is not None and not name.startswith(f"{item}/"):
            continue
        file = step_dir / name
        try:
            size = file.stat().st_size
            if size != expected["bytes"]:
                raise CheckpointDamaged(f"{file} has {size} bytes, its checksum file says {expected['bytes']}")
            if file_crc32c(file) != expected["crc32c"]:
                raise CheckpointDamaged(f"{file} does not match its CRC32C in {path}")
        except FileNotFoundError:
            raise CheckpointDamaged(f"{file} is missing") from None
        except (OSError, KeyError, TypeError) as exc:
            raise CheckpointDamaged(f"{file} cannot be checked ({exc})") from exc


def _verify_storage_checksums(step_dir: RunPath, recorded: dict[str, Any], item: str | None, path: RunPath) -> None:
    """A bucket step against the sizes and storage checksums its checksums.json recorded (one listing)."""
    if not isinstance(step_dir, BucketPath):
        raise CheckpointDamaged(f"{path} holds a bucket's checksums, but {step_dir} is on a disk: copy checkpoints "
                                "between a bucket and a disk with their folder, then restore them where they are")
    found = storage_checksums(step_dir)
    for name, expected in recorded.items():
        if item is not None and not name.startswith(f"{item}/"):
            continue
        file = step_dir / name
        now = found.get(name)
        try:
            if now is None:
                raise CheckpointDamaged(f"{file} is missing")
            if now["bytes"] != expected["bytes"]:
                raise CheckpointDamaged(f"{file} has {now['bytes']} bytes, its checksum file says {expected['bytes']}")
            if now["checksum"] != expected["checksum"]:
                raise CheckpointDamaged(f"{file} does not match the checksum the storage gave it when it was "
                                        f"written ({path}): it was replaced or changed since")
        except (KeyError, TypeError) as exc:
            raise CheckpointDamaged(f"{file} cannot be checked ({exc})") from exc


class ChecksumWriter:
    """Writes the checksums of each saved step once its committed folder appears (one thread)."""

    def __init__(self, directory: RunPath) -> None:
        self.directory = directory
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-checksums")
        self._futures: list[Future[None]] = []
        self._settled = threading.Event()  # Orbax has finished every save started so far

    def schedule(self, step: int) -> None:
        self._settled.clear()
        self._futures.append(self._pool.submit(self._write_when_committed, self.directory / str(step)))

    def _write_when_committed(self, step_dir: RunPath) -> None:
        poll = 0.2 if isinstance(step_dir, BucketPath) else 0.02  # a request per look at a bucket
        while not committed(step_dir):
            if self._settled.is_set():
                if not committed(step_dir):
                    return  # the save failed; Orbax reports why
                break
            time.sleep(poll)
        write_checksums(step_dir)

    def settle(self) -> None:
        """Called once Orbax finished its saves: write what is pending and raise the first error."""
        self._settled.set()
        futures, self._futures = self._futures, []
        for future in futures:
            future.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def committed_step_bytes(directory: RunPath) -> tuple[int, int] | None:
    """``(step, bytes)`` of the newest step with checksums: what the next save will need on disk."""
    for step_dir in sorted((p for p in directory.iterdir() if p.name.isdigit()), key=lambda p: -int(p.name)):
        with suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
            files = parse_json((step_dir / CHECKSUMS).read_text(encoding="utf-8"))["files"]
            return int(step_dir.name), sum(int(f["bytes"]) for f in files.values())
    return None


# what Orbax and tensorstore raise on a file they cannot read (tensorstore: ValueError)
READ_ERRORS = (ValueError, KeyError, TypeError, OSError)


OWN_RUN_ADVICE = "move the folder away or delete it to start over"
# what a reader (eval, export, generation, a branch) says: the folder is another run's, maybe still training
READER_ADVICE = ("these are the checkpoints of the run that wrote them: rerun once that run has saved a sound step "
                 "(resume it with recipes/04_pretrain.py)")


def restore_verified(manager: ocp.CheckpointManager, read: Callable[[int], Any],
                     steps: Sequence[int] | None = None, item: str | None = None,
                     advice: str = OWN_RUN_ADVICE) -> tuple[int, Any, list[int]]:
    """``read(step)`` of the newest step that passes its checksums and reads back (``item``: the checksums
    of that item's files alone, for a ``read`` that reads nothing else, such as ``read_meta``).

    Each step is pinned while it is checked and read (``trainer.checkpoint_pins``): a training run saving
    beside this reader keeps it. A step its run rotated away before the pin (or before a training run that
    predates pins honoured it) is no damage: with ``steps`` None the newest step is listed again and read
    instead, said in one line; a given step that is gone is one error line naming the steps there are.
    Each damaged step is logged as a warning naming the file, and the previous one is tried.
    Returns ``(step, read(step), damaged steps)``; raises CheckpointDamaged naming the checkpoint
    folder (and ``advice``) when no step is left. Errors of ``read`` other than read errors (e.g. a
    checkpoint of another model) propagate.
    """
    directory = location(str(manager.directory))
    newest_wanted = steps is None
    candidates = sorted(manager.all_steps() if steps is None else steps, reverse=True)
    damaged: list[int] = []
    rotated: list[int] = []
    reasons: list[str] = []
    # a folder written before per-file checksums existed: read it (Orbax's read errors still fall back)
    # rather than call every step damaged and lose a run to an upgrade
    legacy = bool(candidates) and not uses_checksums(directory)
    if legacy:
        log.warning("the checkpoints in %s have no checksums (written by an older version): restoring them "
                    "unverified; steps saved from now on are verified", directory)
    while candidates:
        step = candidates.pop(0)
        with pinned(directory, step):
            try:
                if not committed(directory / str(step)):
                    raise StepRotated
                try:
                    if not legacy:
                        verify_checksums(directory / str(step), item)
                    return step, read(step), damaged
                except Exception as exc:
                    if not committed(directory / str(step)):
                        raise StepRotated from exc  # its files went with the whole step: not a damaged one
                    if isinstance(exc, CheckpointDamaged) or not isinstance(exc, READ_ERRORS):
                        raise
                    raise CheckpointDamaged(f"step {step} passed its checksums but cannot be read: "
                                            f"{str(exc).splitlines()[0][:300]}") from exc
            except StepRotated:
                rotated.append(step)
                if newest_wanted:
                    manager.reload()
                    tried = {*damaged, *rotated}
                    candidates = sorted((s for s in manager.all_steps() if s not in tried), reverse=True)
                log.warning("checkpoint step %d was removed by its run's checkpoint rotation (train.keep_checkpoints) "
                            "while this was loading it: %s", step,
                            f"loading step {candidates[0]}" if candidates else "no other step is left")
            except CheckpointDamaged as exc:
                damaged.append(step)
                reasons.append(f"step {step}: {exc}")
                older = [s for s in candidates if s < step]
                log.warning("checkpoint step %d is damaged: %s; %s", step, exc,
                            f"falling back to step {older[0]}" if older else "no older step is left")
    if rotated and not damaged:
        manager.reload()
        left = sorted(manager.all_steps())
        raise CheckpointRotated(f"checkpoint step {', '.join(map(str, rotated))} of {directory} was removed by its "
                                "run's checkpoint rotation (train.keep_checkpoints) before it could be read: "
                                f"choose a step the run keeps (there now: {', '.join(map(str, left)) or 'none'})")
    raise CheckpointDamaged(f"no restorable checkpoint in {directory} ({'; '.join(reasons)}): {advice}")


def set_aside(manager: ocp.CheckpointManager, steps: Sequence[int], into: str = DAMAGED_DIR,
              why: str = "damaged") -> None:
    """Move damaged steps (or, ``into``/``why``, steps set aside for another reason) into ``damaged/``,
    kept for inspection: the run saves those steps again."""
    if not steps:
        return
    directory = location(str(manager.directory))
    if jax.process_index() == 0:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
        for step in steps:
            target = directory / into / f"{step}-{stamp}"
            target.parent.mkdir(exist_ok=True)
            (directory / str(step)).rename(target)
            log.warning("moved the %s checkpoint step %d to %s", why, step, target)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("checkpoint-set-aside")
    manager.reload()
