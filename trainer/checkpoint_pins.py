"""Readers pin the checkpoint step they load, and the training run's rotation keeps a pinned step.

A training run keeps its latest ``train.keep_checkpoints`` steps and deletes older ones as it saves new
ones (Orbax's preservation policy). Recipe 05, 05b, 05c and 09, and a branch started from a run that is
still training, read a step of that run's folder meanwhile: without a pin the trainer could delete the
step between the reader's listing and its last read. A reader writes
``checkpoints/.readers/<step>.<host>.<pid>.<token>.json`` (created exclusively: a file on a disk, an object
in a bucket) before it opens the step and removes it when done; ``KeepPinned``, one of the trainer's
preservation policies, keeps every step with a live pin. A pin whose reader died is not live: on the
reader's host, its pid is gone; anywhere, it is older than ``PIN_LIFETIME_S`` (a reader still at work
after that may lose its step, and retries the newest one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import time
from collections.abc import Iterator, Sequence

from orbax.checkpoint.checkpoint_managers import preservation_policy

from experiment.jsontext import parse_json
from experiment.lock import _pid_alive
from experiment.storage import RunPath, create_exclusive
from experiment.storage.retry import unique_token

log = logging.getLogger("trainer.checkpoint")
PINS_DIR = ".readers"  # not a step's name (Orbax lists only numbered folders)
PIN_LIFETIME_S = 6 * 3600.0  # loading the largest model this project trains takes minutes, not hours


def _pin_step(name: str) -> int | None:
    head = name.split(".", 1)[0]
    return int(head) if head.isdigit() and name.endswith(".json") else None


@contextlib.contextmanager
def pinned(checkpoint_dir: RunPath, step: int) -> Iterator[None]:
    """Hold a pin on ``step`` of ``checkpoint_dir`` for the block. A folder this process cannot write (a
    read-only copy of a run) is read unpinned: nothing rotates it."""
    path = checkpoint_dir / PINS_DIR / f"{step}.{socket.gethostname()}.{os.getpid()}.{unique_token()}.json"
    record = {"step": step, "host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
    try:
        create_exclusive(path, (json.dumps(record) + "\n").encode())
    except OSError as exc:
        log.info("cannot pin checkpoint step %d in %s (%s): reading it unpinned", step, checkpoint_dir,
                 exc.strerror or exc)
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
            path.parent.rmdir()  # the last reader leaves no folder (another reader's pin keeps it: not empty)


def _live(record: dict[str, object], now: float) -> bool:
    try:
        since, pid, host = float(record["since"]), int(record["pid"]), str(record["host"])  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError):
        return False
    if now - since > PIN_LIFETIME_S:
        return False
    return _pid_alive(pid) if host == socket.gethostname() else True


def pinned_steps(checkpoint_dir: RunPath) -> set[int]:
    """The steps of ``checkpoint_dir`` a live reader has pinned."""
    folder = checkpoint_dir / PINS_DIR
    try:
        names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
    except OSError:
        return set()
    steps, now = set(), time.time()
    for name in names:
        step = _pin_step(name)
        if step is None or step in steps:
            continue
        with contextlib.suppress(OSError, ValueError):  # a pin removed or being written meanwhile
            if _live(parse_json((folder / name).read_text(encoding="utf-8")), now):
                steps.add(step)
    return steps


@dataclasses.dataclass
class KeepPinned(preservation_policy.PreservationPolicy):
    """An Orbax preservation policy: keep every step a live reader has pinned (``pinned_steps``)."""

    checkpoint_dir: RunPath

    def should_preserve(self, checkpoints: Sequence[preservation_policy.PolicyCheckpointInfo], *,
                        context: preservation_policy.PreservationContext) -> Sequence[bool]:
        pins = pinned_steps(self.checkpoint_dir) if checkpoints else set()
        return [info.step in pins for info in checkpoints]
